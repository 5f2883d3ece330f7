//! A newer generation that deletes and updates rows, not only inserts, checkpointed into the main
//! file before the retired writer notices its loss.
//!
//! The table holds 120 history rows `h001`..`h120` (rowids 1..120, about 200 bytes each: seven
//! leaves of 18, 18, …, 12 rows), checkpointed into the main file in the setup. W (guarded,
//! autocheckpoint off) is opened in the setup and commits `w1` there (in its WAL only). In the
//! schedule W inserts `w2`, updates `h028` and `h060` to version `w`, deletes `h080`..`h086`,
//! inserts `w3` and closes, each statement one step. `AN` is the actor and then the newer
//! writer N, one after the other: it removes the `-wal`, the `-shm` or both, then N (guarded or
//! stock) opens in another process (`process.rs`), inserts `n1`, deletes either the oldest 22
//! rows (a retention cleanup: the first leaf freed) or `h062`..`h078` (a range in the middle),
//! updates `h030` and `h088` to version `n`, inserts `n2`, checkpoints (PASSIVE or TRUNCATE)
//! and closes, each statement one step.
//!
//! The rows W touches and the rows N touches are apart, but share leaves: W's WAL carries the
//! leaves of `h019`..`h036` (with `h028`), `h055`..`h072` (`h060`) and `h073`..`h090` (its
//! deletion), on which N deleted rows (the cleanup's `h019`..`h022`, the middle's
//! `h062`..`h078`) and updated `h030` and `h088`. Recovery reading "image + WAL" (`add-only`,
//! with N's file as the image) finds those rows in W's pages and N's file without them or with
//! another version: it inserts the deleted rows again, and the old versions beside the new. The
//! `changes` rule applies only what W itself changed (`check.rs`, invariant 8).
//!
//! The loss is both files or the `-shm` alone, never the `-wal` alone: then N maps W's `-shm`,
//! whose index names W's frames, writes its own frames after them into the new WAL (whose header
//! and first frames are a hole) wherever it reads no page W wrote, and its checkpoint copies the
//! hole into the main file: a malformed database that SQLite's trust in a `-shm` whose `-wal` was
//! removed makes, whatever recovery does (tests/explore/README.md, "Scenarios").

use std::path::Path;
use std::sync::Arc;

use rusqlite::Connection;

use super::{part, Built};
use crate::process::Other;
use crate::sched::{note, step_number, Rng};
use crate::world::{act, open_direct, sidecar, Act, Shared, Who};

/// The history rows, `h001`..`h120` at rowids 1..120.
const HISTORY: u32 = 120;

/// History row `id`'s name.
fn h(id: u32) -> String {
    format!("h{id:03}")
}

/// The rows W updates, the range W deletes; N's updates, N's two ranges (apart from W's).
const W_UPDATES: [u32; 2] = [28, 60];
const W_DELETES: (u32, u32) = (80, 86);
const N_UPDATES: [u32; 2] = [30, 88];
const N_DELETES: [(&str, (u32, u32)); 2] = [("oldest 22", (1, 22)), ("middle", (62, 78))];

