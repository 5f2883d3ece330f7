//! The guard's retirement and capture events reach SQLite's own error log (`sqlite3_log`): a
//! program that configured `SQLITE_CONFIG_LOG` and no `log` logger sees them.

use crate::common;

use common::*;
use rusqlite::ffi;

static SEEN: parking_lot::Mutex<Vec<(i32, String)>> = parking_lot::Mutex::new(Vec::new());

fn sink(code: std::ffi::c_int, message: &str) {
    SEEN.lock().push((code, message.to_owned()));
}

test_alone! {
    fn the_retirement_and_the_capture_reach_sqlite3_log() {
        // SAFETY: this process runs this one test on one thread, before anything in it used
        // SQLite: SQLITE_CONFIG_LOG is set before sqlite3_initialize, as SQLite requires.
        unsafe { rusqlite::trace::config_log(Some(sink)) }.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        checkpointed_history(&conn);
        insert(&conn, "retired 0").unwrap();
        assert!(
            !SEEN.lock().iter().any(|(_, m)| m.starts_with("hermes-guard")),
            "nothing from the guard before the loss: {:?}",
            SEEN.lock()
        );
        lose_sidecars(&path, false);
        assert!(is_refusal(&insert(&conn, "after").unwrap_err()));
        let capture = conn.guard_status().unwrap().capture.unwrap();
        hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

        let seen = SEEN.lock().clone();
        let retired = format!(
            "hermes-guard: {} is retired for this connection: the -wal file",
            path.display()
        );
        let retirements: Vec<_> = seen
            .iter()
            .filter(|(_, m)| m.starts_with(&retired) && m.ends_with("writes to it are refused"))
            .collect();
        assert_eq!(retirements.len(), 1, "{seen:?}");
        assert_eq!(retirements[0].0, ffi::SQLITE_READONLY_DBMOVED, "{seen:?}");
        let captured = format!(
            "hermes-guard: captured the retired generation of {} into {}",
            path.display(),
            capture.display()
        );
        assert!(
            seen.iter().any(|(c, m)| *c == ffi::SQLITE_WARNING && *m == captured),
            "{seen:?}"
        );
    }
}

test_alone! {
    fn the_wal_reset_tripwire_reaches_sqlite3_log() {
        // SAFETY: as above: one test, one thread, before anything in this process used SQLite.
        unsafe { rusqlite::trace::config_log(Some(sink)) }.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
        insert(&conn, "one").unwrap();
        let log: u32 = conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
            .unwrap();
        // The race's damage, made by hand: nBackfill (offset 96 of the wal-index) past mxFrame.
        let shm = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("state.db-shm"))
            .unwrap();
        std::os::unix::fs::FileExt::write_at(&shm, &(log + 5).to_ne_bytes(), 96).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .unwrap();
        let seen = SEEN.lock().clone();
        let alarm = format!("hermes-guard: the wal-index of {} says", path.display());
        assert!(
            seen.iter().any(|(c, m)| *c == ffi::SQLITE_CORRUPT && m.starts_with(&alarm)),
            "{seen:?}"
        );
    }
}
