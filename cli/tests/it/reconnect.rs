//! A reconnect in the same process after a loss (issue 30): while a connection of the retired
//! generation stays open, a new connection to the database attaches to the unix VFS's shared
//! `-shm` mapping of the lost generation and is refused (`shm-lost`); the status of each says how
//! many such connections are still open here. Once they are all closed, a new connection maps
//! the `-shm` at the path afresh and works, without a restart.

use std::fs;

use crate::common::*;

#[test]
fn a_reconnect_is_refused_while_an_old_connection_is_open_and_works_once_all_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let old = open_guarded(&db);
    checkpointed_history(&old);
    insert(&old, "committed before the loss").unwrap();
    for suffix in ["-wal", "-shm"] {
        fs::remove_file(sidecar(&db, suffix)).unwrap();
    }
    assert!(is_refusal(&insert(&old, "refused").unwrap_err()));
    assert_eq!(old.guard_status().unwrap().retired_connections_here, 1);

    // A pool's new connection, the old one still open.
    let new = open_guarded(&db);
    let refused = insert(&new, "through the new connection").unwrap_err();
    assert!(is_refusal(&refused), "{refused}");
    let status = new.guard_status().unwrap();
    assert_eq!(status.reason, Some(hermes_guard::RetireReason::ShmLost));
    assert_eq!(
        status.retired_connections_here, 2,
        "the old one and this one"
    );

    drop(new);
    drop(old);
    let fresh = open_guarded(&db);
    insert(&fresh, "after every old connection closed").unwrap();
    let status = fresh.guard_status().unwrap();
    assert!(!status.retired, "a fresh generation");
    assert_eq!(status.retired_connections_here, 0);
    assert!(integrity_ok(&fresh));
    assert_eq!(count_like(&fresh, "after every old connection closed"), 1);
}
