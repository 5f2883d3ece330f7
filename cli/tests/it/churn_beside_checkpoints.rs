//! A process that only opens, reads and closes connections beside two guarded
//! writer processes that commit and checkpoint is never taken for a victim of an overwrite in
//! place. Nothing is removed or replaced here, so any retirement (`main-overwritten` at a close),
//! any capture beside the database and any WARN or ERROR line is a false alarm.
//!
//! Before the fix the two churn tests failed in 5 of 5 runs each (about 110 alarm lines in their
//! 4 s; the workload, 8 s runs: 3 to 65 retirements and 1 to 683 WARN lines, 14 of 14
//! runs), and passed 10 of 10 after: the close's
//! judgement read the main file's first pages with no lock while another process checkpointed,
//! and took the checkpoint progress of a generation a reset had just started for the progress of
//! the one whose WAL header it had read ("none of the 0 frame(s) its checkpoints copied has
//! it"); the opener's judgement of a WAL in use read the main file after the WAL's frames, so a
//! frame committed and copied in between was in neither.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{artifacts, insert, integrity_ok, manifest, open_guarded, Gateway};
use rusqlite::{Connection, OpenFlags};

/// How long each role runs: before the fix a few retirements came in every second.
const SECONDS: &str = "4";

fn spawn(db: &Path, role: &str, checkpoint: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args([
            "writer",
            "--vfs",
            "guard",
            "--role",
            role,
            "--seconds",
            SECONDS,
        ])
        .args(["--checkpoint", checkpoint, "--db"])
        .arg(db)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a churn child: its `done` line and what it logged (WARN and above).
fn finish(child: Child, what: &str) -> (serde_json::Value, String) {
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let done: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: {e}: {stdout:?} {stderr}"));
    (done, stderr)
}

/// Two writers checkpointing as `modes` say and one churning reader, on one database, at once.
fn churn(modes: [&str; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    // The database and its WAL-base record exist before the churn starts.
    open_guarded(&db);
    let writers = modes.map(|mode| spawn(&db, "churn-writer", mode));
    let reader = spawn(&db, "churn-reader", "passive");
    let [w1, w2] = writers;
    let mut logs = String::new();
    for (child, what) in [(w1, "writer 1"), (w2, "writer 2")] {
        let (done, log) = finish(child, what);
        assert_eq!(done["failed"], 0, "{what}: {done}");
        assert!(done["commits"].as_u64().unwrap() > 0, "{what}: {done}");
        assert_eq!(done["guard"]["retired"], false, "{what}: {done}");
        assert_eq!(done["guard"]["refusals"], 0, "{what}: {done}");
        assert_eq!(
            done["close_error"],
            serde_json::Value::Null,
            "{what}: {done}"
        );
        logs += &log;
    }
    let (done, log) = finish(reader, "reader");
    assert_eq!(done["failed"], 0, "reader: {done} {log}");
    assert!(done["opens"].as_u64().unwrap() > 0, "reader: {done}");
    logs += &log;
    let alarms: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert_eq!(
        alarms.len(),
        0,
        "false alarms ({} lines), the first: {:?}",
        alarms.len(),
        alarms.first()
    );
    assert_eq!(artifacts(dir.path()), Vec::<std::path::PathBuf>::new());
    let conn = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_WRITE).unwrap();
    assert!(integrity_ok(&conn));
}

#[test]
fn a_reader_churning_beside_autocheckpointing_and_passive_writers_is_never_retired() {
    churn(["auto", "passive"]);
}

#[test]
fn a_reader_churning_beside_passive_and_restart_writers_is_never_retired() {
    churn(["passive", "restart"]);
}

/// What the close's judgement is for still holds under its lock: a copy in place over the
/// database after this connection's generation began and was checkpointed (nothing left to
/// checkpoint, so no checkpoint judges it) is found at the close, which retires the generation
/// and captures it (reason `main-overwritten`) instead of deleting the WAL. (Fails with the
/// close's judgement taken out.)
#[test]
fn an_in_place_copy_found_at_the_close_is_still_retired_and_captured() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let backup = dir.path().join("backup.db");
    let conn = open_guarded(&db);
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..20 {
        insert(&conn, &format!("history {i}")).unwrap();
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    std::fs::copy(&db, &backup).unwrap();
    for i in 0..5 {
        insert(&conn, &format!("checkpointed {i}")).unwrap();
    }
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .unwrap();
    // The next commit restarts the WAL: a generation begun on the checkpointed file.
    for i in 0..3 {
        insert(&conn, &format!("this generation {i}")).unwrap();
    }
    // Copied too: the close's own checkpoint has nothing to write, so only the close's
    // judgement (at `SQLITE_FCNTL_HAS_MOVED`) sees the copy.
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .unwrap();
    let bytes = std::fs::read(&backup).unwrap();
    std::fs::write(&db, bytes).unwrap();
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(manifest(&found[0])["reason"], "main-overwritten");
}

/// And the opener's judgement of a WAL in use still speaks when a restore really was undone: a
/// guarded writer's WAL left by its crash, an older copy put in place, a stock connection that
/// replayed the WAL onto it and holds it; a guarded opener then finds the WAL in use and not
/// written on the file, and says so at WARN (its confirmation reads the same things again).
#[test]
fn a_restore_undone_by_a_stock_holder_is_still_reported_by_a_guarded_opener() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let backup = dir.path().join("backup.db");
    {
        let conn = open_guarded(&db);
        insert(&conn, "before the backup").unwrap();
    }
    std::fs::copy(&db, &backup).unwrap();
    let (gw, _) = Gateway::start(&db, "guard");
    gw.kill();
    std::fs::write(&db, std::fs::read(&backup).unwrap()).unwrap();
    let stock = Connection::open(&db).unwrap();
    let rows: i64 = stock
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert!(rows > 1, "the stock opener replayed the WAL: {rows}");
    let out = Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args([
            "writer",
            "--vfs",
            "guard",
            "--role",
            "churn-reader",
            "--seconds",
            "0.2",
        ])
        .arg("--db")
        .arg(&db)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("is in use by another connection but was not written on the database"),
        "{stderr}"
    );
    drop(stock);
}
