//! `hermes_guard_merges`: a generation is merged once, however many copies of its capture are
//! applied, damaged or not: a copy that reaches further than an earlier merge adds only what
//! its later commits did.

use crate::common;
use crate::recover_cli::lost_rows;
use crate::verify_from_bytes::tampered_copy;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use hermes_guard::recover::{self, Capture, MergeOptions, MergeReport, MergeRule};
use rusqlite::Connection;

fn apply(capture: &Path, database: &Path) -> MergeReport {
    let capture = Capture::open(capture).unwrap();
    recover::apply(&capture, database, &MergeOptions::default(), &mut |_| {}).unwrap()
}

/// Every `content` of `messages`, sorted.
fn contents(path: &Path) -> Vec<String> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT content FROM messages ORDER BY content")
        .unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for f in fs::read_dir(from).unwrap().flatten() {
        fs::copy(f.path(), to.join(f.file_name())).unwrap();
    }
}

/// The 1-based frame numbers of the WAL's commit frames.
fn commit_frames(wal: &[u8]) -> Vec<usize> {
    let page_size = u32::from_be_bytes(wal[8..12].try_into().unwrap()) as usize;
    let frame = 24 + page_size;
    (0..(wal.len() - 32) / frame)
        .filter(|i| {
            let at = 32 + i * frame;
            u32::from_be_bytes(wal[at + 4..at + 8].try_into().unwrap()) != 0
        })
        .map(|i| i + 1)
        .collect()
}

#[test]
fn an_intact_capture_applied_twice_adds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_rows(dir.path(), 12);
    let first = apply(&artifact, &path);
    assert_eq!(first.rule, MergeRule::Delta, "{}", first.rule_reason);
    assert_eq!(first.inserted(), 12);
    let after_first = contents(&path);
    let second = apply(&artifact, &path);
    assert_eq!(second.inserted(), 0, "{second:?}");
    assert_eq!(second.changed(), 0, "{second:?}");
    assert!(second.merged_before.is_some());
    assert_eq!(contents(&path), after_first);
    let live = Connection::open(&path).unwrap();
    assert_eq!(count_like(&live, "retired %"), 12);
    let frames: i64 = live
        .query_row("SELECT frames FROM hermes_guard_merges", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        frames,
        manifest(&artifact)["wal"]["frames"].as_i64().unwrap()
    );
}

#[test]
fn a_copy_of_a_capture_in_another_directory_applied_after_the_original_adds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_rows(dir.path(), 12);
    let elsewhere = dir.path().join("elsewhere").join("a-copy");
    copy_dir(&artifact, &elsewhere);
    assert_eq!(apply(&artifact, &path).inserted(), 12);
    let after_first = contents(&path);
    let copy = apply(&elsewhere, &path);
    assert_eq!(copy.inserted(), 0, "{copy:?}");
    assert_eq!(copy.changed(), 0, "{copy:?}");
    assert!(copy.merged_before.is_some());
    assert_eq!(contents(&path), after_first);
    // And the other way round, in another database: the copy first, then the original.
    fs::create_dir(dir.path().join("two")).unwrap();
    let (path, artifact) = lost_rows(&dir.path().join("two"), 12);
    let elsewhere = dir.path().join("elsewhere").join("another-copy");
    copy_dir(&artifact, &elsewhere);
    assert_eq!(apply(&elsewhere, &path).inserted(), 12);
    assert_eq!(apply(&artifact, &path).inserted(), 0);
    assert_eq!(
        count_like(&Connection::open(&path).unwrap(), "retired %"),
        12
    );
}

#[test]
fn a_ledger_row_of_the_old_format_still_counts_as_merged() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_rows(dir.path(), 6);
    let m = manifest(&artifact);
    let old_key = format!(
        "wal:{} main:{}",
        m["wal"]["sha256"].as_str().unwrap(),
        m["main"]["sha256"].as_str().unwrap()
    );
    Connection::open(&path)
        .unwrap()
        .execute_batch(&format!(
            "CREATE TABLE hermes_guard_merges (generation TEXT PRIMARY KEY, capture TEXT NOT NULL,
                 merged_at TEXT NOT NULL, inserted INTEGER NOT NULL, tables TEXT NOT NULL);
             INSERT INTO hermes_guard_merges VALUES
                 ('{old_key}', '/old', '2026-11-30T00:00:00Z', 6, '[]');"
        ))
        .unwrap();
    let report = apply(&artifact, &path);
    assert_eq!(report.inserted(), 0, "{report:?}");
    assert_eq!(
        report.merged_before.as_deref(),
        Some("2026-11-30T00:00:00Z")
    );
    assert_eq!(
        count_like(&Connection::open(&path).unwrap(), "retired %"),
        0
    );
}

/// A capture whose WAL commits 8 rows, then changes and deletes some of them and of the
/// history, then adds 4 more; the newer generation took the captured rowids.
fn inserts_then_changes(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("state.db");
    let conn = open_guarded(&path);
    checkpointed_history(&conn);
    for i in 0..8 {
        insert(&conn, &format!("retired {i}")).unwrap();
    }
    for sql in [
        "UPDATE messages SET content = 'history 3 edited' WHERE content = 'history 3'",
        "UPDATE messages SET content = 'retired 1 edited' WHERE content = 'retired 1'",
        "DELETE FROM messages WHERE content = 'retired 2'",
        "DELETE FROM messages WHERE content = 'history 5'",
    ] {
        conn.execute_batch(sql).unwrap();
    }
    for i in 8..12 {
        insert(&conn, &format!("retired {i}")).unwrap();
    }
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);
    newer_generation(&path, 10);
    (path, artifact)
}

