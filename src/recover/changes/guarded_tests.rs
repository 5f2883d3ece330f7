//! End to end through the guard: a generation written by a guarded connection, whose `-wal` and
//! `-shm` are then removed, is captured with the base of its pages (`<file>-base`, freed pages
//! flagged); the changes computed from that capture alone are exactly the SQL difference the
//! generation made, with nothing undecided.

use rusqlite::{Connection, OpenFlags};

use super::tests::{computed, ops, oracle, setup, Run, TABLES};
use super::*;

/// The oracle tests' setup and operations, through the guard, then the loss and the capture.
/// Returns the run (its `wal` the captured WAL) and the capture directory.
fn guarded_run() -> (Run, std::path::PathBuf) {
    crate::vfs::register().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.db");
    let conn =
        Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), crate::VFS_NAME).unwrap();
    conn.execute_batch("PRAGMA page_size = 1024; PRAGMA journal_mode = WAL;")
        .unwrap();
    setup(&conn);
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let snapshot = std::fs::read(&path).unwrap();
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
    ops(&conn);
    for suffix in ["-wal", "-shm"] {
        let mut side = path.clone().into_os_string();
        side.push(suffix);
        std::fs::remove_file(side).unwrap();
    }
    let refused = conn.execute("INSERT INTO plain VALUES (-1, 'refused')", []);
    assert!(refused.is_err(), "the write after the loss is refused");
    let capture = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(".retired-wal-"))
        .expect("the generation is captured at the refusal");
    let wal = std::fs::read(capture.join("g.db-wal")).unwrap();
    (Run::from_parts(dir, conn, snapshot, wal), capture)
}

#[test]
fn a_guarded_generations_capture_gives_exactly_its_changes() {
    let (run, capture) = guarded_run();
    let want = oracle(&run, TABLES);
    let pages = GenerationPages::from_capture(&capture, 0).unwrap();
    assert!(
        !pages.freed.is_empty(),
        "the deletes freed pages, kept by the guard"
    );
    let changes = compute(&pages, None);
    assert!(
        changes.unattributed_pages.is_empty(),
        "{:#?}",
        changes.notes
    );
    for t in &changes.tables {
        assert!(t.undecided.is_empty(), "{}: {:#?}", t.name, t.undecided);
        assert!(t.unknown_base_pages.is_empty(), "{}", t.name);
    }
    assert_eq!(computed(&changes, TABLES), want);
}
