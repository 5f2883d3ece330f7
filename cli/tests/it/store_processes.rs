//! The store across processes: writers in two processes, and a gateway process whose sidecars
//! are taken away — its retired rows must be recoverable from the capture after it has exited,
//! and its close must not clobber the newer generation written meanwhile.
//!
//! The second process is this test binary itself, re-executed to run only the `#[ignore]`d
//! `child` test with `HERMES_STORE_CHILD` saying what to do (a common Rust idiom for a helper
//! process that shares the test's code). Run normally, `child` is ignored; run by hand
//! without the variable it does nothing.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::*;
use hermes_guard_store::{NewMessage, SessionDb, StoreError};
use serde_json::{json, Value};

const ROLE: &str = "HERMES_STORE_CHILD";
const DB: &str = "HERMES_STORE_CHILD_DB";
const ROWS: &str = "HERMES_STORE_CHILD_ROWS";
/// Marks the child's own lines among the test harness's output.
const TAG: &str = "CHILD ";

// ── the child ───────────────────────────────────────────────────────────────────────────────

#[test]
#[ignore = "helper process for the other tests in this file; does nothing on its own"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var(DB).expect("HERMES_STORE_CHILD_DB"));
    let rows: usize = std::env::var(ROWS).map_or(0, |n| n.parse().unwrap());
    match role.as_str() {
        "writer" => child_writer(&path, rows),
        "gateway" => child_gateway(&path, rows),
        other => panic!("unknown child role {other:?}"),
    }
}

fn emit(value: Value) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG}{value}").unwrap();
    out.flush().unwrap();
}

fn child_writer(path: &Path, rows: usize) {
    let db = SessionDb::open(path).unwrap();
    db.ensure_session("shared", "two-processes").unwrap();
    for i in 0..rows {
        db.append_message("shared", &NewMessage::new("user", format!("child row {i}")))
            .unwrap();
    }
    db.close().unwrap();
}

/// Seeds and checkpoints history, commits `rows` messages that live only in its WAL, then
/// serves `write`, `close` and `quit` on stdin.
fn child_gateway(path: &Path, rows: usize) {
    let mut db = Some(store_with_checkpointed_history(path));
    for i in 0..rows {
        db.as_ref()
            .unwrap()
            .append_message(
                "gw-0",
                &NewMessage::new("assistant", format!("uncheckpointed {i}")),
            )
            .unwrap();
    }
    emit(json!({"event": "ready", "pid": std::process::id()}));
    for line in std::io::stdin().lines() {
        match line.unwrap().trim() {
            "write" => {
                let open = db.as_ref().expect("a write after close");
                let result =
                    open.append_message("gw-0", &NewMessage::new("user", "after the loss"));
                emit(json!({
                    "event": "write",
                    "refused": matches!(result, Err(StoreError::WalLost { .. })),
                    "artifact": result.as_ref().err().and_then(StoreError::capture),
                    "error": result.err().map(|e| e.to_string()),
                }));
            }
            "close" => {
                // A close that cannot capture hands the handle back, still open.
                let error = match db.take().map(SessionDb::close) {
                    Some(Err((open, e))) => {
                        db = Some(open);
                        Some(e.to_string())
                    }
                    _ => None,
                };
                emit(json!({"event": "closed", "error": error}));
            }
            "quit" => break,
            other => panic!("unknown command {other:?}"),
        }
    }
}

// ── the parent's side ───────────────────────────────────────────────────────────────────────

struct ChildProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl ChildProcess {
    fn spawn(role: &str, path: &Path, rows: usize) -> ChildProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "store_processes::child",
                "--ignored",
                "--nocapture",
            ])
            .env(ROLE, role)
            .env(DB, path)
            .env(ROWS, rows.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        ChildProcess {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
    }

    fn next_event(&mut self, event: &str) -> Value {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "child exited before {event:?}");
            if let Some(json) = line.trim_end().strip_prefix(TAG) {
                let value: Value = serde_json::from_str(json).unwrap();
                assert_eq!(value["event"], event, "{value}");
                return value;
            }
        }
    }

    /// Closes stdin and waits; true when the child test passed.
    fn wait_success(mut self) -> bool {
        drop(self.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        self.child.wait().unwrap().success()
    }
}

