//! A newer generation checkpointed into the main file before the retired writer
//! notices its loss. A guarded writer holds `state.db` — 20 rows of history checkpointed into
//! the main file, 4 rows only in its WAL (automatic checkpoints off) — when its `-wal` and
//! `-shm` are unlinked. Another process (guarded or stock) then commits 50 rows of its own and
//! checkpoints them into the main file (PASSIVE or TRUNCATE), and only then does the writer try
//! to write: refused (1032, `SQLITE_READONLY_DBMOVED`), its generation captured. The operator
//! runs `hermes-guard captures <db>` and every `recover` command it lists, with `--apply`.
//!
//! Every row must end live exactly once: the 50 newer rows untouched (same rowid, same
//! content), the 4 retired rows, the 20 of history; `integrity_check` ok. The control order
//! (the writer's refusal before the newer commits) and the delayed capture (the capture fails
//! at the refusal, like a full disk, and is retried at the close, after the newer checkpoint)
//! must end the same.
//!
//! Both the writer and the peer are this test binary re-executed to run the `#[ignore]`d
//! `child` test (as in `store_processes.rs`): the writer is driven over its stdin and answers
//! with tagged JSON lines, and the capture fault (`test_hooks::inject_capture_fault`, which is
//! process-local) is injected inside it.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::*;
use rusqlite::Connection;
use serde_json::{json, Value};

const ROLE: &str = "HERMES_NEWER_GEN_CHILD";
const DB: &str = "HERMES_NEWER_GEN_DB";
const VFS: &str = "HERMES_NEWER_GEN_VFS";
const CHECKPOINT: &str = "HERMES_NEWER_GEN_CHECKPOINT";
/// Marks the child's own lines among the test harness's output.
const TAG: &str = "NEWER-GEN ";

const HISTORY: i64 = 20;
const RETIRED: i64 = 4;
const NEWER: i64 = 50;
/// Enough newer rows to split the table's one leaf into a tree (the retired WAL still holds
/// that page as a leaf, so the capture's image and WAL disagree on the table's shape).
const SPLITTING: i64 = 400;
const ROWS: &str = "HERMES_NEWER_GEN_ROWS";
const FAULT: &str = "No space left on device (os error 28)";

// ── the children ────────────────────────────────────────────────────────────────────────────

#[test]
#[ignore = "helper process for the other tests in this file; does nothing on its own"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var_os(DB).expect("HERMES_NEWER_GEN_DB"));
    match role.as_str() {
        "writer" => child_writer(&path),
        "peer" => child_peer(
            &path,
            &std::env::var(VFS).unwrap(),
            &std::env::var(CHECKPOINT).unwrap(),
            std::env::var(ROWS).unwrap().parse().unwrap(),
        ),
        other => panic!("unknown child role {other:?}"),
    }
}

fn emit(value: Value) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG}{value}").unwrap();
    out.flush().unwrap();
}

/// The guarded writer: history checkpointed, `retired 0..4` only in its WAL, then `fault`,
/// `clear`, `write`, `close` and `quit` on stdin.
fn child_writer(path: &Path) {
    let dir = path.parent().unwrap().to_path_buf();
    let mut conn = Some(open_guarded(path));
    let c = conn.as_ref().unwrap();
    checkpointed_history(c);
    for i in 0..RETIRED {
        insert(c, &format!("retired-{i}")).unwrap();
    }
    emit(json!({"event": "ready", "pid": std::process::id()}));
    for line in std::io::stdin().lines() {
        match line.unwrap().trim() {
            "fault" => {
                hermes_guard::test_hooks::inject_capture_fault(&dir, FAULT);
                emit(json!({"event": "fault"}));
            }
            "clear" => {
                hermes_guard::test_hooks::clear_capture_fault(&dir);
                emit(json!({"event": "clear"}));
            }
            "write" => {
                let c = conn.as_ref().expect("a write after close");
                let result = insert(c, "after the loss");
                let status = c.guard_status().unwrap();
                emit(json!({
                    "event": "write",
                    "refused": result.is_err(),
                    "extended_code": result.as_ref().err()
                        .and_then(|e| e.sqlite_error()).map(|e| e.extended_code),
                    "error": result.err().map(|e| e.to_string()),
                    "capture": status.capture,
                    "capture_error": status.capture_error,
                }));
            }
            "close" => {
                let c = conn.take().expect("a close after close");
                let error = hermes_guard::close(c).err().map(|(_, e)| e.to_string());
                emit(json!({"event": "closed", "error": error}));
            }
            "quit" => break,
            other => panic!("unknown command {other:?}"),
        }
    }
}

