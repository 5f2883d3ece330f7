//! The workloads of `bench --cost` and their targets: W1, R1, W2 (the wall-clock bench's own
//! sessions) and O1/O2 (connection churn).

use std::path::Path;

use super::Result;
use hermes_guard_cli::workloads::{self, Context, Synchronous, Vfs};

/// What the guard may add per checkpoint: its check (one `epoll_wait`) and the main file's stamp
/// after it (one `stat`, see docs/decisions.md, "Heal at close").
pub(super) const CHECKPOINT_SYSCALLS: f64 = 2.0;

/// What the guard may add per WAL restart (one after each complete checkpoint): the WAL-base
/// record's `pread` of the main file's first pages and its `fsetxattr`.
pub(super) const WAL_RESTART_SYSCALLS: f64 = 2.0;

/// What the overwrite judgement adds per checkpoint that writes the main file: the WAL-base
/// record's `fgetxattr`, the WAL header's `pread` and one `pread` of the main file's recorded first
/// pages, before the checkpoint's first write.
pub(super) const OVERWRITE_JUDGE_SYSCALLS: f64 = 3.0;

/// What the WAL-reset rule adds per WAL restart while it is on (by default only on a SQLite with
/// the race, `HERMES_GUARD_WAL_RESET_GUARD=on` elsewhere): CKPT taken and released.
pub(super) const WAL_RESET_RULE_SYSCALLS: f64 = 2.0;

/// A workload the cost mode measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CostWorkload {
    /// One-row autocommit INSERT, WAL, synchronous=NORMAL.
    W1,
    /// Point SELECT by primary key.
    R1,
    /// 1,000-row transactions, synchronous=NORMAL.
    W2,
    /// Open + one point read + close, beside a long-lived connection.
    O1,
    /// The same with 1,000 other WAL databases open in the process.
    O2,
}

/// The other databases O2 holds open.
const O2_OTHERS: u64 = 1_000;
/// The same in a smoke run, whose numbers mean nothing: opening 1,000 databases under callgrind
/// took four of a smoke run's five minutes.
const O2_OTHERS_SMOKE: u64 = 20;

const W2_ROWS: u64 = 1000;
/// Rows of the database R1 reads.
pub(super) const READ_ROWS: u64 = 100_000;

impl CostWorkload {
    const ALL: [CostWorkload; 5] = [
        CostWorkload::W1,
        CostWorkload::R1,
        CostWorkload::W2,
        CostWorkload::O1,
        CostWorkload::O2,
    ];

    /// Open + read + close: judged per cycle, with no checkpoint in it.
    pub(super) fn is_churn(self) -> bool {
        matches!(self, CostWorkload::O1 | CostWorkload::O2)
    }

