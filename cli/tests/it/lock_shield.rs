//! The lock shield: a stray `close()` of the database file in the writer's process drops the
//! process's POSIX locks on it; the shield's open-file-description locks keep the writer visible to
//! other processes, so a peer's close neither checkpoints nor deletes the WAL the writer still
//! uses.
//!
//! The peers are Debian's `/usr/bin/python3` with its stdlib `sqlite3` (the system SQLite, 3.40 on
//! Debian 12, which deletes the WAL at its close in this sequence once it gets EXCLUSIVE); the
//! tests skip, saying why, where it is absent.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use rusqlite::Connection;

use crate::common::*;
use crate::system_python::{peer_getlk, system_python, SHM_DMS};

/// The peer: `write <db> <n> <tag>` commits `n` one-row transactions and closes (printing the
/// system SQLite's version).
const PEER: &str = r#"
import sys
mode = sys.argv[1]
if mode == "write":
    import sqlite3
    db, n, tag = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    c = sqlite3.connect(db, isolation_level=None, timeout=10)
    for i in range(n):
        c.execute("INSERT INTO messages (session, content) VALUES (?, ?)", (tag, "%s %d" % (tag, i)))
    c.close()
    print(sqlite3.sqlite_version)
"#;

fn peer(python: &str, args: &[&str]) -> String {
    let out = Command::new(python)
        .arg("-c")
        .arg(PEER)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "peer {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A peer process on the system SQLite commits `n` rows tagged `tag` and closes.
fn peer_writes(python: &str, db: &Path, n: u32, tag: &str) {
    peer(
        python,
        &["write", db.to_str().unwrap(), &n.to_string(), tag],
    );
}

/// Something in the writer's process reads the file and closes it: every POSIX lock this process
/// held on the inode is gone.
fn stray_close(path: &Path) {
    drop(fs::File::open(path).unwrap());
}

const SHARED_FIRST: i64 = 0x4000_0002;
const SHARED_SIZE: i64 = 510;

#[derive(Debug)]
struct Outcome {
    /// Rows whose commit was reported as successful, by anybody.
    committed: i64,
    /// Rows a fresh connection finds afterwards (`None`: the database cannot be read).
    present: Option<i64>,
    integrity_ok: bool,
    /// The WAL was still there after the peer B closed.
    wal_kept_through_b: bool,
    /// A's writes that were refused or failed.
    a_failures: u32,
    captures: usize,
}

/// The issue's sequence: A has five rows only in its WAL; a stray close in A's process; peer B
/// writes one row and closes; A writes five; peer C writes 20 and closes; A writes five more and
/// closes.
fn scenario(python: &str, dir: &Path, guarded: bool) -> Outcome {
    let path = dir.join("state.db");
    let a = if guarded {
        open_guarded(&path)
    } else {
        open_stock(&path)
    };
    checkpointed_history(&a);
    let mut committed = 20;
    for i in 0..5 {
        insert(&a, &format!("A only in the WAL {i}")).unwrap();
        committed += 1;
    }
    if guarded {
        let status = a.guard_status().unwrap();
        assert!(
            status.shield_active && status.shield_shm_active,
            "the shield is up before the stray close: {status:?}"
        );
    }

    stray_close(&path);
    peer_writes(python, &path, 1, "B");
    committed += 1;
    let wal_kept_through_b = sidecar(&path, "-wal").exists();

    let mut a_failures = 0;
    let mut a_writes = |a: &Connection, label: &str| {
        for i in 0..5 {
            match insert(a, &format!("{label} {i}")) {
                Ok(_) => committed += 1,
                Err(_) => a_failures += 1,
            }
        }
    };
    a_writes(&a, "A after B");
    peer_writes(python, &path, 20, "C");
    let mut committed_c = 20;
    a_writes(&a, "A after C");
    if guarded {
        hermes_guard::close(a).map_err(|(_, e)| e).unwrap();
    } else {
        drop(a);
    }
    committed += std::mem::take(&mut committed_c);

    let check = Connection::open(&path).unwrap();
    let present = check
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .ok();
    let integrity_ok = check
        .query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .is_ok_and(|s| s == "ok");
    Outcome {
        committed,
        present,
        integrity_ok,
        wal_kept_through_b,
        a_failures,
        captures: artifacts(dir).len(),
    }
}

#[test]
fn a_stray_close_in_the_writers_process_costs_nothing_with_the_shield() {
    let Some(python) = system_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let outcome = scenario(python, dir.path(), true);
    println!("with the shield: {outcome:?}");
    assert!(outcome.wal_kept_through_b, "B's close deleted A's WAL");
    assert_eq!(outcome.a_failures, 0, "A's ten writes were all accepted");
    assert_eq!(outcome.committed, 56);
    assert_eq!(outcome.present, Some(56), "nothing lost");
    assert!(outcome.integrity_ok);
    assert_eq!(outcome.captures, 0, "nothing retired, nothing captured");
    // A's close was the last: it checkpointed and deleted the WAL as usual.
    assert!(!sidecar(&dir.path().join("state.db"), "-wal").exists());
}

/// The control: the same sequence through the stock VFS loses rows (or the database), so the
/// test above cannot pass without testing anything.
#[test]
fn the_same_stray_close_loses_rows_on_the_stock_vfs() {
    let Some(python) = system_python() else {
        return;
    };
    let version = Command::new(python)
        .args(["-c", "import sqlite3; print(sqlite3.sqlite_version)"])
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let dir = tempfile::tempdir().unwrap();
    let outcome = scenario(python, dir.path(), false);
    println!("stock VFS, peers on SQLite {version}: {outcome:?}");
    assert!(
        !outcome.wal_kept_through_b,
        "the peer (SQLite {version}) did not delete the WAL: the scenario no longer reproduces \
         the loss on this system"
    );
    assert!(
        outcome.present != Some(outcome.committed) || !outcome.integrity_ok,
        "the stock VFS lost nothing: {outcome:?}"
    );
}

/// Another process sees the shield's locks (OFD locks report `l_pid == -1`) on the main file's
/// SHARED range and on the `-shm` dead-man switch, after stray closes of both files.
#[test]
fn another_process_sees_the_shield_after_stray_closes_of_the_db_and_shm() {
    let Some(python) = system_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "one").unwrap();
    let shm = sidecar(&path, "-shm");
    stray_close(&path);
    stray_close(&shm);
    assert_eq!(
        peer_getlk(python, &path, SHARED_FIRST, SHARED_SIZE),
        ("read".to_string(), -1)
    );
    assert_eq!(
        peer_getlk(python, &shm, SHM_DMS, 1),
        ("read".to_string(), -1)
    );
    // Writes go on, and the status says the shield is up.
    insert(&conn, "two").unwrap();
    let status = conn.guard_status().unwrap();
    assert!(status.shield_active && status.shield_shm_active);
    assert_eq!(status.shield_off_reason, None);
    drop(conn);
    // Closed: nothing is left behind on either file.
    assert!(!path.with_extension("db-wal").exists());
    fs::write(&shm, b"").unwrap();
    assert_eq!(
        peer_getlk(python, &path, SHARED_FIRST, SHARED_SIZE).0,
        "none"
    );
    assert_eq!(peer_getlk(python, &shm, SHM_DMS, 1).0, "none");
}

