//! Close: the loss first seen at close is captured there, and a close that cannot capture does
//! not settle.

use crate::common;

use common::*;
use hermes_guard::GuardError;

#[test]
fn close_captures_when_the_loss_is_first_seen_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    lose_sidecars(&path, false);

    // No write in between: the close itself must notice the loss and capture.
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "exactly one capture: {found:?}");
    assert_eq!(manifest(&found[0])["trigger"], "close");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert!(integrity_ok(&recovered));
}

#[test]
fn dropping_a_connection_captures_at_close_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    lose_sidecars(&path, true);

    // A plain drop goes through sqlite3_close, whose pager asks the VFS whether the file moved.
    drop(conn);

    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "exactly one capture: {found:?}");
    assert_eq!(manifest(&found[0])["trigger"], "close");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

#[test]
fn close_refuses_to_settle_without_a_capture_and_succeeds_on_retry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    lose_sidecars(&path, false);

    hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");
    let (conn, err) = hermes_guard::close(conn).expect_err("close must not settle uncaptured");
    assert!(
        matches!(&err, GuardError::Capture(e) if e.to_string().contains("no space left on device")),
        "{err}"
    );
    let status = conn.guard_status().unwrap();
    assert!(status.retired && status.capture.is_none());
    assert!(status.capture_error.unwrap().contains("no space left"));
    assert!(
        artifacts(dir.path()).is_empty(),
        "a failed capture leaves nothing behind"
    );
    // The handle stays open and usable for reads of what it already sees.
    assert_eq!(count_like(&conn, &sentinel), 1);

    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1);
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

#[test]
fn a_refused_write_keeps_refusing_and_is_captured_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    lose_sidecars(&path, false);

    for _ in 0..5 {
        let err = insert(&conn, "after the loss").unwrap_err();
        assert!(is_refusal(&err), "{err}");
    }
    let status = conn.guard_status().unwrap();
    assert_eq!(status.refusals, 5);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    assert_eq!(
        artifacts(dir.path()).len(),
        1,
        "captured once per generation"
    );
}

#[test]
fn a_connection_opened_beside_a_lost_generation_writes_and_captures_nothing_of_its_own() {
    // A second connection opened in the same process while the first still maps the unlinked
    // -shm maps the new `-shm` at the path (the guard keeps one mapping per `-shm` file): it is
    // not retired, it writes, and its close captures nothing; the first one's close captures its
    // generation.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let first = open_guarded(&path);
    let sentinel = wal_only_sentinel(&first);
    lose_sidecars(&path, false);

    let second = open_guarded(&path);
    insert(&second, "through the new generation").unwrap();
    let status = second.guard_status().unwrap();
    assert!(!status.retired, "{status:?}");
    hermes_guard::close(second).map_err(|(_, e)| e).unwrap();
    assert!(
        artifacts(dir.path()).is_empty(),
        "a capture of the new generation was written"
    );
    assert!(is_refusal(&insert(&first, "refused").unwrap_err()));
    hermes_guard::close(first).map_err(|(_, e)| e).unwrap();
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}
