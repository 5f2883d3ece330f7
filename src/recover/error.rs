//! The errors of recovery. Every variant names the path it concerns.

use std::io;
use std::path::PathBuf;

/// Why a capture could not be opened, or a merge or rebuild could not be done. Whenever one is
/// returned, nothing was written to the live database.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The directory is a capture that was interrupted while being written (`.partial`): it is
    /// not complete and is never used. It can be deleted.
    #[error(
        "{capture} is an interrupted capture (its name ends in .partial): it was never completed \
         and cannot be trusted; a complete capture has no .partial suffix"
    )]
    Partial {
        /// The directory given.
        capture: PathBuf,
    },

    /// The path is not a capture directory (no `manifest.json`, not a directory, or a manifest
    /// that is not a capture's).
    #[error("{path} is not a hermes-guard capture: {why}")]
    NotACapture {
        /// The path given.
        path: PathBuf,
        /// What is missing or wrong.
        why: String,
    },

    /// The capture's manifest names a file that is not in the directory.
    #[error("{capture}: the manifest names {file}, which is missing from the capture")]
    MissingFile {
        /// The capture directory.
        capture: PathBuf,
        /// The file's name inside it.
        file: String,
    },

    /// A captured file's size differs from the manifest's.
    #[error(
        "{capture}: {file} is {found} bytes, the manifest says {expected}: the capture was \
         changed or damaged after it was written"
    )]
    SizeMismatch {
        /// The capture directory.
        capture: PathBuf,
        /// The file's name inside it.
        file: String,
        /// Bytes recorded in the manifest.
        expected: u64,
        /// Bytes found.
        found: u64,
    },

    /// A captured file's sha256 differs from the manifest's.
    #[error(
        "{capture}: the sha256 of {file} is {found}, the manifest says {expected}: the capture \
         was changed or damaged after it was written"
    )]
    Sha256Mismatch {
        /// The capture directory.
        capture: PathBuf,
        /// The file's name inside it.
        file: String,
        /// sha256 recorded in the manifest.
        expected: String,
        /// sha256 found.
        found: String,
    },

    /// The target is not something a capture can be merged into.
    #[error("{database}: {why}")]
    BadTarget {
        /// The target given.
        database: PathBuf,
        /// Why it cannot be used.
        why: String,
    },

    /// The target is one of the capture's own files (or inside the capture): captures are never
    /// changed.
    #[error(
        "{database} is inside the capture {capture}: a capture is never written to; give the live \
         database with --into"
    )]
    TargetIsCapture {
        /// The target given.
        database: PathBuf,
        /// The capture.
        capture: PathBuf,
    },

    /// The live database is not the database the capture was taken of: no table in common, or
    /// another `application_id`.
    #[error("{database} is a different database from the one captured in {capture}: {why}")]
    DifferentDatabase {
        /// The target given.
        database: PathBuf,
        /// The capture.
        capture: PathBuf,
        /// What differs.
        why: String,
    },

    /// The live database's generation is retired for the connection recovery opened (its
    /// `-wal`/`-shm` or main file is being taken away right now): nothing was written.
    #[error(
        "{database}: the guard refused the merge because the database's generation was retired \
         under it ({why}); nothing was written — run again once the files are stable"
    )]
    Retired {
        /// The target.
        database: PathBuf,
        /// The guard's reason.
        why: String,
    },

    /// The merge would leave foreign-key violations that were not there before: it was rolled
    /// back.
    #[error(
        "{database}: the merge was rolled back: it would leave {} new foreign-key violation(s) \
         (first: {})", violations.len(), violations.first().map(String::as_str).unwrap_or("-")
    )]
    ForeignKeys {
        /// The target.
        database: PathBuf,
        /// `table rowid → parent` for each new violation.
        violations: Vec<String>,
    },

    /// Another connection holds the database, so it cannot be swapped.
    #[error(
        "{database} is open in another connection (it could not be locked exclusively): stop \
         every process that uses it, then run the rebuild again; nothing was changed"
    )]
    InUse {
        /// The database.
        database: PathBuf,
    },

    /// `--rebuild` on a database that is not torn: the capture's manifest does not say the loss
    /// tore it, and its `integrity_check` is clean. Nothing was changed.
    #[error(
        "{database} is not torn: the capture {capture} does not record a torn main file \
         (main_torn: false) and the database's integrity_check is ok, so a rebuild would replace \
         a healthy file; merge the captured rows with `recover --apply` instead. Nothing was changed"
    )]
    NotTorn {
        /// The database.
        database: PathBuf,
        /// The capture.
        capture: PathBuf,
    },

    /// The rebuilt database failed its own check and was not swapped in.
    #[error("the database rebuilt for {database} failed its check ({why}); the live file was not touched")]
    RebuildCheck {
        /// The database.
        database: PathBuf,
        /// What the check said.
        why: String,
    },

    /// The capture's files do not give its generation's pages: its WAL holds no valid header or
    /// no commit, or its `<file>-base` is not a base file or belongs to another generation.
    #[error("{capture}: the captured generation's pages cannot be read: {why}")]
    GenerationPages {
        /// The capture directory.
        capture: PathBuf,
        /// What is wrong.
        why: String,
    },

    /// `manifest.json` could not be parsed.
    #[error("{capture}: manifest.json cannot be read as a capture manifest: {source}")]
    Manifest {
        /// The capture directory.
        capture: PathBuf,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },

    /// An I/O error.
    #[error("{path}: {operation}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },

    /// An SQLite error.
    #[error("{path}: {operation}: {source}")]
    Sqlite {
        /// The database.
        path: PathBuf,
        /// What was being done.
        operation: String,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
}

impl RecoverError {
    /// Whether the error is about what was given (a capture that is not sound, a target that
    /// cannot receive it) rather than a failure while working.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            RecoverError::Io { .. }
                | RecoverError::Sqlite { .. }
                | RecoverError::ForeignKeys { .. }
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>, operation: &'static str, source: io::Error) -> Self {
        RecoverError::Io {
            path: path.into(),
            operation,
            source,
        }
    }

    pub(crate) fn sqlite(
        path: impl Into<PathBuf>,
        operation: impl Into<String>,
        source: rusqlite::Error,
    ) -> Self {
        RecoverError::Sqlite {
            path: path.into(),
            operation: operation.into(),
            source,
        }
    }
}

impl From<crate::wal_base::MainCheckError> for RecoverError {
    /// A `--main` file refused is a capture that cannot be used as given.
    fn from(e: crate::wal_base::MainCheckError) -> Self {
        use crate::wal_base::MainCheckError;
        match e {
            MainCheckError::Refused { path, why } => RecoverError::NotACapture { path, why },
            MainCheckError::Io {
                path,
                operation,
                source,
            } => RecoverError::Io {
                path,
                operation,
                source,
            },
        }
    }
}
