//! The errors of the guard's public API.

use std::path::PathBuf;

use crate::capture::{CaptureError, ManifestError};

/// An error from the guard's public API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The VFS could not be registered.
    #[error("registering the hermes-guard VFS failed: {0}")]
    Register(String),
    /// The guard runs on Linux only (its directory watch is inotify and epoll); on this operating
    /// system the crate builds but [`register`](crate::register) returns this.
    #[error(
        "hermes-guard is not supported on {os}: the guard needs Linux (inotify, epoll, /proc)"
    )]
    UnsupportedPlatform {
        /// `std::env::consts::OS` of the running program.
        os: &'static str,
    },
    /// The connection's database is not opened through hermes-guard, so it has no guard to ask.
    #[error(
        "{database} is not opened through the hermes-guard VFS (open it with vfs=hermes-guard \
         after hermes_guard::register())"
    )]
    NotGuarded {
        /// The database asked about.
        database: PathBuf,
    },
    /// The retired generation could not be captured (or was not, by identity): the connection
    /// keeps its descriptors and a later close retries. The capture's own error, whole.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// A capture's `manifest.json` could not be read or parsed.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The guard answered a capture request with a failure this library could not take back
    /// typed (the VFS and the library disagree: a version mismatch).
    #[error("the retired generation of {database} could not be captured: {message}")]
    CaptureRefused {
        /// The database whose generation is uncaptured.
        database: PathBuf,
        /// What SQLite relayed.
        message: String,
    },
    /// SQLite said no.
    #[error("SQLite error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The status the VFS returned did not parse (a version mismatch between library and VFS).
    #[error("malformed hermes-guard status: {0}")]
    Status(#[from] serde_json::Error),
}
