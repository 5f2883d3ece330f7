//! The invariants checked after every schedule, outside it (no participant runs any more):
//!
//! 1. `PRAGMA integrity_check` of the live database is `ok`, before and after recovery;
//! 2. every acknowledged row is live (once) or, when not, in a capture that was not healed;
//! 3. no capture without a loss (an actor's step that took a file away or restored one);
//! 4. no refusal (`SQLITE_READONLY_DBMOVED`) before the first loss: a healthy connection is
//!    never refused;
//! 5. a restore the guard was first to see is never undone: when a stale WAL was set aside, or a
//!    guarded opener reached the WAL's open before any stock opener took SHARED, none of its
//!    rows is live; after a backup restored over the file under running connections, no row
//!    committed before the restore and missing from the backup is live (renamed over the file:
//!    a new inode, which the pins see; copied over it in place: judged `main-overwritten`);
//! 6. after `recover --apply` of every capture (the library's `recover::apply`), every
//!    acknowledged row is live exactly once, and the database passes its integrity check.
//! 7. no WARN or ERROR line of the guard (this process's or a child's) in a schedule without a
//!    loss: with nothing taken away, a line that wakes someone is a false alarm.
//! 8. at the end (after `recover --apply` when there is a capture), no row whose deletion was
//!    acknowledged is live, and a row whose update was acknowledged is live in that version only:
//!    a newer generation's deletions and updates are not undone by the retired generation's
//!    recovery, and the retired generation's acknowledged ones are applied (`newer-changes`,
//!    whose participants never touch the same row).
//! 9. what a scenario's script saw go wrong as it ran (`Ledger::violations`): in
//!    `two-generations`, a write of the newer generation's connection in the lost one's process
//!    refused or failed otherwise than busy, or a write of the lost generation's connection after
//!    the loss not refused.

use std::collections::HashMap;
use std::path::Path;

use hermes_guard::recover::{self, Capture, MergeOptions};
use hermes_guard::RetireReason;

use crate::world::{open_direct, Ledger};

/// The rows of table `t` (by `v`) with how many times each is there.
fn rows(conn: &rusqlite::Connection) -> rusqlite::Result<HashMap<String, usize>> {
    let mut out = HashMap::new();
    let mut stmt = conn.prepare("SELECT v FROM t")?;
    for v in stmt.query_map([], |r| r.get::<_, String>(0))? {
        *out.entry(v?).or_insert(0) += 1;
    }
    Ok(out)
}

fn integrity(conn: &rusqlite::Connection) -> String {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .unwrap_or_else(|e| e.to_string())
}

/// The live database's rows and integrity, through the guard (as the next opener sees it).
fn live(db: &Path) -> Result<(HashMap<String, usize>, String), String> {
    let conn = open_direct(db).map_err(|e| format!("the live database cannot be opened: {e}"))?;
    let rows = rows(&conn).map_err(|e| format!("the live database cannot be read: {e}"))?;
    let ok = integrity(&conn);
    drop(conn);
    Ok((rows, ok))
}

