//! The guard's own write paths through the power-loss filesystem, the power cut before every
//! durable step: after each crash every acknowledged row is live or in a capture `verify`
//! accepts (one whose `healed.json` says healed counts only as live), no complete capture's
//! manifest lies about its files, the live file passes `integrity_check` through the guard, and
//! `recover --apply` of the captures then leaves every acknowledged row live.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hermes_guard::manifest::HealState;
use hermes_guard::recover::{verify_capture, Capture};
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

fn ids(conn: &Connection) -> BTreeSet<i64> {
    let mut stmt = conn.prepare("SELECT id FROM t").unwrap();
    let rows = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// The image reopened through the guard (as the application would after the reboot): its rows,
/// after `integrity_check`.
fn live_rows(point: &Point<'_>) -> BTreeSet<i64> {
    hermes_guard::register().unwrap();
    let what = format!("{} ({:?}, {:?})", point.label, point.names, point.data);
    let conn = Connection::open_with_flags_and_vfs(
        point.image.join("state.db"),
        OpenFlags::default(),
        hermes_guard::VFS_NAME,
    )
    .unwrap_or_else(|e| panic!("{what}: reopening failed: {e}"));
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{what}: integrity_check failed: {e}"));
    assert_eq!(check, "ok", "{what}");
    // A row merged twice under another id would show as its content twice (the workloads' rows
    // hold their id, 1,500 digits wide).
    let twice: Vec<String> = conn
        .prepare(
            "SELECT substr(v, -8) FROM t WHERE length(v) = 1500 GROUP BY v HAVING COUNT(*) > 1",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(twice.is_empty(), "{what}: rows there twice: {twice:?}");
    ids(&conn)
}

/// The complete captures beside the database (no `.partial`).
fn captures(image: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(image)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.contains(".retired-wal-") && !name.ends_with(".partial") && p.is_dir()
        })
        .collect();
    found.sort();
    found
}

/// The rows recoverable from the complete captures: each must verify, and one healed counts
/// for nothing (`recover` merges nothing from it).
fn captured_rows(point: &Point<'_>) -> BTreeSet<i64> {
    let what = format!("{} ({:?}, {:?})", point.label, point.names, point.data);
    let mut rows = BTreeSet::new();
    for dir in captures(point.image) {
        let check =
            verify_capture(&dir).unwrap_or_else(|e| panic!("{what}: {}: {e}", dir.display()));
        assert!(
            check.verified(),
            "{what}: {} lies about its files: {:?}",
            dir.display(),
            check.problems
        );
        let capture =
            Capture::open(&dir).unwrap_or_else(|e| panic!("{what}: {}: {e}", dir.display()));
        // A cut never leaves a heal that the durable facts (the staging file, the `-wal` of the
        // recorded length and sha256, the main file's pages) cannot place.
        assert!(
            !matches!(capture.heal(), HealState::Undetermined { .. }),
            "{what}: {}: {}",
            dir.display(),
            capture.heal().describe()
        );
        if matches!(capture.heal(), HealState::Healed { .. }) {
            continue;
        }
        rows.extend(ids(capture.connection()));
    }
    rows
}

/// Enumerates `scenario`'s crash states (with failing fsyncs and writes); `at_least`: the fewest
/// crash points it may have.
fn enumerate(scenario: &str, at_least: usize, check: impl Fn(&Point<'_>)) {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    template(&template_dir);
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &[scenario],
        "state.db",
    )
    .with_faults()
    .with_reboot();
    let counts = runs.each_point(check).unwrap();
    counts.print(scenario);
    assert!(counts.points >= at_least, "{scenario}: {counts:?}");
}

/// A capture's rename into place.
fn capture_rename(step: &str) -> bool {
    step.starts_with("rename ") && step.contains(".partial -> ")
}

/// The cleanup's unlink of `state.db-wal` durable in the image, the capture's rename into place
/// not.
fn in_the_unlinked_window(point: &Point<'_>) -> bool {
    point.durable(|s| s == "unlink state.db-wal") && !point.durable(capture_rename)
}

/// The heal's commit point durable in the image: its staging file renamed to `state.db-wal`, and
/// not back (the heal rolls back so when the directory's fsync after the rename fails).
fn heal_committed(point: &Point<'_>) -> bool {
    point.durable(|s| {
        s.starts_with("rename state.db-wal.hermes-guard-heal-") && s.ends_with(" -> state.db-wal")
    }) && !point
        .durable(|s| s.starts_with("rename state.db-wal -> state.db-wal.hermes-guard-heal-"))
}

