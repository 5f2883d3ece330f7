//! Thousands of guarded databases open in one process, each in a directory of its own: every one
//! guarded at stock's descriptor count, a loss on a hundred of them refused and captured with
//! nothing lost; and at `EMFILE` the guard fails an open as stock does.
//!
//! `RLIMIT_NOFILE` is raised (the hard limit too, where the process may) in a process of its
//! own. The 10,000-database run is `#[ignore]`d (about a minute in a debug build); a
//! 1,000-database run of the same test is always run (about 5 s). Where the hard limit cannot be
//! raised (a container without `CAP_SYS_RESOURCE`) the big run opens as many as it allows.

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

use crate::common::*;

/// Databases whose sidecars are unlinked.
const LOST: usize = 100;

fn open_descriptors() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Sets the soft limit on descriptors to `want` (the hard one too when it is lower and this
/// process may raise it); returns the soft limit now.
fn set_nofile(want: u64) -> u64 {
    let now = getrlimit(Resource::Nofile);
    let hard = now.maximum.unwrap_or(u64::MAX);
    let raised = Rlimit {
        current: Some(want),
        maximum: Some(hard.max(want)),
    };
    if setrlimit(Resource::Nofile, raised).is_err() {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(want.min(hard)),
                maximum: now.maximum,
            },
        );
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// `count` distinct indices below `n`, spread pseudo-randomly (a fixed seed: the same every run).
fn spread(n: usize, count: usize) -> Vec<usize> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chosen = std::collections::BTreeSet::new();
    while chosen.len() < count.min(n) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chosen.insert((x % n as u64) as usize);
    }
    chosen.into_iter().collect()
}

fn database(base: &Path, i: usize) -> PathBuf {
    base.join(format!("tenant-{i}")).join("state.db")
}

/// Opens `n` guarded databases, each in its own directory with one row in its WAL; asserts they
/// cost stock's three descriptors each; unlinks the `-wal` and `-shm` of `LOST` of them; then
/// writes to every one: the lost ones are refused and captured, the others commit; nothing is
/// lost.
///
/// Where the hard limit on descriptors cannot be raised (no `CAP_SYS_RESOURCE`: a container) and
/// is too low for `n` (three descriptors each, stock's count), as many as it allows, said on
/// stderr.
fn guard_many(wanted: usize) {
    let limit = set_nofile(3 * wanted as u64 + 1_000);
    let n = wanted.min((limit.saturating_sub(1_000) / 3) as usize);
    if n < wanted {
        eprintln!(
            "RLIMIT_NOFILE cannot be raised above {limit} here: {n} databases instead of {wanted}"
        );
    }
    assert!(n >= 1_000, "RLIMIT_NOFILE {limit} is too low for this test");
    let base = tempfile::tempdir().unwrap();
    // The process-wide descriptors (the watcher's) exist before anything is counted.
    let warm = open_guarded(&base.path().join("warm-up.db"));
    insert(&warm, "warm").unwrap();
    let before = open_descriptors();
    let conns: Vec<Connection> = (0..n)
        .map(|i| {
            let db = database(base.path(), i);
            fs::create_dir(db.parent().unwrap()).unwrap();
            let conn = open_guarded(&db);
            insert(&conn, &format!("before {i}")).unwrap();
            conn
        })
        .collect();
    assert_eq!(
        open_descriptors() - before,
        3 * n,
        "{n} guarded WAL databases: stock's main, WAL and -shm each, nothing more"
    );
    let lost = spread(n, LOST);
    for &i in &lost {
        lose_sidecars(&database(base.path(), i), false);
    }
    let mut captures = Vec::new();
    for (i, conn) in conns.iter().enumerate() {
        let wrote = insert(conn, &format!("after {i}"));
        if lost.binary_search(&i).is_ok() {
            let err = wrote.expect_err("a write into a lost generation is refused");
            assert!(is_refusal(&err), "database {i}: {err}");
            let status = conn.guard_status().unwrap();
            captures.push((i, status.capture.expect("captured at the refusal")));
        } else {
            wrote.unwrap_or_else(|e| panic!("database {i}: {e}"));
        }
    }
    drop(conns);
    drop(warm);
    for (i, capture) in &captures {
        let restored = recover(
            capture,
            "state.db",
            &base.path().join(format!("restored-{i}")),
        );
        assert_eq!(
            count_like(&restored, &format!("before {i}")),
            1,
            "database {i}"
        );
    }
    for i in (0..n).filter(|i| lost.binary_search(i).is_err()) {
        let conn = Connection::open(database(base.path(), i)).unwrap();
        assert_eq!(count_like(&conn, &format!("before {i}")), 1, "database {i}");
        assert_eq!(count_like(&conn, &format!("after {i}")), 1, "database {i}");
    }
}

test_alone! {
    fn a_thousand_guarded_databases_cost_stocks_descriptors_and_a_hundred_losses_are_captured() {
        guard_many(1_000);
    }
}

test_alone! {
    #[ignore = "about a minute in a debug build; the 1,000-database run is always run"]
    fn ten_thousand_guarded_databases_cost_stocks_descriptors_and_a_hundred_losses_are_captured() {
        guard_many(10_000);
    }
}

