//! The in-process workloads, each run once per VFS per round. Every function builds what it needs
//! (untimed), then times only the operations the workload is about.
//!
//! Self-contained on purpose: `cli/benches/guard_vs_stock.rs` includes this file with `#[path]`, so
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
    /// Time the measuring thread spent on a CPU during it (user and kernel, not waiting for a
    /// CPU or a disk); `None` where `/proc/thread-self/schedstat` is missing.
    pub cpu: Option<Duration>,
}

impl Timed {
    /// Operations per second of wall-clock time.
    pub fn rate(&self) -> f64 {
        self.ops / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Both sections together.
    pub fn plus(self, other: Timed) -> Timed {
        Timed {
            ops: self.ops + other.ops,
            elapsed: self.elapsed + other.elapsed,
            cpu: self.cpu.zip(other.cpu).map(|(a, b)| a + b),
        }
    }

    /// Nothing yet.
    pub fn zero() -> Timed {
        Timed {
            ops: 0.0,
            elapsed: Duration::ZERO,
            cpu: Some(Duration::ZERO),
        }
    }

    /// Operations per second of CPU time; NaN when unknown.
    pub fn cpu_rate(&self) -> f64 {
        self.cpu
            .map_or(f64::NAN, |cpu| self.ops / cpu.as_secs_f64().max(1e-9))
    }
}

/// Times a section by the wall clock and by the thread's own CPU time.
pub struct Stopwatch {
    wall: Instant,
    cpu: Option<u64>,
}

impl Stopwatch {
    /// Starts both clocks.
    pub fn start() -> Stopwatch {
        let cpu = thread_cpu_ns();
        Stopwatch {
            wall: Instant::now(),
            cpu,
        }
    }

    /// Stops both clocks; `ops` operations were done.
    pub fn stop(&self, ops: f64) -> Timed {
        let elapsed = self.wall.elapsed();
        let cpu = match (self.cpu, thread_cpu_ns()) {
            (Some(start), Some(end)) => Some(Duration::from_nanos(end.saturating_sub(start))),
            _ => None,
        };
        Timed { ops, elapsed, cpu }
    }
}

/// Nanoseconds this thread has spent on a CPU, from the scheduler's own accounting. The kernel
/// brings a running task's count up to date only at scheduler events, so yield first: that is
/// one, and it makes the figure exact to the call.
pub fn thread_cpu_ns() -> Option<u64> {
    std::thread::yield_now();
    let stat = fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
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
    format!(
        "{i:>12} the quick brown fox jumps over the lazy dog; message body of a typical turn .."
    )
}

/// Opens `path` through `vfs` in WAL mode, as an application would.
pub fn open(vfs: Vfs, path: &Path) -> Result<Connection, BenchError> {
    if vfs == Vfs::Guard {
        hermes_guard::register().map_err(|e| BenchError::Invalid(e.to_string()))?;
    }
    let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs.sqlite_name())
        .ctx("opening", path)?;
    // The PRAGMA, not rusqlite's busy_timeout (which needs SQLite 3.44): see the library's
    // set_busy_timeout.
    conn.pragma_update(None, "busy_timeout", 30_000)
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

/// A fresh directory for one measurement, removed when dropped. The file system is settled
/// first, so no measurement pays for the write-back (and discards) of the one before.
pub fn scratch(dir: &Path) -> Result<tempfile::TempDir, BenchError> {
    settle(dir)?;
    tempfile::Builder::new()
        .prefix("run-")
        .tempdir_in(dir)
        .ctx("creating a scratch directory in", dir)
}

/// Writes back everything dirty on `dir`'s file system (`syncfs`), outside any timed section.
pub fn settle(dir: &Path) -> Result<(), BenchError> {
    let handle = fs::File::open(dir).ctx("opening", dir)?;
    rustix::fs::syncfs(&handle)
        .map_err(std::io::Error::from)
        .ctx("syncing the file system of", dir)
}

fn close(conn: Connection, path: &Path) -> Result<(), BenchError> {
    conn.close().map_err(|(_, e)| e).ctx("closing", path)
}

/// An open workload: its database is ready, and each `run` times `ops` more of its operations.
/// Holding one session per VFS open at once lets a round alternate between them in small
/// chunks, so both see the same moment of a noisy machine.
pub trait Session {
    /// Untimed work before the next `run`, such as rebuilding what the last one used up.
    fn prepare(&mut self) -> Result<(), BenchError> {
        Ok(())
    }
    /// Times `ops` operations.
    fn run(&mut self, ops: u64) -> Result<Timed, BenchError>;
    /// Closes the database (untimed), reporting a failed close.
    fn finish(self: Box<Self>) -> Result<(), BenchError>;
    /// How many checkpoints the writes so far made, where the session can tell.
    fn checkpoints(&self) -> Result<Option<u64>, BenchError> {
        Ok(None)
    }
}

/// W1 and W2: inserts into a fresh database, `rows_per_txn` rows per transaction (1: autocommit
/// statements), at `sync`. An operation is a transaction.
pub struct Inserts {
    conn: Connection,
    path: PathBuf,
    rows_per_txn: u64,
    next: u64,
    _dir: tempfile::TempDir,
}

impl Inserts {
    /// A fresh database under `dir`, opened through `vfs`.
    pub fn open(
        vfs: Vfs,
        dir: &Path,
        sync: Synchronous,
        rows_per_txn: u64,
    ) -> Result<Box<dyn Session>, BenchError> {
        let scratch = scratch(dir)?;
        let path = scratch.path().join("w.db");
        let conn = open(vfs, &path)?;
        conn.pragma_update(None, "synchronous", sync.pragma())
            .ctx("setting synchronous", &path)?;
        conn.execute_batch(TABLE).ctx("creating the table", &path)?;
        Ok(Box::new(Inserts {
            conn,
            path,
            rows_per_txn,
            next: 0,
            _dir: scratch,
        }))
    }
}

impl Session for Inserts {
    fn run(&mut self, txns: u64) -> Result<Timed, BenchError> {
        let (conn, path) = (&self.conn, &self.path);
        let mut insert = conn
            .prepare_cached(INSERT)
            .ctx("preparing the insert", path)?;
        let batched = self.rows_per_txn > 1;
        let clock = Stopwatch::start();
        for _ in 0..txns {
            if batched {
                conn.execute_batch("BEGIN").ctx("beginning", path)?;
            }
            for _ in 0..self.rows_per_txn {
                let i = self.next;
                self.next += 1;
                insert
                    .execute(params![i as i64, payload(i)])
                    .ctx("inserting", path)?;
            }
            if batched {
                conn.execute_batch("COMMIT").ctx("committing", path)?;
            }
        }
        Ok(clock.stop(txns as f64))
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        close(self.conn, &self.path)
    }

