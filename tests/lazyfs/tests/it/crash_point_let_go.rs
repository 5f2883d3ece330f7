//! The two captures a connection makes when its database is taken from under it, through the
//! power-loss filesystem, the power cut before every durable step: the main file replaced by a
//! restore (`rename` of another file over the path; reason `main-replaced`), and the database's
//! directory deleted whole with the orphan capture directory set (the let-go at close). After each
//! crash no complete capture's manifest lies about its files, the live file passes
//! `integrity_check` through the guard, and once the guard has said the generation is captured (the
//! refusal, or the close returning) every acknowledged row is in a capture `verify` accepts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hermes_guard::manifest::HealState;
use hermes_guard::recover::{verify_capture, Capture};
use hermes_guard::RetireReason;
use hermes_guard_lazyfs::harness::{Enumeration, Point};
use rusqlite::{Connection, OpenFlags};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_crash-workload");

/// A WAL database with the table `t` at `db`, holding `rows` (checkpointed: no `-wal` left).
fn database(db: &Path, rows: &[i64]) {
    let conn = Connection::open(db).unwrap();
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .unwrap();
    for id in rows {
        conn.execute("INSERT INTO t(id, v) VALUES (?1, 'restored')", [id])
            .unwrap();
    }
}

fn ids(conn: &Connection) -> BTreeSet<i64> {
    let mut stmt = conn.prepare("SELECT id FROM t").unwrap();
    let rows = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

fn what(point: &Point<'_>) -> String {
    format!("{} ({:?}, {:?})", point.label, point.names, point.data)
}

/// `db` reopened through the guard: its rows, after `integrity_check`.
fn live_rows(point: &Point<'_>, db: &Path) -> BTreeSet<i64> {
    hermes_guard::register().unwrap();
    let what = what(point);
    let conn =
        Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME)
            .unwrap_or_else(|e| panic!("{what}: reopening failed: {e}"));
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{what}: integrity_check failed: {e}"));
    assert_eq!(check, "ok", "{what}");
    ids(&conn)
}

/// The complete captures in `dir` (no `.partial`).
fn captures(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.contains(".retired-wal-") && !name.ends_with(".partial") && p.is_dir()
        })
        .collect();
    found.sort();
    found
}

/// The rows of the complete captures in `dir`: each must verify (a healed one counts for
/// nothing), and have been taken for one of `reasons` (any, when none is given).
fn captured_rows(point: &Point<'_>, dir: &Path, reasons: &[RetireReason]) -> BTreeSet<i64> {
    let what = what(point);
    let mut rows = BTreeSet::new();
    for dir in captures(dir) {
        let check =
            verify_capture(&dir).unwrap_or_else(|e| panic!("{what}: {}: {e}", dir.display()));
        assert!(
            check.verified(),
            "{what}: {} lies about its files: {:?}",
            dir.display(),
            check.problems
        );
        assert!(
            reasons.is_empty() || check.manifest.reason.is_some_and(|r| reasons.contains(&r)),
            "{what}: {} was taken for {:?}",
            dir.display(),
            check.manifest.reason
        );
        if check.manifest.reason == Some(RetireReason::StaleWal) {
            // A stale WAL alone: its rows need the main file it was written on (`--main`).
            continue;
        }
        let capture =
            Capture::open(&dir).unwrap_or_else(|e| panic!("{what}: {}: {e}", dir.display()));
        if !matches!(capture.heal(), HealState::Healed { .. }) {
            rows.extend(ids(capture.connection()));
        }
    }
    rows
}

/// Whether a name operation `step` accepts is durable in the image, and a capture's rename into
/// place not.
fn before_the_capture(point: &Point<'_>, step: impl Fn(&str) -> bool) -> bool {
    point.durable(step)
        && !point.durable(|s| s.starts_with("rename ") && s.contains(".partial -> "))
}

