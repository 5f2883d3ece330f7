//! The first refused write captures the exact retired generation.

use crate::common;

use common::*;
use sha2::{Digest, Sha256};

fn halt_captures_the_exact_retired_generation(rename: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    let wal_id = identity(&sidecar(&path, "-wal"));
    lose_sidecars(&path, rename);
    let original = descriptor_contents(wal_id);

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(
        is_refusal(&err),
        "expected SQLITE_READONLY_DBMOVED, got {err}"
    );
    assert_eq!(conn.classify(&err), hermes_guard::ErrorClass::WalLost);

    let status = conn.guard_status().unwrap();
    let artifact = status.capture.clone().expect("captured at the halt");
    assert!(artifact.is_dir() && artifact.parent() == Some(dir.path()));
    let manifest = manifest(&artifact);
    assert_eq!(manifest["trigger"], "halt");
    assert_eq!(
        manifest["wal"]["identity"],
        serde_json::json!([wal_id.dev, wal_id.ino])
    );
    let captured = std::fs::read(artifact.join("state.db-wal")).unwrap();
    assert!(!captured.is_empty());
    assert_same_bytes(&captured, &original, "captured WAL");
    assert_eq!(
        manifest["wal"]["sha256"],
        format!("{:x}", Sha256::digest(&captured))
    );
    assert_eq!(manifest["main"]["mode"], "copied");
    assert_eq!(manifest["main"]["header"]["valid"], true);
    assert_eq!(
        std::fs::metadata(artifact.join("state.db")).unwrap().len(),
        manifest["main"]["bytes"].as_u64().unwrap()
    );

    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert_eq!(count_like(&recovered, "after the loss"), 0);
    assert!(integrity_ok(&recovered));

    close_while_restarted(conn, &path);
    assert_eq!(
        artifacts(dir.path()),
        vec![artifact],
        "captured once, not again at close"
    );
}

#[test]
fn halt_captures_the_exact_retired_generation_after_unlink() {
    halt_captures_the_exact_retired_generation(false);
}

#[test]
fn halt_captures_the_exact_retired_generation_after_rename() {
    halt_captures_the_exact_retired_generation(true);
}

#[test]
fn exclusive_locking_mode_is_refused_at_the_first_wal_write() {
    // No -shm and no xShmLock in this mode: only the WAL's own writes show the transaction.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    conn.execute_batch("PRAGMA locking_mode=EXCLUSIVE").unwrap();
    let sentinel = wal_only_sentinel(&conn);
    let wal_id = identity(&sidecar(&path, "-wal"));
    std::fs::remove_file(sidecar(&path, "-wal")).unwrap();
    let original = descriptor_contents(wal_id);

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    assert_same_bytes(
        &descriptor_contents(wal_id),
        &original,
        "retired WAL after refusal",
    );
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    // The connection holds EXCLUSIVE until it closes: no other process could open it meanwhile.
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

#[test]
fn a_checkpoint_of_a_retired_generation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    let main_before = std::fs::read(&path).unwrap();
    lose_sidecars(&path, false);

    for mode in ["PASSIVE", "FULL", "RESTART", "TRUNCATE"] {
        let result = conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()));
        assert!(
            result.is_err_and(|e| is_refusal(&e)),
            "{mode} checkpoint was not refused"
        );
    }
    assert_same_bytes(
        &std::fs::read(&path).unwrap(),
        &main_before,
        "main file after refused checkpoints",
    );
    close_while_restarted(conn, &path);
    assert_same_bytes(
        &std::fs::read(&path).unwrap(),
        &main_before,
        "main file after close",
    );
}
