//! The scenarios: who takes part (guarded or stock connections, actors), what each one's script
//! is, and what the setup leaves on disk before the schedule starts. A scenario's variant (which
//! file an actor takes away, which checkpoint mode) is drawn from the seed, so a seed names one
//! schedule of one variant.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

mod newer_changes;
mod two_generations;

use crate::process::Other;
use crate::sched::{Participant, Rng};
use crate::world::{act, open_direct, sidecar, Act, Shared, Who};

/// What a scenario's setup hands to the schedule.
pub struct Built {
    pub parts: Vec<Participant>,
    /// The main file a stale WAL was written on (`recover --main`), when the setup made one.
    pub stale_main: Option<PathBuf>,
    /// The variant the seed chose (which file the actor takes, which checkpoint modes).
    pub variant: String,
}

/// One scenario.
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// About how many steps a schedule of it takes (PCT's change points fall among them).
    pub horizon: usize,
    /// Whether a checkpoint's `xUnfetch(0, NULL)` on the main file is a yield point: the one VFS
    /// call between a checkpointer's read of the WAL header and its `nBackfill` check, the
    /// window of the WAL-reset race (docs/architecture.md). Only where it is wanted: a new yield
    /// point changes every schedule of a scenario, and the found bugs' seeds with them.
    pub unfetch: bool,
    pub build: fn(&Path, &mut Rng, &Shared) -> Built,
}

pub const ALL: &[Scenario] = &[
    Scenario {
        name: "lone-loss",
        about: "one guarded writer (3 commits, then close: the heal) while an actor removes or renames its -wal or removes its -shm",
        horizon: 120,
        unfetch: false,
        build: lone_loss,
    },
    Scenario {
        name: "peer-loss",
        about: "two guarded writers on the same database while an actor removes or renames the -wal: refusal and capture",
        horizon: 200,
        unfetch: false,
        build: peer_loss,
    },
    Scenario {
        name: "restore-openers",
        about: "a killed writer's WAL, a backup restored over the file (cp or mv), then a guarded and a stock opener race",
        horizon: 150,
        unfetch: false,
        build: restore_openers,
    },
    Scenario {
        name: "restore-running",
        about: "a backup (older than the file) restored over the file (cp or mv) under a running guarded writer and a second guarded opener",
        horizon: 200,
        unfetch: false,
        build: restore_running,
    },
    Scenario {
        name: "restore-checkpointed",
        about: "a backup (older than the file) copied over the file in place while its WAL holds frames every one of which is checkpointed, under a guarded opener whose commit resets that WAL; the connection that wrote them closes",
        horizon: 120,
        unfetch: false,
        build: restore_checkpointed,
    },
    Scenario {
        name: "killed-peer",
        about: "a guarded writer that abandons its connection after its commits (a kill: open until the schedule ends, closed before the checks), a guarded peer, an actor removing or renaming the -wal",
        horizon: 200,
        unfetch: false,
        build: killed_peer,
    },
    Scenario {
        name: "newer-checkpointed",
        about: "a guarded writer (2 commits before the schedule, 2 in it, close) whose -wal and/or -shm are removed, then a newer writer (guarded or stock: 2 commits, a PASSIVE or TRUNCATE checkpoint, close) whose rows the retired writer's capture and its recovery must keep",
        horizon: 45,
        unfetch: false,
        build: newer_checkpointed,
    },
    Scenario {
        name: "newer-changes",
        about: "120 history rows in the main file; a guarded writer (autocheckpoint off: an insert before the schedule; in it an insert, 2 updates, a range deleted, an insert, close) whose -wal and/or -shm are removed, then a newer writer (guarded or stock: an insert, the oldest rows or a middle range deleted, 2 other rows updated, an insert, a PASSIVE or TRUNCATE checkpoint, close): after recovery none of the newer writer's deletions or updates is undone, the retired writer's are applied",
        horizon: 80,
        unfetch: false,
        build: newer_changes::newer_changes,
    },
    Scenario {
        name: "in-flight",
        about: "a guarded writer inside a write transaction (2 rows, then COMMIT, close) whose -wal or -shm is removed; then, in other processes, a stock reader opens and counts, and a newer writer (guarded or stock: 2 commits, a PASSIVE or TRUNCATE checkpoint, close) (the commit refused or safe, never written over)",
        horizon: 60,
        unfetch: false,
        build: in_flight,
    },
    Scenario {
        name: "two-generations",
        about: "one process, two generations: a guarded connection A (rows checkpointed and rows in its WAL only; idle or in a read transaction) whose -wal and -shm are removed, a new guarded connection B of the same process (2 commits, never refused), a stock connection in another process sharing B's -shm (count, 2 commits, a PASSIVE or TRUNCATE checkpoint); A's writes after the loss refused",
        horizon: 100,
        unfetch: false,
        build: two_generations::two_generations,
    },
    Scenario {
        name: "churn",
        about: "no loss: a guarded reader in another process opening, counting and closing, over and over, beside a guarded writer checkpointing PASSIVE and a guarded or stock one checkpointing RESTART (no retirement, no capture, no WARN line)",
        horizon: 160,
        unfetch: false,
        build: churn,
    },
    Scenario {
        name: "wal-reset",
        about: "no loss: a guarded checkpointer (a complete checkpoint of any mode, then a PASSIVE one) beside a guarded writer whose commits reset the WAL it finds wholly checkpointed (the WAL-reset race of SQLite 3.7.0-3.51.2)",
        horizon: 120,
        unfetch: true,
        build: wal_reset,
    },
    Scenario {
        name: "checkpoint-race",
        about: "no loss: a guarded and a stock writer, a guarded checkpointer (two random modes) racing the writers' WAL resets",
        horizon: 250,
        unfetch: true,
        build: checkpoint_race,
    },
];

