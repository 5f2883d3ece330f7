//! Two generations in one process. Since the guard maps the wal-index itself (one node per `-shm`
//! file, docs/architecture.md "The wal-index node"), a connection opened in the lost generation's
//! process after a loss maps the `-shm` now at the path and writes at once; the lost generation's
//! connection keeps its own node and is refused until it closes.
//!
//! A (guarded) is opened in the setup and commits `w1` there, checkpointed into the main file,
//! then `w2` and `w3`, in its WAL only; it is left idle, or inside a read transaction (`BEGIN`, a
//! count) — the variant. In the schedule:
//!
//! - `A`: idle, it inserts `a1` (before the loss: acknowledged, must survive through its
//!   capture; after: refused); in its read transaction, it counts. Then, once the loss is done,
//!   it inserts `a2` (in the read transaction when it has one: then a `ROLLBACK`, and `a3` in a
//!   transaction of its own), each of which must be refused; then it closes.
//! - `LB`: the loss (`rm state.db-wal`, `rm state.db-shm`, each a step), then B, a new guarded
//!   connection of this process: it opens, inserts `b1`, `b2` and closes. None of its statements
//!   may be refused, nor fail otherwise than busy.
//! - `S`: once the loss is done, a stock connection in another process (`process.rs`), which
//!   shares B's new `-shm`: it opens, counts, inserts `s1`, checkpoints (PASSIVE or TRUNCATE, the
//!   variant), inserts `s2` and closes, each statement a step. Its busy timeout is 0: a statement
//!   that meets B's write lock fails `SQLITE_BUSY`, recorded as an error (not a violation).
//!
//! The usual checks follow (every acknowledged row live once, or in an unhealed capture; every
//! capture applied, then every one live exactly once; integrity), and the script's own
//! (`Ledger::violations`, `check.rs` invariant 9).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::{Connection, ErrorCode};

use super::{create, part, Built};
use crate::process::Other;
use crate::sched::{note, step_number, yield_now, Kind, Rng};
use crate::world::{act, is_refusal, open, Act, Shared, Who};

/// Whether `e` is `SQLITE_BUSY` (any extended code of it).
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::DatabaseBusy)
}

/// Yields (blocked) until `done`: a participant that must act after the loss waits for it.
fn wait_for_the_loss(done: &AtomicBool) {
    while !done.load(Ordering::Acquire) {
        yield_now(Kind::Blocked, || "wait for the loss".into());
    }
}

/// Records a violation the script saw.
fn violation(who: &Who, what: String) {
    who.ledger.lock().violations.push(what);
}

/// B's statement: acknowledged, or failed busy; anything else (a refusal above all) is a
/// violation.
fn newer(b: &Who, what: &str, e: &rusqlite::Error) {
    b.saw(what, e);
    if !is_busy(e) {
        let step = step_number();
        let how = if is_refusal(e) { "refused" } else { "failed" };
        violation(
            b,
            format!(
                "B, the newer generation's connection in the lost one's process, was {how} at \
                 its {what} (step {step}): {e}"
            ),
        );
    }
}

/// A's write `v` after the loss, in autocommit or in its open read transaction (`in_txn`: then
/// its `COMMIT` follows when the insert is not refused). It must be refused: acknowledged, or
/// failed otherwise, it is a violation.
fn lost_write(a: &Who, conn: &Connection, v: &str, in_txn: bool) {
    let txn = if in_txn {
        " (in its read transaction)"
    } else {
        ""
    };
    note(|| format!("insert {v} after the loss{txn}: must be refused"));
    let mut written = conn.execute("INSERT INTO t(v) VALUES (?1)", [v]);
    if in_txn && written.is_ok() {
        note(|| "COMMIT".into());
        written = conn.execute_batch("COMMIT").map(|()| 1);
    }
    let step = step_number();
    match written {
        Ok(_) => {
            a.ledger.lock().acked.push((v.to_string(), step));
            violation(
                a,
                format!(
                    "A, the lost generation's connection, wrote {v}{txn} after the loss (step \
                     {step}): acknowledged, not refused"
                ),
            );
        }
        Err(e) => {
            a.saw(&format!("insert {v}"), &e);
            if !is_refusal(&e) {
                violation(
                    a,
                    format!(
                        "A, the lost generation's connection, failed its write of {v}{txn} after \
                         the loss (step {step}) with {e}, not the guard's refusal"
                    ),
                );
            }
        }
    }
}

pub(super) fn two_generations(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create(db, &[]);
    let reading = rng.below(2) == 0;
    let mode = ["PASSIVE", "TRUNCATE"][rng.below(2) as usize];
    let conn = crate::world::open(db, true).expect("open the lost generation's connection");
    conn.execute("INSERT INTO t(v) VALUES ('w1')", []).unwrap();
    let (busy, log, done): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert!(
        busy == 0 && log > 0 && done == log,
        "w1 checkpointed into the main file"
    );
    for v in ["w2", "w3"] {
        conn.execute("INSERT INTO t(v) VALUES (?1)", [v]).unwrap();
    }
    if reading {
        conn.execute_batch("BEGIN").unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3, "A's read transaction sees its rows");
    }
    l.lock()
        .acked
        .extend(["w1", "w2", "w3"].map(|v| (v.to_string(), 0)));
    let lost = Arc::new(AtomicBool::new(false));
    let (a, b, s) = (Who::new("A", l), Who::new("B", l), Who::new("S", l));

    let gone = Arc::clone(&lost);
    let old = part("A", move || {
        if reading {
            a.count(&conn);
        } else {
            a.insert(&conn, "a1");
        }
        wait_for_the_loss(&gone);
        lost_write(&a, &conn, "a2", reading);
        if reading {
            if !conn.is_autocommit() {
                note(|| "ROLLBACK".into());
                if let Err(e) = conn.execute_batch("ROLLBACK") {
                    a.saw("rollback", &e);
                }
            }
            lost_write(&a, &conn, "a3", false);
        }
        a.close(conn, true);
    });

    let (path, ledger, gone) = (db.to_path_buf(), Arc::clone(l), Arc::clone(&lost));
    let loss_and_newer = part("LB", move || {
        act(&path, Act::UnlinkWal, &ledger);
        act(&path, Act::UnlinkShm, &ledger);
        gone.store(true, Ordering::Release);
        note(|| "open guarded (B)".into());
        let conn = match open(&path, true) {
            Ok(c) => c,
            Err(e) => return newer(&b, "open", &e),
        };
        for v in ["b1", "b2"] {
            note(|| format!("insert {v}"));
            match conn.execute("INSERT INTO t(v) VALUES (?1)", [v]) {
                Ok(_) => {
                    let step = step_number();
                    b.ledger.lock().acked.push((v.to_string(), step));
                }
                Err(e) => newer(&b, &format!("insert {v}"), &e),
            }
        }
        b.close(conn, true);
    });

    let (path, gone) = (db.to_path_buf(), lost);
    let stock = part("S", move || {
        wait_for_the_loss(&gone);
        let Some(mut conn) = Other::open(&s, &path, false) else {
            return;
        };
        conn.count();
        conn.insert("s1");
        conn.checkpoint(mode);
        conn.insert("s2");
        conn.close();
    });

    Built {
        parts: vec![old, loss_and_newer, stock],
        stale_main: None,
        variant: format!(
            "A {}; rm state.db-wal + rm state.db-shm; S stock, {mode}",
            if reading {
                "in a read transaction"
            } else {
                "idle"
            }
        ),
    }
}
