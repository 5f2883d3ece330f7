//! `walfile` against WAL and database files written by the real (bundled)
//! SQLite, read while the writing connection is still open.

use std::path::{Path, PathBuf};

use hermes_guard::test_hooks::{parse_main_header, summarize_wal, WalScanner, WalSummary};
use rusqlite::Connection;

/// Opens `dir/name.db` in WAL mode with automatic checkpoints disabled.
fn open_wal_db(dir: &Path, name: &str) -> (Connection, PathBuf, PathBuf) {
    let db = dir.join(format!("{name}.db"));
    let wal = dir.join(format!("{name}.db-wal"));
    let conn = Connection::open(&db).expect("open");
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode, "wal");
    conn.execute_batch("PRAGMA wal_autocheckpoint=0;")
        .expect("wal_autocheckpoint");
    (conn, db, wal)
}

fn page_size(conn: &Connection) -> u32 {
    conn.query_row("PRAGMA page_size", [], |r| r.get(0))
        .expect("page_size")
}

/// Runs `n` single-statement (autocommit) inserts: `n` commits.
fn insert_rows(conn: &Connection, n: usize, tag: &str) {
    for i in 0..n {
        conn.execute(
            "INSERT INTO t(v) VALUES (?1)",
            [format!("{tag}-{i}-{}", "x".repeat(200))],
        )
        .expect("insert");
    }
}

fn assert_fully_committed(s: &WalSummary, page_size: u32, commits: u64) {
    assert!(s.header.valid, "{s:?}");
    assert_eq!(s.header.page_size, page_size, "{s:?}");
    assert_eq!(s.commits, commits, "{s:?}");
    assert!(s.frames >= commits, "{s:?}");
    assert_eq!(s.last_commit_frame, Some(s.frames), "{s:?}");
    assert_eq!(s.committed_frames, s.frames, "{s:?}");
    assert_eq!(s.torn_tail_bytes, 0, "{s:?}");
    let frame = 24 + u64::from(page_size);
    assert_eq!(s.bytes, 32 + s.frames * frame, "{s:?}");
}

#[test]
fn real_wal_with_k_autocommit_transactions_is_summarised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (conn, _db, wal) = open_wal_db(dir.path(), "autocommit");
    let ps = page_size(&conn);
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .expect("create"); // commit 1
    insert_rows(&conn, 9, "a"); // commits 2..=10

    let bytes = std::fs::read(&wal).expect("read wal");
    let s = summarize_wal(&bytes);
    assert_fully_committed(&s, ps, 10);
    drop(conn);
}

#[test]
fn real_wal_counts_a_multi_statement_transaction_as_one_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut conn, _db, wal) = open_wal_db(dir.path(), "explicit");
    let ps = page_size(&conn);
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .expect("create"); // commit 1
    for round in 0..3 {
        // commits 2..=4, each with many rows spilling over several pages
        let tx = conn.transaction().expect("begin");
        insert_rows(&tx, 50, &format!("r{round}"));
        tx.commit().expect("commit");
    }
    // A rolled-back transaction writes no commit frame.
    let tx = conn.transaction().expect("begin");
    insert_rows(&tx, 5, "rolled-back");
    tx.rollback().expect("rollback");

    let bytes = std::fs::read(&wal).expect("read wal");
    let s = summarize_wal(&bytes);
    assert_fully_committed(&s, ps, 4);
    assert!(s.frames > 4, "multi-page transactions: {s:?}");
    drop(conn);
}

#[test]
fn real_wal_scanned_in_small_chunks_matches_one_shot_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (conn, _db, wal) = open_wal_db(dir.path(), "chunks");
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .expect("create");
    insert_rows(&conn, 20, "c");

    let bytes = std::fs::read(&wal).expect("read wal");
    let whole = summarize_wal(&bytes);
    let mut scanner = WalScanner::new();
    for chunk in bytes.chunks(1000) {
        scanner.feed(chunk);
    }
    assert_eq!(scanner.finish(), whole);
    assert_eq!(whole.commits, 21);
    drop(conn);
}

#[test]
fn real_wal_truncated_mid_frame_keeps_only_the_intact_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (conn, _db, wal) = open_wal_db(dir.path(), "torn");
    let ps = page_size(&conn);
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .expect("create");
    insert_rows(&conn, 5, "t");
    let prev = summarize_wal(&std::fs::read(&wal).expect("read wal"));
    insert_rows(&conn, 1, "last"); // commit 7

    let bytes = std::fs::read(&wal).expect("read wal");
    let full = summarize_wal(&bytes);
    assert_fully_committed(&full, ps, 7);
    let frame = 24 + ps as usize;
    let cut = bytes.len() - frame / 2; // tear the last (commit) frame
    let s = summarize_wal(&bytes[..cut]);
    assert_eq!(s.frames, full.frames - 1);
    assert_eq!(s.commits, 6);
    assert_eq!(s.committed_frames, prev.frames);
    assert_eq!(s.last_commit_frame, Some(prev.frames));
    assert_eq!(s.torn_tail_bytes, (frame - frame / 2) as u64);
    drop(conn);
}

#[test]
fn real_wal_reset_after_checkpoint_ignores_stale_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (conn, _db, wal) = open_wal_db(dir.path(), "reset");
    let ps = page_size(&conn);
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .expect("create");
    insert_rows(&conn, 30, "old");
    let before = summarize_wal(&std::fs::read(&wal).expect("read wal"));
    assert_fully_committed(&before, ps, 31);

    // Full checkpoint (no readers), then the next writer restarts the WAL
    // from the beginning with new salts, leaving the old frames beyond.
    let (busy, _log, _ckpt): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .expect("checkpoint");
    assert_eq!(busy, 0);
    insert_rows(&conn, 2, "new");

    let bytes = std::fs::read(&wal).expect("read wal");
    assert_eq!(
        bytes.len() as u64,
        before.bytes,
        "WAL file is reused, not truncated"
    );
    let s = summarize_wal(&bytes);
    assert!(s.header.valid);
    assert_ne!(s.header.salts, before.header.salts);
    assert_eq!(s.header.checkpoint_seq, before.header.checkpoint_seq + 1);
    assert_eq!(s.commits, 2);
    assert_eq!(s.last_commit_frame, Some(s.frames));
    assert!(s.frames < before.frames);
    assert_eq!(
        s.torn_tail_bytes,
        s.bytes - 32 - s.frames * (24 + u64::from(ps))
    );
    assert!(s.torn_tail_bytes > 0);
    drop(conn);
}

#[test]
fn real_main_header_parses_valid_in_wal_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (conn, db, _wal) = open_wal_db(dir.path(), "main");
    let ps = page_size(&conn);
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .expect("create");
    insert_rows(&conn, 3, "m");

    let bytes = std::fs::read(&db).expect("read db");
    let h = parse_main_header(&bytes);
    assert!(h.valid, "{h:?}");
    assert_eq!(h.page_size, ps);
    assert!(h.wal_mode, "{h:?}");
    assert_eq!((h.write_version, h.read_version), (2, 2));
    assert!(h.page_count >= 1, "{h:?}");
    drop(conn);
}
