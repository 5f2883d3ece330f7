//! CK: PASSIVE and TRUNCATE checkpoints of a WAL of a given size.

use std::fs;
use std::path::{Path, PathBuf};

use hermes_guard::paths::sidecar;
use rusqlite::Connection;

use super::{close, open, scratch, settle, BenchError, Context, Session, Stopwatch, Timed, Vfs};

/// Checkpoint modes measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointMode {
    /// Copies what it can without waiting for anybody; takes the checkpoint lock only.
    Passive,
    /// Also takes the WAL write lock and truncates the WAL to zero bytes.
    Truncate,
}

impl CheckpointMode {
    pub(crate) fn sql(self) -> &'static str {
        match self {
            CheckpointMode::Passive => "PRAGMA wal_checkpoint(PASSIVE)",
            CheckpointMode::Truncate => "PRAGMA wal_checkpoint(TRUNCATE)",
        }
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