pub fn find(name: &str) -> Option<&'static Scenario> {
    ALL.iter().find(|s| s.name == name)
}

/// A new database in WAL mode with table `t`, its WAL checkpointed away, and `rows` rows.
fn create(db: &Path, rows: &[&str]) {
    let conn = open_direct(db).expect("create the database");
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .unwrap();
    for v in rows {
        conn.execute("INSERT INTO t(v) VALUES (?1)", [v]).unwrap();
    }
    drop(conn);
    assert!(
        !sidecar(db, "-wal").exists(),
        "the setup's WAL was checkpointed away"
    );
}

fn part(name: &str, script: impl FnOnce() + Send + 'static) -> Participant {
    Participant {
        name: name.into(),
        script: Box::new(script),
    }
}

/// A guarded or stock writer: open, the rows, close.
fn writer(name: &str, db: &Path, guarded: bool, rows: Vec<String>, l: &Shared) -> Participant {
    let (who, db) = (Who::new(name, l), db.to_path_buf());
    part(name, move || {
        let Some(conn) = who.open(&db, guarded) else {
            return;
        };
        for v in &rows {
            who.insert(&conn, v);
        }
        who.close(conn, guarded);
    })
}

fn actor(db: &Path, what: Act, l: &Shared) -> Participant {
    let (db, l) = (db.to_path_buf(), Arc::clone(l));
    part("A", move || act(&db, what, &l))
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i}")).collect()
}

fn lone_loss(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    let what = [Act::UnlinkWal, Act::RenameWal, Act::UnlinkShm][rng.below(3) as usize];
    Built {
        parts: vec![writer("W", db, true, names("w", 3), l), actor(db, what, l)],
        stale_main: None,
        variant: what.name().into(),
    }
}

fn peer_loss(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    let what = [Act::UnlinkWal, Act::RenameWal][rng.below(2) as usize];
    Built {
        parts: vec![
            writer("W1", db, true, names("a", 2), l),
            writer("W2", db, true, names("b", 2), l),
            actor(db, what, l),
        ],
        stale_main: None,
        variant: what.name().into(),
    }
}

/// The crashed database of `restore-openers`, made once per process: `backup.db` (rows r1, r2),
/// and `crashed/` holding `state.db` with r1..r3 and its WAL (with the guard's record) holding
/// d1..d3, as a writer killed after those commits leaves them. (The backup is older than the
/// crashed file: one identical to the file the WAL began on cannot be told from it.)
static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();

