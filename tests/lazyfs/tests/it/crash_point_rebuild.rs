//! `hermes-guard recover <capture> --into <db> --rebuild --apply` through the power-loss
//! filesystem, the power cut before every durable step: after each crash the live database at the
//! path passes `integrity_check` through the guard and is either the torn file as it was or the
//! rebuilt one, the torn file is kept where the command puts it (`state.db.torn-*/`) whenever it
//! has left the path, and `recover --apply` afterwards merges exactly the rows still missing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hermes_guard::recover::{verify_capture, Capture, MergeOptions};
use hermes_guard::GuardExt;
use hermes_guard_lazyfs::harness::{Enumeration, Point};
use rusqlite::{Connection, OpenFlags};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_crash-workload");

fn guarded(db: &Path) -> Connection {
    hermes_guard::register().unwrap();
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME).unwrap()
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

fn insert(conn: &Connection, id: i64) -> rusqlite::Result<usize> {
    conn.execute(
        "INSERT INTO t(id, v) VALUES (?1, printf('%01500d', ?1))",
        [id],
    )
}

/// The entries of `dir` whose name contains `part` (no `.partial`).
fn named(dir: &Path, part: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.contains(part) && !name.ends_with(".partial") && p.is_dir()
        })
        .collect();
    found.sort();
    found
}

/// `dir/state.db` left torn (cli/tests/it/torn_main.rs): rows 1 to 20 committed, a reader holding
/// the checkpoint back to row 10, the `-wal` and `-shm` lost, the generation captured with
/// `main_torn`, then a newer generation (row 50, another process) on the torn file.
fn template_torn(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    let db = dir.join("state.db");
    Connection::open(&db)
        .unwrap()
        .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);")
        .unwrap();
    let conn = guarded(&db);
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;")
        .unwrap();
    for id in 1..=10 {
        insert(&conn, id).unwrap();
    }
    let reader = Connection::open(&db).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .unwrap();
    for id in 11..=20 {
        insert(&conn, id).unwrap();
    }
    let (log, done): (i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert!(
        done > 0 && done < log,
        "partly checkpointed: {done} of {log}"
    );
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(dir.join(format!("state.db{suffix}"))).unwrap();
    }
    let refused = insert(&conn, 21).unwrap_err();
    assert_eq!(conn.classify(&refused), hermes_guard::ErrorClass::WalLost);
    assert!(conn.guard_status().unwrap().main_torn);
    drop(reader);
    let newer = std::process::Command::new(WORKLOAD)
        .args(["newer", db.to_str().unwrap()])
        .arg(dir.with_extension("acks"))
        .status()
        .unwrap();
    assert!(newer.success());
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    assert_eq!(named(dir, ".retired-wal-").len(), 1);
}

#[test]
fn crash_point_recover_rebuild_keeps_the_torn_file_and_merges_each_row_once() {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    template_torn(&template_dir);
    let torn_rows = ids(&guarded(&template_dir.join("state.db")));
    let torn = std::fs::read(template_dir.join("state.db")).unwrap();
    let expected: BTreeSet<i64> = (1..=20).chain([50]).collect();
    assert!(torn_rows.is_subset(&expected) && torn_rows != expected);
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &["rebuild"],
        "state.db",
    )
    .with_faults();
    let counts = runs
        .each_point(|point| check(point, &torn, &torn_rows, &expected))
        .unwrap();
    counts.print("rebuild");
    assert!(counts.points >= 24, "{counts:?}");
}

fn check(point: &Point<'_>, torn: &[u8], torn_rows: &BTreeSet<i64>, expected: &BTreeSet<i64>) {
    let what = format!("{} ({:?}, {:?})", point.label, point.names, point.data);
    let db = point.image.join("state.db");
    let at_path = std::fs::read(&db).unwrap_or_default();
    let kept = named(point.image, "state.db.torn-")
        .iter()
        .any(|dir| std::fs::read(dir.join("state.db")).ok().as_deref() == Some(torn));
    assert!(
        at_path == torn || kept,
        "{what}: the torn file is neither at the path nor kept: {:?}",
        std::fs::read_dir(point.image)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    let conn = guarded(&db);
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok", "{what}");
    let live = ids(&conn);
    drop(conn);
    assert!(
        live == *torn_rows || live == *expected,
        "{what}: neither the torn file nor the rebuilt one: {live:?}"
    );
    if point.acked.contains(&0) {
        assert_eq!(
            live, *expected,
            "{what}: the rebuild returned OK and was lost"
        );
    }
    for dir in named(point.image, ".retired-wal-") {
        let verified = verify_capture(&dir).unwrap();
        assert!(verified.verified(), "{what}: {:?}", verified.problems);
    }
    // recover --apply afterwards: exactly the rows still missing.
    let capture = Capture::open(&named(point.image, ".retired-wal-")[0]).unwrap();
    let report = hermes_guard::recover::apply(&capture, &db, &MergeOptions::default(), &mut |_| {})
        .unwrap_or_else(|e| panic!("{what}: recover --apply: {e}"));
    assert_eq!(
        report.inserted(),
        expected.difference(&live).count() as u64,
        "{what}: recover --apply inserted other than what was missing"
    );
    assert_eq!(
        ids(&guarded(&db)),
        *expected,
        "{what}: after recover --apply"
    );
}
