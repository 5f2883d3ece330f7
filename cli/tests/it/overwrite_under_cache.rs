//! The last window of an in-place restore that tests/explore found, with real processes: a backup
//! copied over the database in place while its WAL holds no frame, under an application whose page
//! cache was read from the old file. SQLite keeps that cache (the wal-index says nothing changed),
//! so the application's next transaction would begin a WAL generation on the copy from pages of the
//! old file, and its checkpoint would put back rows the restore removed. The guard refuses that
//! transaction before its first frame (`main-overwritten`), and the restore stands.

use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use crate::restore_once::{ack, listed, writes_around_a_backup};
use common::*;
use rusqlite::Connection;

/// The rows of the live database with `content` = `ack K`, for each K in `ks`, counted.
fn acks_live(db: &Path, ks: std::ops::Range<usize>) -> usize {
    let live = Connection::open(db).unwrap();
    ks.map(|k| count_like(&live, &format!("ack {k}")))
        .sum::<i64>() as usize
}

/// The backup is copied over the database in place (the same inode), and the application
/// writes `ack 16`, which is refused; it reconnects, as the refusal tells it to, and writes
/// `ack 17..20` on the restored file, then quits. Returns the refused write's event.
fn copy_in_place_then_write(
    gw: &mut Gateway,
    db: &Path,
    backup: &Path,
    acknowledged: &mut Vec<String>,
) -> serde_json::Value {
    let before = identity(db);
    fs::copy(backup, db).unwrap();
    assert_eq!(identity(db), before, "copied in place: the same inode");
    let refused = ack(gw, 16, acknowledged);
    assert_eq!(
        refused["refused"], true,
        "a write from the old file's cache: {refused}"
    );
    gw.send("reconnect");
    gw.next_event("reconnected");
    for k in 17..20 {
        assert_eq!(ack(gw, k, acknowledged)["refused"], false);
    }
    refused
}

/// At every page size of `PAGE_SIZES` (at 64 KiB pages, whose header field reads `00 01`, a second
/// decoder took it for no page size, kept no page, and let the copy be written over).
#[test]
fn a_copy_in_place_under_a_cache_read_while_the_wal_was_empty_is_refused_before_a_frame() {
    for page_size in PAGE_SIZES {
        eprintln!("page size {page_size}");
        copy_in_place_under_a_cache_is_refused(page_size);
    }
}

/// The database is made with `page_size` before the application opens it.
fn copy_in_place_under_a_cache_is_refused(page_size: u32) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    made_with_page_size(&db, page_size);
    let (mut gw, _) = Gateway::start(&db, "guard");
    // `ack 0..8`, the backup, `ack 8..16`.
    let (mut acknowledged, backup) = writes_around_a_backup(&mut gw, &db);
    // The application's last connection closes (everything checkpointed, the WAL deleted) and
    // it opens again; its first read fills the page cache from the main file.
    gw.send("reconnect");
    gw.next_event("reconnected");
    gw.send("status");
    assert_eq!(gw.next_event("status")["rows"], acknowledged.len());
    let wal = fs::metadata(db.with_file_name("state.db-wal")).map_or(0, |m| m.len());
    assert_eq!(wal, 0, "the WAL holds no frame");
    let refused = copy_in_place_then_write(&mut gw, &db, &backup, &mut acknowledged);
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("readonly")),
        "{refused}"
    );
    assert!(gw.quit().success());
    // The restore stands: what the backup did not have is not back, what came after is there.
    assert_eq!(
        acks_live(&db, 8..17),
        0,
        "rows the restore removed came back"
    );
    assert_eq!(acks_live(&db, 0..8), 8);
    assert_eq!(acks_live(&db, 17..20), 3);
    assert!(integrity_ok(&Connection::open(&db).unwrap()));
    // The refused connection's generation is captured (it held no frame); recovering it as
    // `captures` says brings nothing the restore removed back.
    let captures = listed(&db);
    assert_eq!(captures.len(), 1, "{captures:?}");
    assert_eq!(captures[0].1, "main-overwritten");
    let mut args: Vec<&OsStr> = captures[0].2.iter().map(OsStr::new).collect();
    args.push(OsStr::new("--apply"));
    let (code, out, err) = hermes_guard_cli(&args);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        acks_live(&db, 8..17),
        0,
        "recovery undid the restore: {out}"
    );
    assert_eq!(acks_live(&db, 17..20), 3);
}

/// The same window opened by another process: a stock peer commits and empties the WAL
/// (`wal_checkpoint(TRUNCATE)`: a new generation, which no guarded connection recorded), the
/// application's next read refills its cache from the main file, the backup is copied over it in
/// place, and the application writes: refused before its first frame; neither the peer's rows
/// nor the application's since the backup come back.
/// At every page size of `PAGE_SIZES`.
#[test]
fn a_copy_in_place_after_a_stock_peer_emptied_the_wal_is_refused_at_the_next_write() {
    for page_size in PAGE_SIZES {
        eprintln!("page size {page_size}");
        copy_in_place_after_a_stock_peer_is_refused(page_size);
    }
}

fn copy_in_place_after_a_stock_peer_is_refused(page_size: u32) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    made_with_page_size(&db, page_size);
    let (mut gw, _) = Gateway::start(&db, "guard");
    let (mut acknowledged, backup) = writes_around_a_backup(&mut gw, &db);
    let seen = write_second_generation(&db, "stock", 5);
    assert_eq!(seen as usize, acknowledged.len() + 5);
    gw.send("status");
    assert_eq!(gw.next_event("status")["rows"], seen);
    copy_in_place_then_write(&mut gw, &db, &backup, &mut acknowledged);
    assert!(gw.quit().success());
    let live = Connection::open(&db).unwrap();
    assert_eq!(count_like(&live, "second generation %"), 0);
    assert_eq!(
        acks_live(&db, 8..17),
        0,
        "rows the restore removed came back"
    );
    assert_eq!(acks_live(&db, 0..8) + acks_live(&db, 17..20), 11);
    assert!(integrity_ok(&live));
}
