//! The first refused write captures the exact retired generation.

mod common;

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
    assert_eq!(
        hermes_guard::classify(&conn, &err),
        hermes_guard::ErrorClass::WalGenerationLost
    );

    let status = hermes_guard::status(&conn).unwrap();
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
    assert_eq!(captured, original);
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

    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
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
