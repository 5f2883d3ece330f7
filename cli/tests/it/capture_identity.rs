//! The capture is located by the pinned inode, never by pathname.

use crate::common;

use std::fs;

use common::*;
use hermes_guard::{CaptureError, FileId, GuardError};

#[test]
fn capture_selects_the_recorded_inode_not_the_pathname() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    let wal = sidecar(&path, "-wal");
    let wal_id = identity(&wal);
    lose_sidecars(&path, false);
    let original = descriptor_contents(wal_id);

    // Another owner's WAL, deleted under the same pathname as our lost one.
    let other_path = dir.path().join("other.db");
    let other = open_stock(&other_path);
    insert(&other, "another owner committed this").unwrap();
    fs::rename(sidecar(&other_path, "-wal"), &wal).unwrap();
    let other_id = identity(&wal);
    fs::remove_file(&wal).unwrap();
    assert_ne!(other_id, wal_id);
    let other_before = descriptor_contents(other_id);

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");

    let artifact = conn.guard_status().unwrap().capture.unwrap();
    assert_same_bytes(
        &fs::read(artifact.join("state.db-wal")).unwrap(),
        &original,
        "captured WAL",
    );
    assert_eq!(
        manifest(&artifact)["wal"]["identity"],
        serde_json::json!([wal_id.dev, wal_id.ino])
    );
    assert_same_bytes(
        &descriptor_contents(other_id),
        &other_before,
        "the other owner's WAL",
    );
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    drop(other);
}

#[test]
fn capture_refuses_to_guess_by_pathname() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    lose_sidecars(&path, false);

    // Capturing without an identity (by pathname) cannot be asked for: the call takes a
    // `FileId`, not an `Option`. An identity the connection does not hold is refused.
    let err = conn
        .capture_retired_generation(FileId { dev: 1, ino: 1 })
        .unwrap_err();
    assert!(
        matches!(err, GuardError::Capture(CaptureError::NotHeld { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("no longer holds"), "{err}");

    assert!(
        artifacts(dir.path()).is_empty(),
        "a refused capture writes nothing"
    );
    drop(conn);
}

#[test]
fn capture_by_identity_uses_the_held_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    let wal_id = identity(&sidecar(&path, "-wal"));
    lose_sidecars(&path, false);

    let artifact = conn.capture_retired_generation(wal_id).unwrap();
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    let staging_left: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(staging_left.is_empty(), "staging directory left behind");
    drop(conn);
}

#[test]
fn a_live_generation_is_not_captured_so_later_commits_are_not_left_out() {
    // A capture stands for its generation once taken. Taken of a live one, the commits after it
    // would be in no artifact when the generation is lost later.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    let wal_id = identity(&sidecar(&path, "-wal"));

    let err = conn.capture_retired_generation(wal_id).unwrap_err();
    assert!(
        matches!(err, GuardError::Capture(CaptureError::NotRetired { .. })),
        "{err}"
    );
    assert!(artifacts(dir.path()).is_empty());

    insert(&conn, "late commit").unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1);
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, "late commit"), 1);
}
