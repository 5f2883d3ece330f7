//! A reconnect in the same process after a loss: while a connection of the retired generation stays
//! open (and is refused), a new connection to the database maps the `-shm` now at the path — the
//! guard's wal-index node is one per `-shm` file, not SQLite's one per main file — and writes at
//! once, without a restart. The status of each says how many connections of a retired generation
//! are still open here: the old one until it is closed, then none.

use std::fs;

use crate::common::*;

#[test]
fn a_reconnect_writes_at_once_while_an_old_connection_stays_open_and_is_refused() {
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
    insert(&new, "through the new connection").unwrap();
    let status = new.guard_status().unwrap();
    assert!(!status.retired, "a fresh generation: {status:?}");
    assert_eq!(status.reason, None);
    assert_eq!(status.refusals, 0);
    assert_eq!(
        status.retired_connections_here, 1,
        "the old one, still open; not this one"
    );

    // The old connection is still refused after the new one wrote.
    let refused = insert(&old, "refused again").unwrap_err();
    assert!(is_refusal(&refused), "{refused}");
    let status = old.guard_status().unwrap();
    assert_eq!(status.refusals, 2);
    assert_eq!(status.retired_connections_here, 1);

    drop(old);
    insert(&new, "after the old connection closed").unwrap();
    let status = new.guard_status().unwrap();
    assert!(!status.retired);
    assert_eq!(status.retired_connections_here, 0);
    assert!(integrity_ok(&new));
    assert_eq!(count_like(&new, "through the new connection"), 1);
    assert_eq!(count_like(&new, "after the old connection closed"), 1);
    assert_eq!(count_like(&new, "refused%"), 0);
}
