//! The session store's self-healing: the retired generation of a lost `-wal`/`-shm` (an
//! accident) merged back into the live store when it is next opened, through the library's
//! general merge ([`merge_in_transaction`]) plus what only the store knows: its
//! `state_meta` mark and its `sessions` counters.
//!
//! A capture of a replaced main file (a restore: somebody's decision) is never merged here;
//! `hermes-guard recover` merges it on purpose. A healed capture is marked in the live store's
//! `state_meta` (in the merge's own transaction), so it is not opened again; idempotency does not
//! depend on the mark: the merge records the capture in `hermes_guard_merges` and inserts its
//! rows once, inside `BEGIN IMMEDIATE`.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

use hermes_guard::recover::{
    list_captures, merge_in_transaction, Capture, MergeOptions, RecoverError,
};
use hermes_guard::RetireReason;

/// The `state_meta` key prefix marking a capture as healed (followed by its directory's name).
pub const HEALED_MARK_PREFIX: &str = "hermes-guard.healed:";

/// What the self-healing merged from one capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Healed {
    /// The capture merged from.
    pub capture: PathBuf,
    /// Sessions inserted.
    pub sessions: u64,
    /// Messages inserted.
    pub messages: u64,
    /// Rows inserted in all tables.
    pub rows: u64,
    /// Left over (conflicts kept live, refused or unreadable rows).
    pub left_over: u64,
}

/// Merges every unhealed capture of a lost `-wal`/`-shm` beside the store `path` into `conn` (the
/// store's own guarded connection). Never fails: a capture that cannot be merged is logged at
/// ERROR and left for `hermes-guard recover`.
pub(crate) fn heal_store(conn: &Connection, path: &Path) -> Vec<Healed> {
    let listed = match list_captures(path) {
        Ok(l) => l,
        Err(e) => {
            log::debug!("{}: self-healing: listing captures: {e}", path.display());
            return Vec::new();
        }
    };
    let mut healed = Vec::new();
    for entry in listed {
        let Some(manifest) = &entry.manifest else {
            continue;
        };
        let stale_wal = manifest.reason == Some(RetireReason::StaleWal);
        if manifest.is_main_replaced() || manifest.reason.is_none() || stale_wal {
            continue; // a restore (a stale WAL is one too) is an operator's decision
        }
        // An accident leaves the main file in place: the capture must be of this very file. A
        // restore that also removed the sidecars may be reported as a lost -wal; it replaced the
        // main file, so it is not healed either.
        let live_main = hermes_guard::identity_of_path(path).ok().flatten();
        let same_file = live_main.is_some() && manifest.main.identity == live_main;
        if !same_file {
            log::debug!(
                "{}: not self-healing from {}: it was taken of another main file",
                path.display(),
                entry.path.display()
            );
            continue;
        }
        let mark = format!(
            "{HEALED_MARK_PREFIX}{}",
            Path::new(entry.path.file_name().unwrap_or_default()).to_string_lossy()
        );
        if marked(conn, &mark).unwrap_or(false) {
            continue;
        }
        match heal_one(conn, path, &entry.path, &mark) {
            Ok(Some(h)) => {
                if h.rows > 0 {
                    log::warn!(
                        "hermes-guard: {}: self-healed from {}: merged {} session(s), {} \
                         message(s), {} row(s) in all{}",
                        path.display(),
                        h.capture.display(),
                        h.sessions,
                        h.messages,
                        h.rows,
                        if h.left_over > 0 {
                            format!(
                                "; {} item(s) left over: run `hermes-guard recover {} --into {}`",
                                h.left_over,
                                h.capture.display(),
                                path.display()
                            )
                        } else {
                            String::new()
                        }
                    );
                }
                healed.push(h);
            }
            Ok(None) => {}
            Err(e) => log::error!(
                "hermes-guard: {}: could not self-heal from {}: {e}; run `hermes-guard recover` \
                 by hand",
                path.display(),
                entry.path.display()
            ),
        }
    }
    healed
}