fn open_kind(path: &Path, guarded: bool) -> Connection {
    if guarded {
        open_guarded(path)
    } else {
        open_stock(path)
    }
}

/// Two connections of one process, guarded or stock, close in either order: the last close
/// still checkpoints and deletes the WAL and the `-shm`, exactly as without the shield, and no
/// close fails.
#[test]
fn connections_of_one_process_close_in_any_order_as_without_the_shield() {
    for (first_guarded, second_guarded) in [(true, false), (false, true), (true, true)] {
        for first_closes_first in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("state.db");
            let first = open_kind(&path, first_guarded);
            let second = open_kind(&path, second_guarded);
            for i in 0..10 {
                insert(&first, &format!("first {i}")).unwrap();
                insert(&second, &format!("second {i}")).unwrap();
            }
            let (a, b) = if first_closes_first {
                (first, second)
            } else {
                (second, first)
            };
            a.close().map_err(|(_, e)| e).unwrap();
            assert!(
                sidecar(&path, "-wal").exists(),
                "a close that is not the last keeps the WAL"
            );
            insert(&b, "after the first close").unwrap();
            b.close().map_err(|(_, e)| e).unwrap();
            let case = format!(
                "guarded {first_guarded}/{second_guarded}, first closes first {first_closes_first}"
            );
            assert!(
                !sidecar(&path, "-wal").exists() && !sidecar(&path, "-shm").exists(),
                "{case}: the last close checkpoints and deletes the WAL and -shm"
            );
            let check = Connection::open(&path).unwrap();
            assert_eq!(count_like(&check, "%"), 21, "{case}");
            assert!(integrity_ok(&check), "{case}");
        }
    }
}

/// The shield steps aside for this connection's own EXCLUSIVE (journal-mode switches, VACUUM)
/// and comes back afterwards; a refused EXCLUSIVE (another connection holds SHARED) puts it back
/// at once.
#[test]
fn the_shield_steps_aside_for_its_own_exclusive_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "one").unwrap();
    assert!(conn.guard_status().unwrap().shield_active);

    // Another connection of the process holds SHARED: the switch is refused (as without the
    // shield), and the shield is back up.
    let other = open_stock(&path);
    assert_eq!(count_like(&other, "%"), 1);
    let refused = conn.query_row("PRAGMA journal_mode=DELETE", [], |r| r.get::<_, String>(0));
    assert!(
        matches!(&refused, Ok(mode) if mode == "wal") || refused.is_err(),
        "{refused:?}"
    );
    let status = conn.guard_status().unwrap();
    assert!(
        status.shield_active && status.shield_shm_active,
        "{status:?}"
    );
    other.close().map_err(|(_, e)| e).unwrap();

    // Alone: the switch out of WAL mode goes through; in rollback mode nothing is held.
    let mode: String = conn
        .query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    insert(&conn, "two").unwrap();
    conn.execute_batch("VACUUM").unwrap();
    let status = conn.guard_status().unwrap();
    assert!(
        !status.shield_active && !status.shield_shm_active,
        "{status:?}"
    );
    assert_eq!(status.shield_off_reason, None);

    // Back to WAL mode: up again.
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    insert(&conn, "three").unwrap();
    let status = conn.guard_status().unwrap();
    assert!(
        status.shield_active && status.shield_shm_active,
        "{status:?}"
    );
    conn.close().map_err(|(_, e)| e).unwrap();
    let check = Connection::open(&path).unwrap();
    assert_eq!(count_like(&check, "%"), 3);
    assert!(integrity_ok(&check));
}

/// `PRAGMA hermes_guard_status` carries the shield's state in its JSON, for every binding.
#[test]
fn the_status_reports_the_shield() {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let json: String = conn
        .query_row("PRAGMA hermes_guard_status", [], |r| r.get(0))
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["shield_active"], true, "{json}");
    assert_eq!(json["shield_shm_active"], true, "{json}");
    assert!(json["shield_off_reason"].is_null(), "{json}");
}
