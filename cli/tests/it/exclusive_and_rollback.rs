//! Transaction boundaries the guard cannot take from the shm write lock: `locking_mode=EXCLUSIVE`
//! (no shm locks at all) and rollback-journal mode (a hot-journal rollback takes EXCLUSIVE
//! straight from SHARED).

use crate::common;

use std::fs;
use std::path::Path;

use common::*;
use rusqlite::{Connection, OpenFlags};

fn open_raw_guarded(path: &Path) -> Connection {
    hermes_guard::register().unwrap();
    Connection::open_with_flags_and_vfs(path, OpenFlags::default(), hermes_guard::VFS_NAME).unwrap()
}

fn exclusive_wal(path: &Path) -> Connection {
    let conn = open_raw_guarded(path);
    conn.execute_batch(
        "PRAGMA locking_mode=EXCLUSIVE; PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
         CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, session TEXT, content TEXT);",
    )
    .unwrap();
    for i in 0..20 {
        insert(&conn, &format!("history {i}")).unwrap();
    }
    conn
}

fn wal_len(path: &Path) -> u64 {
    fs::metadata(sidecar(path, "-wal"))
        .map(|m| m.len())
        .unwrap_or(0)
}

fn spill_a_transaction(conn: &Connection) {
    conn.execute_batch("PRAGMA cache_size=5; BEGIN").unwrap();
    for i in 0..200 {
        insert(conn, &format!("spill {i} {}", "y".repeat(2000))).unwrap();
    }
}

#[test]
fn exclusive_mode_checks_the_transaction_after_a_rolled_back_spill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = exclusive_wal(&path);
    let before = wal_len(&path);
    spill_a_transaction(&conn);
    assert!(
        wal_len(&path) > before,
        "the transaction must have spilled frames"
    );
    conn.execute_batch("ROLLBACK").unwrap();
    fs::remove_file(sidecar(&path, "-wal")).unwrap();

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
}

#[test]
fn exclusive_mode_checks_the_transaction_after_a_commit_that_rewrote_checksums() {
    // Pages dirtied again after being spilled make SQLite overwrite frames of the same
    // transaction and then rewrite the checksums of every frame after them.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = exclusive_wal(&path);
    spill_a_transaction(&conn);
    conn.execute_batch("UPDATE messages SET session = 'gw-1' WHERE id <= 25; COMMIT")
        .unwrap();
    fs::remove_file(sidecar(&path, "-wal")).unwrap();

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
}

#[test]
fn exclusive_mode_transactions_keep_working_across_rollbacks_and_rewrites() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = exclusive_wal(&path);
    for round in 0..3 {
        spill_a_transaction(&conn);
        conn.execute_batch("ROLLBACK").unwrap();
        spill_a_transaction(&conn);
        conn.execute_batch("UPDATE messages SET session = 'gw-1' WHERE id <= 25; COMMIT")
            .unwrap();
        insert(&conn, &format!("round {round}")).unwrap();
    }
    let status = conn.guard_status().unwrap();
    assert!(!status.retired);
    assert_eq!(status.refusals, 0);
    assert_eq!(count_like(&conn, "round %"), 3);
}

#[test]
fn a_retired_rollback_mode_reader_leaves_the_newer_generations_journal_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let old = open_raw_guarded(&path);
    old.execute_batch("PRAGMA journal_mode=DELETE; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    let _: i64 = old
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    replace_main_file(&path);

    // The newer generation's writer is mid-transaction: its journal is live, not hot.
    let newer = Connection::open(&path).unwrap();
    newer
        .execute_batch("PRAGMA synchronous=OFF; BEGIN IMMEDIATE; INSERT INTO t VALUES (2);")
        .unwrap();
    let journal = sidecar(&path, "-journal");
    assert!(journal.exists());

    // The retired reader sees no lock on its own (old) inode, takes the journal for hot and
    // would play it back into its inode and delete it by pathname.
    let read = old.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0));
    assert!(
        read.is_err_and(|e| is_refusal(&e)),
        "the retired reader rolled the journal back"
    );
    assert!(
        journal.exists(),
        "the newer generation's live journal was deleted"
    );
    newer.execute_batch("COMMIT").unwrap();
    let rows: i64 = newer
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2);
}
