//! The gateway writer runs in its own process, holds rows only in its WAL, and loses its sidecars.
//! One refused write captures the generation; another process then writes and checkpoints a newer
//! generation at the same path; the gateway closes and exits. The retired rows must be recoverable
//! from the capture alone, and the newer generation must be intact.

use crate::common;

use std::path::PathBuf;

use common::*;

fn retired_rows_recoverable_after_process_exit(rename: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&path, "guard");
    lose_sidecars(&path, rename);

    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true);
    assert_eq!(
        refused["extended_code"],
        rusqlite::ffi::SQLITE_READONLY_DBMOVED
    );
    let artifact = PathBuf::from(refused["artifact"].as_str().expect("captured at the halt"));
    assert!(artifact.is_dir());
    assert_eq!(manifest(&artifact)["trigger"], "halt");

    let expected = write_second_generation(&path, "stock", 400);

    gw.send("close");
    assert_eq!(gw.next_event("closed")["error"], serde_json::Value::Null);
    assert!(gw.quit().success());

    // The writer is gone, and its unlinked WAL inode with it: only the capture remains.
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(
        count_like(&recovered, "uncheckpointed %"),
        4,
        "retired WAL-only rows lost across process exit"
    );
    assert!(integrity_ok(&recovered));

    let live = rusqlite::Connection::open(&path).unwrap();
    assert!(integrity_ok(&live));
    let rows: i64 = live
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        rows, expected,
        "the newer generation was clobbered at close"
    );
}

#[test]
fn retired_rows_recoverable_after_process_exit_with_unlinked_sidecars() {
    retired_rows_recoverable_after_process_exit(false);
}

#[test]
fn retired_rows_recoverable_after_process_exit_with_renamed_sidecars() {
    retired_rows_recoverable_after_process_exit(true);
}

#[test]
fn stock_vfs_loses_the_newer_generation_in_the_same_scenario() {
    // The control: without the guard the same sequence silently loses the newer rows. If this
    // ever stops failing, the scenario above no longer tests anything.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&path, "stock");
    lose_sidecars(&path, false);
    gw.send("write");
    assert_eq!(gw.next_event("write")["refused"], false);
    let expected = write_second_generation(&path, "stock", 100);
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());

    let live = rusqlite::Connection::open(&path).unwrap();
    let rows: i64 = live
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert!(rows < expected, "stock SQLite kept all {expected} rows");
}
