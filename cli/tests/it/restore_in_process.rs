//! Found by tests/explore: a backup renamed over the database while a guarded connection of the
//! same process holds it. The unix VFS keys a `-shm` node by the main file's inode, so an opener of
//! the restored file would get a node of its own on the old file's `-shm` (and, between processes'
//! locks never conflicting within one, share the old file's WAL with its connection). The stale-WAL
//! gate sets that WAL and `-shm` aside, whatever the WAL holds (here nothing: the old connection
//! truncated it), and the opener starts a WAL and a `-shm` of its own.

use std::fs;

use crate::common::{insert, integrity_ok, open_guarded, sidecar};
use crate::stale_wal::{count, seed_with_backup, RESTORED};
use hermes_guard::{identity_of_path, GuardExt, StaleWalAction};

#[test]
fn an_opener_of_a_file_renamed_in_under_a_connection_of_its_own_process_gets_a_wal_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (db, backup) = (dir.path().join("state.db"), dir.path().join("backup.db"));
    seed_with_backup(&db, &backup);
    let old = open_guarded(&db);
    for i in 0..3 {
        insert(&old, &format!("before the restore {i}")).unwrap();
    }
    // The WAL stays at the path, empty, open in `old`; its -shm mapped there.
    old.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let old_wal = identity_of_path(&sidecar(&db, "-wal")).unwrap().unwrap();
    let old_shm = identity_of_path(&sidecar(&db, "-shm")).unwrap().unwrap();

    fs::rename(&backup, &db).unwrap();
    let new = open_guarded(&db);
    assert_eq!(count(&new), RESTORED, "exactly the restored rows");
    let stale = new
        .guard_status()
        .unwrap()
        .stale_wal
        .expect("a stale-WAL report");
    assert_eq!(stale.action, StaleWalAction::SetAside);
    assert!(
        stale.detail.contains("a connection of this process"),
        "{}",
        stale.detail
    );
    let wal_now = identity_of_path(&sidecar(&db, "-wal")).unwrap().unwrap();
    let shm_now = identity_of_path(&sidecar(&db, "-shm")).unwrap().unwrap();
    assert_ne!(wal_now, old_wal, "the opener shares the old file's WAL");
    assert_ne!(shm_now, old_shm, "the opener shares the old file's -shm");

    insert(&new, "after the restore").unwrap();
    assert!(
        insert(&old, "into the replaced file").is_err(),
        "a write to the replaced file is refused"
    );
    drop(old);
    drop(new);
    let again = open_guarded(&db);
    assert_eq!(count(&again), RESTORED + 1);
    assert!(integrity_ok(&again));
}
