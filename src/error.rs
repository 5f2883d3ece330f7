//! The errors of the guard's public API.

use std::path::PathBuf;

use crate::capture::CaptureError;

/// An error from the guard's public API.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The VFS could not be registered.
    #[error("registering the hermes-guard VFS failed: {0}")]
    Register(String),
    /// The connection's database is not opened through hermes-guard, so it has no guard to ask.
    #[error(
        "{database} is not opened through the hermes-guard VFS (open it with vfs=hermes-guard \
         after hermes_guard::register())"
    )]
    NotGuarded {
        /// The database asked about.
        database: PathBuf,
    },
    /// The retired generation could not be captured; the connection keeps its descriptor and a
    /// later close retries.
    #[error("the retired generation of {database} could not be captured, so it was not closed: {message}")]
    CaptureFailed {
        /// The database whose generation is uncaptured.
        database: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Capturing by identity failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// SQLite said no.
    #[error("SQLite error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The status the VFS returned did not parse (a version mismatch between library and VFS).
    #[error("malformed hermes-guard status: {0}")]
    Status(#[from] serde_json::Error),
}