/// Removes the crashed template, if this process made one (the command's last step).
pub fn remove_template() {
    if let Some(dir) = TEMPLATE.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn crashed_template() -> &'static Path {
    TEMPLATE.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("explore-template-")
            .tempdir()
            .expect("a template directory")
            .keep();
        let db = dir.join("state.db");
        create(&db, &["r1", "r2"]);
        std::fs::copy(&db, dir.join("backup.db")).unwrap();
        let conn = open_direct(&db).unwrap();
        conn.execute("INSERT INTO t(v) VALUES ('r3')", []).unwrap();
        drop(conn);
        let conn = open_direct(&db).unwrap();
        for v in ["d1", "d2", "d3"] {
            conn.execute("INSERT INTO t(v) VALUES (?1)", [v]).unwrap();
        }
        std::fs::create_dir(dir.join("crashed")).unwrap();
        // The files as the kill leaves them (the writer is alone and idle: a consistent copy).
        cp_xattrs(&db, &dir.join("crashed"));
        drop(conn);
        dir
    })
}

/// `cp --preserve=xattr` of `db` and its `-wal` and `-shm` into `to` (the WAL's record of the
/// main file it was written on is an extended attribute).
fn cp_xattrs(db: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("--preserve=xattr")
        .args([db.to_path_buf(), sidecar(db, "-wal"), sidecar(db, "-shm")])
        .arg(to)
        .status()
        .expect("run cp");
    assert!(status.success(), "cp --preserve=xattr {}", db.display());
}

/// An opener: open, count, one row, close.
fn opener(name: &str, db: &Path, guarded: bool, v: &str, l: &Shared) -> Participant {
    let (who, db, v) = (Who::new(name, l), db.to_path_buf(), v.to_string());
    part(name, move || {
        let Some(conn) = who.open(&db, guarded) else {
            return;
        };
        who.count(&conn);
        who.insert(&conn, &v);
        who.close(conn, guarded);
    })
}

fn restore_openers(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    let t = crashed_template();
    cp_xattrs(&t.join("crashed").join("state.db"), db.parent().unwrap());
    std::fs::copy(t.join("backup.db"), db.with_file_name("backup.db")).unwrap();
    let restore = [Act::CopyBackupOver, Act::RenameBackupOver][rng.below(2) as usize];
    // The restore, before anybody opens (not a step of the schedule).
    act(db, restore, l);
    {
        let mut l = l.lock();
        // r3 was checkpointed into the file the restore replaced: the restore drops it on
        // purpose (not counted); a replay of the stale WAL brings it back (it is on the WAL's
        // pages), which a set-aside must not.
        l.acked
            .extend(["r1", "r2", "d1", "d2", "d3"].map(|v| (v.to_string(), 0)));
        l.stale_rows
            .extend(["r3", "d1", "d2", "d3"].map(String::from));
    }
    let (g, s) = (
        opener("G", db, true, "g1", l),
        opener("S", db, false, "s1", l),
    );
    // Which one is listed first does not matter: the seed orders them.
    Built {
        parts: vec![g, s],
        stale_main: Some(t.join("crashed").join("state.db")),
        variant: restore.name().into(),
    }
}

fn restore_running(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &["r1", "r2"]);
    std::fs::copy(db, db.with_file_name("backup.db")).unwrap();
    // A commit after the backup, checkpointed: the backup is older than the file the writers'
    // WAL starts on (a backup identical to it cannot be told from the file itself: a documented
    // limit, docs/architecture.md, Known limits).
    let conn = open_direct(db).unwrap();
    conn.execute("INSERT INTO t(v) VALUES ('r3')", []).unwrap();
    drop(conn);
    {
        let mut l = l.lock();
        l.acked
            .extend(["r1", "r2", "r3"].map(|v| (v.to_string(), 0)));
        l.backup_rows = Some(vec!["r1".into(), "r2".into()]);
    }
    let restore = [Act::CopyBackupOver, Act::RenameBackupOver][rng.below(2) as usize];
    Built {
        parts: vec![
            writer("W", db, true, names("w", 3), l),
            opener("O", db, true, "o1", l),
            actor(db, restore, l),
        ],
        stale_main: None,
        variant: restore.name().into(),
    }
}

