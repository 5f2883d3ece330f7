//! The loss scenario every framework test runs, as docs/hosts.md's "With your framework" promises
//! it: a pool of [`POOL`] connections, [`WRITERS`] writers each committing [`ROWS`] rows,
//! [`BATCH`] per checkout; once each has committed [`BEFORE`] (in the WAL only), the `-wal` and
//! `-shm` are unlinked. A write refused on a connection of the lost generation is retried once,
//! by the writer, on a fresh checkout, and must land; afterwards all [`POOL`] connections are
//! healthy at once and each takes a write; once every capture is merged
//! (`hermes_guard::recover`), every acknowledged row is live exactly once.
//!
//! Each pool runs with its default settings and one rule: it drops a retired connection (at its
//! return, its checkout or its recycle). A new connection opened after the loss maps the new
//! `-shm` and passes `check_new` at once, so no test reopens connections until one passes, reaps
//! idle ones, or returns a connection before asking for the next.
//!
//! A framework's test supplies its checkout and its insert ([`write_rows`], or
//! [`write_rows_async`] for an async pool); this crate holds the rest.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hermes_guard::recover::{self, Capture, MergeOptions};
use rusqlite::{Connection, OpenFlags};

/// Connections in the pool.
pub const POOL: usize = 8;
/// Writer threads (or tasks).
pub const WRITERS: usize = 4;
/// Rows each writer commits before the loss.
pub const BEFORE: usize = 25;
/// Rows each writer commits in all.
pub const ROWS: usize = 60;
/// Rows per checkout: the loss lands inside a checkout, so its next write is refused.
pub const BATCH: usize = 5;
/// The insert every framework runs, its one parameter the row's content.
pub const INSERT: &str = "INSERT INTO messages (content) VALUES (?1)";

/// What an insert through a framework came back with.
#[derive(Debug)]
pub enum Write {
    Landed,
    /// Refused by the guard: `SQLITE_READONLY_DBMOVED` (1032), the connection retired.
    Refused(String),
    /// Anything else: the test fails.
    Failed(String),
}

/// One run of the scenario: a database in a temporary directory and what the writers saw.
pub struct Scenario {
    dir: tempfile::TempDir,
    pub db: PathBuf,
    written: AtomicUsize,
    acknowledged: Mutex<Vec<String>>,
    refused_then_landed: AtomicUsize,
}

impl Scenario {
    /// A WAL database with its table and a checkpointed history; the guard registered.
    pub fn new() -> Scenario {
        hermes_guard::register().expect("the guard registers");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = dir.path().join("state.db");
        let conn =
            Connection::open_with_flags_and_vfs(&db, OpenFlags::default(), hermes_guard::VFS_NAME)
                .expect("the database opens");
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT NOT NULL);",
        )
        .expect("the table");
        for i in 0..20 {
            conn.execute(INSERT, [format!("history {i}")]).unwrap();
        }
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        drop(conn);
        Scenario {
            dir,
            db,
            written: AtomicUsize::new(0),
            acknowledged: Mutex::new(Vec::new()),
            refused_then_landed: AtomicUsize::new(0),
        }
    }

    /// The database as a URI through the guard: `file:<path>?vfs=hermes-guard`.
    pub fn uri(&self) -> String {
        format!("file:{}?vfs={}", self.db.display(), hermes_guard::VFS_NAME)
    }

    /// Waits until every writer has committed [`BEFORE`] rows, then unlinks `-wal` and `-shm`.
    pub fn lose_sidecars_mid_stream(&self) {
        while self.written.load(Ordering::SeqCst) < WRITERS * BEFORE {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.lose_sidecars_now();
    }

    /// Unlinks `-wal` and `-shm`.
    pub fn lose_sidecars_now(&self) {
        for suffix in ["-wal", "-shm"] {
            let mut side = self.db.clone().into_os_string();
            side.push(suffix);
            fs::remove_file(&side).expect("the sidecar is there to unlink");
        }
    }

    /// Records a row that was refused once and landed on a fresh checkout.
    pub fn landed_on_retry(&self, row: String) {
        self.refused_then_landed.fetch_add(1, Ordering::SeqCst);
        self.acknowledge(row);
    }

    /// Records a row the application was told was committed.
    pub fn acknowledge(&self, row: String) {
        self.acknowledged.lock().unwrap().push(row);
        self.written.fetch_add(1, Ordering::SeqCst);
    }

    /// Asserts what the writers saw, then merges every capture into the database and asserts
    /// that every acknowledged row is live exactly once. Call it once the pool's connections of
    /// the lost generation are closed (after the all-at-once checkout).
    pub fn assert_every_row_kept(&self, framework: &str) {
        let acknowledged = self.acknowledged.lock().unwrap().clone();
        let refused = self.refused_then_landed.load(Ordering::SeqCst);
        let captures = captures(self.dir.path());
        eprintln!(
            "{framework}: {} rows acknowledged, {refused} refused once and landed on retry, {} \
             capture(s)",
            acknowledged.len(),
            captures.len()
        );
        assert!(
            refused >= 1,
            "{framework}: the loss landed inside a checkout, yet no write was refused"
        );
        assert!(
            !captures.is_empty(),
            "{framework}: the lost generation held rows, yet nothing was captured"
        );
        for path in &captures {
            let capture = Capture::open(path)
                .unwrap_or_else(|e| panic!("{framework}: {}: {e}", path.display()));
            recover::apply(&capture, &self.db, &MergeOptions::default(), &mut |_| {})
                .unwrap_or_else(|e| panic!("{framework}: merging {}: {e}", path.display()));
        }
        let conn = Connection::open_with_flags_and_vfs(
            &self.db,
            OpenFlags::default(),
            hermes_guard::VFS_NAME,
        )
        .unwrap();
        let mut live: HashMap<String, usize> = HashMap::new();
        let mut stmt = conn
            .prepare("SELECT content FROM messages WHERE content NOT LIKE 'history %'")
            .unwrap();
        for content in stmt.query_map([], |r| r.get::<_, String>(0)).unwrap() {
            *live.entry(content.unwrap()).or_default() += 1;
        }
        for row in &acknowledged {
            assert_eq!(
                live.get(row),
                Some(&1),
                "{framework}: {row}: live exactly once"
            );
        }
        assert_eq!(
            live.len(),
            acknowledged.len(),
            "{framework}: a row that was never acknowledged is live"
        );
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "{framework}");
    }
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario::new()
    }
}

