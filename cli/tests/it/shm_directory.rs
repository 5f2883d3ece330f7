//! An `SQLITE_SHM_DIRECTORY` build keeps a database's shared memory in that directory, as
//! `sqlite-shm-<ino>-<dev>`, not as `<db>-shm`. The guard pins the mapped file and must check that
//! same file. Measured on cc1ba9f: every connection retired as `ShmLost` at its first full check (a
//! false refusal and a needless capture).
//!
//! These run only against such a build: tests/unusual-sqlite-builds.sh compiles SQLite with
//! `-DSQLITE_SHM_DIRECTORY` and runs them (`--ignored`) with `HERMES_GUARD_SHM_DIRECTORY` naming
//! the directory.

use crate::common;

use std::path::PathBuf;

use common::*;

/// The build's shared-memory directory, as the script names it.
fn shm_directory() -> PathBuf {
    PathBuf::from(
        std::env::var_os("HERMES_GUARD_SHM_DIRECTORY")
            .expect("run by tests/unusual-sqlite-builds.sh, which names the SQLITE_SHM_DIRECTORY"),
    )
}

/// The shared-memory files in the build's directory.
fn shm_files() -> Vec<PathBuf> {
    std::fs::read_dir(shm_directory())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("sqlite-shm-"))
        .collect()
}

#[test]
#[ignore = "needs an SQLITE_SHM_DIRECTORY build: tests/unusual-sqlite-builds.sh"]
fn a_connection_of_an_shm_directory_build_writes_on_without_a_false_alarm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    for i in 0..10 {
        insert(&conn, &format!("row {i}")).unwrap();
    }
    assert!(
        !sidecar(&path, "-shm").exists(),
        "the build keeps no <db>-shm"
    );
    assert_eq!(shm_files().len(), 1, "{:?}", shm_files());

    // The status runs a full check.
    let status = conn.guard_status().unwrap();
    assert!(!status.retired, "{status:?}");
    assert!(status.shm.is_some(), "the shared memory is pinned");
    insert(&conn, "after the check").unwrap();
    assert!(artifacts(dir.path()).is_empty());
}

#[test]
#[ignore = "needs an SQLITE_SHM_DIRECTORY build: tests/unusual-sqlite-builds.sh"]
fn an_shm_directory_builds_shared_memory_unlinked_under_the_connection_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    checkpointed_history(&conn);
    let before = shm_files();
    let ours: Vec<_> = before
        .iter()
        .filter(|p| {
            p.to_string_lossy()
                .contains(&format!("-{:x}-", identity(&path).ino as u32))
        })
        .collect();
    assert_eq!(ours.len(), 1, "{before:?}");
    std::fs::remove_file(ours[0]).unwrap();

    match insert(&conn, "after the loss") {
        Err(e) if is_refusal(&e) => {}
        other => panic!("the write after the loss was not refused: {other:?}"),
    }
    let status = conn.guard_status().unwrap();
    assert_eq!(status.reason, Some(hermes_guard::RetireReason::ShmLost));
}
