//! The guard's own wal-index node (`src/vfs/wal_index/`) speaks SQLite's shared-memory protocol
//! with stock connections: in this process (SQLite's node, POSIX locks, beside the guard's OFD
//! locks) and in another one (Debian's `/usr/bin/python3` with its stdlib `sqlite3`, the system
//! SQLite 3.40). A guarded and a stock connection exclude each other's writers, honour each
//! other's readers, write side by side, and neither's close drops the other's dead-man switch.
//!
//! The peer process tests skip, saying why, where the system Python is absent.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use rusqlite::{Connection, ErrorCode};

use crate::common::*;
use crate::system_python::{peer_getlk, system_python, SHM_DMS};

/// The peer: `writer <db> <tag>` connects (stock VFS, 10 s busy timeout, `synchronous=NORMAL`),
/// prints `ready` and runs the commands of its stdin, one a line, answering each with a line:
/// `txn <rows> <pad>` commits one transaction (BEGIN IMMEDIATE) of `rows` rows tagged `tag`
/// whose content is padded with `pad` bytes (`done`); `free <txns> <rows> <pad>` commits
/// `txns` such transactions (`done`); `pragma <text>` runs `PRAGMA <text>` (`done`); `check`
/// prints its count of `tag` rows and the `integrity_check`; `quit` closes and exits.
const PEER: &str = r#"
import sys
mode = sys.argv[1]
if mode == "writer":
    import sqlite3
    db, tag = sys.argv[2], sys.argv[3]
    c = sqlite3.connect(db, isolation_level=None, timeout=10)
    c.execute("PRAGMA synchronous=NORMAL")
    t = 0
    def txn(rows, pad):
        global t
        c.execute("BEGIN IMMEDIATE")
        for i in range(rows):
            c.execute("INSERT INTO messages (session, content) VALUES (?, ?)",
                      (tag, "%s %d %d %s" % (tag, t, i, "x" * pad)))
        c.execute("COMMIT")
        t += 1
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "txn":
            txn(int(cmd[1]), int(cmd[2]))
            print("done", flush=True)
        elif cmd[0] == "free":
            for _ in range(int(cmd[1])):
                txn(int(cmd[2]), int(cmd[3]))
            print("done", flush=True)
        elif cmd[0] == "pragma":
            c.execute("PRAGMA " + " ".join(cmd[1:])).fetchall()
            print("done", flush=True)
        elif cmd[0] == "check":
            n = c.execute("SELECT COUNT(*) FROM messages WHERE session = ?", (tag,)).fetchone()[0]
            ok = c.execute("PRAGMA integrity_check").fetchone()[0]
            print(n, ok, flush=True)
        elif cmd[0] == "quit":
            break
    c.close()
"#;

/// The guarded connection maps the wal-index through the guard's own node (whose dead-man switch
/// lock the status reports), not SQLite's.
#[track_caller]
fn assert_own_node(guarded: &Connection) {
    assert!(
        guarded.guard_status().unwrap().shield_shm_active,
        "the guarded connection holds the dead-man switch through its own node"
    );
}

fn this_pid() -> i64 {
    i64::from(std::process::id())
}

/// `conn` waits for no lock: a busy answer comes back at once.
fn no_wait(conn: &Connection) {
    conn.pragma_update(None, "busy_timeout", 0).unwrap();
}

/// The primary and extended result codes of a statement that failed.
fn failure(result: rusqlite::Result<()>) -> (ErrorCode, i32) {
    match result {
        Err(rusqlite::Error::SqliteFailure(e, _)) => (e.code, e.extended_code),
        other => panic!("expected a SQLite failure, got {other:?}"),
    }
}

fn count(conn: &Connection) -> i64 {
    conn.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap()
}

/// `holder` opens a write transaction (BEGIN IMMEDIATE and one row, not committed); `contender`,
/// waiting for nothing, tries BEGIN IMMEDIATE: its result. Then the holder commits, and the
/// contender's BEGIN IMMEDIATE succeeds and sees the holder's row.
fn contend_for_the_write_lock(holder: &Connection, contender: &Connection) -> (ErrorCode, i32) {
    no_wait(contender);
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    insert(holder, "holder's uncommitted row").unwrap();
    let refused = failure(contender.execute_batch("BEGIN IMMEDIATE"));
    holder.execute_batch("COMMIT").unwrap();
    contender.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert_eq!(count(contender), 1, "the holder's row, once committed");
    contender.execute_batch("COMMIT").unwrap();
    refused
}

