//! The errors of the session store and the registry.
//!
//! The first three are the ones the guard exists for; `docs/store.md` says what an application
//! should do with each. Every variant names the database it concerns.

use std::path::{Path, PathBuf};

use hermes_guard::{CaptureError, GuardError, RetireReason};

/// An error from [`SessionDb`](super::SessionDb) or the [registry](crate::registry).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database file behind this handle was replaced (a snapshot restore, a recovery, another
    /// process swapping `state.db`): this handle's generation is retired and refuses every write.
    /// Nothing of the refused write landed. Release the handle and open the path again.
    #[error(
        "{database} was replaced under this handle ({why}); writes through it are refused and \
         none of them lands — release this handle and open the database again to write to the new file"
    , why = reason.map_or("the file at the path is no longer the one this handle opened", RetireReason::describe))]
    MainReplaced {
        /// The database's path.
        database: PathBuf,
        /// What the guard saw.
        reason: Option<RetireReason>,
    },

    /// The `-wal` (or `-shm`) generation this handle wrote was taken away: the other retirement
    /// beside [`StoreError::MainReplaced`] ([`StoreError::is_retired`] is true for both).
    /// Transactions committed only in that WAL are not in the file now at the path; they are in
    /// the capture, when there is one.
    #[error(
        "the WAL generation of {database} was deleted or replaced under this handle ({why}); \
         writes through it are refused and none of them lands. {captured}"
    , why = reason.map_or("a sidecar file is no longer the one this handle wrote", RetireReason::describe)
    , captured = describe_capture(capture.as_deref(), capture_error.as_deref()))]
    WalLost {
        /// The database's path.
        database: PathBuf,
        /// The directory holding the retired generation (WAL, main image, manifest), once written.
        capture: Option<PathBuf>,
        /// Why the capture could not be written yet, when it could not.
        capture_error: Option<String>,
        /// What the guard saw.
        reason: Option<RetireReason>,
    },

    /// The retired generation could not be captured, so it was not closed: it stays open (and
    /// keeps the retired bytes readable) until a retry succeeds. `held_back` says what waited
    /// on it: a `close()` (the handle stays open; call `close()` again) or a registry acquire
    /// (the path's earlier generation is still open and owed its capture, so nothing new was
    /// opened; acquire again).
    #[error("{}", describe_capture_failure(database, message, *held_back))]
    CaptureFailed {
        /// The database's path.
        database: PathBuf,
        /// What went wrong writing the capture.
        message: String,
        /// What the failure held back.
        held_back: HeldBack,
        /// The capture's own error, typed, when the guard handed it back whole (always, unless
        /// the library and the VFS disagree).
        #[source]
        source: Option<CaptureError>,
    },

    /// The handle was closed (or the registry that lent it was closed with `close_all`).
    #[error("{database}: this SessionDb handle is closed")]
    Closed {
        /// The database's path.
        database: PathBuf,
    },

    /// A full-text query FTS5 cannot parse.
    #[error("{database}: invalid search query {query:?}: {message}")]
    InvalidSearchQuery {
        /// The database's path.
        database: PathBuf,
        /// The query as given.
        query: String,
        /// What FTS5 said.
        message: String,
    },

    /// A message was appended to (or a counter bumped on) a session that does not exist.
    #[error("{database}: no session {session_id:?} (create it with create_session or ensure_session first)")]
    UnknownSession {
        /// The database's path.
        database: PathBuf,
        /// The session asked for.
        session_id: String,
    },

    /// The database's schema is newer than this build knows.
    #[error(
        "{database} has schema version {found}, newer than the {supported} this build supports; \
         upgrade hermes-guard rather than writing to it with an older store"
    )]
    SchemaTooNew {
        /// The database's path.
        database: PathBuf,
        /// The version recorded in the database.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },

    /// The database did not switch to WAL mode (e.g. it lives on a filesystem without shared
    /// memory); the guard's protection is about WAL generations, so the store refuses to run.
    #[error("{database} could not be put in WAL mode (journal_mode is {mode:?})")]
    NotWal {
        /// The database's path.
        database: PathBuf,
        /// The journal mode SQLite reported.
        mode: String,
    },

    /// A write kept finding the database locked by other writers.
    #[error("{database}: {operation} gave up after {attempts} attempts: the database stayed locked by another writer")]
    Busy {
        /// The database's path.
        database: PathBuf,
        /// The store method.
        operation: &'static str,
        /// How many times `BEGIN IMMEDIATE` was tried.
        attempts: u32,
    },

    /// The file at the path kept being replaced while the registry opened it.
    #[error(
        "{database} was replaced {attempts} times while the registry was opening it; giving up"
    )]
    Unstable {
        /// The database's path.
        database: PathBuf,
        /// How many opens were made.
        attempts: u32,
    },

    /// A stored JSON column could not be read back, or a value could not be written as JSON.
    #[error("{database}: {operation}: bad JSON: {source}")]
    Json {
        /// The database's path.
        database: PathBuf,
        /// The store method.
        operation: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },

    /// The guard could not answer (registration, status).
    #[error("{database}: hermes-guard: {source}")]
    Guard {
        /// The database's path.
        database: PathBuf,
        /// The guard's error.
        #[source]
        source: GuardError,
    },

    /// The file system said no (e.g. making the path absolute, statting it).
    #[error("{database}: {operation}: {source}")]
    Io {
        /// The database's path.
        database: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// Any other SQLite error.
    #[error("{database}: {operation}: {source}")]
    Sqlite {
        /// The database's path.
        database: PathBuf,
        /// The store method.
        operation: &'static str,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
}

/// What a capture that could not be written held back (see
/// [`StoreError::CaptureFailed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldBack {
    /// A close: the handle was not closed and is still usable.
    Close,
    /// A registry acquire: the path's retired generation is still open and uncaptured, so no new
    /// generation was opened.
    Acquire,
}

