//! Why a capture could not be made, and how the failure reaches the library call that ran the
//! pragma.

use std::io;
use std::path::{Path, PathBuf};

use crate::identity::FileId;

/// A capture that could not be made. Nothing is left behind but, at worst, a `.partial` directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Asked to capture without an identity: guessing by pathname could capture somebody else's WAL.
    #[error(
        "refusing to capture the retired WAL of {database} by pathname: no pinned WAL identity was \
         recorded, and the file now at `{database}-wal` may belong to another generation"
    )]
    NoPinnedIdentity {
        /// The database whose generation was asked for.
        database: PathBuf,
    },
    /// The identity given is not held by any guarded connection of this process.
    #[error(
        "this process no longer holds the WAL inode ({identity}) of {database}: its bytes cannot be \
         captured from here, and the pathname will not be trusted instead"
    )]
    NotHeld {
        /// The database whose generation was asked for.
        database: PathBuf,
        /// The identity asked for.
        identity: FileId,
    },
    /// The generation is live: a capture stands for the generation once taken, so one taken now
    /// would miss every later commit.
    #[error(
        "refusing to capture {database}: its generation is not retired (its -wal, -shm and main \
         file are still the ones the connection opened)"
    )]
    NotRetired {
        /// The database asked about.
        database: PathBuf,
    },
    /// The retired generation holds nothing a capture would save: its WAL has no frame, so the
    /// main file at the path holds everything.
    #[error(
        "nothing to capture for {database}: the retired WAL holds no frame, so nothing is at stake"
    )]
    NothingAtStake {
        /// The database asked about.
        database: PathBuf,
    },
    /// An automatic retry that is not due yet: the last attempt failed and the back-off has not
    /// passed (an explicit request tries at once).
    #[error(
        "the capture of {database}'s retired generation is not retried yet: {attempts} attempt(s) \
         failed, the last with: {last}"
    )]
    Deferred {
        /// The database whose generation waits.
        database: PathBuf,
        /// Failed attempts so far.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The database's directory was deleted and no orphan capture directory is set: the retired
    /// generation was let go uncaptured and its descriptors released.
    #[error(
        "the retired generation of {database} was let go uncaptured: its directory {} was \
         deleted (no link left) and no orphan capture directory is set \
         (HERMES_GUARD_ORPHAN_CAPTURE_DIR, hermes_guard::set_orphan_capture_dir)",
        directory.display()
    )]
    LetGo {
        /// The database whose generation was let go.
        database: PathBuf,
        /// Its deleted directory, as last known.
        directory: PathBuf,
    },
    /// Reading the retired generation or writing the artifact failed.
    #[error("capturing the retired generation of {database} into {artifact}: {source}")]
    Io {
        /// The database whose generation is being captured.
        database: PathBuf,
        /// The artifact (or staging) path being written.
        artifact: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

impl CaptureError {
    /// The database whose generation the capture was for.
    pub fn database(&self) -> &Path {
        match self {
            CaptureError::NoPinnedIdentity { database }
            | CaptureError::NotHeld { database, .. }
            | CaptureError::NotRetired { database }
            | CaptureError::NothingAtStake { database }
            | CaptureError::Io { database, .. }
            | CaptureError::Deferred { database, .. }
            | CaptureError::LetGo { database, .. } => database,
        }
    }
}

thread_local! {
    /// The capture failure a `PRAGMA hermes_guard_capture` on this thread just reported to SQLite
    /// as text, kept whole for the library call that ran the pragma on this same thread.
    static HANDED_OVER: std::cell::RefCell<Option<CaptureError>> =
        const { std::cell::RefCell::new(None) };
}

/// Keeps `error` for [`take_handed_over`] on this thread and returns the message SQLite shows.
pub(crate) fn hand_over(error: CaptureError) -> String {
    let message = error.to_string();
    HANDED_OVER.with(|slot| *slot.borrow_mut() = Some(error));
    message
}

/// The capture failure [`hand_over`] kept on this thread for `database`, if any (taken).
pub(crate) fn take_handed_over(database: &Path) -> Option<CaptureError> {
    HANDED_OVER.with(|slot| {
        let mut slot = slot.borrow_mut();
        match slot.as_ref() {
            Some(e) if e.database() == database => slot.take(),
            _ => None,
        }
    })
}