/// Every acknowledged row is live or in a capture `verify` accepts — except when the cleanup's
/// unlink of the `-wal` is durable in the image and the capture's rename into place is not (at
/// once under journaled metadata, `Names::Ordered`; in a reordered state that kept the unlink):
/// the rows are then in an unlinked file only, which a power cut takes as a `kill -9` would. Under
/// `Names::Strict` that unlink is undone by the cut until the capture's directory fsync, which
/// makes both durable together. A heal whose commit point is durable reads healed in its capture
/// (else `recover` would merge its rows a second time).
fn no_acknowledged_row_lost(point: &Point<'_>) {
    let live = live_rows(point);
    let captured = captured_rows(point);
    if heal_committed(point) {
        for dir in captures(point.image) {
            let capture = Capture::open(&dir).unwrap();
            assert!(
                capture.heal().is_healed(),
                "{}: the heal's commit point is durable and the capture reads {:?}",
                point.what(),
                capture.heal()
            );
        }
    }
    if in_the_unlinked_window(point) {
        return;
    }
    let lost: Vec<i64> = point
        .acked
        .iter()
        .filter(|id| !live.contains(id) && !captured.contains(id))
        .copied()
        .collect();
    assert!(
        lost.is_empty(),
        "{} ({:?}, {:?}): acknowledged rows {lost:?} are neither live ({live:?}) nor captured ({captured:?})",
        point.label,
        point.names,
        point.data
    );
    // recover --apply of every complete capture, twice: it succeeds, and the acknowledged rows
    // are then all live, each once (a healed capture merges nothing: its rows are already
    // there; a row merged twice would come back under a fresh id outside both sets).
    for _ in 0..2 {
        for dir in captures(point.image) {
            let capture = Capture::open(&dir).unwrap();
            let options = hermes_guard::recover::MergeOptions::default();
            hermes_guard::recover::apply(
                &capture,
                &point.image.join("state.db"),
                &options,
                &mut |_| {},
            )
            .unwrap_or_else(|e| panic!("{}: recover --apply {}: {e}", point.label, dir.display()));
        }
    }
    let after = live_rows(point);
    assert!(
        point.acked.iter().all(|id| after.contains(id)),
        "{} ({:?}, {:?}): after recover --apply: {after:?}",
        point.label,
        point.names,
        point.data
    );
    let once: BTreeSet<i64> = live.union(&captured).copied().collect();
    assert!(
        after.is_subset(&once),
        "{} ({:?}, {:?}): after recover --apply, rows merged twice: {:?}",
        point.label,
        point.names,
        point.data,
        after.difference(&once).collect::<Vec<_>>()
    );
}

#[test]
fn crash_point_capture_and_heal_at_close_lose_no_acknowledged_row() {
    enumerate("lost-wal", 34, no_acknowledged_row_lost);
}

