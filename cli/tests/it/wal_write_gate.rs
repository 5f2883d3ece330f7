//! The WAL's write gate: SQLite's WAL writes go straight to the unix VFS while the write lock's
//! check vouches for them, and through the guard from the moment the generation is retired.

use crate::common;

use common::*;

#[test]
fn a_retirement_inside_an_open_transaction_refuses_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    let wal_id = identity(&sidecar(&path, "-wal"));

    // The write lock is taken (and checked) by the first write of the transaction; its frames
    // reach the WAL only at the commit.
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    insert(&conn, "inside the transaction").unwrap();
    lose_sidecars(&path, false);
    let before = descriptor_contents(wal_id);
    // The status runs the check: the generation is retired while the transaction is open.
    assert!(conn.guard_status().unwrap().retired);

    let err = conn.execute_batch("COMMIT").unwrap_err();
    assert!(
        is_refusal(&err),
        "expected SQLITE_READONLY_DBMOVED, got {err}"
    );
    assert_same_bytes(
        &descriptor_contents(wal_id),
        &before,
        "retired WAL after the refused commit",
    );
    let _ = conn.execute_batch("ROLLBACK");
    let artifact = conn
        .guard_status()
        .unwrap()
        .capture
        .expect("captured at the refusal");
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert_eq!(count_like(&recovered, "inside the transaction"), 0);
}

#[test]
fn a_connection_switched_to_exclusive_locking_mode_checks_its_wal_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    // Shared-memory transactions first: the gate is open.
    for i in 0..10 {
        insert(&conn, &format!("shared {i}")).unwrap();
    }
    // From the next transaction on SQLite holds the main file EXCLUSIVE and writes the WAL
    // without its write lock: the gate closes.
    conn.execute_batch("PRAGMA locking_mode=EXCLUSIVE").unwrap();
    let sentinel = wal_only_sentinel(&conn);
    let wal_id = identity(&sidecar(&path, "-wal"));
    std::fs::remove_file(sidecar(&path, "-wal")).unwrap();
    let before = descriptor_contents(wal_id);

    let recovered = refused_and_recovered(conn, wal_id, &before, &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert_eq!(count_like(&recovered, "shared %"), 10);
}

#[test]
fn a_wal_reopened_after_a_journal_mode_round_trip_is_guarded_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "first WAL").unwrap();
    // Out of WAL mode (SQLite closes and deletes the WAL) and back: a new WAL file object.
    let mode: String = conn
        .query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    insert(&conn, "rollback journal").unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let sentinel = wal_only_sentinel(&conn);
    lose_sidecars(&path, true);

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert_eq!(count_like(&recovered, "rollback journal"), 1);
}