/// The last window of an in-place restore at a WAL reset: after the backup and `r3` (checkpointed
/// away), K (opened in the setup) commits `r4` and checkpoints it completely, the WAL staying (K is
/// open); O opens, reads (from the main file: nothing is left to checkpoint) and commits `o1`,
/// which resets the WAL; the backup is copied over the file in place at any step; K closes at any
/// step.
fn restore_checkpointed(db: &Path, _rng: &mut Rng, l: &Shared) -> Built {
    create(db, &["r1", "r2"]);
    std::fs::copy(db, db.with_file_name("backup.db")).unwrap();
    // As in `restore_running`: a commit after the backup, checkpointed away, so that the backup
    // is older than the file K's WAL generation starts on.
    let conn = open_direct(db).unwrap();
    conn.execute("INSERT INTO t(v) VALUES ('r3')", []).unwrap();
    drop(conn);
    let keeper = crate::world::open(db, true).expect("open the keeper's connection");
    keeper
        .execute("INSERT INTO t(v) VALUES ('r4')", [])
        .unwrap();
    let (busy, log, done): (i64, i64, i64) = keeper
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert!(
        busy == 0 && log > 0 && done == log,
        "the WAL wholly checkpointed"
    );
    {
        let mut l = l.lock();
        l.acked
            .extend(["r1", "r2", "r3", "r4"].map(|v| (v.to_string(), 0)));
        l.backup_rows = Some(vec!["r1".into(), "r2".into()]);
    }
    let who = Who::new("K", l);
    Built {
        parts: vec![
            opener("O", db, true, "o1", l),
            part("K", move || who.close(keeper, true)),
            actor(db, Act::CopyBackupOver, l),
        ],
        stale_main: None,
        variant: Act::CopyBackupOver.name().into(),
    }
}

fn checkpoint_race(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    const MODES: [&str; 4] = ["PASSIVE", "FULL", "RESTART", "TRUNCATE"];
    let modes = [MODES[rng.below(4) as usize], MODES[rng.below(4) as usize]];
    let (who, path) = (Who::new("C", l), db.to_path_buf());
    let checkpointer = part("C", move || {
        let Some(conn) = who.open(&path, true) else {
            return;
        };
        for mode in modes {
            who.checkpoint(&conn, mode);
        }
        who.close(conn, true);
    });
    Built {
        parts: vec![
            writer("W1", db, true, names("c", 3), l),
            writer("W2", db, false, names("s", 2), l),
            checkpointer,
        ],
        stale_main: None,
        variant: modes.join(", "),
    }
}

/// The smallest setting of the WAL-reset race (docs/architecture.md, "The WAL-reset race"). The
/// checkpointer's connection is opened in the setup, before two commits it has not seen: its
/// first checkpoint finds the WAL header changed, checkpoints the WAL completely and forgets its
/// copy of the header; so its PASSIVE one reads the header again and calls `xUnfetch(0, NULL)`
/// before comparing `nBackfill`. The writer's first commit resets the WAL it finds wholly
/// checkpointed: a preemption at that `xUnfetch` puts the reset and the commit in the window,
/// and a second one after that commit lets the checkpointer finish by its stale header: it
/// sets `nBackfill` to the old WAL's 5 frames, past the new one, so the writer's next commit
/// (frame 2) is never checkpointed and its close deletes the WAL (`w2` lost). The checkpointer
/// is listed first: the default order runs it first.
fn wal_reset(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    let conn = crate::world::open(db, true).expect("open the checkpointer's connection");
    let setup = open_direct(db).expect("open the database");
    let rows = names("r", 5);
    for v in &rows {
        setup.execute("INSERT INTO t(v) VALUES (?1)", [v]).unwrap();
    }
    drop(setup);
    l.lock().acked.extend(rows.into_iter().map(|v| (v, 0)));
    const MODES: [&str; 4] = ["PASSIVE", "FULL", "RESTART", "TRUNCATE"];
    let first = MODES[rng.below(4) as usize];
    let who = Who::new("C", l);
    let checkpointer = part("C", move || {
        for mode in [first, "PASSIVE"] {
            who.checkpoint(&conn, mode);
        }
        who.close(conn, true);
    });
    Built {
        parts: vec![checkpointer, writer("W", db, true, names("w", 2), l)],
        stale_main: None,
        variant: format!("{first}, PASSIVE"),
    }
}

