//! A connection closing while another connection of the process holds the same generation, whose
//! last full check the directory watch still vouches for, owes no check of its own (the unix VFS
//! refuses its close's EXCLUSIVE in-process). These pin what that must not cost: a loss is still
//! captured, the last connection still checkpoints.

use std::sync::{Arc, Barrier};

use crate::common;

use common::*;

/// A loss after the closing connection's last write, beside a connection that may never write
/// or close again (an idle pool member): the closing connection still finds it (the directory
/// watch no longer vouches for the other's last check) and captures, once.
#[test]
fn a_loss_beside_an_idle_connection_is_captured_by_the_one_that_closes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let idle = open_guarded(&path);
    let churned = open_guarded(&path);
    let sentinel = wal_only_sentinel(&churned);
    lose_sidecars(&path, false);

    drop(churned);
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "captured at the close: {found:?}");
    assert_eq!(manifest(&found[0])["trigger"], "close");

    hermes_guard::close(idle).map_err(|(_, e)| e).unwrap();
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "one capture of the generation: {found:?}");
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

/// The vouch a closing connection's full check shares with the idle connection beside it (its
/// own last check was before an unrelated file came and went) stands only until the next change:
/// a loss after it is still found at the next close, and captured.
#[test]
fn a_vouch_shared_by_one_close_does_not_hide_a_loss_before_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let idle = open_guarded(&path);
    let sentinel = wal_only_sentinel(&idle);
    std::fs::write(dir.path().join("unrelated.log"), b"rotated").unwrap();
    std::fs::remove_file(dir.path().join("unrelated.log")).unwrap();
    for _ in 0..2 {
        let reader = open_guarded(&path);
        assert_eq!(count_like(&reader, &sentinel), 1);
        drop(reader);
    }
    assert!(artifacts(dir.path()).is_empty(), "nothing was lost yet");

    let churned = open_guarded(&path);
    insert(&churned, "written after the shared vouch").unwrap();
    lose_sidecars(&path, true);
    drop(churned);
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "captured at the close: {found:?}");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, "written after the shared vouch"), 1);
    assert_eq!(count_like(&recovered, &sentinel), 1);
    drop(idle);
}