/// `dir/state.db` restored from a copy holding rows 1 to 5, and beside it the WAL of a writer
/// killed after committing rows 11 to 15 on the database as it was before the restore (rows 1 to
/// 8, checkpointed): a stale WAL. Returns that WAL's bytes.
fn template_with_stale_wal(dir: &Path) -> Vec<u8> {
    template(dir);
    let db = dir.join("state.db");
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch("INSERT INTO t(id, v) SELECT value, 'restored' FROM generate_series(1, 5)")
        .unwrap_or_else(|_| {
            for id in 1..=5 {
                conn.execute("INSERT INTO t(id, v) VALUES (?1, 'restored')", [id])
                    .unwrap();
            }
        });
    drop(conn);
    let backup = dir.with_extension("backup");
    std::fs::copy(&db, &backup).unwrap();
    let conn = Connection::open(&db).unwrap();
    for id in 6..=8 {
        conn.execute("INSERT INTO t(id, v) VALUES (?1, 'later')", [id])
            .unwrap();
    }
    drop(conn);
    let status = std::process::Command::new(WORKLOAD)
        .args([
            "write-and-die",
            db.to_str().unwrap(),
            dir.with_extension("acks").to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(!status.success(), "the writer was killed");
    std::fs::copy(&backup, &db).unwrap();
    std::fs::read(dir.join("state.db-wal")).expect("the killed writer's WAL")
}

#[test]
fn crash_point_stale_wal_set_aside_keeps_the_stale_wal_whole() {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    let stale = template_with_stale_wal(&template_dir);
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &["open-stale"],
        "state.db",
    )
    .with_faults();
    let full = runs.run(None).unwrap();
    assert!(
        full.steps
            .iter()
            .any(|s| s.starts_with("link state.db-wal -> ")
                || s.starts_with("rename state.db-wal -> ")),
        "the open did not set the stale WAL aside: {:?}",
        full.steps
    );
    // The capture's rename is made durable (the directory fsynced) before the WAL leaves the path:
    // a disk that kept the unlink and not the rename would hold the stale WAL nowhere (the
    // reordered states show it too; the four images of a cut cannot).
    let renamed = full.steps.iter().position(|s| capture_rename(s));
    let unlinked = full.steps.iter().position(|s| s == "unlink state.db-wal");
    let (Some(renamed), Some(unlinked)) = (renamed, unlinked) else {
        panic!(
            "the set-aside's rename or unlink is missing: {:?}",
            full.steps
        );
    };
    assert!(
        full.steps[renamed..unlinked]
            .iter()
            .any(|s| s == "fsyncdir ."),
        "the WAL left the path before the set-aside's rename was durable: {:?}",
        full.steps
    );
    let counts = runs
        .each_point(|point| {
            let what = format!("{} ({:?}, {:?})", point.label, point.names, point.data);
            let live = live_rows(point);
            assert!(
                point.acked.iter().all(|id| live.contains(id)),
                "{what}: {live:?}"
            );
            let at_path = std::fs::read(point.image.join("state.db-wal")).ok();
            let in_capture = captures(point.image).into_iter().any(|dir| {
                let check = verify_capture(&dir).unwrap();
                assert!(
                    check.verified(),
                    "{what}: {} lies: {:?}",
                    dir.display(),
                    check.problems
                );
                std::fs::read(dir.join(&check.manifest.wal.file))
                    .ok()
                    .as_ref()
                    == Some(&stale)
            });
            assert!(
                in_capture || at_path.as_ref() == Some(&stale),
                "{what}: the stale WAL is neither at the path nor in a complete capture"
            );
        })
        .unwrap();
    counts.print("open-stale");
    assert!(counts.points >= 18, "{counts:?}");
}

/// `dir/state.db` live with row 50 (a newer generation) and beside it the capture of rows 1 to 6
/// (lost with their `-wal`, not healed).
fn template_with_capture(dir: &Path) {
    template(dir);
    let status = std::process::Command::new(WORKLOAD)
        .args([
            "lose-to-newer",
            dir.join("state.db").to_str().unwrap(),
            dir.with_extension("acks").to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(captures(dir).len(), 1);
}

/// `recover --apply`'s merge again, to the end, on the image: what it inserted.
fn apply_again(image: &Path) -> u64 {
    let capture = Capture::open(&captures(image)[0]).unwrap();
    let options = hermes_guard::recover::MergeOptions::default();
    let report =
        hermes_guard::recover::apply(&capture, &image.join("state.db"), &options, &mut |_| {})
            .unwrap();
    report.inserted()
}

#[test]
fn crash_point_recover_apply_merges_each_row_once() {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    template_with_capture(&template_dir);
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &["apply"],
        "state.db",
    )
    .with_faults();
    let expected: BTreeSet<i64> = (1..=6).chain([50]).collect();
    let counts = runs
        .each_point(|point| {
            let what = format!("{} ({:?}, {:?})", point.label, point.names, point.data);
            let live = live_rows(point);
            let missing = expected.difference(&live).count() as u64;
            if point.acked.contains(&0) {
                assert_eq!(
                    missing, 0,
                    "{what}: the merge returned OK and then was lost: {live:?}"
                );
            }
            assert!(live.is_subset(&expected), "{what}: {live:?}");
            assert!(
                live.contains(&50),
                "{what}: the newer generation's row is gone: {live:?}"
            );
            let captured = captured_rows(point);
            assert!(
                expected
                    .iter()
                    .all(|id| live.contains(id) || captured.contains(id)),
                "{what}"
            );
            assert_eq!(
                apply_again(point.image),
                missing,
                "{what}: the merge again inserted other than what was missing"
            );
            assert_eq!(live_rows(point), expected, "{what}: after the merge again");
        })
        .unwrap();
    counts.print("apply");
    assert!(counts.points >= 6, "{counts:?}");
}

/// The recovery after a cut in the capture or the heal at close, itself cut: the next open (its
/// set-aside of a WAL it does not trust), a commit, the close, `recover --apply` of every capture
/// (`reopen-and-recover`), the power cut before each of its durable steps. Then a second recovery
/// (`recover --apply` of every capture again) leaves every row the first cut left recoverable live,
/// and row 100 once its commit returned.
#[test]
fn crash_point_during_recovery_a_second_cut_loses_no_recoverable_row() {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    template(&template_dir);
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &["lost-wal"],
        "state.db",
    );
    let recoverable = |first: &Point<'_>| {
        let mut rows = live_rows(first);
        rows.extend(captured_rows(first));
        rows
    };
    let states = runs
        .during_recovery(
            "reopen-and-recover",
            ".partial -> ",
            5,
            recoverable,
            |required, point| {
                let what = point.what();
                let before = live_rows(point);
                if point.acked.contains(&0) {
                    assert!(
                        required.is_subset(&before),
                        "{what}: the recovery returned OK: {before:?}"
                    );
                }
                for dir in captures(point.image) {
                    let capture = Capture::open(&dir).unwrap();
                    if capture.manifest().reason == Some(hermes_guard::RetireReason::StaleWal) {
                        continue;
                    }
                    let options = hermes_guard::recover::MergeOptions::default();
                    let db = point.image.join("state.db");
                    hermes_guard::recover::apply(&capture, &db, &options, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{what}: the second recover --apply: {e}"));
                }
                let after = live_rows(point);
                let mut wanted = required.clone();
                if point.acked.contains(&100) {
                    wanted.insert(100);
                }
                assert!(
                    wanted.is_subset(&after),
                    "{what}: after the second recovery {after:?}, wanted {wanted:?}"
                );
            },
        )
        .unwrap();
    println!("lost-wal then reopen-and-recover: {states} crash states (during recovery)");
    assert!(states >= 40, "{states}");
}
