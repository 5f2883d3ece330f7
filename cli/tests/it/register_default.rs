//! `register_as_default()` makes every plain open guarded. It runs alone, in a process of its own
//! (`test_alone!`): the default VFS is process-wide.

use hermes_guard::GuardExt;
use rusqlite::Connection;

test_alone! {
    fn register_as_default_guards_plain_opens_and_wraps_the_previous_default() {
        hermes_guard::register_as_default().unwrap();
        // Registering again must not wrap the guard in itself.
        hermes_guard::register().unwrap();
        hermes_guard::register_as_default().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("default.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        let status = conn.guard_status().unwrap();
        assert!(!status.retired);
        assert!(status.wal.is_some(), "the WAL is pinned");
        assert!(status.main.is_some(), "the main file is pinned");

        // An explicit unix open still bypasses the guard.
        let stock =
            Connection::open_with_flags_and_vfs(&path, rusqlite::OpenFlags::default(), "unix").unwrap();
        assert!(stock.guard_status().is_err());
    }
}
