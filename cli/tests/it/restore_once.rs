//! A restore by rename under a running application leaves two captures of one WAL generation
//! (`main-replaced` at the refusal, `stale-wal` when the application reconnects). Recovered as
//! `hermes-guard captures` says, in either order and twice over, every row the application
//! acknowledged is in the live database exactly once.

use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use rusqlite::Connection;

/// Rows the gateway commits before it takes commands: 20 of history, 4 only in its WAL.
const GATEWAY_ROWS: usize = 24;

/// The application (a real second process) writes; a backup is taken with SQLite's backup API;
/// it writes more, checkpoints (its WAL starts over) and writes more; the backup is renamed over
/// the database; its next write is refused; it reconnects and goes on. Returns the contents it
/// acknowledged, and what it logged (stderr, `RUST_LOG=hermes_guard=error`).
fn rename_restore_under_a_running_app(db: &Path) -> (Vec<String>, String) {
    use std::process::{Command, Stdio};
    let log = db.with_file_name("app.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hermes-guard"));
    cmd.args(["writer", "--role", "gateway", "--vfs", "guard", "--db"])
        .arg(db)
        .env("RUST_LOG", "hermes_guard=error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(fs::File::create(&log).unwrap());
    let mut gw = Gateway::spawn(cmd);
    gw.next_event("ready");
    let (mut acknowledged, backup) = writes_around_a_backup(&mut gw, db);
    gw.send("checkpoint");
    assert_eq!(
        gw.next_event("checkpoint")["error"],
        serde_json::Value::Null
    );
    for k in 16..24 {
        ack(&mut gw, k, &mut acknowledged);
    }
    fs::rename(&backup, db).unwrap();
    let refused = ack(&mut gw, 24, &mut acknowledged);
    assert_eq!(refused["refused"], true, "the write onto the old file");
    gw.send("reconnect");
    let back = gw.next_event("reconnected");
    assert!(back["stale_wal_capture"].is_string(), "{back}");
    for k in 25..45 {
        assert_eq!(ack(&mut gw, k, &mut acknowledged)["refused"], false);
    }
    assert!(gw.quit().success());
    (acknowledged, fs::read_to_string(&log).unwrap())
}

/// `ack K` through the gateway: one row, acknowledged (pushed on `acknowledged`) unless refused.
pub fn ack(gw: &mut Gateway, k: usize, acknowledged: &mut Vec<String>) -> serde_json::Value {
    gw.send(&format!("ack {k}"));
    let e = gw.next_event("ack");
    if e["refused"] == false {
        acknowledged.push(format!("ack {k}"));
    }
    e
}

/// A ready gateway on `db` writes `ack 0..8`, a backup of `db` is taken with SQLite's backup
/// API (`backup.db` beside it), and it writes `ack 8..16`. Returns every row it acknowledged
/// (its own 24 first) and the backup.
pub fn writes_around_a_backup(gw: &mut Gateway, db: &Path) -> (Vec<String>, PathBuf) {
    let mut acknowledged: Vec<String> = (0..20)
        .map(|i| format!("history {i}"))
        .chain((0..4).map(|i| format!("uncheckpointed {i}")))
        .collect();
    assert_eq!(acknowledged.len(), GATEWAY_ROWS);
    for k in 0..8 {
        ack(gw, k, &mut acknowledged);
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
        ack(gw, k, &mut acknowledged);
    }
    (acknowledged, backup)
}

/// `captures --json`: each capture and the command it names to bring its rows back.
pub fn listed(db: &Path) -> Vec<(PathBuf, String, Vec<String>)> {
    let (code, out, err) =
        hermes_guard_cli(&[OsStr::new("captures"), db.as_os_str(), "--json".as_ref()]);
    assert!(code == 0 || code == 3, "{code}: {out}{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    rows.iter()
        .map(|r| {
            let command = r["recover"]
                .as_array()
                .unwrap_or_else(|| panic!("no recover command in {r}"))
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect();
            (
                PathBuf::from(r["capture"].as_str().unwrap()),
                r["reason"].as_str().unwrap().to_owned(),
                command,
            )
        })
        .collect()
}

/// Every acknowledged row is live exactly once, and nothing else is: rows = distinct =
/// acknowledged.
#[track_caller]
pub fn assert_exactly_once(db: &Path, acknowledged: &[String]) {
    let live = Connection::open(db).unwrap();
    assert!(integrity_ok(&live));
    let mut rows: Vec<String> = live
        .prepare("SELECT content FROM messages ORDER BY content")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let total = rows.len();
    rows.dedup();
    let mut want = acknowledged.to_vec();
    want.sort();
    assert_eq!(
        (total, rows.len()),
        (want.len(), want.len()),
        "rows, distinct rows = acknowledged"
    );
    assert_eq!(rows, want);
}

fn recover_in_order(reasons: [&str; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let (acknowledged, log) = rename_restore_under_a_running_app(&db);
    let captures = listed(&db);
    let mut got: Vec<&str> = captures.iter().map(|c| c.1.as_str()).collect();
    got.sort();
    assert_eq!(
        got,
        ["main-replaced", "stale-wal"],
        "two captures of one generation"
    );
    // The stale-WAL line names the capture that holds the generation with its main file.
    let replaced = &captures.iter().find(|c| c.1 == "main-replaced").unwrap().0;
    let once = format!(
        "`hermes-guard recover {} --into {}`",
        replaced.display(),
        db.display()
    );
    assert!(log.contains(&once), "{once} in {log}");
    // The generation's missing rows are counted once, with the capture holding its image.
    let (_, out, _) =
        hermes_guard_cli(&[OsStr::new("captures"), db.as_os_str(), "--json".as_ref()]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let of = |reason: &str| rows.iter().find(|r| r["reason"] == reason).unwrap();
    let missing = of("main-replaced")["missing"].as_u64().unwrap();
    assert!(missing > 0);
    assert_eq!(
        of("stale-wal")["missing_counted_in"].as_str(),
        Some(replaced.to_str().unwrap())
    );
    let (_, text, _) = hermes_guard_cli(&[OsStr::new("captures"), db.as_os_str()]);
    assert!(
        text.contains(&format!("{missing} row(s) are still missing")),
        "{text}"
    );
    // Each as listed, in the order given, then all again: nothing more.
    for round in 0..2 {
        for reason in reasons {
            let (capture, _, command) = captures.iter().find(|c| c.1 == reason).unwrap();
            let mut args: Vec<&OsStr> = command.iter().map(OsStr::new).collect();
            args.push(OsStr::new("--apply"));
            let (code, out, err) = hermes_guard_cli(&args);
            assert_eq!(code, 0, "{}: {out}{err}", capture.display());
            if round == 1 {
                assert!(
                    out.contains("generation was already merged into this database on"),
                    "{out}"
                );
            }
        }
    }
    assert_exactly_once(&db, &acknowledged);
    for (_, _, command) in listed(&db) {
        assert!(!command.is_empty());
    }
    let (code, out, err) = hermes_guard_cli(&[OsStr::new("captures"), db.as_os_str()]);
    assert_eq!(code, 0, "nothing is missing any more: {out}{err}");
}

#[test]
fn a_rename_restore_recovered_main_replaced_first_gives_every_acknowledged_row_once() {
    recover_in_order(["main-replaced", "stale-wal"]);
}

#[test]
fn a_rename_restore_recovered_stale_wal_first_gives_every_acknowledged_row_once() {
    recover_in_order(["stale-wal", "main-replaced"]);
}