/// The newer generation: opens `path` through `vfs` (`guard` or `stock`), commits `newer-0..50`
/// in one transaction, checkpoints (`mode`), closes and reports.
fn child_peer(path: &Path, vfs: &str, mode: &str, newer: i64) {
    let conn = match vfs {
        "guard" => open_guarded(path),
        "stock" => open_stock(path),
        other => panic!("unknown vfs {other:?}"),
    };
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    for i in 0..newer {
        insert(&tx, &format!("newer-{i}")).unwrap();
    }
    tx.commit().unwrap();
    let (busy, log, checkpointed): (i64, i64, i64) = conn
        .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    conn.close().map_err(|(_, e)| e).unwrap();
    emit(json!({"event": "done", "busy": busy, "log": log,
        "checkpointed": checkpointed, "rows": rows}));
}

// ── the parent's side ───────────────────────────────────────────────────────────────────────

fn spawn_child(role: &str, path: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "recover_newer_generation::child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role)
    .env(DB, path)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The tagged JSON lines of a child's stdout, from `out`.
fn next_tagged(out: &mut impl BufRead, event: &str) -> Value {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child exited before {event:?}");
        // With one test thread the harness prints `test <name> ... ` before the body's output.
        if let Some((_, json)) = line.trim_end().split_once(TAG) {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(value["event"], event, "{value}");
            return value;
        }
    }
}

struct Writer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Writer {
    fn start(path: &Path) -> Writer {
        let mut child = spawn_child("writer", path, &[]).spawn().unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut writer = Writer {
            child,
            stdin,
            stdout,
        };
        writer.ask("", "ready");
        writer
    }

    /// Sends `command` (none when empty) and returns the answer, which must be `event`.
    fn ask(&mut self, command: &str, event: &str) -> Value {
        if !command.is_empty() {
            let stdin = self.stdin.as_mut().unwrap();
            writeln!(stdin, "{command}").unwrap();
            stdin.flush().unwrap();
        }
        next_tagged(&mut self.stdout, event)
    }

    /// The write after the loss: refused with `SQLITE_READONLY_DBMOVED`.
    fn write_refused(&mut self) -> Value {
        let answer = self.ask("write", "write");
        assert_eq!(answer["refused"], true, "{answer}");
        assert_eq!(
            answer["extended_code"],
            rusqlite::ffi::SQLITE_READONLY_DBMOVED,
            "{answer}"
        );
        answer
    }

    /// `close`, then `quit`: the close must succeed and the child exit cleanly.
    fn close_and_exit(mut self) {
        let closed = self.ask("close", "closed");
        assert_eq!(closed["error"], Value::Null, "{closed}");
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "quit").unwrap();
        drop(self.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the writer failed ({status}):\n{rest}");
    }
}

/// Another process commits the 50 newer rows at `path` through `vfs` and checkpoints them all
/// into the main file with `mode`.
fn newer_generation_checkpointed(path: &Path, vfs: &str, mode: &str, newer: i64) {
    let rows = newer.to_string();
    let out = spawn_child(
        "peer",
        path,
        &[(VFS, vfs), (CHECKPOINT, mode), (ROWS, &rows)],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "the peer failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = next_tagged(&mut &out.stdout[..], "done");
    assert_eq!(
        done["rows"],
        HISTORY + newer,
        "the peer sees history + its rows: {done}"
    );
    assert_eq!(done["busy"], 0, "{done}");
    assert_eq!(
        done["log"], done["checkpointed"],
        "fully checkpointed: {done}"
    );
}

/// Every `(rowid, content)` of the live `messages`.
fn live_rows(path: &Path) -> Vec<(i64, String)> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT id, content FROM messages ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    rows
}