#[test]
fn a_guarded_write_transaction_makes_a_stock_begin_immediate_of_the_same_process_busy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let guarded = open_guarded(&path);
    assert_own_node(&guarded);
    let stock = open_stock(&path);
    assert_eq!(
        contend_for_the_write_lock(&guarded, &stock),
        (ErrorCode::DatabaseBusy, rusqlite::ffi::SQLITE_BUSY)
    );
}

#[test]
fn a_stock_write_transaction_makes_a_guarded_begin_immediate_of_the_same_process_busy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let guarded = open_guarded(&path);
    assert_own_node(&guarded);
    let stock = open_stock(&path);
    assert_eq!(
        contend_for_the_write_lock(&stock, &guarded),
        (ErrorCode::DatabaseBusy, rusqlite::ffi::SQLITE_BUSY)
    );
}

/// `(busy, log, checkpointed)` of `PRAGMA wal_checkpoint(RESTART)` on `checkpointer` (waiting for
/// nothing), made while `reader` holds a read transaction begun before the checkpointer's last 10
/// commits, or after `reader` ended it (`reader_done`). Automatic checkpoints are off.
fn restart_beside_a_reader(
    checkpointer: &Connection,
    reader: &Connection,
    reader_done: bool,
) -> (i64, i64, i64) {
    no_wait(checkpointer);
    checkpointer
        .execute_batch("PRAGMA wal_autocheckpoint=0")
        .unwrap();
    reader.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..10 {
        insert(checkpointer, &format!("before the read {i}")).unwrap();
    }
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(count(reader), 10, "the reader's snapshot");
    for i in 0..10 {
        insert(checkpointer, &format!("after the read {i}")).unwrap();
    }
    if reader_done {
        reader.execute_batch("COMMIT").unwrap();
    }
    let outcome = checkpointer
        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    if !reader_done {
        assert_eq!(count(reader), 10, "the reader's snapshot is intact");
        reader.execute_batch("COMMIT").unwrap();
    }
    outcome
}

/// The same with two stock connections: what SQLite does between connections of its own.
fn restart_beside_a_stock_reader(dir: &Path) -> (i64, i64, i64) {
    let path = dir.join("stock-pair.db");
    let checkpointer = open_stock(&path);
    let reader = open_stock(&path);
    restart_beside_a_reader(&checkpointer, &reader, false)
}

#[test]
fn a_guarded_readers_open_transaction_keeps_a_stock_restart_checkpoint_from_completing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let checkpointer = open_stock(&path);
    let reader = open_guarded(&path);
    assert_own_node(&reader);
    let (busy, log, done) = restart_beside_a_reader(&checkpointer, &reader, false);
    assert_eq!(busy, 1, "RESTART waits for the reader: busy");
    assert!(
        done < log,
        "frames past the reader's snapshot stay in the WAL: {done}/{log}"
    );
    assert_eq!(
        (busy, log, done),
        restart_beside_a_stock_reader(dir.path()),
        "as beside a stock reader"
    );
}

#[test]
fn a_stock_readers_open_transaction_keeps_a_guarded_restart_checkpoint_from_completing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let checkpointer = open_guarded(&path);
    assert_own_node(&checkpointer);
    let reader = open_stock(&path);
    let (busy, log, done) = restart_beside_a_reader(&checkpointer, &reader, false);
    assert_eq!(busy, 1, "RESTART waits for the reader: busy");
    assert!(
        done < log,
        "frames past the reader's snapshot stay in the WAL: {done}/{log}"
    );
    assert_eq!(
        (busy, log, done),
        restart_beside_a_stock_reader(dir.path()),
        "as beside a stock reader"
    );
}

#[test]
fn a_stock_restart_checkpoint_completes_once_the_guarded_reader_ends_its_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let checkpointer = open_stock(&path);
    let reader = open_guarded(&path);
    assert_own_node(&reader);
    let (busy, log, done) = restart_beside_a_reader(&checkpointer, &reader, true);
    assert_eq!(
        (busy, done),
        (0, log),
        "every frame checkpointed, the WAL restarted"
    );
}

