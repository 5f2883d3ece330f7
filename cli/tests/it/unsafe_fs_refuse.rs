//! `HERMES_GUARD_UNSAFE_FS=refuse` on a filesystem where WAL mode is not safe refuses
//! shared WAL mode, and still lets an existing WAL database be read and taken out of WAL mode
//! the way its error says: alone, under `PRAGMA locking_mode=EXCLUSIVE` (SQLite keeps the
//! wal-index in heap memory then), then `PRAGMA journal_mode=DELETE`.
//!
//! This machine cannot mount NFS: the child process runs with the test hook
//! `HERMES_GUARD_TEST_FS_MAGIC=6969` (NFS's `statfs` magic), which the guard reads in place of
//! the directory's real magic number. Everything else — SQLite, the files, the WAL — is real.

use crate::common::*;

use std::path::Path;
use std::process::Command;

use rusqlite::{Connection, OpenFlags};

/// Through the guard, as the file is: no journal mode asked for.
fn open_plain_guarded(db: &Path) -> Connection {
    hermes_guard::register().unwrap();
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME).unwrap()
}

const CHILD: &str = "HERMES_UNSAFE_FS_CHILD_DB";
const ROWS: i64 = 12;

/// The child: the steps under the refusal, each result on its own line of stdout.
#[test]
#[ignore = "helper process for the test below; does nothing on its own"]
fn child() {
    let Some(db) = std::env::var_os(CHILD) else {
        return;
    };
    let db = Path::new(&db);
    let shared = open_plain_guarded(db);
    let refused = shared.query_row("SELECT COUNT(*) FROM t", [], |r| r.get::<_, i64>(0));
    println!(
        "RESULT shared {}",
        refused.map_or_else(|e| format!("error {e}"), |n| n.to_string())
    );
    drop(shared);
    let alone = open_plain_guarded(db);
    let mode: String = alone
        .query_row("PRAGMA locking_mode=EXCLUSIVE", [], |r| r.get(0))
        .unwrap();
    let n: i64 = alone
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .unwrap();
    println!("RESULT exclusive {mode} {n}");
    let journal: String = alone
        .query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))
        .unwrap();
    println!("RESULT journal {journal}");
    drop(alone);
    let after = open_plain_guarded(db);
    let n: i64 = after
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .unwrap();
    println!("RESULT after {n}");
}

/// A WAL database whose last `ROWS` commits are only in its WAL (copied while its writer was
/// idle, as a crash leaves it).
fn wal_database_with_frames(dir: &Path) -> std::path::PathBuf {
    let work = dir.join("work");
    std::fs::create_dir(&work).unwrap();
    let w = work.join("state.db");
    let conn = Connection::open(&w).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t(v TEXT);",
    )
    .unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    for i in 0..ROWS {
        conn.execute("INSERT INTO t VALUES (?1)", [format!("row {i}")])
            .unwrap();
    }
    let db = dir.join("state.db");
    std::fs::copy(&w, &db).unwrap();
    std::fs::copy(work.join("state.db-wal"), dir.join("state.db-wal")).unwrap();
    drop(conn);
    db
}

#[test]
fn refuse_on_an_unsafe_filesystem_still_reads_and_converts_a_wal_database_opened_exclusive() {
    let dir = tempfile::tempdir().unwrap();
    let db = wal_database_with_frames(dir.path());
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unsafe_fs_refuse::child",
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads=1"])
        .env(CHILD, &db)
        .env("HERMES_GUARD_TEST_FS_MAGIC", "6969")
        .env("HERMES_GUARD_UNSAFE_FS", "refuse")
        .env("HERMES_GUARD_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let result = |step: &str| {
        stdout
            .lines()
            .find_map(|l| l.split_once(&format!("RESULT {step} ")).map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no {step} result:\n{stdout}\n{stderr}"))
            .to_owned()
    };
    assert!(result("shared").starts_with("error "), "{stdout}");
    assert_eq!(result("exclusive"), format!("exclusive {ROWS}"), "{stderr}");
    assert_eq!(result("journal"), "delete", "{stderr}");
    assert_eq!(result("after"), ROWS.to_string(), "{stderr}");
    assert!(!dir.path().join("state.db-wal").exists(), "out of WAL mode");
    let plain = Connection::open(&db).unwrap();
    assert!(integrity_ok(&plain));
    let mode: String = plain
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
}
