//! The stale-WAL set-aside is made under EXCLUSIVE on the main file, so an opener racing it — stock
//! or guarded, another process or another thread — sees the stale WAL before or none after. A
//! guarded writer is killed with 20,000 rows in its WAL, the database file is restored
//! (`cp backup state.db`), and the openers start at once.
//!
//! What must hold in every run: nobody is refused or retired; at most one capture; a capture,
//! once written, verifies and holds the stale WAL byte for byte (nobody wrote into it); when the
//! WAL was set aside every opener saw the restored rows and the live file keeps them. When a
//! stock opener got there first, it replayed the stale WAL as stock always does (the guard cannot
//! stop another program) and the guard, seeing the WAL in use, left it alone: then nothing was
//! set aside and nothing claims the restore stands.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{self, artifacts, integrity_ok, open_guarded, sidecar};
use crate::stale_wal::{count, killed_writer, seed_with_backup, RESTORED};
use hermes_guard::GuardExt;

/// Rows of 400 bytes the killed writer leaves in its WAL (about 9 MB: the judgement reads it
/// all, which keeps the race window open as wide as a real one).
const BULK: u32 = 20_000;

/// The files of one restore: the pre-restore database with its stale WAL and `-shm`, and the
/// backup to copy over it.
struct Template {
    _dir: tempfile::TempDir,
    main: PathBuf,
    backup: PathBuf,
    /// Rows the stale generation holds (what a replay brings back).
    at_death: i64,
}

impl Template {
    fn new() -> Template {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let backup = dir.path().join("backup.db");
        seed_with_backup(&db, &backup);
        killed_writer(&db, "guard", BULK);
        // What a replay of the stale WAL gives: counted on a copy, through the stock VFS.
        let probe = dir.path().join("probe");
        fs::create_dir(&probe).unwrap();
        let copy = probe.join("state.db");
        for suffix in ["", "-wal", "-shm"] {
            fs::copy(sidecar(&db, suffix), sidecar(&copy, suffix)).unwrap();
        }
        let at_death = count(&common::open_stock(&copy));
        assert!(at_death > RESTORED + i64::from(BULK));
        Template {
            main: db,
            backup,
            at_death,
            _dir: dir,
        }
    }

    /// A fresh copy of the crashed database at `dir/state.db`, then the backup copied over it in
    /// place (the operator's restore). Returns the database path and the stale WAL's bytes.
    fn restore_into(&self, dir: &Path) -> (PathBuf, Vec<u8>) {
        let db = dir.join("state.db");
        for suffix in ["", "-wal", "-shm"] {
            copy_with_xattrs(&sidecar(&self.main, suffix), &sidecar(&db, suffix));
        }
        fs::copy(&self.backup, &db).unwrap();
        (db.clone(), fs::read(sidecar(&db, "-wal")).unwrap())
    }
}

/// Copies `from` to `to` with its extended attributes (the WAL's record of the main file it was
/// started on is one), as `cp --preserve=xattr` does.
fn copy_with_xattrs(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("--preserve=xattr")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success(), "cp {}", from.display());
}

