//! The processes of recover_changes.rs and the runbook they end in. W, the guarded writer, and
//! N, the newer generation, are this test binary re-executed to run the `#[ignore]`d
//! [`child`] test: W commits a plan's history (checkpointed) and its acknowledged transactions
//! (only in its WAL), says `ready`, and is then driven over stdin (`write`, `close`); N runs the
//! plan's transactions through the stock or the guarded VFS and checkpoints. Both answer with
//! tagged JSON lines.
//!
//! [`run_once`] plays a whole scenario: W, `rm <db>-wal <db>-shm`, N, W's refused write and
//! close, then the operator's runbook (`captures <db> --json` and every `recover … --apply` it
//! lists, twice), and checks the live rows against [`Expected`].

use crate::common;
use crate::recover_changes_model::{content, Content, Expected};
use crate::recover_changes_scenarios::{Link, Op, Plan, Scenario};

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::*;
use rusqlite::types::Value;
use rusqlite::Connection;
use serde_json::{json, Value as Json};

const ROLE: &str = "HERMES_RECOVER_CHANGES_CHILD";
const DB: &str = "HERMES_RECOVER_CHANGES_DB";
const SCENARIO: &str = "HERMES_RECOVER_CHANGES_SCENARIO";
const SEED: &str = "HERMES_RECOVER_CHANGES_SEED";
const VFS: &str = "HERMES_RECOVER_CHANGES_VFS";
const CHECKPOINT: &str = "HERMES_RECOVER_CHANGES_CHECKPOINT";
/// Marks the child's own lines among the test harness's output.
const TAG: &str = "RECOVER-CHANGES ";

// ── the children ────────────────────────────────────────────────────────────────────────────

#[test]
#[ignore = "helper process for recover_changes.rs; does nothing on its own"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var_os(DB).unwrap());
    let scenario = Scenario::from_name(&std::env::var(SCENARIO).unwrap());
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    let plan = scenario.plan(seed);
    match role.as_str() {
        "writer" => child_writer(&path, &plan),
        "newer" => child_newer(
            &path,
            &plan,
            &std::env::var(VFS).unwrap(),
            &std::env::var(CHECKPOINT).unwrap(),
        ),
        other => panic!("unknown child role {other:?}"),
    }
}

fn emit(value: Json) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG}{value}").unwrap();
    out.flush().unwrap();
}

/// Runs `op`; it must change exactly one row.
fn run(conn: &Connection, plan: &Plan, op: &Op) {
    let changed = match op {
        Op::Insert(t, values) => {
            let table = &plan.tables[*t];
            let marks = vec!["?"; table.cols.len()].join(", ");
            conn.execute(
                &format!(
                    "INSERT INTO {} ({}) VALUES ({marks})",
                    table.name,
                    table.cols.join(", ")
                ),
                rusqlite::params_from_iter(values),
            )
        }
        Op::Update {
            table,
            rowid,
            col,
            value,
        } => {
            let table = &plan.tables[*table];
            conn.execute(
                &format!(
                    "UPDATE {} SET {} = ?1 WHERE rowid = ?2",
                    table.name, table.cols[*col]
                ),
                rusqlite::params![value, rowid],
            )
        }
        Op::Delete(table, rowid) => conn.execute(
            &format!("DELETE FROM {} WHERE rowid = ?1", plan.tables[*table].name),
            [rowid],
        ),
    };
    assert_eq!(changed.unwrap(), 1, "{op:?}");
}

/// Commits each of `transactions`.
fn commit_all(conn: &Connection, plan: &Plan, transactions: &[Vec<Op>]) {
    for ops in transactions {
        let tx = conn.unchecked_transaction().unwrap();
        for op in ops {
            run(&tx, plan, op);
        }
        tx.commit().unwrap();
    }
}

fn checkpoint(conn: &Connection, mode: &str) -> (i64, i64, i64) {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
    .unwrap()
}

