//! Issue 34: a restore by copy in place (`cp backup.db state.db`: the same inode) under a
//! running guarded application is found before a checkpoint writes into the restored file: the
//! checkpoint is refused, the generation captured (reason `main-overwritten`), the live file
//! keeps `integrity_check` ok, and after recovery every acknowledged row is live exactly once.

use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use crate::restore_once::{assert_exactly_once, listed};
use common::*;
use rusqlite::Connection;

/// The application writes; a backup is taken; it writes more (only in its WAL); the backup is
/// copied over the database in place; the application checkpoints. Returns what it
/// acknowledged and the checkpoint's answer.
fn copy_restore_under_a_running_app(db: &Path) -> (Vec<String>, serde_json::Value) {
    let (mut gw, _) = Gateway::start(db, "guard");
    let mut acknowledged: Vec<String> = (0..20)
        .map(|i| format!("history {i}"))
        .chain((0..4).map(|i| format!("uncheckpointed {i}")))
        .collect();
    let ack = |gw: &mut Gateway, k: usize, acknowledged: &mut Vec<String>| {
        gw.send(&format!("ack {k}"));
        let e = gw.next_event("ack");
        if e["refused"] == false {
            acknowledged.push(format!("ack {k}"));
        }
        e
    };
    for k in 0..8 {
        ack(&mut gw, k, &mut acknowledged);
    }
    let backup = db.with_file_name("backup.db");
    {
        let src = open_guarded(db);
        let mut dst = Connection::open(&backup).unwrap();
        rusqlite::backup::Backup::new(&src, &mut dst)
            .unwrap()
            .run_to_completion(1000, std::time::Duration::ZERO, None)
            .unwrap();
    }
    for k in 8..16 {
        ack(&mut gw, k, &mut acknowledged);
    }
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

#[test]
fn an_in_place_copy_over_the_database_is_refused_captured_and_recovered_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
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
