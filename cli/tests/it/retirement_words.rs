//! The retirement line says where the retired generation's committed rows are: captured beside
//! the database when its WAL holds frames, and when it holds none, that nothing is captured and
//! why the rows are safe without it (checkpointed into the file, by this connection or by the
//! newer generation that read them from the WAL left at the path).

use crate::common;

use std::path::Path;
use std::sync::Mutex;

use common::*;
use log::Level;

static LOGS: Mutex<Vec<(Level, String)>> = Mutex::new(Vec::new());

fn record(record: &log::Record<'_>) {
    LOGS.lock()
        .unwrap()
        .push((record.level(), record.args().to_string()));
}

/// The ERROR line that retired `db`.
fn retirement_line(db: &Path) -> String {
    let name = format!("{} is retired for this connection", db.display());
    let lines: Vec<String> = LOGS
        .lock()
        .unwrap()
        .iter()
        .filter(|(level, line)| *level == Level::Error && line.contains(&name))
        .map(|(_, line)| line.clone())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    lines[0].clone()
}

/// The WARN line that names `what`.
fn warn_line_naming(what: &Path) -> String {
    let what = what.display().to_string();
    LOGS.lock()
        .unwrap()
        .iter()
        .find(|(level, line)| *level == Level::Warn && line.contains(&what))
        .map(|(_, line)| line.clone())
        .unwrap_or_else(|| panic!("no WARN line names {what}"))
}

fn remove(path: &Path, suffix: &str) {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    std::fs::remove_file(name).unwrap();
}

fn live_rows(path: &Path) -> i64 {
    count_like(&open_stock(path), "kept %")
}

/// A guarded writer of `state.db` in a new temporary directory, with three committed rows in its
/// WAL (automatic checkpoints off), and the log recorded.
fn writer_with_three_rows() -> (tempfile::TempDir, std::path::PathBuf, rusqlite::Connection) {
    record_logs_into(record);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let w = open_guarded(&path);
    w.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..3 {
        insert(&w, &format!("kept {i}")).unwrap();
    }
    (dir, path, w)
}

#[test]
fn a_retirement_with_frames_in_its_wal_says_they_are_captured() {
    let (dir, path, w) = writer_with_three_rows();
    remove(&path, "-wal");
    let refused = insert(&w, "refused").unwrap_err();
    assert!(is_refusal(&refused), "not a refusal: {refused:?}");

    let line = retirement_line(&path);
    assert!(
        line.contains("Its committed rows are captured beside the database"),
        "{line}"
    );
    let [capture] = &artifacts(dir.path())[..] else {
        panic!("one capture: {:?}", artifacts(dir.path()));
    };
    // Outside Python the capture's line names the command alone.
    let said = warn_line_naming(capture);
    let command = format!(
        "run `hermes-guard recover {} --into {} --apply`",
        capture.display(),
        path.display()
    );
    assert!(said.contains(&command), "{said}");
    assert!(!said.contains("hermes_guard."), "{said}");
}

#[test]
fn a_retirement_whose_wal_was_checkpointed_empty_says_nothing_is_captured_and_why() {
    let (dir, path, w) = writer_with_three_rows();
    w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    remove(&path, "-wal");
    let refused = insert(&w, "refused").unwrap_err();
    assert!(is_refusal(&refused), "not a refusal: {refused:?}");

    let line = retirement_line(&path);
    assert!(line.contains("Nothing is captured"), "{line}");
    assert!(
        line.contains("checkpointed into the database file"),
        "{line}"
    );
    hermes_guard::close(w).map_err(|(_, e)| e).unwrap();
    assert!(artifacts(dir.path()).is_empty(), "no capture");
    assert_eq!(live_rows(&path), 3);
}

/// Only the `-shm` removed; another process opens (reading this connection's frames from the
/// WAL left at the path), commits, and truncates that WAL: nothing of the retired generation is
/// outside the live file, and the line says so instead of promising a capture.
#[test]
fn a_retirement_whose_wal_the_newer_generation_truncated_says_the_rows_are_live() {
    let (dir, path, w) = writer_with_three_rows();
    remove(&path, "-shm");
    write_second_generation(&path, "stock", 2);
    let refused = insert(&w, "refused").unwrap_err();
    assert!(is_refusal(&refused), "not a refusal: {refused:?}");

    let line = retirement_line(&path);
    assert!(line.contains("Nothing is captured"), "{line}");
    assert!(line.contains("in the live database"), "{line}");
    hermes_guard::close(w).map_err(|(_, e)| e).unwrap();
    assert!(artifacts(dir.path()).is_empty(), "no capture");
    assert_eq!(live_rows(&path), 3);
}