/// Checks the invariants; `stale_main` is the main file a stale WAL was written on (the
/// pre-restore copy, `recover --main`); `guard_first`: a guarded opener reached the WAL's open
/// before any stock opener took SHARED. Returns the violations, empty when all hold.
pub fn check(
    db: &Path,
    ledger: &Ledger,
    stale_main: Option<&Path>,
    guard_first: bool,
) -> Vec<String> {
    // 9. What the scripts saw go wrong as they ran.
    let mut bad = ledger.violations.clone();
    let (live_rows, ok) = match live(db) {
        Ok(x) => x,
        Err(e) => {
            bad.push(e);
            return bad;
        }
    };
    if ok != "ok" {
        bad.push(format!("integrity_check of the live database: {ok}"));
    }
    let listing = match recover::list_captures(db) {
        Ok(l) => l,
        Err(e) => {
            bad.push(format!("captures cannot be listed: {e}"));
            return bad;
        }
    };
    let mut captures = Vec::new();
    // The main images of the other captures: a stale WAL's `--main` when the setup kept none
    // (a restore under a running writer: its own capture holds the file its WAL was written on).
    let images: Vec<std::path::PathBuf> = listing
        .iter()
        .filter(|c| !c.partial)
        .map(|c| c.path.join(db.file_name().unwrap_or_default()))
        .filter(|p| p.exists())
        .collect();
    for c in listing.iter().filter(|c| !c.partial) {
        let stale = c
            .manifest
            .as_ref()
            .is_some_and(|m| m.reason == Some(RetireReason::StaleWal));
        let opened = if !stale {
            Capture::open(&c.path)
        } else if let Some(main) = stale_main {
            Capture::open_with_main(&c.path, Some(main))
        } else {
            let mut tried = images
                .iter()
                .map(|m| Capture::open_with_main(&c.path, Some(m)));
            match tried.find(Result::is_ok) {
                Some(found) => found,
                // Without the file it was written on it cannot be read (docs/recovery.md):
                // kept, not counted; its rows must then be somewhere else.
                None => continue,
            }
        };
        match opened {
            Ok(cap) => {
                let healed = !matches!(cap.heal(), hermes_guard::manifest::HealState::NotHealed);
                let held = rows(cap.connection()).unwrap_or_default();
                captures.push((cap, stale, healed, held));
            }
            Err(e) => bad.push(format!(
                "capture {} cannot be opened: {e}",
                c.path.display()
            )),
        }
    }
    if listing.iter().any(|c| c.partial) {
        bad.push("a partial capture was left behind".into());
    }
    // What a restore under running connections throws away on purpose (see `Ledger`).
    let restored_at = ledger
        .losses
        .iter()
        .find(|(what, _)| what.contains("backup"))
        .map(|(_, s)| *s);
    let discarded = |v: &str, step: usize| {
        ledger.backup_rows.as_ref().is_some_and(|kept| {
            restored_at.is_some_and(|r| step < r) && !kept.iter().any(|k| k == v)
        })
    };
    // A backup copied over the file in place keeps its inode: nothing the guard pins changes; a
    // guarded connection's next checkpoint and its close judge the file's first pages against the
    // WAL generation's record (`main-overwritten`), so that the generation is not checkpointed onto
    // the copy. Said apart from a renamed restore's undoing.
    let in_place = ledger
        .losses
        .iter()
        .any(|(what, _)| what.starts_with("cp backup"));
    let mut acked: Vec<&str> = Vec::new();
    for (v, step) in &ledger.acked {
        if !discarded(v, *step) {
            acked.push(v);
        } else if in_place && live_rows.contains_key(v) {
            bad.push(format!(
                "row {v}, committed before the backup was copied over the file in place and not in \
                 the backup, is live: the copy was overwritten by a checkpoint"
            ));
        } else if live_rows.contains_key(v) {
            bad.push(format!(
                "row {v}, committed before the restore and not in the backup, is live: the restore was undone"
            ));
        }
    }
    // 2. Live once, or in a capture that was not healed.
    for &v in &acked {
        let n = live_rows.get(v).copied().unwrap_or(0);
        if n > 1 {
            bad.push(format!("acknowledged row {v} is live {n} times"));
        }
        let held = captures
            .iter()
            .filter(|(_, _, healed, h)| !healed && h.contains_key(v))
            .count();
        if n == 0 && held == 0 {
            bad.push(format!(
                "acknowledged row {v} is neither live nor in a capture"
            ));
        }
    }
    // 3. No capture without a loss.
    let listed = listing.iter().filter(|c| !c.partial).count();
    if ledger.losses.is_empty() && listed > 0 {
        bad.push(format!("{listed} capture(s) without any loss"));
    }
    // 7. No alarm without a loss. With the WAL-reset rule off on a SQLite that has the race
    // (wal_reset.rs's rediscovery), the guard's report of the race's state is true: SQLite itself
    // damaged the wal-index, whether or not this schedule goes on to lose a row.
    let race_possible = !hermes_guard::wal_reset_guard_on()
        && hermes_guard::sqlite_has_wal_reset_race(rusqlite::version_number());
    if ledger.losses.is_empty() {
        for w in &ledger.warnings {
            if race_possible && w.contains("SQLite's WAL-reset race") {
                continue;
            }
            bad.push(format!("the guard logged with nothing taken away: {w}"));
        }
    }
    // 4. No refusal of a healthy connection.
    let first_loss = ledger.losses.iter().map(|(_, s)| *s).min();
    for (who, step) in &ledger.refusals {
        if first_loss.is_none_or(|l| *step < l) {
            bad.push(format!("{who} was refused at step {step}, before any loss"));
        }
    }
    // 5. A set-aside stale WAL stays aside; a guarded opener that came first sets it aside.
    if !ledger.stale_rows.is_empty() && guard_first {
        for v in &ledger.stale_rows {
            if live_rows.contains_key(v) {
                bad.push(format!(
                    "a guarded opener reached the WAL before any stock opener took SHARED, yet \
                     the stale WAL's row {v} is live: the restore it saw first was undone"
                ));
            }
        }
    } else if captures.iter().any(|(_, stale, _, _)| *stale) {
        for v in &ledger.stale_rows {
            if live_rows.contains_key(v) {
                bad.push(format!(
                    "the stale WAL was set aside, yet its row {v} is live: the restore was undone"
                ));
            }
        }
    }
    // 6. Recovery: every capture applied, then every acknowledged row exactly once.
    for (cap, _, _, _) in &captures {
        if let Err(e) = recover::apply(cap, db, &MergeOptions::default(), &mut |_| {}) {
            bad.push(format!("recover --apply {}: {e}", cap.dir().display()));
        }
    }
    if !captures.is_empty() {
        match live(db) {
            Ok((after, ok)) => {
                if ok != "ok" {
                    bad.push(format!("integrity_check after recover --apply: {ok}"));
                }
                for &v in &acked {
                    let n = after.get(v).copied().unwrap_or(0);
                    if n != 1 {
                        bad.push(format!("after recover --apply, row {v} is live {n} times"));
                    }
                }
            }
            Err(e) => bad.push(format!("after recover --apply: {e}")),
        }
    }
    // 8. Acknowledged deletions and updates, at the end.
    if !ledger.deleted.is_empty() || !ledger.updated.is_empty() {
        let when = if captures.is_empty() {
            "at the end (no capture)"
        } else {
            "after recover --apply"
        };
        match versions(db) {
            Ok(live) => bad.extend(changes_kept(ledger, &live, when)),
            Err(e) => bad.push(format!("{when}: {e}")),
        }
    }
    bad
}