/// The database with its history rows, checkpointed into the main file.
fn create_history(db: &Path) {
    let conn = open_direct(db).expect("create the database");
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL, ver TEXT NOT NULL DEFAULT '0', \
         pad TEXT); BEGIN",
    )
    .unwrap();
    for id in 1..=HISTORY {
        let pad = format!("{id:03}").repeat(67);
        conn.execute(
            "INSERT INTO t(id, v, pad) VALUES (?1, ?2, ?3)",
            rusqlite::params![id, h(id), pad],
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
    drop(conn);
    assert!(
        !sidecar(db, "-wal").exists(),
        "the setup's WAL was checkpointed away"
    );
}

/// What an acknowledged statement did, for the ledger.
enum Did {
    Deleted(Vec<String>),
    Updated(String, &'static str),
}

fn record(l: &Shared, who: &str, did: Did) {
    let step = step_number();
    let mut l = l.lock();
    match did {
        Did::Deleted(rows) => l
            .deleted
            .extend(rows.into_iter().map(|v| (v, who.to_string(), step))),
        Did::Updated(v, ver) => l.updated.push((v, ver.to_string(), who.to_string(), step)),
    }
}

/// The range `lo..=hi` deleted: its statement and its rows.
fn delete(lo: u32, hi: u32) -> (String, Did) {
    (
        format!("DELETE FROM t WHERE id BETWEEN {lo} AND {hi}"),
        Did::Deleted((lo..=hi).map(h).collect()),
    )
}

/// Row `id` updated to version `ver` (a new padding, `pad_len` bytes, too).
fn update(id: u32, ver: &'static str, pad_len: usize) -> (String, Did) {
    (
        format!(
            "UPDATE t SET ver = '{ver}', pad = '{}' WHERE id = {id}",
            ver.repeat(pad_len)
        ),
        Did::Updated(h(id), ver),
    )
}

/// W's statement (in this process): a step, its error recorded. Acknowledged when it returns
/// Ok, whatever number of rows it changed; a number other than `rows` is recorded among the
/// errors the replay shows (a statement that read a page a newer generation checkpointed into
/// the main file under W's transaction can find nothing to change, and commit nothing).
fn w_exec(w: &Who, conn: &Connection, what: &str, sql: &str, rows: usize) -> bool {
    note(|| what.to_string());
    match conn.execute(sql, []) {
        Ok(n) => {
            if n != rows {
                let step = step_number();
                w.ledger.lock().errors.push(format!(
                    "W {what} at step {step}: acknowledged, but changed {n} row(s), not {rows}"
                ));
            }
            true
        }
        Err(e) => {
            w.saw(what, &e);
            false
        }
    }
}

pub(super) fn newer_changes(db: &Path, rng: &mut Rng, l: &Shared) -> Built {
    create_history(db);
    // Not the `-wal` alone: see the module's doc.
    const LOSSES: [&[Act]; 2] = [&[Act::UnlinkWal, Act::UnlinkShm], &[Act::UnlinkShm]];
    let losses = LOSSES[rng.below(2) as usize];
    let guarded = rng.below(2) == 0;
    let (cleanup, (lo, hi)) = N_DELETES[rng.below(2) as usize];
    let mode = ["PASSIVE", "TRUNCATE"][rng.below(2) as usize];
    let conn = crate::world::open(db, true).expect("open the retired writer's connection");
    conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    conn.execute("INSERT INTO t(v) VALUES ('w1')", []).unwrap();
    {
        // Every row nobody deletes is acknowledged (before the schedule); updated rows too
        // (their versions are `updated`'s).
        let deleted =
            |id: u32| (W_DELETES.0..=W_DELETES.1).contains(&id) || (lo..=hi).contains(&id);
        let mut l = l.lock();
        l.acked.extend(
            (1..=HISTORY)
                .filter(|id| !deleted(*id))
                .map(|id| (h(id), 0)),
        );
        l.acked.push(("w1".into(), 0));
    }
    let (w, n) = (Who::new("W", l), Who::new("N", l));
    let ledger = Arc::clone(l);
    let retired = part("W", move || {
        w.insert(&conn, "w2");
        let mut changes: Vec<(String, String, Did, usize)> = W_UPDATES
            .iter()
            .map(|&id| {
                let (sql, did) = update(id, "w", 150);
                (format!("update {}", h(id)), sql, did, 1)
            })
            .collect();
        let (sql, did) = delete(W_DELETES.0, W_DELETES.1);
        changes.push((
            format!("delete {}..{}", h(W_DELETES.0), h(W_DELETES.1)),
            sql,
            did,
            (W_DELETES.1 - W_DELETES.0 + 1) as usize,
        ));
        for (what, sql, did, rows) in changes {
            if w_exec(&w, &conn, &what, &sql, rows) {
                record(&ledger, "W", did);
            }
        }
        w.insert(&conn, "w3");
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
        conn.insert("n1");
        let mut changes = vec![{
            let (sql, did) = delete(lo, hi);
            (format!("delete {}..{}", h(lo), h(hi)), sql, did)
        }];
        changes.extend(N_UPDATES.iter().map(|&id| {
            let (sql, did) = update(id, "n", 40);
            (format!("update {}", h(id)), sql, did)
        }));
        for (what, sql, did) in changes {
            if conn.exec(&what, &sql) {
                record(&ledger, "N", did);
            }
        }
        conn.insert("n2");
        conn.checkpoint(mode);
        conn.close();
    });
    let losses: Vec<&str> = losses.iter().map(|a| a.name()).collect();
    Built {
        parts: vec![retired, newer],
        stale_main: None,
        variant: format!(
            "{}; N {}, deletes the {cleanup} ({}..{}), {mode}",
            losses.join(" + "),
            if guarded { "guarded" } else { "stock" },
            h(lo),
            h(hi)
        ),
    }
}
