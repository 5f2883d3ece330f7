//! What a recovery merges: the captured generation's own changes (its WAL against the main
//! image it was written on), into a fresh database too; rows whose content repeats are all
//! kept; another database is refused.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use hermes_guard::recover::{self, Capture, ConflictPolicy, MergeOptions, MergeRule, RecoverError};
use rusqlite::{Connection, OpenFlags};

fn count(path: &Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// A fresh database through the guard: WAL mode, then `schema` and `rows` committed only in
/// the WAL (no checkpoint). The sidecars are unlinked, the next write is refused and captured;
/// the connection closes. Returns the capture.
fn fresh_database_lost(path: &Path, schema: &str, rows: impl FnOnce(&Connection)) -> PathBuf {
    hermes_guard::register().unwrap();
    let conn =
        Connection::open_with_flags_and_vfs(path, OpenFlags::default(), hermes_guard::VFS_NAME)
            .unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    conn.execute_batch(schema).unwrap();
    rows(&conn);
    lose_sidecars(path, false);
    assert!(is_refusal(
        &conn.execute_batch("CREATE TABLE refused (x)").unwrap_err()
    ));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    // The restarted application is already up when the old connection closes: a newer generation
    // exists, so the close does not heal the loss and recovery is needed.
    let restarted = NewerGenerationOpen::start(path);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    drop(restarted);
    artifact
}

const NOTES: &str = "
    CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT);
    CREATE INDEX notes_title ON notes(title);
    CREATE VIRTUAL TABLE notes_fts USING fts5(body, content='notes', content_rowid='id');
    CREATE TRIGGER notes_ai AFTER INSERT ON notes BEGIN
        INSERT INTO notes_fts(rowid, body) VALUES (new.id, new.body);
    END;
    CREATE VIEW titles AS SELECT title FROM notes;
    PRAGMA user_version = 3;
";

/// The first loss a new application meets: before the first checkpoint its schema lived only
/// in the WAL, so the live file has no tables at all.
pub(crate) fn fresh_notes_lost(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("notes.db");
    let artifact = fresh_database_lost(&path, NOTES, |conn| {
        for i in 0..30 {
            let body = if i == 17 {
                "a platypus in the lost WAL".to_owned()
            } else {
                format!("body {i}")
            };
            conn.execute(
                "INSERT INTO notes (title, body) VALUES ('same title', ?1)",
                [body],
            )
            .unwrap();
        }
    });
    (path, artifact)
}

#[test]
fn a_fresh_database_gets_the_captured_schema_then_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = fresh_notes_lost(dir.path());
    let objects = "SELECT COUNT(*) FROM sqlite_master";
    assert_eq!(count(&path, objects), 0, "the live file has no tables");

    let capture = Capture::open(&artifact).unwrap();
    let plan = recover::plan(&capture, &path, &MergeOptions::default()).unwrap();
    assert_eq!(plan.rule, MergeRule::Delta, "{}", plan.rule_reason);
    for object in [
        "table notes",
        "index notes_title",
        "table notes_fts",
        "trigger notes_ai",
        "view titles",
    ] {
        assert!(
            plan.created.iter().any(|c| c == object),
            "{:?}",
            plan.created
        );
    }
    assert_eq!(plan.missing(), 30);
    assert_eq!(count(&path, objects), 0, "a plan writes nothing");

    let done = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(done.inserted(), 30);
    assert_eq!(done.left_over(), 0, "{done:?}");
    assert_eq!(count(&path, "SELECT COUNT(*) FROM notes"), 30);
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM notes WHERE title = 'same title'"
        ),
        30,
        "repeated titles are all kept"
    );
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM notes_fts WHERE notes_fts MATCH 'platypus'"
        ),
        1,
        "the full-text index holds the merged rows"
    );
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('notes_title', 'notes_ai', 'titles')"
        ),
        3
    );
    assert_eq!(count(&path, "PRAGMA user_version"), 3);
    assert!(integrity_ok(&Connection::open(&path).unwrap()));

    let again = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert!(again.nothing_to_do(), "{again:?}");
    assert!(again.merged_before.is_some());
    assert_eq!(count(&path, "SELECT COUNT(*) FROM notes"), 30);
}