/// W: the history, checkpointed; the plan's acknowledged transactions, only in its WAL (for
/// T7, a part of them backfilled by a PASSIVE checkpoint a reader held back); then `write`,
/// `close` and `quit` on stdin.
fn child_writer(path: &Path, plan: &Plan) {
    made_with_page_size(path, plan.page_size);
    // The second name exists before W opens (a hard link farm, a backup's link): W's watch of
    // its own names never sees N's `link.db-wal` created.
    if let Some(link) = link_path(path, plan.link) {
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::fs::hard_link(path, &link).unwrap();
    }
    let mut w = Some(open_guarded(path));
    let c = w.as_ref().unwrap();
    c.execute_batch("PRAGMA secure_delete=OFF; PRAGMA wal_autocheckpoint=0")
        .unwrap();
    for table in &plan.tables {
        c.execute_batch(table.create).unwrap();
    }
    commit_all(c, plan, std::slice::from_ref(&plan.history));
    assert_eq!(
        checkpoint(c, "TRUNCATE").0,
        0,
        "the history is checkpointed"
    );
    let mut backfill = Json::Null;
    if plan.backfilled.is_empty() {
        commit_all(c, plan, &plan.w);
    } else {
        commit_all(c, plan, &plan.backfilled);
        let reader = open_stock(path);
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        commit_all(c, plan, &plan.w);
        let (busy, log, done) = checkpoint(c, "PASSIVE");
        assert!(
            busy == 0 && 0 < done && done < log,
            "the reader holds the checkpoint back: busy {busy}, {done} of {log} frames"
        );
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        backfill = json!({"log": log, "checkpointed": done});
    }
    emit(json!({"event": "ready", "backfill": backfill}));
    for line in std::io::stdin().lines() {
        match line.unwrap().trim() {
            "write" => {
                let c = w.as_ref().expect("a write after close");
                let result = insert(c, "after the loss");
                let status = c.guard_status().unwrap();
                emit(json!({
                    "event": "write",
                    "extended_code": result.as_ref().err()
                        .and_then(|e| e.sqlite_error()).map(|e| e.extended_code),
                    "capture": status.capture,
                }));
            }
            "close" => {
                let error = hermes_guard::close(w.take().expect("one close"))
                    .err()
                    .map(|(_, e)| e.to_string());
                emit(json!({"event": "closed", "error": error}));
            }
            "quit" => break,
            other => panic!("unknown command {other:?}"),
        }
    }
}

/// N: opens `path` (the database, or a hard link to it) through `vfs`, commits the plan's
/// transactions, checkpoints with `mode` and closes.
fn child_newer(path: &Path, plan: &Plan, vfs: &str, mode: &str) {
    let conn = match vfs {
        "guard" => open_guarded(path),
        "stock" => open_stock(path),
        other => panic!("unknown vfs {other:?}"),
    };
    conn.execute_batch("PRAGMA secure_delete=OFF; PRAGMA wal_autocheckpoint=0")
        .unwrap();
    commit_all(&conn, plan, &plan.n);
    let (busy, log, checkpointed) = checkpoint(&conn, mode);
    conn.close().map_err(|(_, e)| e).unwrap();
    emit(json!({"event": "done", "busy": busy, "log": log, "checkpointed": checkpointed}));
}

// ── the parent's side ───────────────────────────────────────────────────────────────────────

fn child_command(role: &str, path: &Path, scenario: Scenario, seed: u64) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "recover_changes_harness::child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role)
    .env(DB, path)
    .env(SCENARIO, scenario.name())
    .env(SEED, seed.to_string())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    cmd
}

/// The next tagged JSON line of a child's stdout, which must be `event`.
fn next_tagged(out: &mut impl BufRead, event: &str) -> Json {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child exited before {event:?}");
        if let Some((_, doc)) = line.trim_end().split_once(TAG) {
            let value: Json = serde_json::from_str(doc).unwrap();
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
    fn start(path: &Path, scenario: Scenario, seed: u64) -> (Writer, Json) {
        let mut child = child_command("writer", path, scenario, seed)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut writer = Writer {
            child,
            stdin,
            stdout,
        };
        let ready = writer.ask("", "ready");
        (writer, ready)
    }

    fn ask(&mut self, command: &str, event: &str) -> Json {
        if !command.is_empty() {
            let stdin = self.stdin.as_mut().unwrap();
            writeln!(stdin, "{command}").unwrap();
            stdin.flush().unwrap();
        }
        next_tagged(&mut self.stdout, event)
    }

    /// The write after the loss: refused (`SQLITE_READONLY_DBMOVED`) and captured; then the
    /// close, and the child's exit. Returns the capture.
    fn refused_and_closed(mut self) -> PathBuf {
        let answer = self.ask("write", "write");
        assert_eq!(
            answer["extended_code"],
            rusqlite::ffi::SQLITE_READONLY_DBMOVED,
            "{answer}"
        );
        let capture = PathBuf::from(answer["capture"].as_str().expect("captured"));
        let closed = self.ask("close", "closed");
        assert_eq!(closed["error"], Json::Null, "{closed}");
        writeln!(self.stdin.as_mut().unwrap(), "quit").unwrap();
        drop(self.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "W failed ({status}):\n{rest}");
        capture
    }
}

/// N, in its own process, through `vfs`, at `path`; its checkpoint must copy everything.
fn newer_generation(path: &Path, scenario: Scenario, seed: u64, vfs: &str, mode: &str) {
    let out = child_command("newer", path, scenario, seed)
        .env(VFS, vfs)
        .env(CHECKPOINT, mode)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "N failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = next_tagged(&mut &out.stdout[..], "done");
    assert_eq!(done["busy"], 0, "{done}");
    assert_eq!(
        done["log"], done["checkpointed"],
        "fully checkpointed: {done}"
    );
}

/// `hermes-guard captures <db> --json`: its exit code and listing.
fn captures(path: &Path) -> (i32, Json) {
    let (code, out, err) =
        hermes_guard_cli(&["captures".as_ref(), path.as_ref(), "--json".as_ref()]);
    let listing = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}\n{err}"));
    (code, listing)
}