    /// The WAL header's checkpoint sequence number (bytes 12..16, big-endian): SQLite counts
    /// in it each restart of the log, which follows each completed checkpoint. One connection
    /// writes, so every autocheckpoint completes.
    fn checkpoints(&self) -> Result<Option<u64>, BenchError> {
        let wal = sidecar(&self.path, "-wal");
        let mut header = [0u8; 16];
        let read = std::fs::File::open(&wal)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header));
        match read {
            Ok(()) => Ok(Some(
                u32::from_be_bytes([header[12], header[13], header[14], header[15]]) as u64,
            )),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.kind() == std::io::ErrorKind::UnexpectedEof =>
            {
                Ok(Some(0))
            }
            Err(e) => Err(e).ctx("reading the WAL header of", &wal),
        }
    }
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

/// R1 and R2: a reader on the shared read database, warmed by one full scan so both VFSes start
/// from the same page cache. R1's operation is a point SELECT by primary key (its own read
/// transaction); R2's is a full scan, counted in rows.
pub struct Reads {
    conn: Connection,
    db: PathBuf,
    rows: u64,
    keys: XorShift,
    scan: bool,
}

impl Reads {
    /// Point lookups (`scan == false`) or full scans of `db`, which holds `rows` rows.
    pub fn open(
        vfs: Vfs,
        db: &Path,
        rows: u64,
        scan: bool,
    ) -> Result<Box<dyn Session>, BenchError> {
        let conn = open(vfs, db)?;
        scan_once(&conn, db)?;
        Ok(Box::new(Reads {
            conn,
            db: db.to_path_buf(),
            rows,
            keys: XorShift::new(0x9e37_79b9_7f4a_7c15),
            scan,
        }))
    }
}

