//! Where the wrapped file object lives: in SQLite's buffer over the unix VFS (moved to the heap
//! when a retired main file must outlive SQLite's close), on the heap over any other VFS. Each
//! test runs alone, in a process of its own (`test_alone!`): the default VFS and the
//! pending-capture list are process-wide.

use crate::common;

use std::ffi::CStr;
use std::path::{Path, PathBuf};

use common::*;
use rusqlite::ffi;

/// Drops `conn` while no capture can be written beside `dir`'s database (the guard holds its
/// retired generation), then lets the capture through; returns the one capture.
#[track_caller]
fn held_at_close_then_captured(conn: rusqlite::Connection, dir: &Path) -> PathBuf {
    hermes_guard::test_hooks::inject_capture_fault(dir, "no space left on device");
    drop(conn);
    assert!(artifacts(dir).is_empty());
    assert_eq!(
        hermes_guard::retry_pending_captures(),
        1,
        "the generation is held"
    );
    hermes_guard::test_hooks::clear_capture_fault(dir);
    assert_eq!(hermes_guard::retry_pending_captures(), 0, "captured");
    let found = artifacts(dir);
    assert_eq!(found.len(), 1);
    found.into_iter().next().expect("one capture")
}

test_alone! {
    memcheck fn a_replaced_main_file_held_past_its_close_is_captured_from_the_moved_file_object() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        let sentinel = wal_only_sentinel(&conn);
        // Into the main file: a restore tool leaves an empty WAL (see main_replaced.rs).
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let old_main = std::fs::read(&path).unwrap();
        replace_main_file(&path);
        // The restored file moves on; the old main image is reachable only through the guarded
        // connection's descriptor from here on.
        let fresh = open_stock(&path);
        insert(&fresh, "written after the restore").unwrap();
        fresh
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();

        // The close finds the main file replaced and cannot capture: SQLite frees the file
        // object's memory, the guard keeps the unix file (moved to the heap).
        let capture = held_at_close_then_captured(conn, dir.path());
        let manifest = manifest(&capture);
        assert_eq!(manifest["main"]["mode"], "copied");
        let captured_main = std::fs::read(capture.join("state.db")).unwrap();
        assert_same_bytes(&captured_main, &old_main, "captured main image");
        let recovered = recover(&capture, "state.db", &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
        assert_eq!(count_like(&recovered, "written after the restore"), 0);
        assert!(integrity_ok(&recovered));
        drop(fresh);
    }
}

type OpenFn = unsafe extern "C" fn(
    *mut ffi::sqlite3_vfs,
    ffi::sqlite3_filename,
    *mut ffi::sqlite3_file,
    std::ffi::c_int,
    *mut std::ffi::c_int,
) -> std::ffi::c_int;

/// Registers a copy of SQLite's unix VFS named `name` (with `open` as its `xOpen`, if given) and
/// makes it the default, as a host with a VFS of its own would have it.
fn register_a_default_copy_of_unix(name: &'static CStr, open: Option<OpenFn>) {
    // SAFETY: SQLite's own unix VFS lives for the process; the copy is leaked (SQLite keeps
    // pointers to it) and differs only in its name, its list link and (if given) its xOpen.
    unsafe {
        let unix = ffi::sqlite3_vfs_find(c"unix".as_ptr());
        assert!(!unix.is_null());
        REAL_UNIX.store(unix, std::sync::atomic::Ordering::Release);
        let copy = Box::leak(Box::new(*unix));
        copy.zName = name.as_ptr();
        copy.pNext = std::ptr::null_mut();
        if open.is_some() {
            copy.xOpen = open;
        }
        assert_eq!(ffi::sqlite3_vfs_register(copy, 1), ffi::SQLITE_OK);
    }
}

/// A copy of the unix VFS under a name outside the unix family: the heap layout, with objects
/// the guard can check.
fn register_a_default_vfs_outside_the_unix_family() {
    register_a_default_copy_of_unix(c"plain-copy", None);
}

