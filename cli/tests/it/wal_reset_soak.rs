//! The WAL-reset race's soak: four processes on one database through the guard with the WAL-reset
//! rule on — two writers (`wal_autocheckpoint` small, so their commits reset the WAL often; one
//! also runs PASSIVE checkpoints of its own) and two checkpointers (one cycling PASSIVE, FULL,
//! RESTART and TRUNCATE, one PASSIVE only, the mode the race needs). Every committed row must be
//! there at the end, `integrity_check` ok, no tripwire alarm. The WAL's final size is printed, not
//! asserted: whether commits ever find the WAL wholly checkpointed depends on how the four
//! processes are scheduled (on a loaded 2-core machine none may, and the WAL grows as it does in
//! stock SQLite). That a deferred reset happens at the next commit with no checkpoint running is
//! `wal_reset::a_checkpoint_lock_held_elsewhere_defers_the_reset_and_the_commit_appends`. Short
//! (a few seconds): it runs in every `cargo test`, and on the system SQLite 3.40.1 in
//! tests/system-sqlite.sh. A longer run: `HERMES_GUARD_SOAK_ROWS=20000`.
//!
//! The processes are this test binary, re-executed to run the ignored `child` test with
//! `WAL_SOAK_ROLE` saying what to do.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use hermes_guard::GuardStatus;
use rusqlite::{Connection, OpenFlags};

use crate::common::GuardExt;

const ROLE: &str = "WAL_SOAK_ROLE";
const DB: &str = "WAL_SOAK_DB";
const ROWS: &str = "WAL_SOAK_ROWS";
/// Marks a child's status line among the harness's output.
const TAG: &str = "WAL-SOAK-STATUS ";
/// Rows per writer in an ordinary run.
const DEFAULT_ROWS: i64 = 1_000;

fn open(path: &Path) -> Connection {
    hermes_guard::register().unwrap();
    let conn =
        Connection::open_with_flags_and_vfs(path, OpenFlags::default(), hermes_guard::VFS_NAME)
            .unwrap();
    conn.pragma_update(None, "busy_timeout", 20_000).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let on: String = conn
        .query_row("PRAGMA hermes_guard_wal_reset_guard=on", [], |r| r.get(0))
        .unwrap();
    assert_eq!(on, "on");
    conn
}

#[test]
#[ignore = "helper process for wal_reset_soak::four_processes_lose_nothing; does nothing on its own"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var(DB).unwrap());
    let rows: i64 = std::env::var(ROWS).unwrap().parse().unwrap();
    let conn = open(&path);
    match role.as_str() {
        "writer-1" | "writer-2" => {
            let writer: i64 = role[7..].parse().unwrap();
            conn.execute_batch("PRAGMA wal_autocheckpoint=8").unwrap();
            for seq in 0..rows {
                conn.execute(
                    "INSERT INTO t (writer, seq, pad) VALUES (?1, ?2, randomblob(600))",
                    [writer, seq],
                )
                .unwrap();
                // A pause between commits lets the checkpointers catch up, so that commits
                // find the WAL wholly checkpointed and reset it, often while a checkpoint
                // runs: what the rule is for.
                std::thread::sleep(std::time::Duration::from_micros(300));
                if writer == 2 && seq % 7 == 0 {
                    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        .unwrap();
                }
            }
        }
        "checkpointer-all" | "checkpointer-passive" => {
            let modes: &[&str] = if role == "checkpointer-all" {
                &["PASSIVE", "FULL", "RESTART", "TRUNCATE"]
            } else {
                &["PASSIVE"]
            };
            let done = path.with_extension("done");
            let mut i = 0;
            while !done.exists() {
                let mode = modes[i % modes.len()];
                if let Err(e) =
                    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
                {
                    panic!("{role}: {mode} checkpoint: {e}; {:?}", conn.guard_status());
                }
                i += 1;
            }
        }
        other => panic!("unknown role {other}"),
    }
    let status = serde_json::to_string(&conn.guard_status().unwrap()).unwrap();
    println!("{TAG}{role} {status}");
}

fn spawn(role: &str, path: &Path, rows: i64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "wal_reset_soak::child",
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads=1"])
        .env(ROLE, role)
        .env(DB, path)
        .env(ROWS, rows.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` and returns its status line.
fn finish(child: Child, role: &str) -> GuardStatus {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{role} failed:\n{stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(TAG).map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("{role} printed no status:\n{stdout}"));
    let json = line.split_once(' ').unwrap().1;
    serde_json::from_str(json).unwrap()
}

#[test]
fn four_processes_with_the_rule_lose_nothing() {
    let rows: i64 =
        std::env::var("HERMES_GUARD_SOAK_ROWS").map_or(DEFAULT_ROWS, |n| n.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open(&path);
    conn.execute_batch(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, writer INTEGER, seq INTEGER, pad BLOB);
         CREATE INDEX t_writer_seq ON t (writer, seq);",
    )
    .unwrap();
    let checkpointers = [
        ("checkpointer-all", spawn("checkpointer-all", &path, rows)),
        (
            "checkpointer-passive",
            spawn("checkpointer-passive", &path, rows),
        ),
    ];
    let writers = [
        ("writer-1", spawn("writer-1", &path, rows)),
        ("writer-2", spawn("writer-2", &path, rows)),
    ];
    let mut statuses = Vec::new();
    for (role, child) in writers {
        statuses.push((role, finish(child, role)));
    }
    std::fs::write(path.with_extension("done"), b"").unwrap();
    for (role, child) in checkpointers {
        statuses.push((role, finish(child, role)));
    }
    let wal = std::fs::metadata(dir.path().join("state.db-wal")).map_or(0, |m| m.len());
    for (role, s) in &statuses {
        println!(
            "SQLite {} {role}: resets guarded {}, deferred {}, alarms {}; WAL {wal} bytes",
            rusqlite::version(),
            s.wal_resets_guarded,
            s.wal_resets_deferred,
            s.wal_index_alarms
        );
        assert_eq!(s.wal_index_alarms, 0, "{role}: the tripwire sounded");
    }
    let fresh = open(&path);
    for writer in [1, 2] {
        let (n, distinct): (i64, i64) = fresh
            .query_row(
                "SELECT count(*), count(DISTINCT seq) FROM t WHERE writer = ?1",
                [writer],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((n, distinct), (rows, rows), "writer {writer}'s rows");
    }
    let integrity: String = fresh
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}