/// Starts a guarded opener process: it reads, commits one row, checkpoints and closes.
fn guarded_opener(db: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args([
            "writer", "--role", "second", "--vfs", "guard", "--rows", "1",
        ])
        .arg("--db")
        .arg(db)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

const STOCK_OPENER: &str = "
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=20)
before = conn.execute('SELECT COUNT(*) FROM messages').fetchone()[0]
conn.execute(\"INSERT INTO messages (session, content) VALUES ('stock', 'stock peer')\")
conn.commit()
conn.close()
print(before)
";

/// Starts the distribution's Python with its stock `sqlite3` (SQLite 3.40.1 on Debian 12): it
/// reads, commits one row and closes.
fn stock_opener(python: &Path, db: &Path) -> std::process::Child {
    Command::new(python)
        .args(["-c", STOCK_OPENER])
        .arg(db)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[track_caller]
fn finished(child: std::process::Child, who: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{who} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one capture in `dir`, if any (asserting there is at most one), checked: `verify` accepts
/// it and its WAL is the stale WAL byte for byte.
#[track_caller]
fn checked_capture(dir: &Path, stale_wal: &[u8]) -> Option<PathBuf> {
    let captures = artifacts(dir);
    assert!(captures.len() <= 1, "one capture at most: {captures:?}");
    let capture = captures.into_iter().next()?;
    let (code, out, err) = common::hermes_guard_cli(&["verify".as_ref(), capture.as_os_str()]);
    assert_eq!(code, 0, "verify {}: {out}{err}", capture.display());
    common::assert_same_bytes(
        &fs::read(capture.join("state.db-wal")).unwrap(),
        stale_wal,
        "the stale WAL in the capture",
    );
    Some(capture)
}

#[test]
fn a_stock_opener_racing_the_set_aside_never_undoes_a_restore_the_guard_kept() {
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        return common::skip_unless_ci("no /usr/bin/python3 (the distribution's stock sqlite3)");
    }
    let template = Template::new();
    let (mut set_aside, mut stock_first) = (0, 0);
    for run in 0..50u64 {
        let dir = tempfile::tempdir().unwrap();
        let (db, stale_wal) = template.restore_into(dir.path());
        // From the stock opener 30 ms ahead to the guarded one 30 ms ahead.
        let offset = -30 + (run as i64 * 61 / 50);
        let (guarded, stock) = if offset < 0 {
            let stock = stock_opener(python, &db);
            std::thread::sleep(Duration::from_millis(offset.unsigned_abs()));
            (guarded_opener(&db), stock)
        } else {
            let guarded = guarded_opener(&db);
            std::thread::sleep(Duration::from_millis(offset as u64));
            (guarded, stock_opener(python, &db))
        };
        let guarded_out = finished(guarded, "the guarded opener");
        let stock_saw: i64 = finished(stock, "the stock opener").trim().parse().unwrap();
        let conn = open_guarded(&db);
        let live = count(&conn);
        assert!(integrity_ok(&conn), "run {run}");
        assert!(!conn.guard_status().unwrap().retired, "run {run}");
        drop(conn);
        match checked_capture(dir.path(), &stale_wal) {
            Some(_) => {
                set_aside += 1;
                assert_eq!(
                    live,
                    RESTORED + 2,
                    "run {run}: the restore stands ({guarded_out})"
                );
                assert!(
                    stock_saw <= RESTORED + 1,
                    "run {run}: stock read {stock_saw}"
                );
            }
            None => {
                stock_first += 1;
                assert_eq!(live, template.at_death + 2, "run {run}: stock replayed it");
            }
        }
    }
    eprintln!("50 runs: {set_aside} set aside by the guard, {stock_first} opened by stock first");
}

/// `n` guarded connections of this process opening the restored database at the same moment:
/// each reads and returns what it saw and whether it was retired.
fn open_together(db: &Path, n: usize) -> Vec<(i64, bool)> {
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let conn = open_guarded(db);
                    let seen = count(&conn);
                    (seen, conn.guard_status().unwrap().retired)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn eight_threads_opening_after_a_restore_agree_on_it_with_one_capture() {
    let template = Template::new();
    for run in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let (db, stale_wal) = template.restore_into(dir.path());
        for (seen, retired) in open_together(&db, 8) {
            assert_eq!(seen, RESTORED, "run {run}: every thread reads the restore");
            assert!(!retired, "run {run}: nobody retired");
        }
        assert!(
            checked_capture(dir.path(), &stale_wal).is_some(),
            "run {run}"
        );
    }
}

#[test]
fn two_guarded_processes_opening_after_a_restore_agree_on_it_with_one_capture() {
    let template = Template::new();
    for run in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let (db, stale_wal) = template.restore_into(dir.path());
        let (a, b) = (guarded_opener(&db), guarded_opener(&db));
        for out in [finished(a, "opener a"), finished(b, "opener b")] {
            let done: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            let rows = done["rows"].as_i64().unwrap();
            assert!(
                rows == RESTORED + 1 || rows == RESTORED + 2,
                "run {run}: {out}"
            );
        }
        assert!(
            checked_capture(dir.path(), &stale_wal).is_some(),
            "run {run}"
        );
        let conn = open_guarded(&db);
        assert_eq!(count(&conn), RESTORED + 2, "run {run}");
        assert!(integrity_ok(&conn));
    }
}

const STOCK_ON_CUE: &str = "
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=20)
print('ready', flush=True)
sys.stdin.readline()
before = conn.execute('SELECT COUNT(*) FROM messages').fetchone()[0]
conn.close()
print(before, flush=True)
";

/// The race of a stock opener with the guard's stale-WAL gate, measured (not a test of timing:
/// `--ignored`, it prints what it saw): the guarded opener's first query starts `lead` ahead of a
/// stock opener's (the distribution's Python, its connection made and waiting for its cue), 20 runs
/// per lead. Counts the runs in which the restore stood.
#[test]
#[ignore = "a measurement: cargo test -p hermes-guard-cli --test it measure_a_guarded_opener -- --ignored --nocapture"]
fn measure_a_guarded_opener_ahead_of_a_stock_one_keeps_the_restore() {
    use std::io::{BufRead, Write};
    let python = Path::new("/usr/bin/python3");
    let template = Template::new();
    // A host with many locks (1,700 were measured on one): 2,000 byte-range locks held by another
    // process, which any reader of `/proc/locks` pays for.
    let locks = tempfile::NamedTempFile::new().unwrap();
    let mut holder = Command::new(python)
        .args(["-c", LOCK_HOLDER])
        .arg(locks.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut held = std::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    assert_eq!(held.next().unwrap().unwrap(), "held");
    for lead_us in [0u64, 200, 1000, 2000] {
        let mut kept = 0;
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let (db, _) = template.restore_into(dir.path());
            let mut stock = Command::new(python)
                .args(["-c", STOCK_ON_CUE])
                .arg(&db)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = std::io::BufReader::new(stock.stdout.take().unwrap()).lines();
            assert_eq!(lines.next().unwrap().unwrap(), "ready");
            let guarded = open_guarded(&db);
            let go = std::thread::spawn(move || count(&guarded));
            std::thread::sleep(Duration::from_micros(lead_us));
            writeln!(stock.stdin.as_mut().unwrap(), "go").unwrap();
            let _ = go.join().unwrap();
            let _stock_saw: i64 = lines.next().unwrap().unwrap().trim().parse().unwrap();
            stock.wait().unwrap();
            let conn = open_guarded(&db);
            assert!(integrity_ok(&conn));
            if count(&conn) == RESTORED {
                kept += 1;
            }
        }
        eprintln!("guarded first query {lead_us} us ahead: the restore stood in {kept} of 20 runs");
    }
    drop(holder.stdin.take());
    holder.wait().unwrap();
}

const LOCK_HOLDER: &str = "
import fcntl, sys
f = open(sys.argv[1], 'w')
for i in range(2000):
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i)
print('held', flush=True)
sys.stdin.read()
";
