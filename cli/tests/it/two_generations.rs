//! Two generations in one process. Connection A has committed rows that live only in its WAL
//! (20 rows of checkpointed history, then 20 more with automatic checkpoints off) when the
//! database's `-wal` and `-shm` are unlinked under it (or the `-shm` alone). A stays open: idle,
//! inside a read transaction, or held by another thread. A new connection B, opened in the same
//! process, maps the `-shm` now at the path (the guard's wal-index node is one per `-shm` file,
//! not one per main file as in SQLite's unix VFS) and commits each of its 10 rows on the first
//! attempt, with no retry and no reopen. A's next write is refused and A's generation is captured
//! beside the database. A is closed, then B; the operator's runbook (`hermes-guard captures`,
//! then every `recover --apply` it lists) leaves every row either connection had acknowledged
//! live exactly once.
//!
//! With the `-shm` alone unlinked, the `-wal` left at the path is still A's: B's open rebuilds a
//! wal-index from it, so B reads A's rows at once and appends its own to the same file; A is
//! refused (`shm-lost`) all the same, its capture holds both generations' frames, and the runbook
//! finds every row already live.
//!
//! One module per case (how A is held, what was unlinked), one behaviour per test.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use hermes_guard::{GuardStatus, RetireReason};
use rusqlite::Connection;

use crate::common::*;

/// Rows A commits after its checkpointed history: they live only in its WAL.
const LOST_ROWS: usize = 20;
/// Rows B commits, one statement each.
const NEW_ROWS: usize = 10;
/// The history `checkpointed_history` commits (`history 0` ...).
const HISTORY_ROWS: usize = 20;
/// What A tries to write after the loss.
const REFUSED_ROW: &str = "written by the old connection after the loss";

fn lost_row(i: usize) -> String {
    format!("old generation row {i}")
}

fn new_row(i: usize) -> String {
    format!("new generation row {i}")
}

/// How connection A is held when its files are lost.
#[derive(Clone, Copy, Debug)]
enum Held {
    /// Open, no statement running.
    Idle,
    /// Inside a read transaction (`BEGIN`, a `SELECT`), left open.
    InReadTransaction,
    /// Opened, written and kept open by another thread, which runs what this one asks of it.
    OnAnotherThread,
}

/// What is unlinked under A.
#[derive(Clone, Copy, Debug)]
enum Loss {
    WalAndShm,
    ShmOnly,
    /// The `-wal` alone: the `-shm` at the path still describes A's WAL, which a new connection's
    /// new `-wal` is not (the guard gives it a fresh `-shm`).
    WalOnly,
}

impl Loss {
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Loss::WalAndShm => &["-wal", "-shm"],
            Loss::ShmOnly => &["-shm"],
            Loss::WalOnly => &["-wal"],
        }
    }

    /// Why A's generation is retired: the guard checks the `-wal` before the `-shm`.
    fn reason(self) -> RetireReason {
        match self {
            Loss::WalAndShm | Loss::WalOnly => RetireReason::WalLost,
            Loss::ShmOnly => RetireReason::ShmLost,
        }
    }
}

type Job = Box<dyn FnOnce(&Connection) + Send>;

/// Connection A, here or on a thread of its own.
enum OldConnection {
    Here(Connection),
    Thread {
        jobs: mpsc::Sender<Job>,
        thread: JoinHandle<()>,
    },
}

impl OldConnection {
    /// Opens A at `path` (on its own thread for [`Held::OnAnotherThread`]), commits the
    /// checkpointed history and [`LOST_ROWS`] rows only in the WAL, and holds it as `held` says.
    fn open(path: &Path, held: Held) -> OldConnection {
        let old = match held {
            Held::Idle | Held::InReadTransaction => OldConnection::Here(open_guarded(path)),
            Held::OnAnotherThread => {
                let path = path.to_owned();
                let (jobs, inbox) = mpsc::channel::<Job>();
                let thread = std::thread::spawn(move || {
                    let conn = open_guarded(&path);
                    for job in inbox {
                        job(&conn);
                    }
                    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
                });
                OldConnection::Thread { jobs, thread }
            }
        };
        old.run(move |conn| {
            checkpointed_history(conn);
            for i in 0..LOST_ROWS {
                insert(conn, &lost_row(i)).unwrap();
            }
            if let Held::InReadTransaction = held {
                conn.execute_batch("BEGIN").unwrap();
                let seen: i64 = conn
                    .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
                    .unwrap();
                assert_eq!(seen, (HISTORY_ROWS + LOST_ROWS) as i64);
            }
        });
        old
    }