/// Every `recover` command `listing` shows, with `--apply`: each one's exit code, and what they
/// printed.
fn apply_listed(listing: &Json) -> (Vec<i32>, String) {
    let mut codes = Vec::new();
    let mut log = String::new();
    for row in listing.as_array().unwrap() {
        let Some(words) = row["recover"].as_array() else {
            continue;
        };
        let mut words: Vec<&str> = words.iter().map(|w| w.as_str().unwrap()).collect();
        words.push("--apply");
        let args: Vec<&OsStr> = words.iter().map(OsStr::new).collect();
        let (code, out, err) = hermes_guard_cli(&args);
        codes.push(code);
        log.push_str(&format!(
            "$ hermes-guard {} (exit {code})\n{out}{err}\n",
            words.join(" ")
        ));
    }
    (codes, log)
}

/// The live rows of the plan's tables, by content.
fn live_contents(conn: &Connection, plan: &Plan) -> BTreeMap<Content, usize> {
    let mut live = BTreeMap::new();
    for table in &plan.tables {
        let sql = format!("SELECT {} FROM {}", table.cols.join(", "), table.name);
        let mut stmt = conn.prepare(&sql).unwrap();
        let rows = stmt
            .query_map([], |r| {
                (0..table.cols.len())
                    .map(|i| r.get::<_, Value>(i))
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .unwrap();
        for values in rows {
            *live
                .entry(content(table.name, &values.unwrap()))
                .or_insert(0) += 1;
        }
    }
    live
}

/// Every row of every table (sorted; an INTEGER PRIMARY KEY shows the rowid), for "a second run changes nothing".
fn dump(conn: &Connection) -> Vec<String> {
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    let tables: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let mut out = Vec::new();
    for table in tables {
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let n = stmt.column_count();
        let rows = stmt
            .query_map([], |r| {
                (0..n)
                    .map(|i| r.get::<_, Value>(i))
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .unwrap();
        for row in rows {
            out.push(format!("{table} {:?}", row.unwrap()));
        }
    }
    out.sort();
    out
}

/// The sum of `plan.balances`' column per group, live.
fn live_balances(conn: &Connection, plan: &Plan) -> BTreeMap<String, i64> {
    let Some((t, group, sum)) = plan.balances else {
        return BTreeMap::new();
    };
    let table = &plan.tables[t];
    let sql = format!(
        "SELECT {g}, SUM({s}) FROM {name} GROUP BY {g}",
        g = table.cols[group],
        s = table.cols[sum],
        name = table.name
    );
    let mut stmt = conn.prepare(&sql).unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((format!("{:?}", r.get::<_, Value>(0)?), r.get::<_, i64>(1)?))
        })
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

/// The hard link N writes through (made by W before it opens), if the plan has one.
fn link_path(db: &Path, link: Link) -> Option<PathBuf> {
    let dir = db.parent().unwrap();
    match link {
        Link::None => None,
        Link::SameDirectory => Some(dir.join("link.db")),
        Link::OtherDirectory => Some(dir.join("other").join("link.db")),
    }
}

/// One run of `scenario` with `seed`, N through `vfs` checkpointing with `mode`: `Err` says
/// every way the outcome differs from what is expected (the caller collects them over runs).
pub fn run_once(scenario: Scenario, seed: u64, vfs: &str, mode: &str) -> Result<(), String> {
    let plan = scenario.plan(seed);
    let expected = Expected::of(&plan);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (writer, ready) = Writer::start(&path, scenario, seed);
    lose_sidecars(&path, false);
    let newer_path = link_path(&path, plan.link).unwrap_or_else(|| path.clone());
    newer_generation(&newer_path, scenario, seed, vfs, mode);
    let capture = writer.refused_and_closed();
    let listed = artifacts(dir.path());
    assert_eq!(listed, std::slice::from_ref(&capture), "one capture, W's");
    let m = manifest(&capture);
    let over_cap = m["base_pages"]["over_cap"].as_u64().unwrap_or(0);
    if plan.over_cap {
        assert!(over_cap > 0, "W wrote more pages than the cap: {m:#}");
    } else {
        assert_eq!(over_cap, 0, "{m:#}");
    }

    let mut failures: Vec<String> = Vec::new();
    let (_, before) = captures(&path);
    let missing_before = before[0]["missing"].as_u64();
    let (codes, log) = apply_listed(&before);
    let live = Connection::open(&path).unwrap();
    let after_first = dump(&live);
    let (codes_again, log_again) = apply_listed(&before);
    let after_second = dump(&live);
    let (captures_after, after) = captures(&path);
    let missing_after = after[0]["missing"].as_u64();

    let exit = if expected.undecided > 0 || plan.over_cap {
        3
    } else {
        0
    };
    if codes != [exit] {
        failures.push(format!(
            "recover --apply exited {codes:?}, expected {exit} ({} undecided{})",
            expected.undecided,
            if plan.over_cap { ", over the cap" } else { "" }
        ));
    }
    if codes_again != [exit] {
        failures.push(format!(
            "the second recover --apply exited {codes_again:?}, expected {exit}"
        ));
    }
    if let Some(diff) = expected.differences(&live_contents(&live, &plan)) {
        failures.push(format!("live rows after the runbook:\n    {diff}"));
    }
    let balances = live_balances(&live, &plan);
    if balances != expected.balances {
        failures.push(format!(
            "balances {balances:?}, expected {:?}",
            expected.balances
        ));
    }
    if !integrity_ok(&live) {
        failures.push("integrity_check is not ok".into());
    }
    if count_like(&live, "after the loss") != 0 {
        failures.push("the refused write is live".into());
    }
    if after_first != after_second {
        let changed = after_first
            .iter()
            .filter(|r| !after_second.contains(r))
            .count()
            + after_second
                .iter()
                .filter(|r| !after_first.contains(r))
                .count();
        failures.push(format!(
            "the second run of the recoveries changed {changed} row(s)"
        ));
    }
    if scenario == Scenario::MergesAndFrees && missing_before != Some(expected.w_inserts as u64) {
        failures.push(format!(
            "captures said {missing_before:?} missing before --apply; W inserted {}",
            expected.w_inserts
        ));
    }
    // `captures` may still exit 1 (the capture's image + WAL, N's file under W's pages, need
    // not pass integrity_check), never 3 once everything decidable is applied.
    if exit == 0 && (missing_after != Some(0) || captures_after == 3) {
        failures.push(format!(
            "captures after the runbook: exit {captures_after}, {missing_after:?} missing"
        ));
    }
    if failures.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}\n  [W: {} inserts, {} updates, {} deletes; {} undecided expected; captures missing \
         {missing_before:?} before, {missing_after:?} after; W ready {ready}; base {} ({})]\n{}",
        failures.join("\n  "),
        expected.w_inserts,
        expected.w_updates,
        expected.w_deletes,
        expected.undecided,
        before[0]["base"],
        before[0]["base_evidence"],
        if std::env::var_os("HERMES_GUARD_SHOW_RECOVER").is_some() {
            format!("{log}{log_again}")
        } else {
            String::new()
        }
    ))
}

/// How many runs (seeds) each test makes per checkpoint mode: `HERMES_GUARD_RUNS`, 1 unless set.
pub fn runs() -> u64 {
    std::env::var("HERMES_GUARD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Runs `scenario` with N through `vfs`, for each seed and both checkpoint modes, and fails
/// with every failing run's differences.
#[track_caller]
pub fn check_scenario(scenario: Scenario, vfs: &str) {
    let mut failures = Vec::new();
    let runs = runs();
    for run in 0..runs {
        for mode in ["PASSIVE", "TRUNCATE"] {
            let seed = 1000 * (scenario as u64 + 1) + run;
            if let Err(e) = run_once(scenario, seed, vfs, mode) {
                failures.push(format!("{scenario:?}, N {vfs}, {mode}, seed {seed}: {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        2 * runs,
        failures.join("\n")
    );
}