/// Opens databases under `base` through `open_one` until one fails (at its open or at its first
/// write, where SQLite opens the WAL and the `-shm`): how many worked, and the failure's code.
fn open_until_emfile(
    base: &Path,
    open_one: fn(&Path) -> rusqlite::Result<Connection>,
) -> (Vec<Connection>, usize, rusqlite::Error) {
    let mut conns = Vec::new();
    for i in 0.. {
        let db = database(base, i);
        fs::create_dir(db.parent().unwrap()).unwrap();
        let opened = open_one(&db).and_then(|conn| {
            conn.execute_batch(
                "PRAGMA journal_mode=WAL; CREATE TABLE messages (id INTEGER PRIMARY KEY, \
                 session TEXT, content TEXT)",
            )?;
            insert(&conn, &format!("before {i}"))?;
            Ok(conn)
        });
        match opened {
            Ok(conn) => conns.push(conn),
            Err(e) => return (conns, i, e),
        }
    }
    unreachable!()
}

fn open_with(vfs: &str, db: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags_and_vfs(db, rusqlite::OpenFlags::default(), vfs)
}

test_alone! {
    fn at_emfile_the_guard_fails_an_open_as_stock_does_and_nothing_is_retired() {
        hermes_guard::register().unwrap();
        let base = tempfile::tempdir().unwrap();
        let warm = open_guarded(&base.path().join("warm-up.db"));
        insert(&warm, "warm").unwrap();
        let limit = open_descriptors() as u64 + 3 * 20 + 1;
        let restore = getrlimit(Resource::Nofile);
        let stock_base = base.path().join("stock");
        let guarded_base = base.path().join("guarded");
        fs::create_dir(&stock_base).unwrap();
        fs::create_dir(&guarded_base).unwrap();

        set_nofile(limit);
        let (stock, stock_opened, stock_err) = open_until_emfile(&stock_base, |db| open_with("unix", db));
        drop(stock);
        let (guarded, guarded_opened, guarded_err) =
            open_until_emfile(&guarded_base, |db| open_with(hermes_guard::VFS_NAME, db));
        setrlimit(Resource::Nofile, restore).unwrap();

        assert_eq!(guarded_opened, stock_opened, "as many databases as stock under the limit");
        assert_eq!(
            guarded_err.sqlite_error_code(),
            stock_err.sqlite_error_code(),
            "the same error: {guarded_err} / {stock_err}"
        );
        for (i, conn) in guarded.iter().enumerate() {
            let status = conn.guard_status().unwrap();
            assert!(!status.retired, "database {i} retired: {status:?}");
            insert(conn, &format!("after {i}")).unwrap();
        }
        // The database whose open failed works once descriptors are free: nothing half-pinned.
        let failed = database(&guarded_base, guarded_opened);
        let conn = open_guarded(&failed);
        insert(&conn, "after the limit").unwrap();
        assert!(!conn.guard_status().unwrap().retired);
        drop((guarded, conn, warm));
        for i in 0..guarded_opened {
            let conn = Connection::open(database(&guarded_base, i)).unwrap();
            assert_eq!(count_like(&conn, &format!("before {i}")), 1);
            assert_eq!(count_like(&conn, &format!("after {i}")), 1);
        }
    }
}

/// The resident set of this process, KiB (`VmRSS`).
fn rss_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

const MEMORY_SIDE: &str = "HERMES_GUARD_TEST_MEMORY_SIDE";

/// Run by [`memory_per_connection_against_stock`] in a process of its own per side and count:
/// `<vfs> <n>` in [`MEMORY_SIDE`]; prints the resident set added per open connection.
#[test]
#[ignore = "a measurement, run by memory_per_connection_against_stock"]
fn memory_side() {
    let Some(side) = std::env::var_os(MEMORY_SIDE) else {
        return;
    };
    let side = side.into_string().unwrap();
    let (vfs, n) = side.split_once(' ').unwrap();
    let wanted: usize = n.parse().unwrap();
    let limit = set_nofile(3 * wanted as u64 + 1_000);
    let n = wanted.min((limit.saturating_sub(1_000) / 3) as usize);
    hermes_guard::register().unwrap();
    let base = tempfile::tempdir().unwrap();
    let open = |db: &Path| {
        let conn = open_with(vfs, db).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE messages (id INTEGER PRIMARY KEY, \
             session TEXT, content TEXT)",
        )
        .unwrap();
        insert(&conn, "hello").unwrap();
        conn
    };
    let warm = open(&base.path().join("warm-up.db"));
    let before = rss_kib();
    let conns: Vec<Connection> = (0..n)
        .map(|i| {
            let db = database(base.path(), i);
            fs::create_dir(db.parent().unwrap()).unwrap();
            open(&db)
        })
        .collect();
    let after = rss_kib();
    println!(
        "RSS_PER_CONNECTION_BYTES={} {n}",
        (after - before) * 1024 / n as u64
    );
    drop((conns, warm));
}

#[test]
#[ignore = "a measurement (prints RSS per connection, guarded against stock, at 1,000 and 10,000)"]
fn memory_per_connection_against_stock() {
    for n in [1_000, 10_000] {
        let per = |vfs: &str| -> (u64, u64) {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "many_databases::memory_side",
                    "--ignored",
                    "--nocapture",
                ])
                .env(MEMORY_SIDE, format!("{vfs} {n}"))
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            stdout
                .lines()
                .find_map(|l| l.strip_prefix("RSS_PER_CONNECTION_BYTES="))
                .and_then(|l| l.split_once(' '))
                .map(|(bytes, n)| (bytes.parse().unwrap(), n.parse().unwrap()))
                .unwrap_or_else(|| panic!("{vfs} {n}: {stdout}"))
        };
        let ((stock, opened), (guarded, _)) = (per("unix"), per(hermes_guard::VFS_NAME));
        println!(
            "{opened} connections (of {n} asked): RSS per connection stock {stock} B, guarded \
             {guarded} B, extra {} B",
            guarded as i64 - stock as i64
        );
    }
}
