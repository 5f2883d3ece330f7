//! Why `recover --main`'s file could not be checked against a stale WAL's record. Every variant
//! names the path it concerns; recovery turns it into its own error (`RecoverError`).

use std::io;
use std::path::PathBuf;

/// Why the file given as the main file of a stale WAL's capture is refused, or could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MainCheckError {
    /// The file is not the database file the captured WAL was written on, or the capture has no
    /// record to check it by.
    #[error("{path} is not the main file of this capture: {why}")]
    Refused {
        /// The file given.
        path: PathBuf,
        /// What does not match.
        why: String,
    },

    /// An I/O error.
    #[error("{path}: {operation}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

impl MainCheckError {
    pub(crate) fn io(path: impl Into<PathBuf>, operation: &'static str, source: io::Error) -> Self {
        MainCheckError::Io {
            path: path.into(),
            operation,
            source,
        }
    }
}
