//! O1/O2: connection churn — open a WAL database, read one row, close — while a
//! long-lived connection of the same process keeps the database open (a web framework's
//! per-request connection beside its pool, a CLI beside a daemon), and, for O2, with `others`
//! more WAL databases open in the process (each with its `-shm` mapped).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::{close, open, payload, BenchError, Context, Session, Stopwatch, Timed, Vfs, INSERT};
use super::{XorShift, TABLE};

/// Rows of the churned database.
const ROWS: u64 = 1_000;

/// Open + one point read + close, `ops` times.
pub struct Churn {
    vfs: Vfs,
    db: PathBuf,
    keys: XorShift,
    /// The long-lived connection, and the other databases' (kept open while the session lives).
    held: Vec<(Connection, PathBuf)>,
    _dir: tempfile::TempDir,
}

impl Churn {
    /// The churned database in a scratch directory under `dir`, held open by a long-lived
    /// connection, and `others` more WAL databases open beside it, all through `vfs`.
    pub fn open(vfs: Vfs, dir: &Path, others: u64) -> Result<Box<dyn Session>, BenchError> {
        let scratch = super::scratch(dir)?;
        let db = scratch.path().join("churn.db");
        let holder = open(vfs, &db)?;
        holder.execute_batch(TABLE).ctx("creating the table", &db)?;
        {
            let tx = holder
                .unchecked_transaction()
                .ctx("beginning the fill", &db)?;
            let mut insert = tx.prepare(INSERT).ctx("preparing the fill", &db)?;
            for i in 0..ROWS {
                insert
                    .execute(rusqlite::params![i as i64, payload(i)])
                    .ctx("filling", &db)?;
            }
            drop(insert);
            tx.commit().ctx("committing the fill", &db)?;
        }
        let mut held = vec![(holder, db.clone())];
        for n in 0..others {
            let other = scratch.path().join(format!("other-{n}.db"));
            let conn = open(vfs, &other)?;
            conn.execute_batch(TABLE)
                .ctx("creating the table", &other)?;
            conn.query_row("SELECT count(*) FROM t", [], |_| Ok(()))
                .ctx("reading", &other)?;
            held.push((conn, other));
        }
        Ok(Box::new(Churn {
            vfs,
            db,
            keys: XorShift::new(0x2545_f491_4f6c_dd1d),
            held,
            _dir: scratch,
        }))
    }

    fn cycle(&mut self) -> Result<(), BenchError> {
        let conn = Connection::open_with_flags_and_vfs(
            &self.db,
            OpenFlags::default(),
            self.vfs.sqlite_name(),
        )
        .ctx("opening", &self.db)?;
        let id = (self.keys.next_u64() % ROWS) as i64 + 1;
        let len = conn
            .query_row("SELECT payload FROM t WHERE id = ?1", [id], |r| {
                r.get_ref(0).map(|v| v.as_bytes().map_or(0, <[u8]>::len))
            })
            .ctx("looking up a row", &self.db)?;
        std::hint::black_box(len);
        close(conn, &self.db)
    }
}

impl Session for Churn {
    fn run(&mut self, ops: u64) -> Result<Timed, BenchError> {
        let clock = Stopwatch::start();
        for _ in 0..ops {
            self.cycle()?;
        }
        Ok(clock.stop(ops as f64))
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        for (conn, path) in self.held {
            close(conn, &path)?;
        }
        Ok(())
    }
}
