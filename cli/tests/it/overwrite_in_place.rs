//! A restore by copy in place (`cp backup.db state.db`: the same inode) under a running guarded
//! application is found before a checkpoint writes into the restored file: the checkpoint is
//! refused, the generation captured (reason `main-overwritten`), the live file keeps
//! `integrity_check` ok, and after recovery every acknowledged row is live exactly once.

use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use crate::restore_once::{ack, assert_exactly_once, listed, writes_around_a_backup};
use common::*;
use rusqlite::Connection;

/// The application writes; a backup is taken; it writes more (only in its WAL); the backup is
/// copied over the database in place; the application checkpoints. Returns what it
/// acknowledged and the checkpoint's answer.
fn copy_restore_under_a_running_app(db: &Path) -> (Vec<String>, serde_json::Value) {
    let (mut gw, _) = Gateway::start(db, "guard");
    let (mut acknowledged, backup) = writes_around_a_backup(&mut gw, db);
    let before = identity(db);
    fs::copy(&backup, db).unwrap();
    assert_eq!(identity(db), before, "copied in place: the same inode");
    gw.send("checkpoint");
    let checkpoint = gw.next_event("checkpoint");
    assert_eq!(ack(&mut gw, 16, &mut acknowledged)["refused"], true);
    gw.send("reconnect");
    gw.next_event("reconnected");
    for k in 17..30 {
        assert_eq!(ack(&mut gw, k, &mut acknowledged)["refused"], false);
    }
    assert!(gw.quit().success());
    (acknowledged, checkpoint)
}

/// At every page size of `PAGE_SIZES`.
#[test]
fn an_in_place_copy_over_the_database_is_refused_captured_and_recovered_once() {
    for page_size in PAGE_SIZES {
        eprintln!("page size {page_size}");
        in_place_copy_is_refused_captured_and_recovered_once(page_size);
    }
}

fn in_place_copy_is_refused_captured_and_recovered_once(page_size: u32) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    made_with_page_size(&db, page_size);
    let (acknowledged, checkpoint) = copy_restore_under_a_running_app(&db);
    assert!(
        checkpoint["error"]
            .as_str()
            .is_some_and(|e| e.contains("readonly")),
        "the checkpoint onto the restored file is refused: {checkpoint}"
    );
    assert!(integrity_ok(&Connection::open(&db).unwrap()));
    let captures = listed(&db);
    assert_eq!(
        captures
            .iter()
            .filter(|c| c.1 == "main-overwritten")
            .count(),
        1,
        "{captures:?}"
    );
    // Each capture as `captures` says, twice over.
    for _ in 0..2 {
        for (capture, _, command) in &captures {
            let mut args: Vec<&OsStr> = command.iter().map(OsStr::new).collect();
            args.push(OsStr::new("--apply"));
            let (code, out, err) = hermes_guard_cli(&args);
            assert_eq!(code, 0, "{}: {out}{err}", capture.display());
        }
    }
    assert_exactly_once(&db, &acknowledged);
}

/// Checkpoints held back by a reader copy part of the WAL into the main file: the next
/// checkpoint finds pages that are not as the generation began but are frames a checkpoint
/// copied, and goes on (no false alarm); so does the close. At every page size of `PAGE_SIZES`.
#[test]
fn partial_checkpoints_under_a_reader_are_not_taken_for_an_overwrite() {
    for page_size in PAGE_SIZES {
        eprintln!("page size {page_size}");
        partial_checkpoints_are_no_overwrite(page_size);
    }
}

fn partial_checkpoints_are_no_overwrite(page_size: u32) {
    use hermes_guard::GuardExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    made_with_page_size(&db, page_size);
    let writer = open_guarded(&db);
    writer.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    checkpointed_history(&writer);
    let bulk = |n: usize, tag: &str| {
        for i in 0..n {
            insert(&writer, &format!("{tag} {i} {}", "x".repeat(300))).unwrap();
        }
    };
    // A main file of some pages, then a new WAL generation (its record covers them).
    bulk(40, "history");
    writer
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    bulk(45, "before the reader");
    let reader = open_guarded(&db);
    let mut seen = 0i64;
    for round in 0..3 {
        // The reader's snapshot moves on each round; the checkpoint copies up to it only.
        reader.execute_batch("BEGIN").unwrap();
        seen = reader
            .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
            .unwrap();
        bulk(20, &format!("held back {round}"));
        // Page 1 changes too (the schema): the next checkpoint finds it as a frame left it.
        writer
            .execute_batch(&format!("CREATE TABLE extra_{round}(x)"))
            .unwrap();
        let (busy, log, done): (i64, i64, i64) = writer
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(busy, 0, "round {round}");
        assert!(
            done < log,
            "round {round}: held back by the reader ({done} of {log})"
        );
        reader.execute_batch("COMMIT").unwrap();
    }
    assert!(!writer.guard_status().unwrap().retired);
    drop(reader);
    writer
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    bulk(5, "after");
    assert!(!writer.guard_status().unwrap().retired);
    hermes_guard::close(writer).map_err(|(_, e)| e).unwrap();
    assert!(artifacts(dir.path()).is_empty(), "nothing captured");
    let live = Connection::open(&db).unwrap();
    assert!(integrity_ok(&live));
    assert!(count_like(&live, "%") > seen);
}

/// The bench's W1: one-row transactions under the default autocheckpoint, then the close: every
/// checkpoint and the close judge the main file, and none takes it for an overwrite. At every
/// page size of `PAGE_SIZES`.
#[test]
fn autocheckpoints_and_the_close_of_a_busy_writer_are_no_overwrite() {
    for page_size in PAGE_SIZES {
        eprintln!("page size {page_size}");
        autocheckpoints_are_no_overwrite(page_size);
    }
}

fn autocheckpoints_are_no_overwrite(page_size: u32) {
    use hermes_guard::GuardExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    made_with_page_size(&db, page_size);
    let conn = open_guarded(&db);
    conn.execute_batch("PRAGMA synchronous=NORMAL").unwrap();
    for i in 0..3000 {
        insert(&conn, &format!("row {i}")).unwrap();
    }
    assert!(!conn.guard_status().unwrap().retired);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    assert!(artifacts(dir.path()).is_empty(), "nothing captured");
    assert_eq!(count_like(&open_guarded(&db), "row %"), 3000);
}