fn killed_peer(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    let what = [Act::UnlinkWal, Act::RenameWal][rng.below(2) as usize];
    let (who, path) = (Who::new("K", l), db.to_path_buf());
    let killed = part("K", move || {
        let Some(conn) = who.open(&path, true) else {
            return;
        };
        for v in ["k1", "k2"] {
            who.insert(&conn, v);
        }
        who.abandon(conn);
    });
    Built {
        parts: vec![
            killed,
            writer("W", db, true, names("b", 2), l),
            actor(db, what, l),
        ],
        stale_main: None,
        variant: what.name().into(),
    }
}

/// A newer generation checkpointed into the main file before the retired writer notices its loss. W
/// (guarded) is opened in the setup and commits `w1`, `w2` there (in its WAL only: its first
/// commits, before any loss); in the schedule it commits `w3`, `w4` and closes. The other
/// participant, `AN`, is the actor and then the newer writer N, one after the other (N opens after
/// the loss, as a newer generation does): it removes the `-wal`, the `-shm` or both, then N
/// (guarded or stock) opens in another process (`process.rs`: in this one it would join W's mapping
/// of the unlinked `-shm`), commits `n1`, `n2`, runs a PASSIVE or TRUNCATE checkpoint and closes,
/// each statement one step. Every order of the loss, N's commits and checkpoint, W's next commit
/// (or refusal, and capture) and W's close is a schedule; wherever W's capture lands, its recovery
/// must not delete or overwrite N's rows.
fn newer_checkpointed(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    const LOSSES: [&[Act]; 3] = [
        &[Act::UnlinkWal, Act::UnlinkShm],
        &[Act::UnlinkWal],
        &[Act::UnlinkShm],
    ];
    let losses = LOSSES[rng.below(3) as usize];
    let guarded = rng.below(2) == 0;
    let mode = ["PASSIVE", "TRUNCATE"][rng.below(2) as usize];
    let conn = crate::world::open(db, true).expect("open the retired writer's connection");
    let first = names("w", 2);
    for v in &first {
        conn.execute("INSERT INTO t(v) VALUES (?1)", [v]).unwrap();
    }
    l.lock().acked.extend(first.into_iter().map(|v| (v, 0)));
    let (w, n) = (Who::new("W", l), Who::new("N", l));
    let retired = part("W", move || {
        for v in ["w3", "w4"] {
            w.insert(&conn, v);
        }
        w.close(conn, true);
    });
    let (path, ledger) = (db.to_path_buf(), Arc::clone(l));
    let newer = part("AN", move || {
        for &what in losses {
            act(&path, what, &ledger);
        }
        let Some(mut conn) = Other::open(&n, &path, guarded) else {
            return;
        };
        for v in ["n1", "n2"] {
            conn.insert(v);
        }
        conn.checkpoint(mode);
        conn.close();
    });
    let losses: Vec<&str> = losses.iter().map(|a| a.name()).collect();
    Built {
        parts: vec![retired, newer],
        stale_main: None,
        variant: format!(
            "{}; N {}, {mode}",
            losses.join(" + "),
            if guarded { "guarded" } else { "stock" }
        ),
    }
}