/// The live rows of `t` by `v`, each with the versions (column `ver`) it is live in.
fn versions(db: &Path) -> Result<HashMap<String, Vec<String>>, String> {
    let conn = open_direct(db).map_err(|e| format!("the live database cannot be opened: {e}"))?;
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let mut stmt = conn
        .prepare("SELECT v, ver FROM t")
        .map_err(|e| format!("the live database cannot be read: {e}"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(|e| format!("the live database cannot be read: {e}"))?;
    for row in rows {
        let (v, ver) = row.map_err(|e| format!("the live database cannot be read: {e}"))?;
        out.entry(v).or_default().push(ver);
    }
    Ok(out)
}

/// Invariant 8 on the rows `live` (by `v`, with their versions), `when` naming the moment.
fn changes_kept(ledger: &Ledger, live: &HashMap<String, Vec<String>>, when: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for (v, who, step) in &ledger.deleted {
        if let Some(vers) = live.get(v) {
            bad.push(format!(
                "{when}, row {v}, whose deletion by {who} was acknowledged at step {step}, is \
                 live (version(s) {vers:?}): {}",
                if who == "W" {
                    "the retired generation's deletion is not applied"
                } else {
                    "a deleted row brought back"
                }
            ));
        }
    }
    for (v, ver, who, step) in &ledger.updated {
        let vers = live.get(v).map(Vec::as_slice).unwrap_or_default();
        let old: Vec<&String> = vers.iter().filter(|x| *x != ver).collect();
        if !vers.contains(ver) {
            bad.push(format!(
                "{when}, row {v}, updated by {who} to version {ver} (acknowledged at step \
                 {step}), is not live in that version (live: {vers:?}){}",
                if who == "W" {
                    ": the retired generation's update is not applied"
                } else {
                    ": the update undone"
                }
            ));
        } else if !old.is_empty() {
            bad.push(format!(
                "{when}, row {v}, updated by {who} to version {ver} (acknowledged at step \
                 {step}), is live in an old version too (live: {vers:?}): {}",
                if who == "W" {
                    "the retired generation's update inserted beside the row, not applied to it"
                } else {
                    "an old version brought back"
                }
            ));
        }
    }
    bad
}
