//! `hermes-guard status <db>`: one read-only answer to "is this database healthy, is anything held,
//! are there captures" — 0 healthy, 3 attention (each thing listed with what to do), 2 bad input.

use std::fs;
use std::path::Path;

use crate::common;
use crate::stale_wal::{killed_writer, seed_with_backup};

use common::*;

/// `hermes-guard status <db> --json`: its exit code and document.
fn status_of(db: &Path) -> (i32, serde_json::Value) {
    let (code, out, err) =
        hermes_guard_cli(&["status".as_ref(), db.as_os_str(), "--json".as_ref()]);
    let doc = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}{err}"));
    (code, doc)
}

#[test]
fn a_database_closed_cleanly_is_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let conn = open_guarded(&db);
    checkpointed_history(&conn);
    drop(conn);
    let (code, doc) = status_of(&db);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["healthy"], true, "{doc}");
    assert_eq!(doc["wal"]["verdict"], "no-wal", "{doc}");
    assert_eq!(doc["captures"].as_array().unwrap().len(), 0);
}

#[test]
fn the_status_names_a_local_filesystem_and_calls_it_wal_safe() {
    let dir = crate::fs_matrix::scratch();
    let db = dir.path().join("state.db");
    drop(open_guarded(&db));
    let (code, doc) = status_of(&db);
    assert_eq!(code, 0, "{doc}");
    assert!(doc["filesystem"]["name"].is_string(), "{doc}");
    assert_eq!(doc["filesystem"]["wal_safe"], true, "{doc}");
}

#[test]
fn a_wal_a_killed_guarded_writer_left_continues_the_database_and_is_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    seed_with_backup(&db, &dir.path().join("backup.db"));
    killed_writer(&db, "guard", 0);
    let (code, doc) = status_of(&db);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["wal"]["verdict"], "continues", "{doc}");
}

#[test]
fn a_stale_wal_beside_a_restored_file_needs_attention_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let backup = dir.path().join("backup.db");
    seed_with_backup(&db, &backup);
    killed_writer(&db, "guard", 30);
    fs::copy(&backup, &db).unwrap();
    let before: Vec<_> = [&db, &sidecar(&db, "-wal")]
        .iter()
        .map(|p| fs::read(p).unwrap())
        .collect();
    let (code, doc) = status_of(&db);
    assert_eq!(code, 3, "{doc}");
    assert_eq!(doc["wal"]["verdict"], "stale", "{doc}");
    assert!(doc["attention"][0]
        .as_str()
        .unwrap()
        .contains("another database file"));
    let after: Vec<_> = [&db, &sidecar(&db, "-wal")]
        .iter()
        .map(|p| fs::read(p).unwrap())
        .collect();
    assert!(before == after, "status wrote");
    assert!(artifacts(dir.path()).is_empty());
}

#[test]
fn a_capture_with_rows_missing_needs_attention_and_names_the_recover_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let conn = open_guarded(&db);
    wal_only_sentinel(&conn);
    lose_sidecars(&db, false);
    assert!(insert(&conn, "after the loss").is_err(), "refused");
    close_while_restarted(conn, &db);
    let [capture] = artifacts(dir.path()).try_into().unwrap();
    let (code, doc) = status_of(&db);
    assert_eq!(code, 3, "{doc}");
    assert_eq!(doc["captures"][0]["capture"], capture.display().to_string());
    assert!(doc["captures"][0]["missing"].as_u64().unwrap() > 0, "{doc}");
    let said = doc["attention"][0].as_str().unwrap();
    assert!(
        said.contains(&format!("hermes-guard recover {}", capture.display())),
        "{said}"
    );
}

#[test]
fn status_of_a_path_that_does_not_exist_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = hermes_guard_cli(&[
        "status".as_ref(),
        dir.path().join("nonexistent.db").as_os_str(),
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("nonexistent.db"), "{err}");
}

test_alone! {
    fn a_generation_held_uncaptured_needs_attention_with_where_to_copy_it_from() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let conn = open_guarded(&db);
        wal_only_sentinel(&conn);
        lose_sidecars(&db, false);
        hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");
        drop(conn);

        let (code, doc) = status_of(&db);
        assert_eq!(code, 3, "{doc}");
        let held = &doc["held"][0];
        assert_eq!(held["pid"], std::process::id());
        assert_eq!(held["captured"], false, "{doc}");
        let said = doc["attention"][0].as_str().unwrap();
        assert!(said.contains("NOT captured") && said.contains("/proc/"), "{said}");

        hermes_guard::test_hooks::clear_capture_fault(dir.path());
        assert_eq!(hermes_guard::retry_pending_captures(), 0);
        let (_, doc) = status_of(&db);
        assert_eq!(doc["held"].as_array().unwrap().len(), 0, "{doc}");
    }
}
