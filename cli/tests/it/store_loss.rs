//! Losing a generation under a SessionDb: every write is refused with the typed error, nothing
//! lands, the retired generation is captured, and close() never settles without the capture.

use crate::common;

use std::path::Path;

use common::*;
use hermes_guard::RetireReason;
use hermes_guard_store::{NewMessage, NewSession, SessionDb, StoreError};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// A store whose history is checkpointed and whose last message lives only in the WAL.
fn store_with_wal_only_sentinel(path: &Path) -> (SessionDb, String) {
    let db = store_with_checkpointed_history(path);
    let sentinel = format!("{SENTINEL_PREFIX}{}", "x".repeat(3000));
    db.append_message("gw-0", &NewMessage::new("assistant", sentinel.clone()))
        .unwrap();
    (db, sentinel)
}

/// Every public write method, each with a value that would be visible if it landed.
fn every_write(db: &SessionDb) -> Vec<(&'static str, Result<(), StoreError>)> {
    vec![
        (
            "create_session",
            db.create_session(&NewSession::new("landed-create", "cli")),
        ),
        (
            "ensure_session",
            db.ensure_session("landed-ensure", "cli").map(drop),
        ),
        ("end_session", db.end_session("gw-0", "landed").map(drop)),
        (
            "append_message",
            db.append_message("gw-0", &NewMessage::new("user", "landed message"))
                .map(drop),
        ),
        ("set_meta", db.set_meta("landed", "yes")),
        (
            "update_token_counts",
            db.update_token_counts("gw-0", 1000, 1000),
        ),
        ("set_session_title", db.set_session_title("gw-0", "landed")),
    ]
}

/// Opens what is at `path` now and asserts none of [`every_write`]'s effects are there.
fn assert_no_write_landed(path: &Path) {
    let fresh = SessionDb::open(path).unwrap();
    assert!(fresh.get_session("landed-create").unwrap().is_none());
    assert!(fresh.get_session("landed-ensure").unwrap().is_none());
    assert_eq!(fresh.get_meta("landed").unwrap(), None);
    let gw = fresh.get_session("gw-0").unwrap().expect("seeded session");
    assert_eq!(gw.end_reason, None);
    assert_eq!(gw.title, None);
    assert_eq!(gw.input_tokens, 0);
    assert!(fresh.search_messages("landed", 10).unwrap().is_empty());
    fresh.close().unwrap();
}

fn store_halt_captures_the_exact_retired_generation(rename: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (db, sentinel) = store_with_wal_only_sentinel(&path);
    let wal_id = identity(&sidecar(&path, "-wal"));
    lose_sidecars(&path, rename);
    let original = descriptor_contents(wal_id);

    let err = db
        .append_message("gw-0", &NewMessage::new("user", "after the loss"))
        .unwrap_err();
    let StoreError::WalLost {
        capture: Some(artifact),
        reason,
        ..
    } = &err
    else {
        panic!("expected WalLost with a capture, got {err:?}");
    };
    assert!(err.is_retired(), "a kind of MainReplaced");
    assert!(matches!(
        reason,
        Some(RetireReason::WalLost | RetireReason::ShmLost)
    ));
    assert!(err.to_string().contains(&artifact.display().to_string()));
    assert!(artifact.is_dir() && artifact.parent() == Some(dir.path()));

    let manifest = manifest(artifact);
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

    let recovered = recover(artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert_eq!(count_like(&recovered, "after the loss"), 0);
    assert!(integrity_ok(&recovered));

    let closed = db.close().unwrap();
    assert_eq!(closed.capture.as_ref(), Some(artifact));
    assert_eq!(
        artifacts(dir.path()),
        vec![artifact.clone()],
        "captured once, not again at close"
    );
}

#[test]
fn store_halt_captures_the_exact_retired_generation_after_unlink() {
    store_halt_captures_the_exact_retired_generation(false);
}

#[test]
fn store_halt_captures_the_exact_retired_generation_after_rename() {
    store_halt_captures_the_exact_retired_generation(true);
}

#[test]
fn every_public_write_method_fails_with_deleted_wal_generation_every_time_and_none_lands() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (db, _) = store_with_wal_only_sentinel(&path);
    lose_sidecars(&path, false);

    let mut first_capture = None;
    for round in 0..2 {
        for (method, result) in every_write(&db) {
            match result {
                Err(StoreError::WalLost {
                    capture: Some(capture),
                    ..
                }) => {
                    let first = first_capture.get_or_insert(capture.clone());
                    assert_eq!(&capture, first, "{method}: one capture per generation");
                }
                other => {
                    panic!("round {round}, {method}: expected WalLost, got {other:?}")
                }
            }
        }
    }
    // Reads of what the handle already sees go on working.
    assert_eq!(db.get_session("gw-0").unwrap().unwrap().message_count, 21);
    assert!(db.has_seen_retirement());
    db.close().unwrap();
    assert_no_write_landed(&path);
}