/// The operator's step: `hermes-guard captures <db> --json`, then every `recover` command it
/// lists, with `--apply`. Returns the listing and each command's exit code and output.
fn recover_every_listed_capture(path: &Path) -> (Value, Vec<(i32, String)>) {
    let (code, out, err) =
        hermes_guard_cli(&["captures".as_ref(), path.as_ref(), "--json".as_ref()]);
    assert_eq!(
        code, 3,
        "rows are missing before the recovery:\n{out}\n{err}"
    );
    let listing: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}\n{err}"));
    let mut applied = Vec::new();
    for row in listing.as_array().unwrap() {
        assert_eq!(row["partial"], false, "{row}");
        let mut words: Vec<String> = row["recover"]
            .as_array()
            .unwrap_or_else(|| panic!("no recover command in {row}"))
            .iter()
            .map(|w| w.as_str().unwrap().to_owned())
            .collect();
        words.push("--apply".to_owned());
        let args: Vec<&std::ffi::OsStr> = words.iter().map(|w| w.as_ref()).collect();
        let (code, out, err) = hermes_guard_cli(&args);
        applied.push((
            code,
            format!("$ hermes-guard {}\n{out}{err}", words.join(" ")),
        ));
    }
    (listing, applied)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Order {
    /// The newer generation commits and checkpoints, then the writer's write is refused.
    NewerFirst,
    /// Control: the writer's write is refused (and captured) before the newer commits.
    RefusalFirst,
    /// The capture fails at the refusal; the newer generation commits and checkpoints after
    /// the fault is cleared; the capture is taken at the writer's close.
    CaptureDelayed,
}

fn scenario(order: Order, peer: &str, mode: &str) {
    scenario_with(order, peer, mode, NEWER);
}

fn scenario_with(order: Order, peer: &str, mode: &str, newer: i64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut writer = Writer::start(&path);
    if order == Order::CaptureDelayed {
        writer.ask("fault", "fault");
    }
    lose_sidecars(&path, false);

    let halt = match order {
        Order::NewerFirst => {
            newer_generation_checkpointed(&path, peer, mode, newer);
            Some(writer.write_refused())
        }
        Order::RefusalFirst => {
            let refused = writer.write_refused();
            newer_generation_checkpointed(&path, peer, mode, newer);
            Some(refused)
        }
        Order::CaptureDelayed => {
            let refused = writer.write_refused();
            assert_eq!(refused["capture"], Value::Null, "{refused}");
            let why = refused["capture_error"].as_str().unwrap_or_default();
            assert!(why.contains(FAULT), "the capture failed: {refused}");
            assert!(
                artifacts(dir.path()).is_empty(),
                "no capture while it fails"
            );
            writer.ask("clear", "clear");
            newer_generation_checkpointed(&path, peer, mode, newer);
            None
        }
    };
    writer.close_and_exit();

    // One capture of the retired generation, beside the database.
    let captured = artifacts(dir.path());
    assert_eq!(captured.len(), 1, "{captured:?}");
    let trigger = manifest(&captured[0])["trigger"].clone();
    if let Some(halt) = &halt {
        assert_eq!(halt["capture"], json!(captured[0]), "{halt}");
        assert_eq!(trigger, "halt");
    } else {
        assert_eq!(trigger, "close", "retried at the close");
    }

    // Before the recovery the newer generation is live: 20 of history + 50 newer rows.
    let before = live_rows(&path);
    assert_eq!(before.len() as i64, HISTORY + newer, "{before:?}");
    let newer_before = before.iter().filter(|(_, c)| c.starts_with("newer-"));
    assert_eq!(newer_before.count() as i64, newer, "{before:?}");

    let (listing, applied) = recover_every_listed_capture(&path);
    let log = format!("captures: {listing:#}\n{}", {
        let outs: Vec<&str> = applied.iter().map(|(_, o)| o.as_str()).collect();
        outs.join("\n")
    });

    let after = live_rows(&path);
    let live = Connection::open(&path).unwrap();
    let kept_newer = count_like(&live, "newer-%");
    assert_eq!(
        kept_newer, newer,
        "{order:?}, {peer} peer, {mode}: {kept_newer} of {newer} newer rows kept after \
         `recover --apply`\n{log}"
    );
    for i in 0..newer {
        assert_eq!(
            count_like(&live, &format!("newer-{i}")),
            1,
            "newer-{i}\n{log}"
        );
    }
    for i in 0..RETIRED {
        assert_eq!(
            count_like(&live, &format!("retired-{i}")),
            1,
            "retired-{i} live exactly once\n{log}"
        );
    }
    for i in 0..HISTORY {
        assert_eq!(
            count_like(&live, &format!("history {i}")),
            1,
            "history {i}\n{log}"
        );
    }
    let lost: Vec<&(i64, String)> = before.iter().filter(|r| !after.contains(r)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} live rows deleted or overwritten by the recovery: {lost:?}\n{log}",
        lost.len(),
        before.len()
    );
    assert_eq!(count_like(&live, "after the loss"), 0, "the refused write");
    assert_eq!(
        after.len() as i64,
        HISTORY + RETIRED + newer,
        "{after:?}\n{log}"
    );
    assert!(integrity_ok(&live), "{log}");
    drop(live);
    for (code, out) in &applied {
        assert_eq!(*code, 0, "{out}");
    }
    let (code, out, _) = hermes_guard_cli(&["captures".as_ref(), path.as_ref()]);
    assert_eq!(code, 0, "nothing left to recover:\n{out}");
}

