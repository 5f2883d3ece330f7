//! SQLite's own promise kept under the guard: ordinary WAL commits and checkpoints through
//! `hermes-guard`, the power cut at every durable step. `synchronous=FULL`: every acknowledged
//! commit survives; `NORMAL`: the database is consistent, the last commits may go.

use std::path::Path;

use hermes_guard_lazyfs::harness::{Enumeration, Point};
use rusqlite::{Connection, OpenFlags};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_crash-workload");

/// A WAL database with the empty table `t`, in `dir/state.db`.
fn template(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    let conn = Connection::open(dir.join("state.db")).unwrap();
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .unwrap();
}

/// The image's rows, after `integrity_check` passed through the guard.
fn rows_of(point: &Point<'_>) -> Vec<i64> {
    hermes_guard::register().unwrap();
    let conn = Connection::open_with_flags_and_vfs(
        point.image.join("state.db"),
        OpenFlags::default(),
        hermes_guard::VFS_NAME,
    )
    .unwrap_or_else(|e| panic!("{}: reopening failed: {e}", point.label));
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        check, "ok",
        "{} ({:?}, {:?})",
        point.label, point.names, point.data
    );
    let mut stmt = conn.prepare("SELECT id FROM t ORDER BY id").unwrap();
    let rows = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// Enumerates `scenario`'s crash states; `at_least`: the fewest crash points it may have (fewer
/// means the write path lost durable steps).
fn enumerate(scenario: &str, at_least: usize, check: impl Fn(&Point<'_>, &[i64])) {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    template(&template_dir);
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &[scenario],
        "state.db",
    );
    let counts = runs
        .each_point(|point| {
            let rows = rows_of(point);
            let prefix: Vec<i64> = (1..=rows.len() as i64).collect();
            assert_eq!(
                rows, prefix,
                "{}: the surviving commits are not a prefix",
                point.label
            );
            check(point, &rows);
        })
        .unwrap();
    counts.print(scenario);
    assert!(counts.points >= at_least, "{scenario}: {counts:?}");
}

#[test]
fn crash_point_sqlite_full_keeps_every_acknowledged_commit() {
    enumerate("commits-full", 60, |point, rows| {
        let acked = point.acked.iter().max().copied().unwrap_or(0);
        assert!(
            rows.len() as i64 >= acked,
            "{} ({:?}, {:?}): {acked} acknowledged, {} survived",
            point.label,
            point.names,
            point.data,
            rows.len()
        );
    });
}

#[test]
fn crash_point_sqlite_normal_stays_consistent() {
    enumerate("commits-normal", 38, |_, _| {});
}
