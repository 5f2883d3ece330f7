//! What a guarded database costs in descriptors, against stock. Counted from `/proc/self/fd`,
//! process-wide, so each test runs in a process of its own.

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::common::*;

/// Databases each in a directory of its own, as a test suite or a per-tenant server has them.
const DATABASES: usize = 40;

/// The targets of every descriptor this process has open.
fn open_descriptors() -> Vec<PathBuf> {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .collect()
}

/// Opens `DATABASES` WAL databases, each in its own directory under `base`, with one write each
/// (so the WAL and the `-shm` are open), and returns them left open.
fn open_many(base: &Path, open: fn(&Path) -> Connection) -> Vec<Connection> {
    (0..DATABASES)
        .map(|i| {
            let dir = base.join(format!("tenant-{i}"));
            fs::create_dir(&dir).unwrap();
            let conn = open(&dir.join("state.db"));
            insert(&conn, "hello").unwrap();
            conn
        })
        .collect()
}

/// Opens and closes one guarded database first, so the process-wide descriptors (the watcher's
/// inotify, epoll and mountinfo) exist before anything is counted.
fn warm_up(base: &Path) {
    let dir = base.join("warm-up");
    fs::create_dir(&dir).unwrap();
    let conn = open_guarded(&dir.join("state.db"));
    insert(&conn, "warm").unwrap();
    drop(conn);
}

test_alone! {
    fn each_guarded_wal_is_open_once_as_stock_has_it() {
        let base = tempfile::tempdir().unwrap();
        warm_up(base.path());
        let conns = open_many(base.path(), open_guarded);
        let wal_descriptors = open_descriptors()
            .iter()
            .filter(|t| t.as_os_str().to_string_lossy().ends_with("state.db-wal"))
            .count();
        drop(conns);
        assert_eq!(wal_descriptors, DATABASES, "one descriptor per WAL: SQLite's own");
    }
}

test_alone! {
    fn a_retired_wal_outlives_sqlites_descriptor_through_a_dup_of_the_guards() {
        let base = tempfile::tempdir().unwrap();
        let db = base.path().join("state.db");
        let conn = open_guarded(&db);
        let sentinel = wal_only_sentinel(&conn);
        lose_sidecars(&db, false);
        assert!(insert(&conn, "refused").is_err_and(|e| is_refusal(&e)));
        let holding_wal = || {
            open_descriptors()
                .iter()
                .filter(|t| t.as_os_str().to_string_lossy().contains("state.db-wal"))
                .count()
        };
        assert_eq!(holding_wal(), 2, "SQLite's descriptor and the guard's dup");
        drop(conn);
        assert_eq!(holding_wal(), 0, "captured: nothing held past the close");
        let captured = artifacts(base.path());
        assert_eq!(captured.len(), 1);
        let restored = recover(&captured[0], "state.db", &base.path().join("restored"));
        assert_eq!(count_like(&restored, &sentinel), 1);
    }
}

test_alone! {
    fn databases_each_in_its_own_directory_cost_what_stock_costs() {
        let base = tempfile::tempdir().unwrap();
        warm_up(base.path());
        let stock_base = base.path().join("stock");
        let guarded_base = base.path().join("guarded");
        fs::create_dir(&stock_base).unwrap();
        fs::create_dir(&guarded_base).unwrap();
        let before = open_descriptors().len();
        let stock = open_many(&stock_base, open_stock);
        let with_stock = open_descriptors().len();
        let guarded = open_many(&guarded_base, open_guarded);
        let with_both = open_descriptors().len();
        drop((stock, guarded));
        assert_eq!(
            with_both - with_stock,
            with_stock - before,
            "{DATABASES} guarded databases against {DATABASES} stock ones"
        );
        assert_eq!(with_stock - before, 3 * DATABASES, "stock: main, WAL, -shm each");
    }
}
