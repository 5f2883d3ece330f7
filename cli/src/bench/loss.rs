//! L1: a new connection writes at once after a loss.
//!
//! In one process, connection A (guarded) commits rows that live only in its WAL
//! (`wal_autocheckpoint=0`) and stays open, idle, while the database's `-wal` and `-shm` are
//! unlinked under it. The clock starts at the unlink. A new guarded connection B opens the
//! database as an application would (no `PRAGMA journal_mode`: the file is in WAL mode already;
//! `synchronous` left at its default, or set to NORMAL) and inserts [`ROWS`] rows, one
//! transaction each, with no retry: its busy timeout is 0, so a commit that met a lock fails
//! instead of waiting. The clock stops at the last commit. Then A tries one write, which the
//! guard must refuse (`SQLITE_READONLY_DBMOVED`, A's generation captured beside the database).
//!
//! The target: B commits 10 of 10 rows within 50 ms of the loss, in 20 of 20 runs, and A is
//! refused. Not a ratio against stock: SQLite's unix VFS keeps one wal-index per main file in a
//! process, so a stock B would share A's, mapped from the unlinked `-shm`.

use std::path::Path;
use std::time::{Duration, Instant};

use hermes_guard_cli::workloads::{self, payload, BenchError, Context, Vfs, TABLE};
use rusqlite::{params, Connection, OpenFlags};

use super::ids::{Id, Sizes};
use super::Result;

/// Rows B commits after the loss, one transaction each.
pub(super) const ROWS: u64 = 10;
/// Rows A commits into its WAL before the loss.
pub(super) const LOST_ROWS: u64 = 20;
/// The bound on the time from the loss to B's last commit.
pub(super) const WITHIN: Duration = Duration::from_millis(50);

const INSERT: &str = "INSERT INTO t (k, payload) VALUES (?1, ?2)";

/// What one run saw.
#[derive(Debug, Clone)]
pub(super) struct Run {
    /// B's inserts that returned Ok, each on its only attempt.
    pub(super) committed: u64,
    /// B's rows B reads back after its inserts.
    pub(super) visible: i64,
    /// From the unlink to B's last insert returning (all [`ROWS`] attempted).
    pub(super) elapsed: Duration,
    /// A's write after B's was refused by the guard.
    pub(super) old_refused: bool,
    /// B's `PRAGMA synchronous` (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA).
    pub(super) synchronous: i64,
    /// The first of B's failed inserts, or A's write when it was not refused.
    pub(super) failure: Option<String>,
}

impl Run {
    /// Every row committed on its first attempt, and read back, within [`WITHIN`] of the loss.
    pub(super) fn in_time(&self) -> bool {
        self.all_committed() && self.elapsed <= WITHIN
    }

    pub(super) fn all_committed(&self) -> bool {
        self.committed == ROWS && self.visible == ROWS as i64
    }
}

/// One row of the L1 table: the runs of one `synchronous` setting.
pub(super) struct LossRow {
    pub(super) id: Id,
    pub(super) runs: Vec<Run>,
}

impl LossRow {
    /// The target: every run committed every row within [`WITHIN`], and A was refused in every run.
    pub(super) fn pass(&self) -> bool {
        !self.runs.is_empty() && self.runs.iter().all(|r| r.in_time() && r.old_refused)
    }
}

/// B's `synchronous`, by row.
fn synchronous_of(id: Id) -> Option<&'static str> {
    match id {
        Id::L1Normal => Some("NORMAL"),
        _ => None,
    }
}

/// Runs `sizes.loss_runs` losses for `id`, each in a scratch directory of its own under `dir`.
pub(super) fn measure(id: Id, dir: &Path, sizes: &Sizes) -> Result<LossRow> {
    let mut runs = Vec::new();
    for n in 0..sizes.loss_runs {
        let run = one(dir, synchronous_of(id))?;
        eprintln!(
            "{:<12} run {:<8} {}/{} rows  {:>8.2} ms  old connection {}{}",
            id.code(),
            format!("{}/{}", n + 1, sizes.loss_runs),
            run.committed,
            ROWS,
            run.elapsed.as_secs_f64() * 1e3,
            if run.old_refused {
                "refused"
            } else {
                "NOT refused"
            },
            run.failure
                .as_deref()
                .map_or(String::new(), |f| format!("  ({f})")),
        );
        runs.push(run);
    }
    Ok(LossRow { id, runs })
}

/// One loss: A written and held, the unlink, B's rows timed, A's write, both closed.
fn one(dir: &Path, synchronous: Option<&str>) -> Result<Run> {
    let scratch = workloads::scratch(dir)?;
    let db = scratch.path().join("loss.db");
    let old = workloads::open(Vfs::Guard, &db)?;
    old.execute_batch(TABLE).ctx("creating the table", &db)?;
    // The table in the main file, so the new generation has it; A's rows only in its WAL.
    old.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .ctx("checkpointing the schema", &db)?;
    old.pragma_update(None, "wal_autocheckpoint", 0)
        .ctx("turning automatic checkpoints off", &db)?;
    for i in 0..LOST_ROWS {
        old.execute(INSERT, params![i as i64, payload(i)])
            .ctx("writing the old generation's rows", &db)?;
    }
    workloads::settle(scratch.path())?;
    for suffix in ["-wal", "-shm"] {
        let sidecar = db.with_file_name(format!("loss.db{suffix}"));
        std::fs::remove_file(&sidecar).ctx("unlinking", &sidecar)?;
    }

    let loss = Instant::now();
    let new =
        Connection::open_with_flags_and_vfs(&db, OpenFlags::default(), hermes_guard::VFS_NAME)
            .ctx("opening the new connection", &db)?;
    // rusqlite's default is 5 s; 0 is SQLite's: a commit that met a lock fails, no hidden retry.
    new.pragma_update(None, "busy_timeout", 0)
        .ctx("setting busy_timeout", &db)?;
    if let Some(mode) = synchronous {
        new.pragma_update(None, "synchronous", mode)
            .ctx("setting synchronous", &db)?;
    }
    let mut committed = 0;
    let mut failure = None;
    for i in 0..ROWS {
        let k = (LOST_ROWS + i) as i64;
        match new.execute(INSERT, params![k, payload(k as u64)]) {
            Ok(_) => committed += 1,
            Err(e) => {
                failure.get_or_insert_with(|| format!("new connection's row {}: {e}", i + 1));
            }
        }
    }
    let elapsed = loss.elapsed();

    let visible: i64 = new
        .query_row(
            "SELECT count(*) FROM t WHERE k >= ?1",
            [LOST_ROWS as i64],
            |r| r.get(0),
        )
        .ctx("counting the new connection's rows", &db)?;
    let synchronous: i64 = new
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .ctx("reading synchronous", &db)?;
    let old_refused = match old.execute(INSERT, params![-1_i64, payload(0)]) {
        Err(e) if is_refusal(&e) => true,
        Err(e) => {
            failure.get_or_insert_with(|| format!("the old connection's write: {e}"));
            false
        }
        Ok(_) => {
            failure.get_or_insert_with(|| "the old connection wrote after the loss".into());
            false
        }
    };
    hermes_guard::close(old)
        .map_err(|(_, e)| BenchError::Invalid(format!("closing the old connection: {e}")))?;
    new.close()
        .map_err(|(_, e)| e)
        .ctx("closing the new connection", &db)?;
    Ok(Run {
        committed,
        visible,
        elapsed,
        old_refused,
        synchronous,
        failure,
    })
}

fn is_refusal(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error(), Some(e) if e.extended_code == rusqlite::ffi::SQLITE_READONLY_DBMOVED)
}
