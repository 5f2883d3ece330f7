//! The in-process workloads of `hermes-guard bench`, each run once per VFS per round, and what
//! they share: opening a database through either VFS, the error type, the clocks. Every workload
//! builds what it needs (untimed), then times only the operations it is about.
//!
//! A library target (`hermes_guard_cli`) so that `hermes-guard bench` and the criterion benches
//! (`cli/benches/guard_vs_stock.rs`) measure the very same code.
//!
//! - [`timing`]: [`Timed`], [`Stopwatch`], the thread's CPU clock.
//! - [`writes`]: W1/W2, [`Inserts`] at a [`Synchronous`].
//! - [`reads`]: R1/R2, [`Reads`] of the database [`build_read_db`] makes.
//! - [`churn`]: O1/O2, [`Churn`]: open + read + close beside a long-lived connection.
//! - [`checkpoints`]: CK, [`Checkpoints`] in a [`CheckpointMode`], and [`fill_wal`].

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

pub mod checkpoints;
pub mod churn;
pub mod reads;
pub mod timing;
pub mod writes;

pub use checkpoints::{fill_wal, CheckpointMode, Checkpoints};
pub use churn::Churn;
pub use reads::{build_read_db, Reads, XorShift};
pub use timing::{thread_cpu_ns, Stopwatch, Timed};
pub use writes::{Inserts, Synchronous};

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

/// The table every row workload writes: an integer key and a ~100-byte text, the shape of a chat
/// message row.
pub const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, k INTEGER NOT NULL, payload TEXT NOT NULL)";
pub(crate) const INSERT: &str = "INSERT INTO t (k, payload) VALUES (?1, ?2)";

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

pub(crate) fn close(conn: Connection, path: &Path) -> Result<(), BenchError> {
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
