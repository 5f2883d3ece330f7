//! `hermes_guard::recover` as a library: opening a capture, planning and applying a merge.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use hermes_guard::recover::{self, Capture, ConflictPolicy, MergeOptions, RecoverError};
use rusqlite::Connection;

fn count(path: &Path, sql: &str) -> i64 {
    let conn = Connection::open(path).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// The demo's scenario: a gateway process with 4 rows only in its WAL loses its sidecars, a
/// second process writes 100 rows reusing the same rowids, the gateway is refused and closes.
fn demo_scenario(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("state.db");
    let (mut gw, _) = Gateway::start(&path, "guard");
    lose_sidecars(&path, false);
    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true);
    let artifact = PathBuf::from(refused["artifact"].as_str().unwrap());
    write_second_generation(&path, "stock", 100);
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());
    (path, artifact)
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| (e.path(), fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn the_demo_capture_merges_every_missing_row_under_fresh_rowids_once() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = demo_scenario(dir.path());
    assert_eq!(count(&path, "SELECT COUNT(*) FROM messages"), 120);
    let before = snapshot(&artifact);

    let capture = Capture::open(&artifact).unwrap();
    assert!(capture.is_clean());
    let plan = recover::plan(&capture, &path, &MergeOptions::default()).unwrap();
    assert!(!plan.applied);
    let messages = plan.tables.iter().find(|t| t.table == "messages").unwrap();
    assert_eq!(messages.in_capture, 24);
    assert_eq!(messages.already_live, 20);
    assert_eq!(messages.to_insert, 4);
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM messages"),
        120,
        "a plan writes nothing"
    );

    let done = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(done.inserted(), 4);
    let messages = done.tables.iter().find(|t| t.table == "messages").unwrap();
    assert_eq!(
        messages.new_rowids, 4,
        "rowids 21-24 were reused by the newer generation"
    );
    assert_eq!(count(&path, "SELECT COUNT(*) FROM messages"), 124);
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM messages WHERE content LIKE 'uncheckpointed %'"
        ),
        4
    );
    assert!(integrity_ok(&Connection::open(&path).unwrap()));

    let again = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(again.inserted(), 0);
    assert!(again.nothing_to_do());
    assert_eq!(count(&path, "SELECT COUNT(*) FROM messages"), 124);
    drop(capture);
    assert_eq!(snapshot(&artifact), before, "the capture is never changed");
}

#[test]
fn bad_captures_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);

    // Not a capture.
    let err = Capture::open(dir.path()).unwrap_err();
    assert!(matches!(err, RecoverError::NotACapture { .. }), "{err}");
    // A .partial directory.
    let partial = dir
        .path()
        .join("state.db.retired-wal-20260101-000000-1.partial");
    fs::create_dir(&partial).unwrap();
    let err = Capture::open(&partial).unwrap_err();
    assert!(matches!(err, RecoverError::Partial { .. }), "{err}");
    assert!(err.to_string().contains(".partial"));

    let copy = |name: &str| {
        let to = dir.path().join(name);
        fs::create_dir(&to).unwrap();
        for f in fs::read_dir(&artifact).unwrap().flatten() {
            fs::copy(f.path(), to.join(f.file_name())).unwrap();
        }
        to
    };
    // A missing file.
    let missing = copy("missing");
    fs::remove_file(missing.join("state.db-wal")).unwrap();
    let err = Capture::open(&missing).unwrap_err();
    assert!(
        matches!(err, RecoverError::MissingFile { ref file, .. } if file == "state.db-wal"),
        "{err}"
    );
    // A size that does not match.
    let short = copy("short");
    let wal = fs::read(short.join("state.db-wal")).unwrap();
    fs::write(short.join("state.db-wal"), &wal[..wal.len() - 1]).unwrap();
    let err = Capture::open(&short).unwrap_err();
    assert!(matches!(err, RecoverError::SizeMismatch { .. }), "{err}");
    // A sha256 that does not match.
    let flipped = copy("flipped");
    let mut main = fs::read(flipped.join("state.db")).unwrap();
    let last = main.len() - 1;
    main[last] ^= 0xff;
    fs::write(flipped.join("state.db"), &main).unwrap();
    let err = Capture::open(&flipped).unwrap_err();
    assert!(matches!(err, RecoverError::Sha256Mismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("flipped"),
        "the error carries the path: {err}"
    );

    // The capture's own files as the target.
    let capture = Capture::open(&artifact).unwrap();
    let err = recover::plan(
        &capture,
        &artifact.join("state.db"),
        &MergeOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RecoverError::TargetIsCapture { .. }), "{err}");
    // A different database.
    let other = dir.path().join("other.db");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE unrelated (x)")
        .unwrap();
    let err = recover::plan(&capture, &other, &MergeOptions::default()).unwrap_err();
    assert!(
        matches!(err, RecoverError::DifferentDatabase { .. }),
        "{err}"
    );
    // Not a database at all.
    let text = dir.path().join("notes.txt");
    fs::write(&text, "hello, this is not a database at all").unwrap();
    let err = recover::plan(&capture, &text, &MergeOptions::default()).unwrap_err();
    assert!(matches!(err, RecoverError::BadTarget { .. }), "{err}");
}

