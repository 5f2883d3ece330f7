//! A capture is as private as its database: every directory and file the guard makes for a
//! database (the capture, its files, `healed.json`, a set-aside WAL's capture, a capture in the
//! fallback directory, a rebuild's new file and kept directory) has the permissions SQLite gives
//! the database's own `-wal` — its bits (a directory's plus search where read is allowed) and,
//! for a root process, its owner.
//!
//! The umask is process-wide: each test runs alone in a process of its own (`test_alone!`) and
//! sets the umask there; a child it starts inherits it.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hermes_guard::GuardExt;
use rustix::fs::Mode;

use crate::common::*;

const NOBODY: u32 = 65534;

/// Mode bits and owner of a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Made {
    mode: u32,
    uid: u32,
    gid: u32,
}

fn made(path: &Path) -> Made {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Made {
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
    }
}

fn set_umask(mask: u32) {
    rustix::process::umask(Mode::from_raw_mode(mask));
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// An empty database file at `db` with `mode`, owned by `owner` when given.
fn empty_database(db: &Path, mode: u32, owner: Option<u32>) {
    fs::File::create(db).unwrap();
    fs::set_permissions(db, fs::Permissions::from_mode(mode)).unwrap();
    if let Some(id) = owner {
        std::os::unix::fs::chown(db, Some(id), Some(id)).unwrap();
    }
}

/// Asserts that `capture` and everything in it has what SQLite gave the database's `-wal`
/// (`wal`): files its mode and owner, directories its mode plus search where read is allowed;
/// and that nothing in it is readable by anyone the database is not.
#[track_caller]
fn assert_as_private_as(capture: &Path, wal: Made) {
    let dir_mode = wal.mode | ((wal.mode & 0o444) >> 2) | 0o700;
    let got = made(capture);
    assert_eq!(
        got,
        Made {
            mode: dir_mode,
            ..wal
        },
        "the capture directory {} (SQLite's -wal: {wal:?})",
        capture.display()
    );
    let mut files = 0;
    for entry in fs::read_dir(capture).unwrap().flatten() {
        let got = made(&entry.path());
        assert_eq!(
            got,
            wal,
            "{} (SQLite's -wal: {wal:?})",
            entry.path().display()
        );
        assert_eq!(
            got.mode & 0o044 & !wal.mode,
            0,
            "readable by more than the database"
        );
        files += 1;
    }
    assert!(files >= 2, "the capture holds its files");
}

/// A guarded connection on a database of `mode` (owned by `owner` when given) under `umask`:
/// history, rows only in the WAL, its `-wal` and `-shm` removed, the next write refused, the
/// connection closed (the lone loss heals at the close, recording it in the capture). Returns
/// what SQLite gave the `-wal` and the capture.
fn lost_and_closed(dir: &Path, mode: u32, umask: u32, owner: Option<u32>) -> (Made, PathBuf) {
    set_umask(umask);
    let db = dir.join("state.db");
    empty_database(&db, mode, owner);
    let conn = open_guarded(&db);
    checkpointed_history(&conn);
    for i in 0..3 {
        insert(&conn, &format!("{SENTINEL_PREFIX}{i}")).unwrap();
    }
    let wal = made(&sidecar(&db, "-wal"));
    lose_sidecars(&db, false);
    assert!(is_refusal(&insert(&conn, "refused").unwrap_err()));
    let capture = conn.guard_status().unwrap().capture.expect("captured");
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    (wal, capture)
}

/// The scenario for a database of `mode` under `umask`: the capture (with its heal record) is as
/// private as SQLite's `-wal`, which has the database's bits whatever the umask.
fn capture_is_as_private_as_the_database(mode: u32, umask: u32) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, capture) = lost_and_closed(dir.path(), mode, umask, None);
    assert_eq!(wal.mode, mode, "SQLite gives its -wal the database's bits");
    assert!(
        capture.join("healed.json").exists(),
        "the close healed and recorded it"
    );
    assert_as_private_as(&capture, wal);
}

test_alone! {
    fn a_0600_database_under_umask_022_is_captured_0700_with_0600_files() {
        capture_is_as_private_as_the_database(0o600, 0o022);
    }
}

test_alone! {
    fn a_0640_database_under_umask_022_is_captured_0750_with_0640_files() {
        capture_is_as_private_as_the_database(0o640, 0o022);
    }
}

test_alone! {
    fn a_0644_database_under_umask_022_is_captured_0755_with_0644_files() {
        capture_is_as_private_as_the_database(0o644, 0o022);
    }
}

test_alone! {
    fn a_0600_database_under_umask_077_is_captured_0700_with_0600_files() {
        capture_is_as_private_as_the_database(0o600, 0o077);
    }
}

