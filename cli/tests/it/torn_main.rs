//! A WAL lost while only partly checkpointed leaves the main file torn: the guard says so at the
//! loss, in the status and in the capture's manifest.

use crate::common;

use common::*;

#[test]
fn a_wal_lost_while_partly_checkpointed_is_reported_as_a_torn_main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let (reader, (log, done)) = partly_checkpointed(&conn, &path, 10);
    assert!(
        done > 0 && done < log,
        "the reader held the checkpoint back: {done} of {log}"
    );

    lose_sidecars(&path, false);
    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "expected a refusal, got {err}");

    let status = conn.guard_status().unwrap();
    assert!(status.main_torn, "status: {status:?}");
    let backfill = status.backfill_at_loss.expect("read from the -shm");
    assert_eq!(i64::from(backfill.frames), log);
    assert_eq!(i64::from(backfill.backfilled), done);

    let artifact = status.capture.expect("captured at the halt");
    let manifest = manifest(&artifact);
    assert_eq!(manifest["main_torn"], true);
    assert_eq!(manifest["backfill_at_loss"]["frames"], log);
    assert_eq!(manifest["backfill_at_loss"]["backfilled"], done);

    drop(reader);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}

#[test]
fn a_wal_lost_after_a_complete_checkpoint_is_not_reported_torn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let (reader, _) = partly_checkpointed(&conn, &path, 10);
    reader.execute_batch("COMMIT").unwrap();
    let (log, done): (i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(done, log, "nothing holds the checkpoint back now");

    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
    let status = conn.guard_status().unwrap();
    assert!(!status.main_torn, "status: {status:?}");
    assert_eq!(
        status.backfill_at_loss.map(|b| b.backfilled),
        Some(log as u32)
    );
    drop(reader);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}

#[test]
fn a_wal_lost_before_any_checkpoint_is_not_reported_torn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    insert(&conn, "only in the WAL").unwrap();

    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after the loss").unwrap_err()));
    let status = conn.guard_status().unwrap();
    assert!(!status.main_torn, "status: {status:?}");
    let backfill = status.backfill_at_loss.expect("read from the -shm");
    assert_eq!(backfill.backfilled, 0);
    assert!(backfill.frames > 0);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}

#[test]
fn a_live_connection_reports_no_backfill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "a row").unwrap();
    let status = conn.guard_status().unwrap();
    assert!(!status.retired && !status.main_torn);
    assert_eq!(status.backfill_at_loss, None);
}