/// A schema with a declared key, a rowid parent with children, AUTOINCREMENT and external
/// content FTS kept by triggers: the live generation has reused rowids.
const SCHEMA: &str = "
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT);
    CREATE TABLE \"odd \"\"name\" (id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT);
    CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES \"odd \"\"name\"(id), note TEXT);
    CREATE VIRTUAL TABLE child_fts USING fts5(note, content='child', content_rowid='id');
    CREATE TRIGGER child_ai AFTER INSERT ON child BEGIN
        INSERT INTO child_fts(rowid, note) VALUES (new.id, new.note);
    END;
";

fn fk_conn(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA foreign_keys=ON").unwrap();
    conn
}

#[test]
fn children_follow_their_parents_new_rowids_and_keys_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let conn = open_guarded(&path);
    conn.execute_batch(SCHEMA).unwrap();
    conn.execute_batch(
        "PRAGMA wal_autocheckpoint=0;
         INSERT INTO kv VALUES ('shared', 'same'), ('both', 'old value');
         INSERT INTO \"odd \"\"name\" (label) VALUES ('p1');
         INSERT INTO child (parent, note) VALUES (1, 'history');",
    )
    .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    // Only in the WAL that will be lost:
    conn.execute_batch(
        "INSERT INTO kv VALUES ('captured only', 'x');
         UPDATE kv SET value = 'captured value' WHERE key = 'both';
         INSERT INTO \"odd \"\"name\" (label) VALUES ('p2 captured');
         INSERT INTO child (parent, note) VALUES (2, 'zebra child of p2');
         INSERT INTO child (parent, note) VALUES (1, 'second child of p1');",
    )
    .unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(
        &conn
            .execute("INSERT INTO kv VALUES ('refused', '')", [])
            .unwrap_err()
    ));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);

    // The newer generation reuses rowid 2 of both tables for other rows.
    let live = fk_conn(&path);
    live.execute_batch(
        "INSERT INTO \"odd \"\"name\" (label) VALUES ('p2 live');
         INSERT INTO child (parent, note) VALUES (2, 'child of live p2');
         UPDATE kv SET value = 'live value' WHERE key = 'both';",
    )
    .unwrap();
    drop(live);

    let capture = Capture::open(&artifact).unwrap();
    let report = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    let table = |n: &str| report.tables.iter().find(|t| t.table == n).unwrap().clone();
    assert_eq!(table("kv").to_insert, 1);
    assert_eq!(table("kv").conflicts, 1);
    assert_eq!(table("kv").conflict_keys, vec!["\"both\"".to_owned()]);
    assert_eq!(table("odd \"name").inserted, 1);
    assert_eq!(table("child").inserted, 2);
    assert!(report.left_over() > 0, "the conflict is left over");
    // Parents come first.
    let order: Vec<&str> = report.tables.iter().map(|t| t.table.as_str()).collect();
    assert!(
        order.iter().position(|t| *t == "odd \"name") < order.iter().position(|t| *t == "child")
    );

    let live = fk_conn(&path);
    let parent_of = |note: &str| -> String {
        live.query_row(
            "SELECT p.label FROM child c JOIN \"odd \"\"name\" p ON p.id = c.parent WHERE c.note = ?1",
            [note],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(parent_of("zebra child of p2"), "p2 captured");
    assert_eq!(parent_of("child of live p2"), "p2 live");
    assert_eq!(parent_of("second child of p1"), "p1");
    let value: String = live
        .query_row("SELECT value FROM kv WHERE key = 'both'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(value, "live value", "live wins a conflict by default");
    let hits: i64 = live
        .query_row(
            "SELECT COUNT(*) FROM child_fts WHERE child_fts MATCH 'zebra'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(hits, 1, "the FTS index follows through the live trigger");
    assert!(integrity_ok(&live));
    drop(live);

    // Asked to, the capture wins the conflict; nothing else changes.
    let options = MergeOptions {
        conflicts: ConflictPolicy::TakeCapture,
        ..MergeOptions::default()
    };
    let again = recover::apply(&capture, &path, &options, &mut |_| {}).unwrap();
    assert_eq!(again.inserted(), 0);
    assert_eq!(again.tables.iter().map(|t| t.replaced).sum::<u64>(), 1);
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM kv WHERE value = 'captured value'"
        ),
        1
    );
    assert_eq!(count(&path, "SELECT COUNT(*) FROM child"), 4);
}

#[test]
fn a_damaged_capture_yields_every_readable_row_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    {
        let tx = conn.unchecked_transaction().unwrap();
        for i in 0..2000 {
            insert(&tx, &format!("row {i:05} {}", "y".repeat(200))).unwrap();
        }
        tx.commit().unwrap();
    }
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);

    // Make a damaged capture that still matches its manifest: replay the WAL into a copy,
    // zero one leaf page in the middle of the table, and record the new sizes and hashes.
    let damaged = dir.path().join("state.db.retired-wal-20260101-000000-9");
    let work = dir.path().join("work");
    let recovered = recover(&artifact, "state.db", &work);
    recovered
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(recovered);
    let mut image = fs::read(work.join("state.db")).unwrap();
    let page = 4096;
    let pages = image.len() / page;
    let victim = pages / 2;
    image[victim * page..(victim + 1) * page].fill(0);
    fs::create_dir(&damaged).unwrap();
    fs::write(damaged.join("state.db"), &image).unwrap();
    fs::write(damaged.join("state.db-wal"), b"").unwrap();
    let mut manifest = manifest(&artifact);
    use sha2::{Digest, Sha256};
    let hex = |b: &[u8]| format!("{:x}", Sha256::digest(b));
    manifest["main"]["bytes"] = image.len().into();
    manifest["main"]["sha256"] = hex(&image).into();
    manifest["wal"]["bytes"] = 0.into();
    manifest["wal"]["sha256"] = hex(b"").into();
    // Not an image the live file descends from (with an empty WAL its generation changed
    // nothing): every captured row is compared with the live rows (the whole rule).
    manifest["main"]["identity"] = serde_json::Value::Null;
    fs::write(
        damaged.join("manifest.json"),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();

    // Empty the live table, so every readable captured row is missing from it.
    Connection::open(&path)
        .unwrap()
        .execute_batch("DELETE FROM messages")
        .unwrap();
    let capture = Capture::open(&damaged).unwrap();
    assert!(!capture.is_clean(), "{:?}", capture.integrity());
    let report = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(report.rule, recover::MergeRule::Whole);
    let messages = report
        .tables
        .iter()
        .find(|t| t.table == "messages")
        .unwrap();
    assert_eq!(messages.unreadable.len(), 1, "{messages:?}");
    let gap = &messages.unreadable[0];
    let lost = gap.at_most.unwrap();
    assert!(lost > 0 && lost < 100, "{gap:?}");
    assert_eq!(messages.in_capture + lost, 2000, "{gap:?}");
    assert_eq!(messages.inserted, messages.in_capture);
    assert!(report.left_over() > 0);
    assert!(integrity_ok(&Connection::open(&path).unwrap()));
}

