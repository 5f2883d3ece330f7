//! R1 and R2: reads of a checkpointed database, a scan and lookups by key.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection};

use super::{close, open, payload, BenchError, Context, Session, Stopwatch, Timed, Vfs};
use super::{INSERT, TABLE};

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
