//! hermes-guard: a SQLite VFS shim that makes a lost WAL generation loud and lossless.
//!
//! WAL-mode SQLite silently loses committed transactions when a connection's `-wal`, `-shm` or
//! main file is unlinked, renamed or replaced underneath it. Register the guard, open with
//! `vfs=hermes-guard`, and such a connection refuses every further write with
//! `SQLITE_READONLY_DBMOVED`, captures the retired generation next to the database, and never
//! checkpoints it over the newer one.
//!
//! ```no_run
//! use rusqlite::{Connection, OpenFlags};
//! hermes_guard::register()?;
//! let conn = Connection::open_with_flags_and_vfs(
//!     "state.db",
//!     OpenFlags::default(),
//!     hermes_guard::VFS_NAME,
//! )?;
//! conn.pragma_update(None, "journal_mode", "WAL")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod capture;
mod error;
pub mod identity;
pub mod paths;
pub mod recover;
pub mod registry;
mod status;
pub mod store;
mod vfs;
pub mod walfile;

use std::path::PathBuf;

use rusqlite::Connection;

pub use capture::{CaptureError, Trigger};
pub use error::GuardError;
pub use identity::FileId;
pub use registry::{Registry, RegistryStats, SharedSessionDb};
pub use status::{ErrorClass, GuardStatus, RetireReason};
pub use store::{SessionDb, StoreError, StoreOptions};
pub use vfs::{register, register_as_default, VFS_NAME};

/// The guard's status for the `main` database of `conn`. Runs the retirement check now.
pub fn status(conn: &Connection) -> Result<GuardStatus, GuardError> {
    guard_pragma(conn, "hermes_guard_status")
}

/// Makes sure that, if `conn`'s generation is retired, it is captured; returns the status.
///
/// Fails with [`GuardError::CaptureFailed`] when the capture cannot be written: the connection
/// then keeps its descriptors so a retry can still succeed.
pub fn ensure_captured(conn: &Connection) -> Result<GuardStatus, GuardError> {
    guard_pragma(conn, "hermes_guard_capture")
}

/// Closes `conn`, but only once a retired generation is safely captured. On failure the
/// connection is handed back, still open, so the caller can retry.
// The shape of `rusqlite::Connection::close`, so callers can treat both alike.
#[allow(clippy::result_large_err)]
pub fn close(conn: Connection) -> Result<(), (Connection, GuardError)> {
    if let Err(e) = ensure_captured(&conn) {
        if !matches!(e, GuardError::NotGuarded { .. }) {
            return Err((conn, e));
        }
    }
    conn.close()
        .map_err(|(conn, e)| (conn, GuardError::Sqlite(e)))
}

/// What `err`, returned by `conn`, means for the application.
pub fn classify(conn: &Connection, err: &rusqlite::Error) -> ErrorClass {
    let reason = status(conn).ok().and_then(|s| s.reason);
    ErrorClass::from_parts(err, reason)
}

/// Captures the retired generation of `conn` whose WAL inode is `wal_identity`, from the
/// descriptor the connection holds. Never guesses by pathname: without an identity, or for one the
/// connection no longer holds, it fails and writes nothing; a live generation is not captured
/// (a capture stands for its generation, and would miss every later commit).
///
/// It runs through `conn` itself, so the capture reads the connection's files on the thread that
/// owns them.
pub fn capture_retired_wal_generation(
    conn: &Connection,
    wal_identity: Option<FileId>,
) -> Result<PathBuf, GuardError> {
    let database = PathBuf::from(conn.path().unwrap_or_default());
    let Some(identity) = wal_identity else {
        return Err(CaptureError::NoPinnedIdentity { database }.into());
    };
    let status = status(conn)?;
    if status.wal != Some(identity) {
        return Err(CaptureError::NotHeld { database, identity }.into());
    }
    if !status.retired {
        return Err(CaptureError::NotRetired { database }.into());
    }
    match ensure_captured(conn)?.capture {
        Some(dir) => Ok(dir),
        None => Err(GuardError::CaptureFailed {
            database,
            message: "the retired WAL holds no frame: nothing is at stake".into(),
        }),
    }
}

/// Retries the captures of retired generations whose connections were closed (dropped) while
/// their capture could not be written. Returns how many remain uncaptured.
pub fn retry_pending_captures() -> usize {
    vfs::retry_pending_captures()
}

fn guard_pragma(conn: &Connection, pragma: &str) -> Result<GuardStatus, GuardError> {
    let database = || PathBuf::from(conn.path().unwrap_or_default());
    let json: Option<String> =
        match conn.query_row(&format!("PRAGMA main.{pragma}"), [], |r| r.get(0)) {
            Ok(json) => Some(json),
            Err(rusqlite::Error::QueryReturnedNoRows) => None,
            Err(rusqlite::Error::SqliteFailure(e, Some(message)))
                if e.code == rusqlite::ErrorCode::Unknown =>
            {
                return Err(GuardError::CaptureFailed {
                    database: database(),
                    message,
                })
            }
            Err(e) => return Err(e.into()),
        };
    match json {
        Some(json) => Ok(serde_json::from_str(&json)?),
        None => Err(GuardError::NotGuarded {
            database: database(),
        }),
    }
}