test_alone! {
    fn over_a_vfs_outside_the_unix_family_every_method_is_wrapped_and_a_loss_is_still_caught() {
        register_a_default_vfs_outside_the_unix_family();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        // SAFETY: the guard's registered VFS lives for the process.
        let guard_file_size = unsafe { (*ffi::sqlite3_vfs_find(c"hermes-guard".as_ptr())).szOsFile };
        assert_eq!(
            guard_file_size as usize,
            std::mem::size_of::<ffi::sqlite3_file>(),
            "over another VFS, SQLite's buffer holds only the header: the wrapped file is on the heap"
        );
        // Ordinary transactions and a checkpoint never trip it.
        for i in 0..200 {
            insert(&conn, &format!("row {i}")).unwrap();
        }
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        assert!(!conn.guard_status().unwrap().retired);

        let sentinel = wal_only_sentinel(&conn);
        let wal_id = identity(&sidecar(&path, "-wal"));
        lose_sidecars(&path, false);
        let before = descriptor_contents(wal_id);
        let recovered = refused_and_recovered(conn, wal_id, &before, &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
        assert_eq!(count_like(&recovered, "row %"), 200);
        assert!(integrity_ok(&recovered));
    }
}

test_alone! {
    memcheck fn over_a_vfs_outside_the_unix_family_a_held_main_file_is_captured_later() {
        register_a_default_vfs_outside_the_unix_family();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        let sentinel = wal_only_sentinel(&conn);
        lose_sidecars(&path, false);
        let capture = held_at_close_then_captured(conn, dir.path());
        let recovered = recover(&capture, "state.db", &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
        assert!(integrity_ok(&recovered));
    }
}

test_alone! {
    memcheck fn a_main_file_renamed_away_and_held_past_its_close_is_captured_and_closed_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        let sentinel = wal_only_sentinel(&conn);
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        // Renamed away, not unlinked: the old inode keeps a name, so the unix VFS's close
        // checks it by its path (the filename SQLite freed with the connection, unless the
        // guard gave the held file a copy of its own).
        std::fs::rename(&path, dir.path().join("state.db.moved-away")).unwrap();
        std::fs::copy(dir.path().join("state.db.moved-away"), &path).unwrap();

        let capture = held_at_close_then_captured(conn, dir.path());
        let recovered = recover(&capture, "state.db", &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
        assert!(integrity_ok(&recovered));
        // The held descriptor is gone with the close: no descriptor of this process is left on
        // the moved-away inode.
        let moved = identity(&dir.path().join("state.db.moved-away"));
        assert_eq!(
            descriptors_on(moved.ino),
            0,
            "the held main file was closed after its capture"
        );
    }
}

/// The unix VFS in disguise: a copy whose `xOpen` hands the real unix VFS to the unix open, so
/// its file objects name another VFS than the one that opened them, as a host's own VFS would
/// have objects the guard cannot check.
static REAL_UNIX: std::sync::atomic::AtomicPtr<ffi::sqlite3_vfs> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

unsafe extern "C" fn open_through_the_real_unix(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: std::ffi::c_int,
    out_flags: *mut std::ffi::c_int,
) -> std::ffi::c_int {
    let unix = REAL_UNIX.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: SQLite's arguments, passed on to SQLite's own unix VFS (registered for the
    // process, stored before this VFS was registered).
    unsafe { ((*unix).xOpen.expect("unix has xOpen"))(unix, name, file, flags, out_flags) }
}

fn register_a_default_vfs_the_guard_cannot_see_into() {
    register_a_default_copy_of_unix(c"foreign-shaped", Some(open_through_the_real_unix));
}

/// How many of this process's descriptors are open on the inode `ino`.
pub(crate) fn descriptors_on(ino: u64) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::metadata(e.path())
                .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == ino)
        })
        .count()
}

test_alone! {
    memcheck fn a_held_main_file_of_a_vfs_the_guard_cannot_see_into_is_captured_and_left_open() {
        register_a_default_vfs_the_guard_cannot_see_into();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        let sentinel = wal_only_sentinel(&conn);
        let main_ino = identity(&path).ino;
        lose_sidecars(&path, false);
        let capture = held_at_close_then_captured(conn, dir.path());
        let recovered = recover(&capture, "state.db", &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
        assert!(integrity_ok(&recovered));
        drop(recovered);
        // Its close could read the filename SQLite freed: the held file is left open.
        assert_eq!(descriptors_on(main_ino), 1, "the held main file stays open");
    }
}

/// What `PRAGMA journal_mode=WAL` answers on `path` through `vfs`.
fn journal_mode_wal(path: &Path, vfs: &str) -> String {
    let conn =
        rusqlite::Connection::open_with_flags_and_vfs(path, rusqlite::OpenFlags::default(), vfs)
            .unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap()
}

test_alone! {
    /// Measured: over `unix-none` (no shared memory: `xShmMap` is NULL) the guard installed its
    /// own `xShmMap`; `journal_mode=WAL` answered "wal" where stock answers "delete", the first
    /// write failed with SQLITE_IOERR_SHMMAP and `unix-none` could no longer open the file.
    fn over_unix_none_a_database_stays_out_of_wal_mode_as_on_stock() {
        // SAFETY: `unix-none` is one of SQLite's own VFSes, registered for the process's life;
        // re-registering it with makeDflt=1 only relinks it at the head.
        unsafe {
            let none = ffi::sqlite3_vfs_find(c"unix-none".as_ptr());
            assert!(!none.is_null());
            assert_eq!(ffi::sqlite3_vfs_register(none, 1), ffi::SQLITE_OK);
        }
        hermes_guard::register().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let stock_path = dir.path().join("stock.db");
        let path = dir.path().join("state.db");

        assert_eq!(journal_mode_wal(&stock_path, "unix-none"), "delete");
        assert_eq!(journal_mode_wal(&path, hermes_guard::VFS_NAME), "delete");

        let conn = rusqlite::Connection::open_with_flags_and_vfs(
            &path,
            rusqlite::OpenFlags::default(),
            hermes_guard::VFS_NAME,
        )
        .unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1), (2), (3);")
            .unwrap();
        drop(conn);

        let plain = rusqlite::Connection::open_with_flags_and_vfs(
            &path,
            rusqlite::OpenFlags::default(),
            "unix-none",
        )
        .unwrap();
        let rows: i64 = plain
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 3);
    }
}

test_alone! {
    /// A VFS that took the name `unix` but opens files its own way: the shield is off, and the
    /// reason names the SQLite the process runs on (`sqlite3_libversion`), not the version the
    /// bindings were compiled against (measured on cc1ba9f: an extension host's WARN named the
    /// compile-time version).
    fn the_shield_off_reason_names_the_running_sqlite_version() {
        register_a_default_copy_of_unix(c"unix", Some(open_through_the_real_unix));
        hermes_guard::register().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let conn = open_guarded(&dir.path().join("state.db"));
        insert(&conn, "a row").unwrap();
        let status = conn.guard_status().unwrap();
        let reason = status.shield_off_reason.unwrap_or_default();
        assert!(
            reason.contains(&format!("SQLite {}", rusqlite::version())),
            "{reason}"
        );
    }
}
