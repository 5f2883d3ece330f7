//! The in-process workloads, each run once per VFS per round. Every function builds what it needs
//! (untimed), then times only the operations the workload is about.
//!
//! Self-contained on purpose: `benches/guard_vs_stock.rs` includes this file with `#[path]`, so
//! the criterion benches and `hermes-guard bench` measure the very same code.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OpenFlags};

/// Which VFS a connection goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Vfs {
    /// SQLite's stock `unix` VFS.
    Stock,
    /// hermes-guard, wrapping the unix VFS.
    Guard,
}

impl Vfs {
    /// The name SQLite knows the VFS by.
    pub fn sqlite_name(self) -> &'static str {
        match self {
            Vfs::Stock => "unix",
            Vfs::Guard => hermes_guard::VFS_NAME,
        }
    }

    /// The value `--vfs` takes for a benchmark child.
    pub fn arg(self) -> &'static str {
        match self {
            Vfs::Stock => "stock",
            Vfs::Guard => "guard",
        }
    }
}

/// A benchmark step that failed, with the file it was working on.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// SQLite refused a step.
    #[error("{step} on {path}: {source}")]
    Sqlite {
        /// What the benchmark was doing.
        step: &'static str,
        /// The database involved.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// A file operation failed.
    #[error("{step} {path}: {source}")]
    Io {
        /// What the benchmark was doing.
        step: &'static str,
        /// The file involved.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A result that means the measurement would be wrong (a checkpoint left frames behind, a
    /// child process misbehaved, a capture was not taken).
    #[error("{0}")]
    Invalid(String),
}

/// Attaches the step and the path to an error.
pub trait Context<T> {
    /// The step `step` on `path` failed.
    fn ctx(self, step: &'static str, path: &Path) -> Result<T, BenchError>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn ctx(self, step: &'static str, path: &Path) -> Result<T, BenchError> {
        self.map_err(|source| BenchError::Sqlite {
            step,
            path: path.to_path_buf(),
            source,
        })
    }
}

impl<T> Context<T> for std::io::Result<T> {
    fn ctx(self, step: &'static str, path: &Path) -> Result<T, BenchError> {
        self.map_err(|source| BenchError::Io {
            step,
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Operations done in the timed section, and how long it took.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// Operations, in the workload's unit (transactions, rows, bytes...).
    pub ops: f64,
    /// Wall-clock time of the timed section only.
    pub elapsed: Duration,
}

impl Timed {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        self.ops / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `PRAGMA synchronous` of the write workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// Sync at checkpoints only: a WAL commit is a `write`.
    Normal,
    /// Sync the WAL at every commit.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// Checkpoint modes measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointMode {
    /// Copies what it can without waiting for anybody; takes the checkpoint lock only.
    Passive,
    /// Also takes the WAL write lock and truncates the WAL to zero bytes.
    Truncate,
}

impl CheckpointMode {
    fn sql(self) -> &'static str {
        match self {
            CheckpointMode::Passive => "PRAGMA wal_checkpoint(PASSIVE)",
            CheckpointMode::Truncate => "PRAGMA wal_checkpoint(TRUNCATE)",
        }
    }
}

/// The table every row workload writes: an integer key and a ~100-byte text, the shape of a chat
/// message row.
pub const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, k INTEGER NOT NULL, payload TEXT NOT NULL)";
const INSERT: &str = "INSERT INTO t (k, payload) VALUES (?1, ?2)";

/// A row's text: fixed length, so every round writes the same bytes.
pub fn payload(i: u64) -> String {
    format!("{i:>12} the quick brown fox jumps over the lazy dog; message body of a typical turn ..")
}

/// Opens `path` through `vfs` in WAL mode, as an application would.
pub fn open(vfs: Vfs, path: &Path) -> Result<Connection, BenchError> {
    if vfs == Vfs::Guard {
        hermes_guard::register().map_err(|e| BenchError::Invalid(e.to_string()))?;
    }
    let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs.sqlite_name())
        .ctx("opening", path)?;
    conn.busy_timeout(Duration::from_secs(30))
        .ctx("setting busy_timeout", path)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .ctx("entering WAL mode", path)?;
    if mode != "wal" {
        return Err(BenchError::Invalid(format!(
            "{} stayed in journal_mode={mode} instead of wal",
            path.display()
        )));
    }
    Ok(conn)
}

/// A fresh directory for one measurement, removed when dropped.
pub fn scratch(dir: &Path) -> Result<tempfile::TempDir, BenchError> {
    tempfile::Builder::new()
        .prefix("run-")
        .tempdir_in(dir)
        .ctx("creating a scratch directory in", dir)
}

fn close(conn: Connection, path: &Path) -> Result<(), BenchError> {
    conn.close().map_err(|(_, e)| e).ctx("closing", path)
}

/// W1: `txns` transactions of one INSERT each (autocommit), at `sync`.
pub fn insert_per_txn(
    vfs: Vfs,
    dir: &Path,
    sync: Synchronous,
    txns: u64,
) -> Result<Timed, BenchError> {
    let scratch = scratch(dir)?;
    let path = scratch.path().join("w1.db");
    let conn = open(vfs, &path)?;
    conn.pragma_update(None, "synchronous", sync.pragma())
        .ctx("setting synchronous", &path)?;
    conn.execute_batch(TABLE).ctx("creating the table", &path)?;
    let elapsed = {
        let mut insert = conn.prepare(INSERT).ctx("preparing the insert", &path)?;
        let start = Instant::now();
        for i in 0..txns {
            insert
                .execute(params![i as i64, payload(i)])
                .ctx("inserting", &path)?;
        }
        start.elapsed()
    };
    close(conn, &path)?;
    Ok(Timed {
        ops: txns as f64,
        elapsed,
    })
}

/// W2: `txns` transactions of `rows` INSERTs each, at synchronous=NORMAL. Counted in rows.
pub fn batch_insert(vfs: Vfs, dir: &Path, txns: u64, rows: u64) -> Result<Timed, BenchError> {
    let scratch = scratch(dir)?;
    let path = scratch.path().join("w2.db");
    let conn = open(vfs, &path)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .ctx("setting synchronous", &path)?;
    conn.execute_batch(TABLE).ctx("creating the table", &path)?;
    let elapsed = {
        let mut insert = conn.prepare(INSERT).ctx("preparing the insert", &path)?;
        let start = Instant::now();
        for t in 0..txns {
            conn.execute_batch("BEGIN").ctx("beginning", &path)?;
            for r in 0..rows {
                let i = t * rows + r;
                insert
                    .execute(params![i as i64, payload(i)])
                    .ctx("inserting", &path)?;
            }
            conn.execute_batch("COMMIT").ctx("committing", &path)?;
        }
        start.elapsed()
    };
    close(conn, &path)?;
    Ok(Timed {
        ops: (txns * rows) as f64,
        elapsed,
    })
}

/// Builds the database the read workloads share: `rows` rows, checkpointed, no WAL left.
/// Built through the stock VFS; both VFSes then read the same file.
pub fn build_read_db(dir: &Path, rows: u64) -> Result<PathBuf, BenchError> {
    let path = dir.join("read.db");
    let conn = open(Vfs::Stock, &path)?;
    conn.execute_batch(TABLE).ctx("creating the table", &path)?;
    conn.execute_batch("BEGIN").ctx("beginning", &path)?;
    {
        let mut insert = conn.prepare(INSERT).ctx("preparing the insert", &path)?;
        for i in 0..rows {
            insert
                .execute(params![i as i64, payload(i)])
                .ctx("inserting", &path)?;
        }
    }
    conn.execute_batch("COMMIT").ctx("committing", &path)?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .ctx("checkpointing", &path)?;
    close(conn, &path)?;
    Ok(path)
}

/// A reader on the shared read database, warmed by one full scan so both VFSes start from the
/// same page cache.
fn warm_reader(vfs: Vfs, db: &Path) -> Result<Connection, BenchError> {
    let conn = open(vfs, db)?;
    scan_once(&conn, db)?;
    Ok(conn)
}

fn scan_once(conn: &Connection, db: &Path) -> Result<i64, BenchError> {
    let mut scan = conn
        .prepare_cached("SELECT count(*), sum(length(payload)) FROM t")
        .ctx("preparing the scan", db)?;
    let (rows, bytes): (i64, i64) = scan
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .ctx("scanning", db)?;
    if bytes <= 0 {
        return Err(BenchError::Invalid(format!(
            "{} has no payload to scan",
            db.display()
        )));
    }
    Ok(rows)
}

/// A small, fixed pseudo-random sequence: both VFSes look up the same keys in the same order.
pub struct XorShift(u64);

impl XorShift {
    /// A generator seeded with `seed` (non-zero).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// R1: `lookups` point SELECTs by primary key (each its own read transaction).
pub fn point_select(vfs: Vfs, db: &Path, rows: u64, lookups: u64) -> Result<Timed, BenchError> {
    let conn = warm_reader(vfs, db)?;
    let elapsed = {
        let mut select = conn
            .prepare("SELECT payload FROM t WHERE id = ?1")
            .ctx("preparing the lookup", db)?;
        let mut keys = XorShift::new(0x9e37_79b9_7f4a_7c15);
        let start = Instant::now();
        for _ in 0..lookups {
            let id = (keys.next_u64() % rows) as i64 + 1;
            let len = select
                .query_row([id], |r| r.get_ref(0).map(|v| v.as_bytes().map_or(0, <[u8]>::len)))
                .ctx("looking up a row", db)?;
            std::hint::black_box(len);
        }
        start.elapsed()
    };
    close(conn, db)?;
    Ok(Timed {
        ops: lookups as f64,
        elapsed,
    })
}

/// R2: `scans` full scans of the table. Counted in rows.
pub fn full_scan(vfs: Vfs, db: &Path, scans: u64) -> Result<Timed, BenchError> {
    let conn = warm_reader(vfs, db)?;
    let mut rows = 0;
    let start = Instant::now();
    for _ in 0..scans {
        rows += scan_once(&conn, db)?;
    }
    let elapsed = start.elapsed();
    close(conn, db)?;
    Ok(Timed {
        ops: rows as f64,
        elapsed,
    })
}

/// CK: builds a WAL of at least `wal_bytes` (autocheckpoint off, untimed), then times one
/// checkpoint of it in `mode`. Counted in WAL bytes.
pub fn checkpoint(
    vfs: Vfs,
    dir: &Path,
    mode: CheckpointMode,
    wal_bytes: u64,
) -> Result<Timed, BenchError> {
    let scratch = scratch(dir)?;
    let path = scratch.path().join("ck.db");
    let conn = open(vfs, &path)?;
    conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0;")
        .ctx("configuring", &path)?;
    let wal = fill_wal(&conn, &path, wal_bytes)?;
    let start = Instant::now();
    let (busy, log, done): (i64, i64, i64) = conn
        .query_row(mode.sql(), [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .ctx("checkpointing", &path)?;
    let elapsed = start.elapsed();
    if busy != 0 || log != done {
        return Err(BenchError::Invalid(format!(
            "the {mode:?} checkpoint of {} copied {done} of {log} frames (busy={busy})",
            path.display()
        )));
    }
    close(conn, &path)?;
    Ok(Timed {
        ops: wal as f64,
        elapsed,
    })
}

/// Appends one-page rows to `path`'s WAL until it holds at least `wal_bytes`; returns its size.
/// Autocheckpoint must be off.
pub fn fill_wal(conn: &Connection, path: &Path, wal_bytes: u64) -> Result<u64, BenchError> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS pages (id INTEGER PRIMARY KEY, body BLOB)")
        .ctx("creating the pages table", path)?;
    let wal_path = sidecar(path, "-wal");
    // A 3,900-byte blob fills one 4 KiB page: a frame of 4,120 bytes per row.
    let per_txn = 256;
    loop {
        let size = fs::metadata(&wal_path)
            .map(|m| m.len())
            .ctx("measuring", &wal_path)?;
        if size >= wal_bytes {
            return Ok(size);
        }
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
             INSERT INTO pages (body) SELECT randomblob(3900) FROM n",
            [per_txn],
        )
        .ctx("filling the WAL", path)?;
    }
}

/// `<db>` + suffix.
pub fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}