/// The captures beside the database.
pub fn captures(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.as_encoded_bytes()
                    .windows(13)
                    .any(|w| w == b".retired-wal-")
            })
        })
        .collect();
    found.sort();
    found
}

/// The row writer `w` writes `i`-th.
pub fn row(w: usize, i: usize) -> String {
    format!("writer {w} row {i}")
}

/// Writer `w`: [`ROWS`] inserts, [`BATCH`] per checkout. A refused insert is retried once on a
/// fresh checkout, and must land. Each next checkout is asked for while the writer still holds
/// the connection it had (`conn = checkout()` drops the old one after the new one is handed
/// out): a connection of the lost generation kept open is no obstacle to a new one (the guard
/// maps each `-shm` file itself), so nothing has to be returned first.
pub fn write_rows<C>(
    sc: &Scenario,
    w: usize,
    checkout: impl Fn() -> C,
    insert: impl Fn(&mut C, &str) -> Write,
) {
    let mut conn = checkout();
    for i in 0..ROWS {
        if i % BATCH == 0 && i > 0 {
            conn = checkout();
        }
        let row = row(w, i);
        match insert(&mut conn, &row) {
            Write::Landed => {}
            Write::Refused(e) => {
                conn = checkout();
                match insert(&mut conn, &row) {
                    Write::Landed => {}
                    other => panic!("{row}: refused ({e}), and the retry did not land: {other:?}"),
                }
                sc.refused_then_landed.fetch_add(1, Ordering::SeqCst);
            }
            Write::Failed(e) => panic!("{row}: {e}"),
        }
        sc.acknowledge(row);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// [`write_rows`] for an async pool (the next checkout asked for while the old one is held, too).
pub async fn write_rows_async<C>(
    sc: &Scenario,
    w: usize,
    checkout: impl AsyncFn() -> C,
    insert: impl AsyncFn(&mut C, &str) -> Write,
) {
    let mut conn = checkout().await;
    for i in 0..ROWS {
        if i % BATCH == 0 && i > 0 {
            conn = checkout().await;
        }
        let row = row(w, i);
        match insert(&mut conn, &row).await {
            Write::Landed => {}
            Write::Refused(e) => {
                conn = checkout().await;
                match insert(&mut conn, &row).await {
                    Write::Landed => {}
                    other => panic!("{row}: refused ({e}), and the retry did not land: {other:?}"),
                }
                sc.refused_then_landed.fetch_add(1, Ordering::SeqCst);
            }
            Write::Failed(e) => panic!("{row}: {e}"),
        }
        sc.acknowledge(row);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A rusqlite insert's outcome.
pub fn rusqlite_write(result: rusqlite::Result<usize>) -> Write {
    match result {
        Ok(_) => Write::Landed,
        Err(e)
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ReadOnly)
                && e.sqlite_error().map(|s| s.extended_code)
                    == Some(rusqlite::ffi::SQLITE_READONLY_DBMOVED) =>
        {
            Write::Refused(e.to_string())
        }
        Err(e) => Write::Failed(e.to_string()),
    }
}