// ── the newer generation checkpointed before the refusal ────────────────────────────────────

#[test]
fn newer_generation_checkpointed_passive_before_the_refusal_keeps_its_rows_guarded_peer() {
    scenario(Order::NewerFirst, "guard", "PASSIVE");
}

#[test]
fn newer_generation_checkpointed_passive_before_the_refusal_keeps_its_rows_stock_peer() {
    scenario(Order::NewerFirst, "stock", "PASSIVE");
}

#[test]
fn newer_generation_checkpointed_truncate_before_the_refusal_keeps_its_rows_guarded_peer() {
    scenario(Order::NewerFirst, "guard", "TRUNCATE");
}

#[test]
fn newer_generation_checkpointed_truncate_before_the_refusal_keeps_its_rows_stock_peer() {
    scenario(Order::NewerFirst, "stock", "TRUNCATE");
}

#[test]
fn newer_generation_that_split_the_table_before_the_refusal_keeps_its_rows_and_the_retired_ones() {
    // The capture's image has the newer tree, its WAL the retired leaf: SQLite calls the pair
    // corrupt (page 1 counts pages the WAL's commit does not); recovery still reads the
    // retired rows.
    scenario_with(Order::NewerFirst, "stock", "TRUNCATE", SPLITTING);
}

// ── control: the refusal before the newer generation commits ───────────────────────────────

#[test]
fn newer_generation_checkpointed_after_the_refusal_keeps_its_rows_guarded_peer() {
    scenario(Order::RefusalFirst, "guard", "PASSIVE");
}

#[test]
fn newer_generation_checkpointed_after_the_refusal_keeps_its_rows_stock_peer() {
    scenario(Order::RefusalFirst, "stock", "PASSIVE");
}

// ── the capture fails at the refusal and is taken at the close ─────────────────────────────

#[test]
fn newer_generation_checkpointed_while_the_capture_failed_keeps_its_rows_guarded_peer() {
    scenario(Order::CaptureDelayed, "guard", "PASSIVE");
}

#[test]
fn newer_generation_checkpointed_while_the_capture_failed_keeps_its_rows_stock_peer() {
    scenario(Order::CaptureDelayed, "stock", "PASSIVE");
}
