//! The database's whole directory renamed away: writes are refused (the path no longer resolves
//! to the file the connection opened), and the capture is written through the directory
//! descriptor held since the open, so it lands beside the database in the directory's new place
//! and close settles.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

/// `<tmp>/db/state.db`, so the directory can be moved away whole.
fn database_in_its_own_directory(tmp: &Path) -> PathBuf {
    let dir = tmp.join("db");
    std::fs::create_dir(&dir).unwrap();
    dir.join("state.db")
}

#[test]
fn a_write_after_the_directory_moved_away_is_refused_and_captured_inside_the_moved_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let path = database_in_its_own_directory(tmp.path());
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    let moved = tmp.path().join("moved-away");
    std::fs::rename(path.parent().unwrap(), &moved).unwrap();
    let moved = moved.canonicalize().unwrap(); // as /proc reports it

    let err = insert(&conn, "after the move").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    let status = conn.guard_status().unwrap();
    let artifact = status
        .capture
        .unwrap_or_else(|| panic!("no capture: {:?}", status.capture_error));
    assert_eq!(artifact.parent(), Some(moved.as_path()), "{artifact:?}");
    assert!(artifact.is_dir());
    assert_eq!(artifacts(&moved), vec![artifact.clone()]);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    let recovered = recover_by_manifest(&artifact, &tmp.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert_eq!(count_like(&recovered, "after the move"), 0);
    assert!(integrity_ok(&recovered));
}

#[test]
fn close_after_the_directory_moved_away_captures_inside_it_and_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let path = database_in_its_own_directory(tmp.path());
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    let moved = tmp.path().join("moved-away");
    std::fs::rename(path.parent().unwrap(), &moved).unwrap();

    // No write in between: the close notices and captures.
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let found = artifacts(&moved);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(manifest(&found[0])["trigger"], "close");
    let recovered = recover_by_manifest(&found[0], &tmp.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

#[test]
fn the_reported_capture_follows_the_directory_when_it_moves_again() {
    let tmp = tempfile::tempdir().unwrap();
    let path = database_in_its_own_directory(tmp.path());
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    let first = tmp.path().join("first-move");
    std::fs::rename(path.parent().unwrap(), &first).unwrap();
    insert(&conn, "after the move").unwrap_err();
    let captured = conn.guard_status().unwrap().capture.expect("captured");

    let second = tmp.path().join("second-move");
    std::fs::rename(&first, &second).unwrap();
    let second = second.canonicalize().unwrap(); // as /proc reports it
    let now = conn.guard_status().unwrap().capture.unwrap();
    assert_eq!(now, second.join(captured.file_name().unwrap()));
    assert!(now.is_dir());
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}
