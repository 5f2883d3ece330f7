//! The directory watch that spares transaction starts their `stat` calls must never make the
//! guard miss a loss, nor invent one.

use crate::common;

use std::fs;

use common::*;

#[test]
fn a_loss_after_many_vouched_transactions_is_refused_at_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    // Many transactions with nothing changing in the directory: the fast path is in use.
    for i in 0..300 {
        insert(&conn, &format!("row {i}")).unwrap();
    }
    fs::remove_file(sidecar(&path, "-wal")).unwrap();
    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    drop(conn);
}

#[test]
fn a_renamed_wal_is_refused_at_the_next_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    for i in 0..50 {
        insert(&conn, &format!("row {i}")).unwrap();
    }
    fs::rename(sidecar(&path, "-wal"), dir.path().join("elsewhere")).unwrap();
    assert!(is_refusal(&insert(&conn, "after the rename").unwrap_err()));
}

#[test]
fn churn_of_unrelated_files_in_the_directory_is_no_loss() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    for i in 0..200 {
        let scratch = dir.path().join(format!("scratch-{i}"));
        fs::write(&scratch, b"x").unwrap();
        insert(&conn, &format!("row {i}")).unwrap();
        fs::rename(&scratch, dir.path().join("scratch-moved")).unwrap();
        insert(&conn, &format!("row {i} again")).unwrap();
    }
    let status = conn.guard_status().unwrap();
    assert!(!status.retired);
    assert_eq!(status.refusals, 0);
    assert_eq!(count_like(&conn, "row %"), 400);
}

#[test]
fn a_wal_renamed_away_and_back_between_transactions_is_the_same_generation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "before").unwrap();
    let wal = sidecar(&path, "-wal");
    fs::rename(&wal, dir.path().join("parked")).unwrap();
    fs::rename(dir.path().join("parked"), &wal).unwrap();
    insert(&conn, "after").unwrap();
    assert!(!conn.guard_status().unwrap().retired);
}