test_alone! {
    fn a_0640_database_under_umask_077_gets_back_the_bits_the_umask_stripped() {
        capture_is_as_private_as_the_database(0o640, 0o077);
    }
}

test_alone! {
    fn a_0644_database_under_umask_077_gets_back_the_bits_the_umask_stripped() {
        capture_is_as_private_as_the_database(0o644, 0o077);
    }
}

test_alone! {
    fn a_root_process_gives_the_capture_of_another_users_database_to_its_owner() {
        if !is_root() {
            skip_unless_ci("giving a file to another user needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (wal, capture) = lost_and_closed(dir.path(), 0o600, 0o022, Some(NOBODY));
        assert_eq!(
            wal,
            Made { mode: 0o600, uid: NOBODY, gid: NOBODY },
            "SQLite gives a root process's -wal the database's owner"
        );
        assert_as_private_as(&capture, wal);
    }
}

test_alone! {
    fn a_stale_wal_set_aside_is_captured_as_privately_as_its_database() {
        set_umask(0o022);
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let backup = dir.path().join("backup.db");
        empty_database(&db, 0o640, None);
        crate::stale_wal::seed_with_backup(&db, &backup);
        crate::stale_wal::killed_writer(&db, "guard", 5);
        let wal = made(&sidecar(&db, "-wal"));
        assert_eq!(wal.mode, 0o640);
        let stale = fs::read(sidecar(&db, "-wal")).unwrap();
        fs::copy(&backup, &db).unwrap();
        let capture =
            crate::stale_wal::assert_set_aside(&db, &stale, crate::stale_wal::RESTORED);
        assert_as_private_as(&capture, wal);
    }
}

test_alone! {
    fn a_capture_in_the_fallback_directory_is_as_private_as_its_database() {
        if !is_root() {
            skip_unless_ci("a writer that may not write beside its database runs as nobody");
            return;
        }
        set_umask(0o022);
        let top = tempfile::tempdir().unwrap();
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let (dir, fallback) = (top.path().join("data"), top.path().join("fallback"));
        for d in [&dir, &fallback] {
            fs::create_dir(d).unwrap();
            fs::set_permissions(d, fs::Permissions::from_mode(0o777)).unwrap();
        }
        let db = dir.join("state.db");
        empty_database(&db, 0o600, Some(NOBODY));
        // A writer as nobody (the umask above inherited), its capture refused beside the
        // database once the directory is no longer writable to it.
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hermes-guard"));
        cmd.args(["writer", "--role", "gateway", "--vfs", "guard", "--wal-rows", "3"])
            .arg("--db")
            .arg(&db)
            .env("HOME", "/nonexistent")
            .env_remove("XDG_STATE_HOME")
            .env("HERMES_GUARD_ORPHAN_CAPTURE_DIR", &fallback)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut gw = Gateway::spawn(cmd);
        gw.next_event("ready");
        let wal = made(&sidecar(&db, "-wal"));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::remove_file(sidecar(&db, "-wal")).unwrap();
        gw.send("write");
        assert_eq!(gw.next_event("write")["refused"], true);
        gw.send("close");
        gw.next_event("closed");
        assert!(gw.quit().success());
        assert!(artifacts(&dir).is_empty(), "nothing beside the database");
        let [capture] = artifacts(&fallback).try_into().unwrap();
        assert_as_private_as(&capture, wal);
    }
}

test_alone! {
    fn a_torn_database_rebuilt_keeps_its_permissions_and_its_torn_copy_is_kept_as_privately() {
        set_umask(0o022);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let owner = is_root().then_some(NOBODY);
        empty_database(&path, 0o600, owner);
        // A loss while a reader held the checkpoint back: the main file is torn.
        let conn = open_guarded(&path);
        // The schema checkpointed first: the torn file still opens (the restarted process
        // below reads it).
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let (reader, _) = partly_checkpointed(&conn, &path, 10);
        let database = made(&path);
        lose_sidecars(&path, false);
        assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
        assert!(conn.guard_status().unwrap().main_torn);
        let artifact = conn.guard_status().unwrap().capture.unwrap();
        drop(reader);
        close_while_restarted(conn, &path);

        let capture = hermes_guard::recover::Capture::open(&artifact).unwrap();
        let report = hermes_guard::recover::rebuild_torn(
            &capture,
            &path,
            &hermes_guard::recover::MergeOptions::default(),
        )
        .unwrap();
        assert_eq!(made(&path), database, "the rebuilt file replaces the database");
        assert_eq!(
            made(&report.kept),
            Made { mode: 0o700, ..database },
            "the directory keeping the torn file"
        );
    }
}
