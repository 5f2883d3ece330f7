//! `SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE` (what hermes-agent sets to keep the close-time checkpoint
//! away): SQLite's close then never asks `SQLITE_FCNTL_HAS_MOVED`, the guard's old only check at
//! close. A `-wal` unlinked after the connection's last write must still be found at the close and
//! captured, whichever way the connection is closed.
//!
//! Measured on cc1ba9f: 5 of 5 rows committed only in the unlinked WAL unreachable, no capture.

use crate::common;

use std::fs;
use std::path::Path;

use common::*;
use rusqlite::config::DbConfig;
use rusqlite::Connection;

const ROWS: usize = 5;

/// A guarded connection with the close-time checkpoint off, checkpointed history, and `ROWS`
/// rows committed only in its WAL.
fn connection_with_rows_only_in_the_wal(path: &Path) -> Connection {
    let conn = open_guarded(path);
    assert!(conn
        .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .unwrap());
    checkpointed_history(&conn);
    for i in 0..ROWS {
        insert(&conn, &format!("{SENTINEL_PREFIX}{i}")).unwrap();
    }
    conn
}

/// The one capture beside the database holds every row that lived only in the lost WAL.
#[track_caller]
fn assert_captured_at_close(dir: &Path) {
    let found = artifacts(dir);
    assert_eq!(found.len(), 1, "exactly one capture: {found:?}");
    assert_eq!(manifest(&found[0])["trigger"], "close");
    let recovered = recover(&found[0], "state.db", &dir.join("recovered"));
    assert_eq!(
        count_like(&recovered, &format!("{SENTINEL_PREFIX}%")),
        ROWS as i64
    );
    assert!(integrity_ok(&recovered));
}

#[test]
fn a_plain_drop_without_the_close_checkpoint_captures_a_wal_unlinked_after_the_last_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = connection_with_rows_only_in_the_wal(&path);
    fs::remove_file(sidecar(&path, "-wal")).unwrap();

    drop(conn);

    assert_captured_at_close(dir.path());
}

#[test]
fn a_plain_drop_without_the_close_checkpoint_captures_sidecars_renamed_away() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = connection_with_rows_only_in_the_wal(&path);
    lose_sidecars(&path, true);

    drop(conn);

    assert_captured_at_close(dir.path());
}

#[test]
fn the_library_close_without_the_close_checkpoint_captures_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = connection_with_rows_only_in_the_wal(&path);
    fs::remove_file(sidecar(&path, "-wal")).unwrap();

    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    assert_captured_at_close(dir.path());
}

#[test]
fn a_close_without_the_close_checkpoint_and_without_a_loss_captures_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = connection_with_rows_only_in_the_wal(&path);

    drop(conn);

    assert!(artifacts(dir.path()).is_empty());
    // The WAL stays (no checkpoint at close), and a new connection reads every row from it.
    let again = open_stock(&path);
    assert_eq!(
        count_like(&again, &format!("{SENTINEL_PREFIX}%")),
        ROWS as i64
    );
}
