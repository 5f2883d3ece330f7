//! W1 and W2: inserts at `synchronous=NORMAL` or `FULL`.

use std::path::{Path, PathBuf};

use hermes_guard::paths::sidecar;
use rusqlite::{params, Connection};

use super::{close, open, payload, scratch, BenchError, Context, Session, Stopwatch, Timed, Vfs};
use super::{INSERT, TABLE};

/// `PRAGMA synchronous` of the write workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// Sync at checkpoints only: a WAL commit is a `write`.
    Normal,
    /// Sync the WAL at every commit.
    Full,
}

impl Synchronous {
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
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
