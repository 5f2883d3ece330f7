//! Found by tests/explore: a WAL whose writer's close could not checkpoint it (another process
//! holds SHARED on the database: a reader's lock), taken away while another connection of the
//! writer's process has the database open but has not read it yet. Nobody has the WAL open then;
//! the closing writer leaves it pinned for that opener, whose first read finds it gone and captures
//! it from the kept descriptor (`wal-lost`) before SQLite creates an empty one.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::{artifacts, count_like, insert, manifest, open_guarded, recover, sidecar};
use rusqlite::{Connection, OpenFlags};

/// SQLite's SHARED lock range on the main file (`SHARED_FIRST`, `SHARED_SIZE`).
const SHARED_FIRST: u64 = 0x4000_0002;
const SHARED_SIZE: u64 = 510;

/// Another process holding a read lock on `db`'s SHARED range, as a reading connection does:
/// the writer's close cannot take EXCLUSIVE, so it keeps the WAL. Released when stdin closes.
fn reader_lock(db: &Path) -> Child {
    let script = format!(
        "import fcntl, sys\nf = open(sys.argv[1], 'rb')\nfcntl.lockf(f, fcntl.LOCK_SH, {SHARED_SIZE}, {SHARED_FIRST}, 0)\nprint('locked', flush=True)\nsys.stdin.read()\n"
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    child
}

fn release(mut child: Child) {
    drop(child.stdin.take());
    child.wait().unwrap();
}

/// A guarded writer commits 3 rows and closes while another process holds a reader's lock (its
/// close cannot checkpoint) and a second guarded connection of this process has `db` open but
/// has not read it yet. Returns that opener and the reader.
fn writer_closed_beside_an_opener(db: &Path) -> (Connection, Child) {
    drop(open_guarded(db)); // the table, checkpointed: no WAL left
    let writer = open_guarded(db);
    let opener =
        Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME)
            .unwrap();
    for i in 0..3 {
        insert(&writer, &format!("left behind {i}")).unwrap();
    }
    let reader = reader_lock(db);
    drop(writer);
    (opener, reader)
}

#[test]
fn a_wal_taken_away_before_an_opener_of_the_writers_process_reads_is_captured() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let (opener, reader) = writer_closed_beside_an_opener(&db);
    assert!(sidecar(&db, "-wal").exists(), "the close kept the WAL");
    fs::rename(sidecar(&db, "-wal"), dir.path().join("moved-away")).unwrap();

    // The opener's first read opens the WAL: none at the path.
    let rows: i64 = opener
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0, "the main file without the moved WAL");
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "one capture: {found:?}");
    assert_eq!(manifest(&found[0])["reason"], "wal-lost");
    let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, "left behind%"), 3);
    drop(opener);
    release(reader);
}

#[test]
fn a_wal_left_for_an_opener_is_replayed_by_it_and_never_captured() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let (opener, reader) = writer_closed_beside_an_opener(&db);
    let rows: i64 = opener
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 3, "the opener replays the WAL the writer left");
    drop(opener);
    release(reader);
    assert!(artifacts(dir.path()).is_empty());
    let again = open_guarded(&db);
    assert_eq!(count_like(&again, "left behind%"), 3);
}