fn describe_capture_failure(database: &Path, message: &str, held_back: HeldBack) -> String {
    let dir = database.parent().unwrap_or(Path::new(".")).display();
    let database = database.display();
    match held_back {
        HeldBack::Close => format!(
            "{database}: the retired WAL generation could not be captured ({message}); the \
             handle was NOT closed and still holds the only copy of those transactions — free \
             space or fix permissions in {dir} and call close() again"
        ),
        HeldBack::Acquire => format!(
            "{database}: the retired WAL generation of this path is still uncaptured ({message}); \
             it is kept open because it holds the only copy of those transactions, and nothing \
             new was opened — free space or fix permissions in {dir} and acquire again"
        ),
    }
}

fn describe_capture(capture: Option<&Path>, capture_error: Option<&str>) -> String {
    match (capture, capture_error) {
        (Some(dir), _) => format!(
            "The retired generation is captured in {}; its transactions are recovered by opening \
             the two files there as a fresh database.",
            dir.display()
        ),
        (None, Some(e)) => format!(
            "The retired generation could NOT be captured yet ({e}); keep this handle open and \
             retry close() once the cause is fixed."
        ),
        (None, None) => "No WAL frames needed capturing.".to_owned(),
    }
}

impl StoreError {
    /// True for both retirements, [`StoreError::WalLost`] and [`StoreError::MainReplaced`]:
    /// this handle's generation is retired for good, the write did not land, and the remedy is
    /// to release the handle and open the path again.
    pub fn is_retired(&self) -> bool {
        matches!(
            self,
            StoreError::MainReplaced { .. } | StoreError::WalLost { .. }
        )
    }

    /// The capture of the retired generation, when the error carries one.
    pub fn capture(&self) -> Option<&Path> {
        match self {
            StoreError::WalLost { capture, .. } => capture.as_deref(),
            _ => None,
        }
    }

    /// The database the error concerns.
    pub fn database(&self) -> &Path {
        match self {
            StoreError::MainReplaced { database, .. }
            | StoreError::WalLost { database, .. }
            | StoreError::CaptureFailed { database, .. }
            | StoreError::Closed { database }
            | StoreError::InvalidSearchQuery { database, .. }
            | StoreError::UnknownSession { database, .. }
            | StoreError::SchemaTooNew { database, .. }
            | StoreError::NotWal { database, .. }
            | StoreError::Busy { database, .. }
            | StoreError::Unstable { database, .. }
            | StoreError::Json { database, .. }
            | StoreError::Guard { database, .. }
            | StoreError::Io { database, .. }
            | StoreError::Sqlite { database, .. } => database,
        }
    }
}
