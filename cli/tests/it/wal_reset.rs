//! SQLite's WAL-reset race (3.7.0–3.51.2, sqlite.org/wal.html#walresetbug), forced
//! deterministically through a pausing VFS stacked above the guard (`pause_vfs.rs`), and the rule
//! that keeps a WAL reset and a checkpoint apart.
//!
//! These tests run on the bundled SQLite (3.54.x: the race is fixed there, the forced
//! interleaving keeps every row with the rule or without), on the system SQLite 3.40.1
//! (tests/system-sqlite.sh) and on the bundled SQLite 3.50.2 of libsqlite3-sys 0.35
//! (tests/unusual-sqlite-builds.sh), where without the rule the committed update is lost.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use hermes_guard::{sqlite_has_wal_reset_race, GuardStatus};
use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags};

use crate::common::GuardExt;
use crate::pause_vfs::PauseVfs;

const ROWS: i64 = 20;
/// What the commit made at the pause sets `v` to (the commit that resets the WAL).
const AT_PAUSE: i64 = 1_000;
/// What the full rewrite after it sets `v` to: every row's last committed update.
const LAST_UPDATE: i64 = 2_000;

fn open(path: &Path, vfs: &str) -> Connection {
    hermes_guard::register().unwrap();
    let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    conn
}

fn set_rule(conn: &Connection, on: bool) {
    let value = if on { "on" } else { "off" };
    let now: String = conn
        .query_row(
            &format!("PRAGMA hermes_guard_wal_reset_guard={value}"),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(now, value);
}

/// `(busy, log, checkpointed)` of a `PRAGMA wal_checkpoint(mode)`.
fn checkpoint(conn: &Connection, mode: &str) -> (i64, i64, i64) {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
    .unwrap()
}

fn integrity(conn: &Connection) -> String {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .unwrap_or_else(|e| e.to_string())
}

struct Outcome {
    /// The checkpointer reached the pause and the writer's commit ran there.
    paused: bool,
    /// Rows whose last committed update is visible after the rewrite and the checkpoint.
    kept: i64,
    integrity: String,
    writer: GuardStatus,
    checkpointer: GuardStatus,
}

/// The interleaving of walrestart.test, through the guard: a checkpoint completes; a second
/// (PASSIVE) checkpoint starts and is paused between its header read and its `nBackfill`
/// check; there a second connection updates every row and commits (the commit that resets the
/// WAL); the checkpoint resumes. Then a full rewrite, a TRUNCATE checkpoint, the count of rows
/// with their last update, and `integrity_check`.
fn forced_race(dir: &Path, vfs_name: &str, rule: bool) -> Outcome {
    hermes_guard::register().unwrap();
    let pause = PauseVfs::register(vfs_name, hermes_guard::VFS_NAME);
    let path = dir.join("state.db");
    let writer = open(&path, hermes_guard::VFS_NAME);
    set_rule(&writer, rule);
    writer
        .execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER, pad BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20)
             INSERT INTO t SELECT i, 0, randomblob(3000) FROM n;",
        )
        .unwrap();
    let checkpointer = open(&path, &pause.name);
    set_rule(&checkpointer, rule);
    // The checkpointer reads the header now: at its checkpoint the header has changed (the
    // condition of the `xUnfetch(0, NULL)` the pause waits at).
    let n: i64 = checkpointer
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, ROWS);
    // A WAL of three rewrites, checkpointed completely: the next commit resets the WAL.
    for _ in 0..3 {
        writer
            .execute("UPDATE t SET v = v + 1, pad = randomblob(3000)", [])
            .unwrap();
    }
    let (busy, log, done) = checkpoint(&writer, "PASSIVE");
    assert_eq!((busy, log), (0, done), "the first checkpoint completes");

    let writer = Arc::new(Mutex::new(writer));
    let at_pause = Arc::clone(&writer);
    pause.arm(move || {
        at_pause
            .lock()
            .execute("UPDATE t SET v = ?1", [AT_PAUSE])
            .unwrap();
    });
    checkpoint(&checkpointer, "PASSIVE");
    let paused = pause.paused();

    let writer = writer.lock();
    let rewrite = writer.execute("UPDATE t SET v = ?1, pad = randomblob(3000)", [LAST_UPDATE]);
    let _ =
        rewrite.and_then(|_| writer.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())));
    // Read back on a fresh connection: the writer's page cache may still hold what it wrote.
    let reader = open(&path, hermes_guard::VFS_NAME);
    let kept = reader
        .query_row("SELECT count(*) FROM t WHERE v = ?1", [LAST_UPDATE], |r| {
            r.get(0)
        })
        .unwrap_or(-1);
    Outcome {
        paused,
        kept,
        integrity: integrity(&reader),
        writer: writer.guard_status().unwrap(),
        checkpointer: checkpointer.guard_status().unwrap(),
    }
}

