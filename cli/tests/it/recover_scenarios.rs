//! Every loss scenario of the suite, recovered with `hermes-guard recover <capture> --into <db>
//! --apply`: every committed row ends in the live database, a second run adds nothing, and
//! integrity_check is ok.

use crate::common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use rusqlite::Connection;

/// The CLI's exit code and everything it printed.
fn cli(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let (code, out, err) = hermes_guard_cli(args);
    (code, out + &err)
}

/// `recover --apply` twice: the first merges `expected_inserted` rows, the second adds nothing,
/// each exiting 0 (done); the live database checks clean.
#[track_caller]
fn recover_twice(artifact: &Path, db: &Path, expected_inserted: u64) {
    let args = |apply: bool| {
        let mut a: Vec<&std::ffi::OsStr> = vec![
            "recover".as_ref(),
            artifact.as_os_str(),
            "--into".as_ref(),
            db.as_os_str(),
            "--json".as_ref(),
        ];
        if apply {
            a.push("--apply".as_ref());
        }
        a
    };
    let (code, out) = cli(&args(false));
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
    assert_eq!(plan["missing"], expected_inserted, "{out}");
    let (code_apply, out) = cli(&args(true));
    let done: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
    assert_eq!(done["inserted"], expected_inserted, "{out}");
    // A plan and a successful merge exit 0 (a merge used to exit 1).
    assert_eq!((code, code_apply), (0, 0), "{out}");
    let (again, out) = cli(&args(true));
    assert_eq!(again, 0, "a second run adds nothing: {out}");
    let live = Connection::open(db).unwrap();
    assert!(integrity_ok(&live));
}

fn total(db: &Path) -> i64 {
    Connection::open(db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap()
}

fn clobbered_by_a_peer(peer: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&path, "guard");
    lose_sidecars(&path, false);
    gw.send("write");
    let refused = gw.next_event("write");
    let artifact = PathBuf::from(refused["artifact"].as_str().unwrap());
    let seen = write_second_generation(&path, peer, 100);
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());
    assert_eq!(seen, 120);

    recover_twice(&artifact, &path, 4);
    assert_eq!(total(&path), 124, "20 history + 4 retired + 100 newer");
    let live = Connection::open(&path).unwrap();
    assert_eq!(count_like(&live, "uncheckpointed %"), 4);
    assert_eq!(count_like(&live, "second generation %"), 100);
}

#[test]
fn clobber_by_a_guarded_peer_is_recovered() {
    clobbered_by_a_peer("guard");
}

#[test]
fn clobber_by_a_stock_peer_is_recovered() {
    clobbered_by_a_peer("stock");
}

#[test]
fn a_kill_9_after_the_loss_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args(["writer", "--role", "gateway", "--vfs", "guard", "--db"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    lines.next().unwrap().unwrap(); // ready
    lose_sidecars(&path, true);
    use std::io::Write;
    writeln!(stdin, "write").unwrap();
    stdin.flush().unwrap();
    let refused: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let artifact = PathBuf::from(refused["artifact"].as_str().unwrap());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    write_second_generation(&path, "stock", 50);
    recover_twice(&artifact, &path, 4);
    assert_eq!(total(&path), 74);
}

#[test]
fn a_lost_shm_alone_leaves_nothing_to_merge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    std::fs::remove_file(sidecar(&path, "-shm")).unwrap();
    assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    newer_generation(&path, 10);
    // The WAL stayed at the path: the live database has the sentinel already.
    recover_twice(&artifact, &path, 0);
    let live = Connection::open(&path).unwrap();
    assert_eq!(count_like(&live, &sentinel), 1);
    assert_eq!(count_like(&live, "newer %"), 10);
}

#[test]
fn a_foreign_wal_put_in_place_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    // A copy of the WAL as it is now, put in place later: another inode, fewer frames.
    let foreign = dir.path().join("foreign-wal");
    std::fs::copy(sidecar(&path, "-wal"), &foreign).unwrap();
    for i in 0..3 {
        insert(&conn, &format!("only in the retired WAL {i}")).unwrap();
    }
    std::fs::rename(&foreign, sidecar(&path, "-wal")).unwrap();
    std::fs::remove_file(sidecar(&path, "-shm")).unwrap();
    assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    newer_generation(&path, 10);
    recover_twice(&artifact, &path, 3);
    let live = Connection::open(&path).unwrap();
    assert_eq!(count_like(&live, "only in the retired WAL %"), 3);
    assert_eq!(count_like(&live, "newer %"), 10);
    assert_eq!(total(&path), 20 + 1 + 3 + 10);
}

#[test]
fn a_restore_of_an_older_snapshot_is_recovered_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    checkpointed_history(&conn);
    let snapshot = dir.path().join("snapshot.db");
    std::fs::copy(&path, &snapshot).unwrap();
    for i in 0..5 {
        insert(&conn, &format!("after the snapshot {i}")).unwrap();
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    std::fs::rename(&snapshot, &path).unwrap(); // the restore
    assert!(is_refusal(
        &insert(&conn, "into the old inode").unwrap_err()
    ));
    let status = conn.guard_status().unwrap();
    let artifact = status.capture.unwrap();
    assert_eq!(manifest(&artifact)["reason"], "main-replaced");
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    newer_generation(&path, 10);
    recover_twice(&artifact, &path, 5);
    assert_eq!(total(&path), 35);
}

#[test]
fn exclusive_locking_mode_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    conn.execute_batch("PRAGMA locking_mode=EXCLUSIVE").unwrap();
    let sentinel = wal_only_sentinel(&conn);
    std::fs::remove_file(sidecar(&path, "-wal")).unwrap();
    assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    // Alone, with its own -shm still at the path: the close heals the lost -wal, so the capture is
    // healed and the merge has nothing left to add.
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    newer_generation(&path, 10);
    recover_twice(&artifact, &path, 0);
    let live = Connection::open(&path).unwrap();
    assert_eq!(count_like(&live, &sentinel), 1);
    assert_eq!(total(&path), 31);
}

#[test]
fn a_fresh_database_whose_schema_lived_only_in_the_lost_wal_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = crate::recover_delta::fresh_notes_lost(dir.path());
    recover_twice(&artifact, &path, 30);
    let live = Connection::open(&path).unwrap();
    let hits: i64 = live
        .query_row(
            "SELECT COUNT(*) FROM notes_fts WHERE notes_fts MATCH 'platypus'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(hits, 1);
    let notes: i64 = live
        .query_row("SELECT COUNT(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(notes, 30);
}

#[test]
fn rows_whose_content_repeats_are_recovered_every_one() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = crate::recover_delta::repeated_content_lost(dir.path());
    recover_twice(&artifact, &path, 48);
    let rows: i64 = Connection::open(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM readings", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        rows, 148,
        "48 captured + 100 of the restarted application, after two runs"
    );
}
