//! Pools that heal themselves: one rule, a pool drops a retired connection, with no restart.
//! The guard answers it with three checks, each one call in a pool's hook (its default settings
//! otherwise); none depends on a pool crate:
//!
//! - [`keep`], at every return of a connection to the pool (r2d2's `has_broken`, sqlx's
//!   `after_release`, deadpool's recycle): [`GuardExt::is_retired`], an atomic read, no SQL and no
//!   system call. A connection whose write was just refused leaves the pool there.
//! - [`check_out`], at every checkout (r2d2's `is_valid`, sqlx's `before_acquire`, deadpool's
//!   recycle): the `stat` of each pinned file and the status pragma. An idle connection whose
//!   generation was lost while it sat in the pool is retired there, never handed out.
//! - [`check_new`], on a new connection (r2d2's `connect`, sqlx's `after_connect`, deadpool's
//!   `post_create` or a wrapping manager's `create`, diesel's `on_acquire` or its manager's
//!   `connect`): one read, which maps the `-shm`, then the check. The guard
//!   maps each `-shm` file itself (one node per file per process, `src/vfs/wal_index`), so a
//!   new connection opened after a loss maps the new `-shm` and passes at once, while the lost
//!   generation's connections still open are refused. It fails only when the loss lands between
//!   the open and the check: the pool drops that one like any retired connection.
//!
//! Nothing else is needed: no reaper of idle connections, no idle timeout, no loop reopening a
//! new connection until it passes, no rule to return a connection before asking for the next.
//! (SQLite's unix VFS shares one `-shm` mapping per **main** file in a process; before the guard
//! mapped the wal-index itself, a new connection joined the lost mapping while any connection of
//! the lost generation was open, and pools needed all four: docs/decisions.md. That is still so
//! where the guard leaves the wal-index to SQLite's node: a build of SQLite that keeps the
//! shared memory elsewhere than `<db>-shm` (`SQLITE_SHM_DIRECTORY`, 8.3 names), a VFS under the
//! guard that is not the unix one, a 32-bit system; the guard logs the first case at its first
//! map.)
//!
//! Each returns the refusal a write gets (`SQLITE_READONLY_DBMOVED`, 1032) for a retired
//! connection. [`crate::raw`] has the same three on a raw handle (`*mut sqlite3`: sqlx, diesel);
//! docs/hosts.md's "With your framework" has each pool's hooks, run by tests/frameworks.
//!
//! With r2d2 (cargo feature `r2d2`) the library brings the manager itself: `GuardedManager`,
//! whose documentation says how each of r2d2's hooks uses the checks, and `FileManager`.
//!
//! What the pool does not do: merge the lost generation back. Its rows are in a capture beside
//! the database, for `hermes-guard recover` (docs/recovery.md), as with any retired connection.

use rusqlite::{ffi, Connection};

use crate::{GuardError, GuardExt, GuardStatus};

#[cfg(feature = "r2d2")]
mod r2d2_manager;
#[cfg(feature = "r2d2")]
pub use r2d2;
#[cfg(feature = "r2d2")]
pub use r2d2_manager::{FileManager, GuardedManager};

/// Whether a pool may keep `conn` as it is returned: `false` once its generation is retired
/// ([`GuardExt::is_retired`]: no SQL, no system call).
pub fn keep(conn: &Connection) -> bool {
    !conn.is_retired()
}

/// A new connection's test: one read (which maps the `-shm`), then [`check_out`]. After a loss
/// a new connection maps the new `-shm` and passes at once; `Err` (the refusal) only when the loss
/// landed between its open and this check: drop it, as any retired connection.
pub fn check_new(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA schema_version", [], |_| Ok(()))?;
    check_out(conn)
}

/// The guard's check of `conn` at a checkout: `Err` (the refusal) when its generation is retired. A
/// connection not opened through the guard passes.
pub fn check_out(conn: &Connection) -> rusqlite::Result<()> {
    if conn.is_retired() {
        return Err(retired(conn.guard_status().ok()));
    }
    match conn.guard_status() {
        Ok(status) if status.retired => Err(retired(Some(status))),
        Ok(_) | Err(GuardError::NotGuarded { .. }) => Ok(()),
        Err(GuardError::Sqlite(e)) => Err(e),
        Err(e) => Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_ERROR),
            Some(e.to_string()),
        )),
    }
}

/// The error of a retired connection: the refusal its writes get.
pub(crate) fn retired(status: Option<GuardStatus>) -> rusqlite::Error {
    let what = match status {
        Some(s) => format!(
            "{} ({})",
            s.database.display(),
            s.reason.map_or("retired", |r| r.describe())
        ),
        None => "its database".into(),
    };
    rusqlite::Error::SqliteFailure(
        ffi::Error::new(ffi::SQLITE_READONLY_DBMOVED),
        Some(format!(
            "hermes-guard: this connection's generation of {what} is retired; the pool lets it go"
        )),
    )
}