#[test]
fn a_damaged_copy_then_the_intact_capture_gives_each_change_once_even_to_moved_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = inserts_then_changes(dir.path());
    let wal =
        fs::read(artifact.join(manifest(&artifact)["wal"]["file"].as_str().unwrap())).unwrap();
    let commits = commit_frames(&wal);
    assert_eq!(commits.len(), 16, "one commit per statement");
    // The first frame of the 9th commit is broken: the 8 inserts are readable, no more.
    let damaged = tampered_copy(&artifact, dir.path(), "damaged", commits[7] + 1);

    let first = apply(&damaged, &path);
    assert_eq!(first.inserted(), 8, "{first:?}");
    assert_eq!(first.changed(), 8, "nothing but the 8 inserts: {first:?}");
    assert_eq!(
        first.tables[0].new_rowids, 8,
        "the newer generation took their rowids"
    );

    // One opened capture: planned, applied, applied again (its base moves back to the image).
    let intact = Capture::open(&artifact).unwrap();
    let options = MergeOptions::default();
    let plan = recover::plan(&intact, &path, &options).unwrap();
    assert_eq!(plan.delta_from_frame, commits[7] as u64, "{plan:?}");
    assert_eq!(
        plan.missing(),
        8,
        "4 to insert, 2 to update, 2 to delete: {plan:?}"
    );
    let second = recover::apply(&intact, &path, &options, &mut |_| {}).unwrap();
    assert!(second.merged_before.is_none());
    assert_eq!(second.delta_from_frame, commits[7] as u64);
    assert_eq!(
        second.inserted(),
        4,
        "only the later commits' rows: {second:?}"
    );
    let t = &second.tables[0];
    assert_eq!((t.updated, t.removed, t.conflicts), (2, 2, 0), "{t:?}");
    let third = recover::apply(&intact, &path, &options, &mut |_| {}).unwrap();
    assert!(third.merged_before.is_some());
    assert_eq!(third.delta_from_frame, 0);
    assert_eq!((third.inserted(), third.changed()), (0, 0), "{third:?}");
    drop(intact);

    let mut expected: Vec<String> = (0..20)
        .filter(|i| *i != 5)
        .map(|i| match i {
            3 => "history 3 edited".to_owned(),
            i => format!("history {i}"),
        })
        .chain((0..10).map(|i| format!("newer {i}")))
        .chain((0..12).filter(|i| *i != 2).map(|i| match i {
            1 => "retired 1 edited".to_owned(),
            i => format!("retired {i}"),
        }))
        .collect();
    expected.sort();
    assert_eq!(contents(&path), expected);

    // Any copy again, damaged or intact: nothing.
    for again in [&artifact, &damaged] {
        let report = apply(again, &path);
        assert_eq!(report.inserted(), 0, "{report:?}");
        assert_eq!(report.changed(), 0, "{report:?}");
        assert_eq!(report.tables[0].conflicts, 0, "{report:?}");
    }
    assert_eq!(contents(&path), expected);
    assert!(integrity_ok(&Connection::open(&path).unwrap()));
}

#[test]
fn under_the_whole_rule_a_damaged_copy_then_the_intact_capture_adds_each_row_version_once() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = inserts_then_changes(dir.path());
    // Another file (another inode) than the one captured: the whole rule.
    let other = dir.path().join("other.db");
    Connection::open(&path)
        .unwrap()
        .execute("VACUUM INTO ?1", [other.to_str().unwrap()])
        .unwrap();
    let wal =
        fs::read(artifact.join(manifest(&artifact)["wal"]["file"].as_str().unwrap())).unwrap();
    let commits = commit_frames(&wal);
    let damaged = tampered_copy(&artifact, dir.path(), "damaged", commits[7] + 1);

    let first = apply(&damaged, &other);
    assert_eq!(first.rule, MergeRule::Whole, "{}", first.rule_reason);
    assert_eq!(first.inserted(), 8, "{first:?}");
    let second = apply(&artifact, &other);
    assert!(second.merged_before.is_none());
    assert_eq!(second.delta_from_frame, commits[7] as u64);
    // What the later commits wrote: 4 rows and 2 changed ones (the whole rule brings a change
    // back as a row of its own and replays no deletion); the 8 of the prefix are not again.
    assert_eq!(second.inserted(), 6, "{second:?}");
    let mut expected: Vec<String> = (0..20)
        .map(|i| format!("history {i}"))
        .chain(["history 3 edited".to_owned(), "retired 1 edited".to_owned()])
        .chain((0..10).map(|i| format!("newer {i}")))
        .chain((0..12).map(|i| format!("retired {i}")))
        .collect();
    expected.sort();
    assert_eq!(contents(&other), expected);
    for again in [&artifact, &damaged] {
        assert_eq!(apply(again, &other).inserted(), 0);
    }
    assert_eq!(contents(&other), expected);
}