/// The shape: 48 rows committed only in the lost WAL of a fresh database; the
/// restarted application creates its table again and inserts 100 rows, 27 of them with the
/// same values as captured ones (under the same rowids).
pub(crate) fn repeated_content_lost(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("readings.db");
    let schema =
        "CREATE TABLE IF NOT EXISTS readings (id INTEGER PRIMARY KEY, sensor TEXT, value INTEGER)";
    let artifact = fresh_database_lost(&path, schema, |conn| {
        for i in 0..48 {
            conn.execute(
                "INSERT INTO readings (sensor, value) VALUES ('s1', ?1)",
                [i % 6],
            )
            .unwrap();
        }
    });
    let restarted = open_stock(&path);
    restarted.execute_batch(schema).unwrap();
    for i in 0..100 {
        let (sensor, value) = if i < 27 { ("s1", i % 6) } else { ("s2", i) };
        restarted
            .execute(
                "INSERT INTO readings (sensor, value) VALUES (?1, ?2)",
                rusqlite::params![sensor, value],
            )
            .unwrap();
    }
    drop(restarted);
    (path, artifact)
}

#[test]
fn rows_whose_content_repeats_are_all_kept_once() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = repeated_content_lost(dir.path());
    let total = "SELECT COUNT(*) FROM readings";
    assert_eq!(count(&path, total), 100);
    let capture = Capture::open(&artifact).unwrap();
    let plan = recover::plan(&capture, &path, &MergeOptions::default()).unwrap();
    let readings = plan.tables.iter().find(|t| t.table == "readings").unwrap();
    assert_eq!(
        (readings.in_capture, readings.to_insert),
        (48, 48),
        "{readings:?}"
    );
    assert_eq!(readings.already_live, 0);

    let done = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(done.inserted(), 48);
    assert_eq!(count(&path, total), 148);
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM readings WHERE sensor = 's1'"),
        48 + 27
    );
    let again = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(again.inserted(), 0);
    assert!(again.nothing_to_do(), "{again:?}");
    assert_eq!(count(&path, total), 148, "a second run adds nothing");
    assert!(integrity_ok(&Connection::open(&path).unwrap()));
}

#[test]
fn the_generations_updates_and_deletions_apply_where_the_live_row_is_as_the_image_had_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    checkpointed_history(&conn);
    conn.execute_batch(
        "UPDATE messages SET content = 'edited 3' WHERE content = 'history 3';
         DELETE FROM messages WHERE content = 'history 5';
         UPDATE messages SET content = 'edited 7' WHERE content = 'history 7';
         DELETE FROM messages WHERE content = 'history 9';",
    )
    .unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "refused").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);
    // The newer generation changed two of the same rows its own way.
    open_stock(&path)
        .execute_batch(
            "UPDATE messages SET content = 'newer edit 7' WHERE content = 'history 7';
             UPDATE messages SET content = 'newer edit 9' WHERE content = 'history 9';",
        )
        .unwrap();

    let capture = Capture::open(&artifact).unwrap();
    let done = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    let m = done.tables.iter().find(|t| t.table == "messages").unwrap();
    assert_eq!((m.changed, m.deleted), (2, 2), "{m:?}");
    assert_eq!((m.updated, m.removed, m.conflicts), (1, 1, 2), "{m:?}");
    assert_eq!(done.left_over(), 2);
    let live = open_stock(&path);
    assert_eq!(count_like(&live, "edited 3"), 1);
    assert_eq!(count_like(&live, "history 5"), 0);
    assert_eq!(count_like(&live, "newer edit 7"), 1, "live wins a conflict");
    assert_eq!(count_like(&live, "newer edit 9"), 1, "live wins a conflict");
    drop(live);

    let again = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(
        again.changed(),
        0,
        "a second run changes nothing: {again:?}"
    );
    let take = MergeOptions {
        conflicts: ConflictPolicy::TakeCapture,
        ..MergeOptions::default()
    };
    let taken = recover::apply(&capture, &path, &take, &mut |_| {}).unwrap();
    assert_eq!(taken.tables[0].replaced, 2, "{taken:?}");
    let live = open_stock(&path);
    assert_eq!(count_like(&live, "edited 7"), 1);
    assert_eq!(count_like(&live, "newer edit 9"), 0);
    assert_eq!(count_like(&live, "newer edit %"), 0);
}