fn marked(conn: &Connection, mark: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM state_meta WHERE key = ?1",
        [mark],
        |_| Ok(()),
    )
    .optional()
    .map(|o| o.is_some())
}

fn heal_one(
    conn: &Connection,
    path: &Path,
    dir: &Path,
    mark: &str,
) -> Result<Option<Healed>, RecoverError> {
    let capture = Capture::open(dir)?;
    let sq = |what: &'static str| {
        move |source| RecoverError::Sqlite {
            path: path.to_path_buf(),
            operation: what.into(),
            source,
        }
    };
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(sq("take the write lock (BEGIN IMMEDIATE)"))?;
    let result = (|| {
        // Another thread or process may have healed it while we waited for the lock.
        if marked(conn, mark).map_err(sq("read state_meta"))? {
            return Ok(None);
        }
        // The general merge, in this transaction: it refuses new foreign-key violations.
        let report =
            merge_in_transaction(&capture, conn, path, &MergeOptions::default(), &mut |_| {})?;
        if report.inserted() > 0 {
            reconcile_sessions(conn, capture.connection())
                .map_err(sq("recompute the session counters"))?;
        }
        let inserted = |t: &str| {
            report
                .tables
                .iter()
                .find(|r| r.table == t)
                .map_or(0, |r| r.inserted)
        };
        let healed = Healed {
            capture: dir.to_path_buf(),
            sessions: inserted("sessions"),
            messages: inserted("messages"),
            rows: report.inserted(),
            // A session in both with other counters is reconciled above, not left over.
            left_over: report.left_over().saturating_sub(
                report
                    .tables
                    .iter()
                    .find(|r| r.table == "sessions")
                    .map_or(0, |r| r.conflicts.saturating_sub(r.replaced)),
            ),
        };
        conn.execute(
            "INSERT OR REPLACE INTO state_meta (key, value) VALUES (?1, ?2)",
            params![mark, serde_json::to_string(&healed).unwrap_or_default()],
        )
        .map_err(sq("mark the capture healed"))?;
        conn.execute_batch("COMMIT").map_err(sq("commit"))?;
        Ok(Some(healed))
    })();
    // After an error, or when another connection healed it first (nothing to commit).
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// After a merge: each session's counters are counted again from its messages, and what only the
/// captured generation knew of a session (its end, its title) fills the live row's gaps; token
/// totals keep the larger of the two.
fn reconcile_sessions(conn: &Connection, captured: &Connection) -> rusqlite::Result<()> {
    let mut stmt = captured.prepare(
        "SELECT id, ended_at, end_reason, title, input_tokens, output_tokens FROM sessions",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<f64>>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, Option<String>>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, i64>(5)?,
        ))
    })?;
    let mut update = conn.prepare(
        "UPDATE sessions SET ended_at = COALESCE(ended_at, ?2),
                             end_reason = COALESCE(end_reason, ?3),
                             title = COALESCE(title, ?4),
                             input_tokens = MAX(input_tokens, ?5),
                             output_tokens = MAX(output_tokens, ?6)
         WHERE id = ?1",
    )?;
    for row in rows {
        let (id, ended_at, end_reason, title, input, output) = row?;
        update.execute(params![id, ended_at, end_reason, title, input, output])?;
    }
    conn.execute_batch(
        "UPDATE sessions SET
             message_count = (SELECT COUNT(*) FROM messages m WHERE m.session_id = sessions.id),
             tool_call_count = (SELECT COALESCE(SUM(CASE
                     WHEN m.tool_calls IS NULL OR m.tool_calls = 'null' THEN 0
                     WHEN json_valid(m.tool_calls) AND json_type(m.tool_calls) = 'array'
                         THEN json_array_length(m.tool_calls)
                     ELSE 1 END), 0)
                 FROM messages m WHERE m.session_id = sessions.id)",
    )
}