#[test]
fn writers_in_two_processes_all_land_with_consistent_counters() {
    const ROWS_EACH: usize = 150;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let db = SessionDb::open(&path).unwrap();
    db.ensure_session("shared", "two-processes").unwrap();

    let child = ChildProcess::spawn("writer", &path, ROWS_EACH);
    for i in 0..ROWS_EACH {
        db.append_message(
            "shared",
            &NewMessage::new("user", format!("parent row {i}")),
        )
        .unwrap();
    }
    assert!(child.wait_success(), "the child writer failed");

    let session = db.get_session("shared").unwrap().unwrap();
    assert_eq!(session.message_count, 2 * ROWS_EACH as i64);
    let messages = db.get_messages("shared").unwrap();
    assert_eq!(messages.len(), 2 * ROWS_EACH);
    for who in ["parent", "child"] {
        let n = messages
            .iter()
            .filter(|m| m.content.as_deref().unwrap_or("").starts_with(who))
            .count();
        assert_eq!(n, ROWS_EACH, "{who}");
    }
    assert_eq!(
        db.search_messages("child", 1000).unwrap().len(),
        ROWS_EACH,
        "the FTS index kept in step across processes"
    );
}

#[test]
fn retired_rows_are_recoverable_after_the_gateway_exits_and_the_newer_generation_survives() {
    const WAL_ROWS: usize = 4;
    const NEWER_ROWS: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");

    let mut gateway = ChildProcess::spawn("gateway", &path, WAL_ROWS);
    gateway.next_event("ready");
    lose_sidecars(&path, false);

    gateway.send("write");
    let refused = gateway.next_event("write");
    assert_eq!(refused["refused"], true, "{refused}");
    let artifact = PathBuf::from(refused["artifact"].as_str().expect("captured at the halt"));
    assert!(artifact.is_dir());
    assert_eq!(manifest(&artifact)["trigger"], "halt");

    // A newer generation at the path, written and checkpointed from this process.
    let expected = {
        // Not self-healing: this test is about the retired handle's close leaving it alone.
        let newer = SessionDb::open_with(&path, no_self_heal()).unwrap();
        newer.ensure_session("second", "cli").unwrap();
        for i in 0..NEWER_ROWS {
            newer
                .append_message(
                    "second",
                    &NewMessage::new("user", format!("second generation {i}")),
                )
                .unwrap();
        }
        newer.try_wal_checkpoint().unwrap();
        let n =
            newer.get_messages("second").unwrap().len() + newer.get_messages("gw-0").unwrap().len();
        newer.close().unwrap();
        n
    };

    gateway.send("close");
    assert_eq!(gateway.next_event("closed")["error"], Value::Null);
    gateway.send("quit");
    assert!(gateway.wait_success(), "the gateway failed");

    // The writer and its unlinked WAL inode are gone: recovery comes from the capture alone.
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(
        count_like(&recovered, "uncheckpointed %"),
        WAL_ROWS as i64,
        "retired WAL-only rows lost across process exit"
    );
    assert!(integrity_ok(&recovered));

    // The newer generation at the path is untouched by the retired handle's close.
    let live = SessionDb::open_with(&path, no_self_heal()).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    assert!(integrity_ok(&raw));
    let total: i64 = raw
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(total as usize, expected);
    assert_eq!(count_like(&raw, "uncheckpointed %"), 0);
    assert_eq!(
        live.get_messages("second").unwrap().len(),
        NEWER_ROWS,
        "the newer generation was clobbered"
    );
}

fn no_self_heal() -> hermes_guard_store::StoreOptions {
    hermes_guard_store::StoreOptions {
        self_heal: false,
        ..hermes_guard_store::StoreOptions::default()
    }
}