/// The stock peer process of [`PEER`]'s `writer` mode.
struct PeerWriter {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl PeerWriter {
    fn start(python: &str, db: &Path, tag: &str) -> PeerWriter {
        let mut child = Command::new(python)
            .arg("-c")
            .arg(PEER)
            .args(["writer", db.to_str().unwrap(), tag])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut peer = PeerWriter {
            child,
            stdin,
            lines,
        };
        assert_eq!(peer.answer(), "ready");
        peer
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self) -> String {
        self.lines
            .next()
            .expect("the peer exited")
            .expect("the peer's stdout")
    }

    fn call(&mut self, command: &str) -> String {
        self.send(command);
        self.answer()
    }

    fn quit(mut self) {
        self.send("quit");
        assert!(self.child.wait().unwrap().success(), "the peer failed");
    }
}

/// One transaction of `rows` rows tagged `guard`, padded with `pad` bytes.
fn guarded_txn(conn: &Connection, t: u32, rows: u32, pad: usize) {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    for i in 0..rows {
        conn.execute(
            "INSERT INTO messages (session, content) VALUES ('guard', ?1)",
            [format!("guard {t} {i} {}", "x".repeat(pad))],
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
}

/// A guarded connection here and a stock one in another process write 10,000 rows: first taking
/// turns, a transaction each (automatic checkpoints off, rows of a page each: the WAL passes the
/// 4062 frames of the wal-index's first region, so both map and read its second), then both at
/// once with automatic checkpoints on (the WAL checkpointed and restarted under both). Each
/// sees every row of the other, and the database is sound.
#[test]
fn a_guarded_and_a_stock_process_writing_in_turns_and_at_once_keep_every_row() {
    const TURNS: u32 = 250;
    const AT_ONCE: u32 = 250;
    const ROWS: u32 = 10;
    /// Near a page per row (4096-byte pages; no overflow page).
    const BIG: usize = 3500;
    const SMALL: usize = 100;
    /// The frames the first region of the wal-index indexes (`HASHTABLE_NPAGE_ONE`).
    const FIRST_REGION_FRAMES: u64 = 4062;
    let Some(python) = system_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let guarded = open_guarded(&path);
    assert_own_node(&guarded);
    guarded
        .execute_batch("PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0")
        .unwrap();
    let mut peer = PeerWriter::start(python, &path, "peer");
    assert_eq!(peer.call("pragma wal_autocheckpoint=0"), "done");

    for t in 0..TURNS {
        assert_eq!(peer.call(&format!("txn {ROWS} {BIG}")), "done");
        guarded_txn(&guarded, t, ROWS, BIG);
    }
    let wal_frames = (std::fs::metadata(sidecar(&path, "-wal")).unwrap().len() - 32) / (4096 + 24);
    assert!(
        wal_frames > FIRST_REGION_FRAMES,
        "the WAL reaches the wal-index's second region: {wal_frames} frames"
    );
    let shm_len = std::fs::metadata(sidecar(&path, "-shm")).unwrap().len();
    assert!(
        shm_len >= 2 * 32768,
        "the -shm was grown to its second region: {shm_len} bytes"
    );
    let taking_turns = i64::from(TURNS * ROWS * 2);
    assert_eq!(count(&guarded), taking_turns);

    guarded
        .execute_batch("PRAGMA wal_autocheckpoint=1000")
        .unwrap();
    assert_eq!(peer.call("pragma wal_autocheckpoint=1000"), "done");
    peer.send(&format!("free {AT_ONCE} {ROWS} {SMALL}"));
    for t in TURNS..TURNS + AT_ONCE {
        guarded_txn(&guarded, t, ROWS, SMALL);
    }
    assert_eq!(peer.answer(), "done");

    let each = i64::from((TURNS + AT_ONCE) * ROWS);
    assert_eq!(
        peer.call("check"),
        format!("{each} ok"),
        "the peer's count of its rows and integrity_check"
    );
    peer.quit();
    let by_session = |conn: &Connection, session: &str| -> i64 {
        conn.query_row(
            "SELECT COUNT(*) FROM messages WHERE session = ?1",
            [session],
            |r| r.get(0),
        )
        .unwrap()
    };
    let turns: i64 = guarded
        .query_row(
            "SELECT COUNT(*) FROM (SELECT session, LAG(session) OVER (ORDER BY id) AS prev \
             FROM messages) WHERE prev IS NOT NULL AND prev <> session",
            [],
            |r| r.get(0),
        )
        .unwrap();
    println!("{turns} changes of writer");
    assert!(
        turns >= i64::from(2 * TURNS - 1),
        "the writers took turns: {turns} changes of writer"
    );
    assert_eq!(by_session(&guarded, "guard"), each);
    assert_eq!(by_session(&guarded, "peer"), each);
    assert!(integrity_ok(&guarded));
    drop(guarded);

    let check = Connection::open(&path).unwrap();
    assert_eq!(by_session(&check, "guard"), each);
    assert_eq!(by_session(&check, "peer"), each);
    assert!(integrity_ok(&check));
}

#[test]
fn closing_a_stock_connection_of_the_process_leaves_the_guarded_ones_dms_lock_visible() {
    let Some(python) = system_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let shm = sidecar(&path, "-shm");
    let guarded = open_guarded(&path);
    assert_own_node(&guarded);
    insert(&guarded, "guarded").unwrap();
    let stock = open_stock(&path);
    insert(&stock, "stock").unwrap();
    // Its close closes SQLite's descriptor of the -shm: every POSIX lock of this process on it
    // goes.
    stock.close().map_err(|(_, e)| e).unwrap();
    assert_eq!(
        peer_getlk(python, &shm, SHM_DMS, 1),
        ("read".to_string(), -1),
        "another process sees the guarded connection's OFD lock"
    );
}

#[test]
fn closing_the_guarded_connection_leaves_a_stock_ones_dms_lock_of_the_process_visible() {
    let Some(python) = system_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let shm = sidecar(&path, "-shm");
    let stock = open_stock(&path);
    insert(&stock, "stock").unwrap();
    let guarded = open_guarded(&path);
    assert_own_node(&guarded);
    insert(&guarded, "guarded").unwrap();
    // The node's descriptor of the -shm must not be closed while this process's POSIX locks
    // (the stock connection's) are on the file.
    guarded.close().map_err(|(_, e)| e).unwrap();
    assert_eq!(
        peer_getlk(python, &shm, SHM_DMS, 1),
        ("read".to_string(), this_pid()),
        "another process sees the stock connection's POSIX lock"
    );
    insert(&stock, "after the guarded close").unwrap();
    assert_eq!(count(&stock), 3);
}

/// `SQLITE_FCNTL_EXTERNAL_READER` on a guarded connection's main file: 1 or 0.
fn external_reader(conn: &Connection) -> i32 {
    let mut out: std::ffi::c_int = -1;
    // SAFETY: the connection's handle is open for the call; "main" is NUL-terminated, and the
    // control writes one `int` into `out`, which outlives the call.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_EXTERNAL_READER,
            (&mut out as *mut std::ffi::c_int).cast(),
        )
    };
    assert_eq!(rc, rusqlite::ffi::SQLITE_OK);
    out
}

#[test]
fn the_guarded_node_reports_an_external_reader_while_a_stock_one_holds_a_read_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let guarded = open_guarded(&path);
    assert_own_node(&guarded);
    insert(&guarded, "row").unwrap();
    let stock = open_stock(&path);
    assert_eq!(external_reader(&guarded), 0, "nobody reads");
    stock.execute_batch("BEGIN").unwrap();
    count(&stock);
    assert_eq!(external_reader(&guarded), 1, "the stock reader's mark");
    stock.execute_batch("COMMIT").unwrap();
    assert_eq!(external_reader(&guarded), 0, "the mark released");
}

/// Connections of one database opening at once in many threads: each new one looks at the
/// others' nodes to join without a `stat` while they map theirs. Every thread finishes (a lock
/// taken in the wrong order would hang them: the watchdog's limit is far beyond a normal run).
#[test]
fn connections_mapping_at_once_in_eight_threads_all_finish() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let peer = open_guarded(&path);
    insert(&peer, "row").unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    for _ in 0..8 {
        let path = path.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..100 {
                let conn = open_guarded(&path);
                assert!(count(&conn) >= 1);
            }
            done.send(()).unwrap();
        });
    }
    for thread in 0..8 {
        finished
            .recv_timeout(std::time::Duration::from_secs(300))
            .unwrap_or_else(|_| panic!("thread {thread} of 8 did not finish: a deadlock"));
    }
}