    pub(super) fn code(self) -> &'static str {
        match self {
            CostWorkload::W1 => "W1",
            CostWorkload::R1 => "R1",
            CostWorkload::W2 => "W2",
            CostWorkload::O1 => "O1",
            CostWorkload::O2 => "O2",
        }
    }

    pub(super) fn arg(self) -> &'static str {
        match self {
            CostWorkload::W1 => "w1",
            CostWorkload::R1 => "r1",
            CostWorkload::W2 => "w2",
            CostWorkload::O1 => "o1",
            CostWorkload::O2 => "o2",
        }
    }

    pub(super) fn title(self) -> &'static str {
        match self {
            CostWorkload::W1 => "1-row INSERT per txn, WAL, synchronous=NORMAL",
            CostWorkload::R1 => "point SELECT by primary key",
            CostWorkload::W2 => "1000-row transactions, synchronous=NORMAL",
            CostWorkload::O1 => "open + point read + close, a long-lived peer",
            CostWorkload::O2 => "O1 with 1,000 other databases open",
        }
    }

    /// The two run lengths (operations); their difference is what is divided by.
    pub(super) fn lengths(self, smoke: bool) -> (u64, u64) {
        match (self, smoke) {
            (CostWorkload::W1, false) => (500, 2500),
            (CostWorkload::R1, false) => (2_000, 12_000),
            // Past the page cache's growth (2,000 pages, about 25 of these transactions), whose
            // `brk` calls would otherwise differ between the two runs by a few.
            (CostWorkload::W2, false) => (60, 180),
            (CostWorkload::W1, true) => (5, 15),
            (CostWorkload::R1, true) => (10, 30),
            (CostWorkload::W2, true) => (1, 2),
            (CostWorkload::O1 | CostWorkload::O2, false) => (200, 1_000),
            (CostWorkload::O1 | CostWorkload::O2, true) => (5, 15),
        }
    }

    /// The targets of the guard's figures against stock: extra syscalls per write transaction
    /// (two: the write lock's check and the commit's, each frame's check paid for by writing
    /// its header and page as one; and seven per checkpoint: the guard checks before each,
    /// judges the main file before its first write, stamps the main file after it, and records
    /// the next WAL generation's base), or per open + read + close (O1, O2: six), extra
    /// instructions (%).
    pub(super) fn target(self) -> (f64, f64) {
        match self {
            CostWorkload::W1 => (2.0, 2.0),
            CostWorkload::R1 => (0.0, 1.0),
            CostWorkload::W2 => (2.0, 0.1),
            CostWorkload::O1 => (6.0, 25.0),
            CostWorkload::O2 => (6.0, 30.0),
        }
    }
}

/// Workloads named by `only` (all when empty): an ID prefix (`W`, `R1`) or a wall-clock row of
/// the same workload (`W1-NORMAL`); `None` when `only` names none of them.
pub fn selected(only: &[String]) -> Option<Vec<CostWorkload>> {
    if only.is_empty() {
        return Some(CostWorkload::ALL.to_vec());
    }
    let picked: Vec<CostWorkload> = CostWorkload::ALL
        .into_iter()
        .filter(|w| {
            only.iter().any(|t| {
                let t = t.trim().to_ascii_uppercase();
                w.code().starts_with(&t) || t.starts_with(w.code())
            })
        })
        .collect();
    (!picked.is_empty()).then_some(picked)
}

/// The other databases O2 holds open in a run, smoke or not.
pub(super) fn o2_others(smoke: bool) -> u64 {
    if smoke {
        O2_OTHERS_SMOKE
    } else {
        O2_OTHERS
    }
}

/// The child's side: set up `workload` through `vfs` (untimed), run `ops` operations, close.
/// `place` is the directory W1/W2/O1/O2 make their databases in, or R1's database; `others`
/// overrides O2's 1,000 other databases.
pub fn child(
    workload: CostWorkload,
    vfs: Vfs,
    place: &Path,
    ops: u64,
    others: Option<u64>,
) -> Result<()> {
    let mut session = match workload {
        CostWorkload::W1 => workloads::Inserts::open(vfs, place, Synchronous::Normal, 1)?,
        CostWorkload::W2 => workloads::Inserts::open(vfs, place, Synchronous::Normal, W2_ROWS)?,
        CostWorkload::O1 => workloads::Churn::open(vfs, place, 0)?,
        CostWorkload::O2 => workloads::Churn::open(vfs, place, others.unwrap_or(O2_OTHERS))?,
        CostWorkload::R1 => {
            // The parent built it with READ_ROWS rows, or fewer for a smoke run.
            let rows: i64 = rusqlite::Connection::open(place)
                .and_then(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)))
                .ctx("counting the rows of", place)?;
            workloads::Reads::open(vfs, place, rows as u64, false)?
        }
    };
    session.prepare()?;
    session.run(ops)?;
    // For the parent: the checkpoints this run made (autocheckpoints of W1/W2).
    if let Some(n) = session.checkpoints()? {
        println!("checkpoints {n}");
    }
    session.finish()?;
    Ok(())
}