#[test]
fn a_torn_live_database_is_rebuilt_only_while_nobody_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    for i in 0..10 {
        insert(&conn, &format!("before the reader {i}")).unwrap();
    }
    let reader = open_stock(&path);
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    for i in 0..10 {
        insert(&conn, &format!("after the reader {i}")).unwrap();
    }
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
    let status = conn.guard_status().unwrap();
    assert!(status.main_torn);
    let artifact = status.capture.unwrap();
    drop(reader);
    close_while_restarted(conn, &path);

    let newer = Connection::open(&path).unwrap();
    for i in 0..5 {
        insert(&newer, &format!("newer generation {i}")).unwrap();
    }

    let capture = Capture::open(&artifact).unwrap();
    assert!(capture.manifest().main_torn);
    // Held open: refused, nothing changes.
    let err = recover::rebuild_torn(&capture, &path, &MergeOptions::default()).unwrap_err();
    assert!(matches!(err, RecoverError::InUse { .. }), "{err}");
    assert_eq!(count_like(&newer, "newer generation %"), 5);
    drop(newer);

    let report = recover::rebuild_torn(&capture, &path, &MergeOptions::default()).unwrap();
    assert!(report.kept.is_dir());
    let live = Connection::open(&path).unwrap();
    assert!(integrity_ok(&live));
    assert_eq!(count_like(&live, "before the reader %"), 10);
    assert_eq!(count_like(&live, "after the reader %"), 10);
    assert_eq!(count_like(&live, "newer generation %"), 5);
    assert_eq!(count_like(&live, "after the loss"), 0);
}
