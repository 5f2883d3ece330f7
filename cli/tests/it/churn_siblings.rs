//! Issue 36: a connection closing while another connection of the process holds the same
//! generation owes no check of its own (the unix VFS refuses its close's EXCLUSIVE in-process);
//! what it would have found, the other connection finds and captures. These pin that hand-over.

use std::sync::{Arc, Barrier};

use crate::common;

use common::*;

#[test]
fn a_loss_left_by_a_closing_connection_is_captured_by_the_one_still_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let holder = open_guarded(&path);
    let churned = open_guarded(&path);
    let sentinel = wal_only_sentinel(&churned);
    lose_sidecars(&path, false);

    drop(churned);
    assert!(
        artifacts(dir.path()).is_empty(),
        "the closing connection leaves the generation to the one still open"
    );

    hermes_guard::close(holder).map_err(|(_, e)| e).unwrap();
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "exactly one capture: {found:?}");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert!(integrity_ok(&recovered));
}

#[test]
fn a_connection_closing_beside_another_leaves_the_wal_and_the_last_one_checkpoints_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let holder = open_guarded(&path);
    holder.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    let churned = open_guarded(&path);
    insert(&churned, "written by the churned connection").unwrap();
    drop(churned);
    assert!(sidecar(&path, "-wal").exists());
    assert_eq!(count_like(&holder, "written by the churned%"), 1);

    drop(holder);
    assert!(
        !sidecar(&path, "-wal").exists(),
        "the last connection's close checkpoints and deletes the WAL, as stock's does"
    );
    let reopened = open_stock(&path);
    assert_eq!(count_like(&reopened, "written by the churned%"), 1);
    assert!(integrity_ok(&reopened));
}

/// Two connections of one generation closing at the same moment after a loss: each marks
/// itself closing before it looks for the other, so at least one of them checks and the
/// generation is captured (once). Every round must hold, however the threads interleave.
#[test]
fn two_connections_closing_at_once_after_a_loss_leave_one_capture() {
    for round in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let first = open_guarded(&path);
        let second = open_guarded(&path);
        let sentinel = wal_only_sentinel(&second);
        lose_sidecars(&path, round % 2 == 1);
        let barrier = Arc::new(Barrier::new(2));
        let closers: Vec<_> = [first, second]
            .into_iter()
            .map(|conn| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    drop(conn);
                })
            })
            .collect();
        for closer in closers {
            closer.join().unwrap();
        }
        let found = artifacts(dir.path());
        assert_eq!(
            found.len(),
            1,
            "round {round}: exactly one capture: {found:?}"
        );
        let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1, "round {round}");
    }
}