#[test]
fn every_public_write_method_fails_with_state_db_replaced_after_a_restore_and_none_lands() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let db = SessionDb::open(&path).unwrap();
    db.create_session(&NewSession::new("gw-0", "gateway"))
        .unwrap();
    db.append_message("gw-0", &NewMessage::new("user", "before the restore"))
        .unwrap();
    db.try_wal_checkpoint().expect("checkpoint ran");

    replace_main_file(&path);

    for round in 0..2 {
        for (method, result) in every_write(&db) {
            match result {
                Err(e @ StoreError::MainReplaced { .. }) => {
                    assert!(e.is_retired());
                    assert!(e.to_string().contains("replaced"), "{e}");
                }
                other => panic!("round {round}, {method}: expected MainReplaced, got {other:?}"),
            }
        }
    }
    assert_eq!(
        db.get_messages("gw-0").unwrap().len(),
        1,
        "reads still work"
    );
    db.close().unwrap();
    assert_no_write_landed(&path);
}

#[test]
fn store_close_captures_when_the_loss_is_first_seen_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (db, sentinel) = store_with_wal_only_sentinel(&path);
    lose_sidecars(&path, false);

    let closed = db.close().unwrap(); // no write in between: close() itself must notice the loss and capture

    let artifact = closed.capture.expect("captured at close");
    assert_eq!(manifest(&artifact)["trigger"], "close");
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

#[test]
fn store_close_refuses_to_settle_without_a_capture_and_succeeds_on_retry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (db, sentinel) = store_with_wal_only_sentinel(&path);
    lose_sidecars(&path, false);

    hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");
    let (db, err) = db.close().unwrap_err();
    assert!(
        matches!(&err, StoreError::CaptureFailed { message, .. } if message.contains("no space left on device")),
        "{err:?}"
    );
    assert!(err.to_string().contains("NOT closed"), "{err}");
    assert!(
        !db.is_closed(),
        "shutdown must not settle while the retired generation is uncaptured"
    );
    assert_eq!(db.retired_generation_capture(), None);
    // Still a working handle: reads answer, writes are refused with the pending capture error.
    assert_eq!(db.get_messages("gw-0").unwrap().len(), 21);
    match db.set_meta("k", "v") {
        Err(StoreError::WalLost {
            capture: None,
            capture_error: Some(why),
            ..
        }) => assert!(why.contains("no space left on device")),
        other => panic!("expected an uncaptured WalLost, got {other:?}"),
    }

    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    let closed = db.close().unwrap();
    let artifact = closed.capture.expect("captured on retry");
    let recovered = recover(&artifact, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

// ── release_or_close logs a capture failure ─────────────────────────────────────────────────

/// (level, target, message) of every record logged in this test process.
static LOGS: Mutex<Vec<(log::Level, String, String)>> = Mutex::new(Vec::new());

fn record_log(record: &log::Record<'_>) {
    LOGS.lock().push((
        record.level(),
        record.target().to_owned(),
        record.args().to_string(),
    ));
}

fn record_logs() {
    record_logs_into(record_log);
}

#[test]
fn a_failed_capture_surfaces_at_error_through_release_or_close_and_the_generation_stays_held() {
    record_logs();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (db, _) = store_with_wal_only_sentinel(&path);
    lose_sidecars(&path, false);
    let marker = format!("no space left on device ({})", dir.path().display());
    hermes_guard::test_hooks::inject_capture_fault(dir.path(), &marker);

    hermes_guard_store::registry::release_or_close(db); // must not fail

    assert!(artifacts(dir.path()).is_empty());
    // The guard logs the failed capture itself; this is release_or_close's own record.
    let logged_at_error = LOGS.lock().iter().any(|(level, target, text)| {
        *level == log::Level::Error
            && target.starts_with("hermes_guard_store::registry")
            && text.contains(&marker)
    });
    assert!(
        logged_at_error,
        "release_or_close must log the capture failure at ERROR"
    );

    // The guard holds the dropped handle's retired generation until a retry captures it.
    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    hermes_guard::retry_pending_captures();
    assert_eq!(artifacts(dir.path()).len(), 1);
}

#[test]
fn dropping_a_retired_store_without_close_still_captures() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (db, sentinel) = store_with_wal_only_sentinel(&path);
    lose_sidecars(&path, false);
    drop(db);
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(manifest(&found[0])["trigger"], "close");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

#[test]
fn opening_the_path_again_in_process_while_a_lost_generation_is_open_works_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (db, sentinel) = store_with_wal_only_sentinel(&path);
    lose_sidecars(&path, false);

    // The guard maps the wal-index per `-shm` file: a store opened now maps the new one and
    // writes, while the lost generation's store is still open.
    let fresh = SessionDb::open(&path).unwrap();
    fresh.ensure_session("after", "cli").unwrap();
    assert!(
        fresh.get_session("gw-0").unwrap().is_some(),
        "checkpointed history kept"
    );
    // Nothing of the new generation is captured; the lost one is, once, at its close.
    assert!(artifacts(dir.path()).is_empty());
    db.close().unwrap();
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "one loss, one capture");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}