fn affected() -> bool {
    sqlite_has_wal_reset_race(rusqlite::version_number())
}

#[test]
fn the_forced_race_keeps_every_row_with_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let out = forced_race(dir.path(), "wal-reset-pause-on", true);
    assert!(out.paused, "the checkpointer reached the pause");
    assert_eq!(out.kept, ROWS, "every row keeps its last committed update");
    assert_eq!(out.integrity, "ok");
    assert_eq!(
        out.writer.wal_resets_deferred, 1,
        "the reset waited for the checkpoint"
    );
    assert_eq!(out.checkpointer.wal_index_alarms, 0);
}

/// Proves the test can fail: on a SQLite with the race, the same interleaving without the rule
/// loses the committed update and the tripwire sounds; on a fixed SQLite it keeps every row.
#[test]
fn the_forced_race_without_the_rule_loses_rows_only_on_an_affected_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let out = forced_race(dir.path(), "wal-reset-pause-off", false);
    assert!(out.paused, "the checkpointer reached the pause");
    assert_eq!(out.writer.wal_resets_deferred, 0);
    println!(
        "SQLite {}: {} of {ROWS} rows kept, integrity_check: {}, tripwire alarms {}",
        rusqlite::version(),
        out.kept,
        out.integrity,
        out.checkpointer.wal_index_alarms
    );
    if affected() {
        assert!(out.kept < ROWS, "the committed update is lost");
        assert_eq!(out.checkpointer.wal_index_alarms, 1, "the tripwire sounded");
    } else {
        assert_eq!(out.kept, ROWS);
        assert_eq!(out.integrity, "ok");
        assert_eq!(out.checkpointer.wal_index_alarms, 0);
    }
}

#[test]
fn the_rule_is_on_by_default_exactly_where_sqlite_has_the_race() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open(&dir.path().join("state.db"), hermes_guard::VFS_NAME);
    let status = conn.guard_status().unwrap();
    assert_eq!(status.wal_reset_guard, hermes_guard::wal_reset_guard_on());
    if hermes_guard::wal_reset_guard() == hermes_guard::WalResetGuard::Auto {
        assert_eq!(status.wal_reset_guard, affected());
    }
}

#[test]
fn a_wal_reset_with_no_checkpoint_running_goes_ahead_under_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open(&dir.path().join("state.db"), hermes_guard::VFS_NAME);
    set_rule(&conn, true);
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1), (2);")
        .unwrap();
    let (_, log, done) = checkpoint(&conn, "PASSIVE");
    assert_eq!(log, done);
    conn.execute("INSERT INTO t VALUES (3)", []).unwrap();
    let status = conn.guard_status().unwrap();
    assert_eq!(
        (status.wal_resets_guarded, status.wal_resets_deferred),
        (1, 0)
    );
    let (_, log, _) = checkpoint(&conn, "PASSIVE");
    assert_eq!(
        log, 1,
        "the WAL restarted: the commit's one frame is at its start"
    );
}