    /// Runs `f` on A, on the thread that holds it, and returns what it returned.
    fn run<R: Send + 'static>(&self, f: impl FnOnce(&Connection) -> R + Send + 'static) -> R {
        match self {
            OldConnection::Here(conn) => f(conn),
            OldConnection::Thread { jobs, .. } => {
                let (reply, answer) = mpsc::sync_channel(1);
                jobs.send(Box::new(move |conn: &Connection| {
                    let _ = reply.send(f(conn));
                }))
                .expect("A's thread is running");
                answer.recv().expect("A's thread ran the job")
            }
        }
    }

    /// Ends a transaction left open (the read transaction's) and closes A.
    fn close(self) {
        self.run(|conn| {
            if !conn.is_autocommit() {
                conn.execute_batch("ROLLBACK").unwrap();
            }
        });
        match self {
            OldConnection::Here(conn) => hermes_guard::close(conn).map_err(|(_, e)| e).unwrap(),
            OldConnection::Thread { jobs, thread } => {
                drop(jobs);
                if let Err(panic) = thread.join() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}

/// Everything the scenario saw, for each test to judge its part.
struct Seen {
    /// What B's `NEW_ROWS` inserts returned, one attempt each.
    new_writes: Vec<rusqlite::Result<usize>>,
    /// B's status after its writes.
    new_status: GuardStatus,
    /// B's counts after its writes: its own rows, A's rows only in the lost WAL.
    new_sees_own: i64,
    new_sees_lost: i64,
    /// What A's write after B's returned, and A's status then.
    old_write: rusqlite::Result<usize>,
    old_status: GuardStatus,
    /// The captures beside the database after A's write.
    captures: Vec<PathBuf>,
    /// A's rows only in the lost WAL, counted in its capture (image + WAL opened apart) after
    /// both connections closed.
    captured_lost_rows: Option<i64>,
    /// Every row A or B had acknowledged.
    acknowledged: Vec<String>,
    /// After both closed and the runbook ran: its output, and the live database.
    runbook: String,
    live: Connection,
    dir: tempfile::TempDir,
}

/// The whole scenario: A written and held, the loss, B's writes, A's write, A closed then B,
/// the runbook.
fn two_generations(held: Held, loss: Loss) -> Seen {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let old = OldConnection::open(&db, held);
    let mut acknowledged: Vec<String> = (0..HISTORY_ROWS)
        .map(|i| format!("history {i}"))
        .chain((0..LOST_ROWS).map(lost_row))
        .collect();

    for suffix in loss.suffixes() {
        std::fs::remove_file(sidecar(&db, suffix)).unwrap();
    }

    let new = open_guarded(&db);
    let new_writes: Vec<_> = (0..NEW_ROWS)
        .map(|i| {
            let written = insert(&new, &new_row(i));
            if written.is_ok() {
                acknowledged.push(new_row(i));
            }
            written
        })
        .collect();
    let new_status = new.guard_status().unwrap();
    let new_sees_own = count_like(&new, "new generation row %");
    let new_sees_lost = count_like(&new, "old generation row %");

    let old_write = old.run(|conn| insert(conn, REFUSED_ROW));
    if old_write.is_ok() {
        acknowledged.push(REFUSED_ROW.to_owned());
    }
    let old_status = old.run(|conn| conn.guard_status().unwrap());
    let captures = artifacts(dir.path());

    old.close();
    hermes_guard::close(new).map_err(|(_, e)| e).unwrap();
    let captured_lost_rows = old_status.capture.as_deref().map(|capture| {
        let elsewhere = tempfile::tempdir().unwrap();
        let copy = recover(capture, "state.db", elsewhere.path());
        count_like(&copy, "old generation row %")
    });
    let runbook = apply_every_listed_recovery(&db);
    let live = Connection::open(&db).unwrap();
    Seen {
        new_writes,
        new_status,
        new_sees_own,
        new_sees_lost,
        old_write,
        old_status,
        captures,
        captured_lost_rows,
        acknowledged,
        runbook,
        live,
        dir,
    }
}

/// B committed each of its rows on its first attempt, as a connection of a live generation.
fn the_new_connection_commits_every_row_at_once(held: Held, loss: Loss) {
    let seen = two_generations(held, loss);
    for (i, written) in seen.new_writes.iter().enumerate() {
        if let Err(e) = written {
            panic!(
                "{held:?}, {loss:?}: the new connection's row {i} of {NEW_ROWS} was not \
                 committed: {e} (refusal: {}); its status: {:?}",
                is_refusal(e),
                seen.new_status
            );
        }
    }
    assert_eq!(seen.new_sees_own, NEW_ROWS as i64);
    let status = &seen.new_status;
    assert!(!status.retired, "{held:?}, {loss:?}: {status:?}");
    assert_eq!(status.reason, None);
    assert_eq!(status.refusals, 0);
    assert_eq!(status.capture, None);
}

/// A's write after B's is refused, its generation retired for the loss and captured beside the
/// database; the capture is the only one.
fn the_old_connection_is_refused_and_captured(held: Held, loss: Loss) {
    let seen = two_generations(held, loss);
    match &seen.old_write {
        Err(e) => assert!(
            is_refusal(e),
            "{held:?}, {loss:?}: expected a guard refusal, got {e}"
        ),
        Ok(_) => panic!("{held:?}, {loss:?}: the old connection wrote after the loss"),
    }
    let status = &seen.old_status;
    assert!(status.retired, "{status:?}");
    assert_eq!(status.reason, Some(loss.reason()));
    assert_eq!(status.refusals, 1);
    assert_eq!(
        status.retired_connections_here, 1,
        "A itself; B, open, is live"
    );
    let capture = status.capture.clone().expect("captured at the refusal");
    assert_eq!(
        capture.parent(),
        Some(seen.dir.path()),
        "beside the database"
    );
    assert_eq!(seen.captures, vec![capture]);
    assert_eq!(seen.captured_lost_rows, Some(LOST_ROWS as i64));
}

/// After both connections closed, `captures` and every `recover --apply` it lists leave each
/// acknowledged row of A and of B live exactly once, the refused one absent.
fn every_acknowledged_row_is_live_once_after_recover(held: Held, loss: Loss) {
    let seen = two_generations(held, loss);
    let live = &seen.live;
    let log = &seen.runbook;
    assert!(integrity_ok(live), "{held:?}, {loss:?}: integrity\n{log}");
    assert_eq!(
        seen.acknowledged.len(),
        HISTORY_ROWS + LOST_ROWS + NEW_ROWS,
        "{held:?}, {loss:?}: every write but A's last was acknowledged"
    );
    for row in &seen.acknowledged {
        let n = count_like(live, row);
        assert_eq!(n, 1, "{held:?}, {loss:?}: {row:?} is live {n} times\n{log}");
    }
    assert_eq!(count_like(live, REFUSED_ROW), 0);
    assert_eq!(
        count_like(live, "%"),
        seen.acknowledged.len() as i64,
        "{held:?}, {loss:?}: no other row\n{log}"
    );
}

/// The three tests of one case.
macro_rules! case {
    ($(#[$doc:meta])* $module:ident: $held:expr, $loss:expr) => {
        $(#[$doc])*
        mod $module {
            use super::*;

            #[test]
            fn a_new_connection_commits_10_of_10_rows_each_on_its_first_attempt() {
                the_new_connection_commits_every_row_at_once($held, $loss);
            }

            #[test]
            fn the_old_connections_next_write_is_refused_and_its_rows_captured_beside_the_database()
            {
                the_old_connection_is_refused_and_captured($held, $loss);
            }

            #[test]
            fn after_recover_every_acknowledged_row_of_both_connections_is_live_exactly_once() {
                every_acknowledged_row_is_live_once_after_recover($held, $loss);
            }
        }
    };
}

case! {
    /// A idle, its `-wal` and `-shm` unlinked.
    idle_old_connection: Held::Idle, Loss::WalAndShm
}

case! {
    /// A inside a read transaction, its `-wal` and `-shm` unlinked.
    old_connection_in_a_read_transaction: Held::InReadTransaction, Loss::WalAndShm
}

case! {
    /// A held by another thread, its `-wal` and `-shm` unlinked.
    old_connection_on_another_thread: Held::OnAnotherThread, Loss::WalAndShm
}

case! {
    /// A idle, its `-shm` alone unlinked.
    idle_old_connection_shm_only: Held::Idle, Loss::ShmOnly
}

case! {
    /// A inside a read transaction, its `-shm` alone unlinked.
    old_connection_in_a_read_transaction_shm_only: Held::InReadTransaction, Loss::ShmOnly
}

case! {
    /// A held by another thread, its `-shm` alone unlinked.
    old_connection_on_another_thread_shm_only: Held::OnAnotherThread, Loss::ShmOnly
}

case! {
    /// A idle, its `-wal` alone unlinked.
    idle_old_connection_wal_only: Held::Idle, Loss::WalOnly
}

case! {
    /// A inside a read transaction, its `-wal` alone unlinked.
    old_connection_in_a_read_transaction_wal_only: Held::InReadTransaction, Loss::WalOnly
}

case! {
    /// A held by another thread, its `-wal` alone unlinked.
    old_connection_on_another_thread_wal_only: Held::OnAnotherThread, Loss::WalOnly
}

/// Where the `-wal` alone went, the `-shm` at the path describes A's lost WAL: B gets a fresh one
/// and, like after both sidecars went, reads the main file alone.
#[test]
fn after_the_wal_alone_is_unlinked_the_new_connection_reads_the_main_file_alone() {
    let seen = two_generations(Held::Idle, Loss::WalOnly);
    assert_eq!(seen.new_sees_lost, 0);
}

/// Where both sidecars went, B's generation starts from the main file: A's rows only in the lost
/// WAL are not B's to read (the runbook brings them back).
#[test]
fn after_the_wal_and_shm_are_unlinked_the_new_connection_reads_the_main_file_alone() {
    let seen = two_generations(Held::Idle, Loss::WalAndShm);
    assert_eq!(seen.new_sees_lost, 0);
}

/// Where the `-shm` alone went, the `-wal` at the path is still A's, every frame of it committed:
/// B's open rebuilds a wal-index from it and reads A's rows at once.
#[test]
fn after_the_shm_alone_is_unlinked_the_new_connection_reads_the_old_ones_rows_from_its_wal() {
    let seen = two_generations(Held::Idle, Loss::ShmOnly);
    assert_eq!(seen.new_sees_lost, LOST_ROWS as i64);
}
