//! The main file replaced under a connection (the snapshot-restore case), and `-shm` alone lost
//! while another process writes.

use crate::common;

use std::fs;
use std::path::PathBuf;

use common::*;
use hermes_guard::{ErrorClass, RetireReason};

#[test]
fn replaced_main_file_refuses_writes_and_leaves_the_restored_file_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    replace_main_file(&path);

    let err = insert(&conn, "into the old inode").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    assert_eq!(conn.classify(&err), ErrorClass::MainReplaced);
    let status = conn.guard_status().unwrap();
    assert_eq!(status.reason, Some(RetireReason::MainReplaced));
    assert!(
        status.capture.is_some(),
        "the retired generation is captured"
    );

    // The restored database takes new writes from a fresh connection...
    let fresh = open_stock(&path);
    for i in 0..50 {
        insert(&fresh, &format!("restored {i}")).unwrap();
    }
    drop(fresh);
    // ...and the retired connection's close does not touch it.
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    let live = rusqlite::Connection::open(&path).unwrap();
    assert!(integrity_ok(&live));
    assert_eq!(count_like(&live, "restored %"), 50);
    assert_eq!(count_like(&live, &sentinel), 1);
    assert_eq!(count_like(&live, "into the old inode"), 0);
}

#[test]
fn a_database_renamed_over_the_path_retires_the_old_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    // An empty WAL, as a restore tool would leave it: stale frames at `-wal` would otherwise be
    // replayed onto the restored file by SQLite itself, guard or no guard.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();

    let other = dir.path().join("other.db");
    let restore = open_stock(&other);
    insert(&restore, "from the snapshot").unwrap();
    restore
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(restore);
    fs::rename(&other, &path).unwrap();

    let err = insert(&conn, "into the old inode").unwrap_err();
    assert_eq!(conn.classify(&err), ErrorClass::MainReplaced);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    let live = rusqlite::Connection::open(&path).unwrap();
    assert!(integrity_ok(&live));
    assert_eq!(count_like(&live, "from the snapshot"), 1);
    assert_eq!(count_like(&live, "into the old inode"), 0);
}

#[test]
fn shm_unlinked_alone_while_another_process_writes_is_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&path, "guard");
    fs::remove_file(sidecar(&path, "-shm")).unwrap();

    // The other process builds a fresh -shm from the same WAL and checkpoints it (TRUNCATE):
    // the gateway's frames are in the live main file now, and the shared WAL is empty.
    let expected = write_second_generation(&path, "stock", 50);

    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true);
    // Nothing retired is left to save: the WAL the gateway pinned holds no frame.
    assert_eq!(refused["artifact"], serde_json::Value::Null);
    gw.send("close");
    assert_eq!(gw.next_event("closed")["error"], serde_json::Value::Null);
    assert!(gw.quit().success());

    let live = rusqlite::Connection::open(&path).unwrap();
    assert!(integrity_ok(&live));
    let rows: i64 = live
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, expected);
    assert_eq!(count_like(&live, "uncheckpointed %"), 4);
    assert_eq!(count_like(&live, "after the loss"), 0);
}

#[test]
fn an_unlinked_shm_alone_retires_the_connection_and_captures_its_wal_frames() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    fs::remove_file(sidecar(&path, "-shm")).unwrap();

    let err = insert(&conn, "after the loss").unwrap_err();
    assert_eq!(conn.classify(&err), ErrorClass::WalLost);
    let status = conn.guard_status().unwrap();
    assert_eq!(status.reason, Some(RetireReason::ShmLost));
    let artifact: PathBuf = status.capture.unwrap();
    assert_eq!(manifest(&artifact)["reason"], "shm-lost");
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}
