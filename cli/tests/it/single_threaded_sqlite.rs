//! An `SQLITE_THREADSAFE=0` build has no mutex at all: the unix VFS's close edits its inode list
//! unguarded. `hermes_guard::retry_pending_captures()` from an application thread must then not
//! close a held main file (measured on cc1ba9f: it ran `unixClose` on that thread); the capture
//! is written there, and the close waits for SQLite's next open or close.
//!
//! rusqlite refuses such a build, so this drives SQLite through its C API. It runs only against
//! such a build: tests/unusual-sqlite-builds.sh compiles one and runs it (`--ignored`).

use crate::common;
use crate::file_layout::descriptors_on;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use common::*;
use rusqlite::ffi;

struct Db(*mut ffi::sqlite3);

impl Db {
    fn open(path: &Path) -> Db {
        let name = CString::new(path.as_os_str().as_bytes()).unwrap();
        let mut db = ptr::null_mut();
        // SAFETY: a NUL-terminated filename and VFS name, and an out-pointer.
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                name.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_CREATE,
                c"hermes-guard".as_ptr(),
            )
        };
        assert_eq!(rc, ffi::SQLITE_OK, "open {}", path.display());
        Db(db)
    }

    #[track_caller]
    fn exec(&self, sql: &str) {
        let sql = CString::new(sql).unwrap();
        // SAFETY: an open connection and a NUL-terminated statement; no callback.
        let rc = unsafe {
            ffi::sqlite3_exec(self.0, sql.as_ptr(), None, ptr::null_mut(), ptr::null_mut())
        };
        assert_eq!(rc, ffi::SQLITE_OK, "{sql:?}");
    }

    fn close(self) {
        // SAFETY: an open connection with no statement left (sqlite3_exec finalizes its own).
        assert_eq!(unsafe { ffi::sqlite3_close(self.0) }, ffi::SQLITE_OK);
    }
}

#[test]
#[ignore = "needs an SQLITE_THREADSAFE=0 build: tests/unusual-sqlite-builds.sh"]
fn a_retry_from_an_application_thread_leaves_the_held_files_close_to_sqlite() {
    // SAFETY: returns a compile-time constant.
    let threadsafe = unsafe { ffi::sqlite3_threadsafe() };
    assert_eq!(threadsafe, 0, "not a THREADSAFE=0 build");
    hermes_guard::register().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let db = Db::open(&path);
    db.exec("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t (x);");
    db.exec("INSERT INTO t VALUES ('history'); PRAGMA wal_checkpoint(TRUNCATE);");
    db.exec("INSERT INTO t VALUES ('committed only in the retired WAL');");
    let main = identity(&path).ino;
    hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");
    lose_sidecars(&path, false);
    db.close();
    assert!(descriptors_on(main) >= 1, "the retired main file is held");

    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    let left = std::thread::spawn(hermes_guard::retry_pending_captures)
        .join()
        .unwrap();
    assert_eq!(left, 0, "captured from the application's thread");
    assert_eq!(artifacts(dir.path()).len(), 1);
    assert!(
        descriptors_on(main) >= 1,
        "the held file's close waits for SQLite's next call"
    );

    Db::open(&dir.path().join("other.db")).close();
    assert_eq!(descriptors_on(main), 0, "closed inside SQLite's next open");
}