impl Session for Reads {
    fn run(&mut self, ops: u64) -> Result<Timed, BenchError> {
        let (conn, db) = (&self.conn, &self.db);
        if self.scan {
            let mut rows = 0;
            let clock = Stopwatch::start();
            for _ in 0..ops {
                rows += scan_once(conn, db)?;
            }
            return Ok(clock.stop(rows as f64));
        }
        let mut select = conn
            .prepare_cached("SELECT payload FROM t WHERE id = ?1")
            .ctx("preparing the lookup", db)?;
        let clock = Stopwatch::start();
        for _ in 0..ops {
            let id = (self.keys.next_u64() % self.rows) as i64 + 1;
            let len = select
                .query_row([id], |r| {
                    r.get_ref(0).map(|v| v.as_bytes().map_or(0, <[u8]>::len))
                })
                .ctx("looking up a row", db)?;
            std::hint::black_box(len);
        }
        Ok(clock.stop(ops as f64))
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        close(self.conn, &self.db)
    }
}

/// CK: checkpoints of a WAL of `wal_bytes` (autocheckpoint off). Each operation rebuilds the WAL
/// untimed (in `prepare`, or before the clock starts in `run`), then times one checkpoint of it
/// in `mode`. Counted in WAL bytes checkpointed.
pub struct Checkpoints {
    conn: Connection,
    path: PathBuf,
    root: PathBuf,
    mode: CheckpointMode,
    wal_bytes: u64,
    /// Whether the WAL holds a full load of frames that no checkpoint has copied yet.
    loaded: bool,
    _dir: tempfile::TempDir,
}

impl Checkpoints {
    /// A fresh database under `dir`, opened through `vfs`.
    pub fn open(
        vfs: Vfs,
        dir: &Path,
        mode: CheckpointMode,
        wal_bytes: u64,
    ) -> Result<Box<dyn Session>, BenchError> {
        let scratch = scratch(dir)?;
        let path = scratch.path().join("ck.db");
        let conn = open(vfs, &path)?;
        conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0;")
            .ctx("configuring", &path)?;
        Ok(Box::new(Checkpoints {
            conn,
            path,
            root: dir.to_path_buf(),
            mode,
            wal_bytes,
            loaded: false,
            _dir: scratch,
        }))
    }
}

impl Session for Checkpoints {
    fn prepare(&mut self) -> Result<(), BenchError> {
        if !self.loaded {
            fill_wal(&self.conn, &self.path, self.wal_bytes)?;
            self.loaded = true;
        }
        // The WAL reaches the disk before the clock starts: a checkpoint is timed for its own
        // work (copying the frames into the database and syncing it), not the build's write-back.
        settle(&self.root)
    }

    fn run(&mut self, checkpoints: u64) -> Result<Timed, BenchError> {
        let mut total = Timed::zero();
        for _ in 0..checkpoints {
            if !self.loaded {
                self.prepare()?;
            }
            // Every load is the same number of frames, written from the start of the WAL (a
            // checkpointed WAL restarts; a truncated one regrows), so the file's size is the
            // load's (TRUNCATE reports no frame counts).
            let wal = sidecar(&self.path, "-wal");
            let bytes = fs::metadata(&wal).map(|m| m.len()).ctx("measuring", &wal)?;
            let clock = Stopwatch::start();
            let (busy, log, done): (i64, i64, i64) = self
                .conn
                .query_row(self.mode.sql(), [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .ctx("checkpointing", &self.path)?;
            let timed = clock.stop(bytes as f64);
            self.loaded = false;
            if busy != 0 || log != done {
                return Err(BenchError::Invalid(format!(
                    "the {:?} checkpoint of {} copied {done} of {log} frames (busy={busy})",
                    self.mode,
                    self.path.display()
                )));
            }
            total = total.plus(timed);
        }
        Ok(total)
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        close(self.conn, &self.path)
    }
}

/// Appends one-page rows to `path`'s WAL until they fill at least `wal_bytes` of frames.
/// Autocheckpoint must be off.
pub fn fill_wal(conn: &Connection, path: &Path, wal_bytes: u64) -> Result<(), BenchError> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS pages (id INTEGER PRIMARY KEY, body BLOB)")
        .ctx("creating the pages table", path)?;
    // A 3,900-byte blob fills one 4 KiB page: one frame of 4,120 bytes per row, and a few more
    // for the interior pages.
    let rows = wal_bytes.div_ceil(4096 + 24);
    let per_txn = 256;
    let mut written = 0;
    while written < rows {
        let n = per_txn.min(rows - written);
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
             INSERT INTO pages (body) SELECT randomblob(3900) FROM n",
            [n as i64],
        )
        .ctx("filling the WAL", path)?;
        written += n;
    }
    Ok(())
}

/// `<db>` + suffix.
pub fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}
