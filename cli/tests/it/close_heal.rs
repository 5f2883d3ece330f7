//! Heal at close: a lone connection whose `-wal` (or `-shm`) was unlinked by a cleanup, with
//! nothing newer at the path, gets its retired generation checkpointed back into the main file at
//! its close, as stock SQLite's close would (after the capture is written). Whenever something
//! newer might exist the close stays capture-only: a newer generation is never overwritten.
//! Measured on cc1ba9f: after such a lone loss the live file had no tables at all; the rows
//! lived only in the capture.

use crate::common;

use std::fs;
use std::path::Path;

use common::*;
use rusqlite::Connection;

const ROWS: usize = 5;

fn live_rows(path: &Path, pattern: &str) -> i64 {
    let live = Connection::open(path).unwrap();
    assert!(integrity_ok(&live));
    count_like(&live, pattern)
}

#[test]
fn a_lone_connections_unlinked_wal_is_checkpointed_back_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = lone_loss(&path, ROWS, &["-wal", "-shm"]);

    drop(conn);

    assert!(
        !sidecar(&path, "-wal").exists(),
        "checkpointed, nothing left to replay"
    );
    assert_eq!(
        live_rows(&path, &format!("{SENTINEL_PREFIX}%")),
        ROWS as i64
    );
    assert_eq!(live_rows(&path, "history %"), 20);
    assert_eq!(
        artifacts(dir.path()).len(),
        1,
        "the capture stays as a copy"
    );
}

#[test]
fn a_lone_connections_unlinked_shm_is_checkpointed_back_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = lone_loss(&path, ROWS, &["-shm"]);

    drop(conn);

    assert!(!sidecar(&path, "-wal").exists());
    assert_eq!(
        live_rows(&path, &format!("{SENTINEL_PREFIX}%")),
        ROWS as i64
    );
    assert_eq!(artifacts(dir.path()).len(), 1);
}

#[test]
fn the_library_close_heals_a_lone_loss_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = lone_loss(&path, ROWS, &["-wal", "-shm"]);

    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    assert_eq!(
        live_rows(&path, &format!("{SENTINEL_PREFIX}%")),
        ROWS as i64
    );
}

#[test]
fn a_newer_generation_open_at_the_close_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = lone_loss(&path, ROWS, &["-wal", "-shm"]);
    let newer = NewerGenerationOpen::start(&path);

    drop(conn);
    drop(newer);

    assert_eq!(live_rows(&path, &format!("{SENTINEL_PREFIX}%")), 0);
    assert_eq!(live_rows(&path, "history %"), 20);
    assert_eq!(
        artifacts(dir.path()).len(),
        1,
        "the capture holds the retired rows"
    );
}

#[test]
fn a_newer_generation_written_checkpointed_and_closed_in_between_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = lone_loss(&path, ROWS, &["-wal", "-shm"]);
    // Another process: opens, commits 3 rows, checkpoints them into the main file (TRUNCATE)
    // and closes; then whatever it left at the path is cleaned away (its close could not
    // delete its -wal while the retired connection's shield holds SHARED): at the retired
    // connection's close nothing newer is at the path any more, only in the main file.
    let total = write_second_generation(&path, "stock", 3);
    for suffix in ["-wal", "-shm"] {
        let _ = fs::remove_file(sidecar(&path, suffix));
    }

    drop(conn);

    assert_eq!(live_rows(&path, "second generation %"), 3);
    assert_eq!(live_rows(&path, &format!("{SENTINEL_PREFIX}%")), 0);
    let live = Connection::open(&path).unwrap();
    let rows: i64 = live
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, total);
    assert_eq!(artifacts(dir.path()).len(), 1);
}

#[test]
fn a_main_file_copied_over_in_between_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let backup = dir.path().join("backup.db");
    {
        let seed = open_guarded(&path);
        checkpointed_history(&seed);
        seed.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        fs::copy(&path, &backup).unwrap();
    }
    let conn = lone_loss(&path, ROWS, &["-wal", "-shm"]);
    // A restore copies an older file over the live one in place: same inode.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::copy(&backup, &path).unwrap();

    drop(conn);

    assert_eq!(live_rows(&path, &format!("{SENTINEL_PREFIX}%")), 0);
    assert_eq!(artifacts(dir.path()).len(), 1);
}