/// A capture of a database with `application_id` 0x48475244 and rows only in its WAL.
fn app_capture(dir: &Path) -> PathBuf {
    let path = dir.join("app.db");
    let conn = open_guarded(&path);
    checkpointed_history(&conn);
    conn.execute_batch("PRAGMA application_id = 0x48475244")
        .unwrap();
    insert(&conn, "only in the WAL").unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "refused").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    // The restarted application is already up when the old connection closes: a newer generation
    // exists, so the close does not heal the loss and recovery is needed.
    let restarted = NewerGenerationOpen::start(&path);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    drop(restarted);
    artifact
}

#[test]
fn another_database_is_refused_with_the_reason_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = app_capture(dir.path());
    let capture = Capture::open(&artifact).unwrap();

    // Same tables, another application.
    let other = dir.path().join("other.db");
    let conn = open_stock(&other);
    conn.execute_batch("PRAGMA application_id = 7").unwrap();
    drop(conn);
    let bytes = fs::read(&other).unwrap();
    let err = recover::apply(&capture, &other, &MergeOptions::default(), &mut |_| {}).unwrap_err();
    assert!(
        matches!(&err, RecoverError::DifferentDatabase { why, .. } if why.contains("application_id")),
        "{err}"
    );
    assert_eq!(fs::read(&other).unwrap(), bytes, "nothing was written");

    // The same table name under another key.
    let conflicting = dir.path().join("conflicting.db");
    Connection::open(&conflicting)
        .unwrap()
        .execute_batch("CREATE TABLE messages (id TEXT PRIMARY KEY, session TEXT, content TEXT)")
        .unwrap();
    let err = recover::plan(&capture, &conflicting, &MergeOptions::default()).unwrap_err();
    assert!(
        matches!(&err, RecoverError::DifferentDatabase { why, .. } if why.contains("conflicting schemas")),
        "{err}"
    );
    drop(capture);

    // Through the CLI: exit 2, the reason on stderr, nothing written.
    let (code, out, err) = hermes_guard_cli(&[
        "recover".as_ref(),
        artifact.as_os_str(),
        "--into".as_ref(),
        other.as_os_str(),
        "--apply".as_ref(),
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("application_id"), "{out}{err}");
    assert_eq!(fs::read(&other).unwrap(), bytes, "nothing was written");
}

#[test]
fn a_row_the_live_schema_refuses_is_counted_and_the_others_still_merge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tags.db");
    let conn = open_guarded(&path);
    conn.execute_batch(
        "PRAGMA wal_autocheckpoint=0;
         CREATE TABLE tags (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
         INSERT INTO tags (name) VALUES ('a');",
    )
    .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch("INSERT INTO tags (name) VALUES ('b'), ('c');")
        .unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "refused").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);
    // The newer generation took the name 'b' without adding a row.
    open_stock(&path)
        .execute_batch("UPDATE tags SET name = 'b' WHERE id = 1")
        .unwrap();

    let capture = Capture::open(&artifact).unwrap();
    let done = recover::apply(&capture, &path, &MergeOptions::default(), &mut |_| {}).unwrap();
    let tags = done.tables.iter().find(|t| t.table == "tags").unwrap();
    assert_eq!(
        (tags.added, tags.inserted, tags.rejected),
        (2, 1, 1),
        "{tags:?}"
    );
    assert_eq!(done.left_over(), 1);
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM tags WHERE name = 'c' AND id = 3"
        ),
        1
    );
    assert_eq!(count(&path, "SELECT COUNT(*) FROM tags"), 2);
}