/// Enumerates `scenario`'s crash states (with failing fsyncs and writes); `at_least`: the fewest
/// crash points it may have.
fn enumerate(
    template: impl Fn(&Path),
    scenario: &str,
    db: &str,
    at_least: usize,
    check: impl Fn(&Point<'_>),
) {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    std::fs::create_dir(&template_dir).unwrap();
    template(&template_dir);
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &[scenario],
        db,
    )
    .with_faults();
    let counts = runs.each_point(check).unwrap();
    counts.print(scenario);
    assert!(counts.points >= at_least, "{scenario}: {counts:?}");
}

/// The rows the workload acknowledged committing (-1 is the guard's acknowledgement that the
/// generation is captured).
fn acked_rows(point: &Point<'_>) -> Vec<i64> {
    point.acked.iter().copied().filter(|&id| id > 0).collect()
}

#[test]
fn crash_point_capture_of_a_replaced_main_file_keeps_the_retired_generation() {
    let template = |dir: &Path| {
        database(&dir.join("state.db"), &[]);
        database(&dir.join("restored.db"), &[1000]);
    };
    enumerate(template, "main-replaced", "state.db", 22, |point| {
        let what = what(point);
        let live = live_rows(point, &point.image.join("state.db"));
        // The reopen sets aside, as a stale WAL, a `-wal` of the retired generation that the
        // cut left beside the restored file (its truncation was not synced).
        let reasons = [RetireReason::MainReplaced, RetireReason::StaleWal];
        let captured = captured_rows(point, point.image, &reasons);
        let lost: Vec<i64> = if point.acked.contains(&-1) {
            // Refused and captured: the retired generation's rows are in the capture.
            acked_rows(point)
                .into_iter()
                .filter(|id| !captured.contains(id))
                .collect()
        } else {
            // The restore's rename, once durable, takes the retired generation with it until the
            // capture is in place: at once under journaled metadata, under POSIX names from the
            // next fsync of the directory on.
            let restore = "rename restored.db -> state.db";
            if before_the_capture(point, |s| s == restore) {
                return;
            }
            acked_rows(point)
                .into_iter()
                .filter(|id| !live.contains(id) && !captured.contains(id))
                .collect()
        };
        assert!(
            lost.is_empty(),
            "{what}: acknowledged rows {lost:?} are lost (live {live:?}, captured {captured:?})"
        );
        assert!(
            live.iter().all(|&id| id == 1000) || live.iter().all(|&id| id != 1000),
            "{what}: the restored file and the retired generation mixed: {live:?}"
        );
    });
}

#[test]
fn crash_point_let_go_to_the_orphan_directory_keeps_the_generation_there() {
    let template = |dir: &Path| {
        std::fs::create_dir(dir.join("d")).unwrap();
        std::fs::create_dir(dir.join("orphans")).unwrap();
        database(&dir.join("d/state.db"), &[]);
    };
    enumerate(template, "orphan", "d/state.db", 22, |point| {
        let what = what(point);
        let db = point.image.join("d/state.db");
        let live = if db.exists() {
            live_rows(point, &db)
        } else {
            BTreeSet::new()
        };
        let captured = captured_rows(point, &point.image.join("orphans"), &[]);
        let deleted =
            |s: &str| s == "unlink d/state.db-wal" || s == "unlink d/state.db" || s == "rmdir d";
        if !point.acked.contains(&-1) && before_the_capture(point, deleted) {
            // The directory's deletion, once durable (the WAL's or the main file's unlink, or the
            // directory's removal), takes the rows with it until the capture is in place.
            return;
        }
        let lost: Vec<i64> = acked_rows(point)
            .into_iter()
            .filter(|id| !live.contains(id) && !captured.contains(id))
            .collect();
        assert!(
            lost.is_empty(),
            "{what}: acknowledged rows {lost:?} are lost (live {live:?}, captured {captured:?})"
        );
        if point.acked.contains(&-1) {
            assert_eq!(captures(&point.image.join("orphans")).len(), 1, "{what}");
        }
    });
}