/// A loss while a write transaction is open. W (guarded) commits `w1`, `w2` in the setup; in the
/// schedule it runs `BEGIN IMMEDIATE`, inserts `w3`, `w4` and commits (the two rows acknowledged at
/// the commit only), then closes. `AN` removes the `-wal` or the `-shm`; a stock reader R opens in
/// another process and counts (SQLite's recovery of the WAL, by a connection that holds no lock W
/// can see); then N (guarded or stock, a process of its own) commits `n1`, `n2`, checkpoints
/// (PASSIVE or TRUNCATE) and closes, and R closes. Wherever the loss falls in W's transaction, W's
/// commit is refused, or it is whole before anyone else could write where it wrote.
fn in_flight(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    let loss = [Act::UnlinkWal, Act::UnlinkShm][rng.below(2) as usize];
    let guarded = rng.below(2) == 0;
    let mode = ["PASSIVE", "TRUNCATE"][rng.below(2) as usize];
    let conn = crate::world::open(db, true).expect("open the writer's connection");
    let first = names("w", 2);
    for v in &first {
        conn.execute("INSERT INTO t(v) VALUES (?1)", [v]).unwrap();
    }
    l.lock().acked.extend(first.into_iter().map(|v| (v, 0)));
    let (w, n, r) = (Who::new("W", l), Who::new("N", l), Who::new("R", l));
    let writer = part("W", move || {
        crate::sched::note(|| "BEGIN IMMEDIATE".into());
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            w.saw("begin", &e);
        } else {
            let mut written = true;
            for v in ["w3", "w4"] {
                crate::sched::note(|| format!("insert {v} (in the transaction)"));
                if let Err(e) = conn.execute("INSERT INTO t(v) VALUES (?1)", [v]) {
                    w.saw(&format!("insert {v}"), &e);
                    written = false;
                    break;
                }
            }
            crate::sched::note(|| "COMMIT".into());
            let committed = if written {
                conn.execute_batch("COMMIT")
                    .map_err(|e| w.saw("commit", &e))
                    .is_ok()
            } else {
                false
            };
            if committed {
                let step = crate::sched::step_number();
                let mut ledger = w.ledger.lock();
                ledger
                    .acked
                    .extend(["w3", "w4"].map(|v| (v.to_string(), step)));
            } else if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
        w.close(conn, true);
    });
    let (path, ledger) = (db.to_path_buf(), Arc::clone(l));
    let newer = part("AN", move || {
        act(&path, loss, &ledger);
        let reader = Other::open(&r, &path, false);
        let mut reader = reader;
        if let Some(reader) = reader.as_mut() {
            reader.count();
        }
        if let Some(mut conn) = Other::open(&n, &path, guarded) {
            for v in ["n1", "n2"] {
                conn.insert(v);
            }
            conn.checkpoint(mode);
            conn.close();
        }
        if let Some(reader) = reader {
            reader.close();
        }
    });
    Built {
        parts: vec![writer, newer],
        stale_main: None,
        variant: format!(
            "{}; stock reader first; N {}, {mode}",
            loss.name(),
            if guarded { "guarded" } else { "stock" }
        ),
    }
}

/// Ordinary churn, nothing taken away. Two writers in this process commit and checkpoint (W1
/// guarded, PASSIVE; W2 guarded or stock, RESTART: its next commit resets the WAL), each main-file
/// write of their checkpoints and each WAL write of their commits a step; the reader R is another
/// process (`process.rs`: its own POSIX locks, as the churning process of the report had), guarded,
/// opening, counting and closing 2 or 3 times, each statement one step. So R's close, and its
/// judgement of the main file, fall between any two writes of a checkpoint copying frames and in
/// the middle of a WAL reset. None of it may retire, capture or log a WARN line (`check.rs`,
/// invariants 3, 4 and 7).
fn churn(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &["c1", "c2"]);
    let stock = rng.below(2) == 0;
    let cycles = 2 + rng.below(2) as usize;
    let committer = |name: &str, guarded: bool, rows: [&'static str; 2], mode: &'static str| {
        let (who, path) = (Who::new(name, l), db.to_path_buf());
        part(name, move || {
            let Some(conn) = who.open(&path, guarded) else {
                return;
            };
            for v in rows {
                who.insert(&conn, v);
                who.checkpoint(&conn, mode);
            }
            who.close(conn, guarded);
        })
    };
    let (r, path) = (Who::new("R", l), db.to_path_buf());
    let reader = part("R", move || {
        for _ in 0..cycles {
            let Some(mut conn) = Other::open(&r, &path, true) else {
                continue;
            };
            conn.count();
            conn.close();
        }
    });
    Built {
        parts: vec![
            committer("W1", true, ["p1", "p2"], "PASSIVE"),
            committer("W2", !stock, ["r1", "r2"], "RESTART"),
            reader,
        ],
        stale_main: None,
        variant: format!(
            "W2 {}, R {cycles} cycles",
            if stock { "stock" } else { "guarded" }
        ),
    }
}