#[test]
fn restart_and_truncate_checkpoints_pass_the_rule_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open(&path, hermes_guard::VFS_NAME);
    set_rule(&conn, true);
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    let guarded = |conn: &Connection| {
        let status = conn.guard_status().unwrap();
        (status.wal_resets_guarded, status.wal_resets_deferred)
    };
    assert_eq!(checkpoint(&conn, "RESTART").0, 0);
    assert_eq!(
        guarded(&conn),
        (0, 0),
        "RESTART's request is not a reset the rule orders"
    );
    // The next commit restarts the WAL: that one is.
    conn.execute("INSERT INTO t VALUES (2)", []).unwrap();
    assert_eq!(guarded(&conn), (1, 0));
    assert_eq!(checkpoint(&conn, "TRUNCATE"), (0, 0, 0));
    assert_eq!(
        std::fs::metadata(dir.path().join("state.db-wal"))
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        guarded(&conn),
        (1, 0),
        "TRUNCATE's request is not one either"
    );
}

/// The tripwire: a wal-index whose `nBackfill` is past its `mxFrame` (written here into the
/// `-shm` by hand, as the race leaves it) is reported at the end of the next checkpoint.
#[test]
fn the_tripwire_reports_nbackfill_past_mxframe_at_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open(&path, hermes_guard::VFS_NAME);
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    let (_, log, _) = checkpoint(&conn, "PASSIVE");
    assert!(log > 0);
    assert_eq!(conn.guard_status().unwrap().wal_index_alarms, 0);
    let shm = OpenOptions::new()
        .write(true)
        .open(dir.path().join("state.db-shm"))
        .unwrap();
    // nBackfill, native-endian, at offset 96 of the wal-index.
    shm.write_at(&(log as u32 + 5).to_ne_bytes(), 96).unwrap();
    checkpoint(&conn, "PASSIVE");
    assert_eq!(conn.guard_status().unwrap().wal_index_alarms, 1);
}

/// `fcntl(F_OFD_SETLK)` of one byte of `file`: a lock owned by the open file description, which
/// conflicts with SQLite's own (process-owned) locks even in this process — as another
/// process's would.
fn ofd_lock(file: &std::fs::File, byte: i64, kind: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed flock is a valid value; the fields that matter are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = byte;
    lock.l_len = 1;
    // SAFETY: a valid descriptor and a valid flock for the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// Another process's checkpoint (its lock on the checkpoint byte of the `-shm`, 120 + 1)
/// defers the reset: the commit appends and succeeds; once the checkpoint is over, the next
/// commit resets the WAL.
#[test]
fn a_checkpoint_lock_held_elsewhere_defers_the_reset_and_the_commit_appends() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open(&dir.path().join("state.db"), hermes_guard::VFS_NAME);
    set_rule(&conn, true);
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    let (_, log, done) = checkpoint(&conn, "PASSIVE");
    assert_eq!(log, done);
    let shm = OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("state.db-shm"))
        .unwrap();
    ofd_lock(&shm, 121, libc::F_WRLCK);
    conn.execute("INSERT INTO t VALUES (2)", []).unwrap();
    let status = conn.guard_status().unwrap();
    assert_eq!(
        (status.wal_resets_deferred, status.wal_resets_guarded),
        (1, 0)
    );
    let frames = |size: u64| (size - 32) / (24 + 4096);
    let wal = std::fs::metadata(dir.path().join("state.db-wal"))
        .unwrap()
        .len();
    assert_eq!(
        frames(wal),
        log as u64 + 1,
        "the commit was appended to the WAL"
    );
    ofd_lock(&shm, 121, libc::F_UNLCK);
    let (_, log, done) = checkpoint(&conn, "PASSIVE");
    assert_eq!(log, done);
    conn.execute("INSERT INTO t VALUES (3)", []).unwrap();
    assert_eq!(conn.guard_status().unwrap().wal_resets_guarded, 1);
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3);
}

#[test]
fn the_rule_pragma_refuses_a_value_other_than_on_off_or_auto() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open(&dir.path().join("state.db"), hermes_guard::VFS_NAME);
    let err = conn
        .query_row("PRAGMA hermes_guard_wal_reset_guard=maybe", [], |r| {
            r.get::<_, String>(0)
        })
        .unwrap_err();
    assert!(err.to_string().contains("on, off or auto"), "{err}");
    let auto: String = conn
        .query_row("PRAGMA hermes_guard_wal_reset_guard=auto", [], |r| r.get(0))
        .unwrap();
    assert_eq!(auto == "on", hermes_guard::wal_reset_guard_on());
}
