//! What a connection's guard can tell about itself, and how to read an error it caused.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::identity::FileId;

/// Why a generation was retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetireReason {
    /// `<db>-wal` no longer resolves to the WAL this connection writes.
    WalLost,
    /// `<db>-shm` no longer resolves to the shared memory this connection maps.
    ShmLost,
    /// `<db>` no longer resolves to the main file this connection opened.
    MainReplaced,
}

impl RetireReason {
    /// A sentence for a person.
    pub fn describe(self) -> &'static str {
        match self {
            RetireReason::WalLost => "the -wal file was unlinked or replaced under the connection",
            RetireReason::ShmLost => "the -shm file was unlinked or replaced under the connection",
            RetireReason::MainReplaced => "the database file was replaced under the connection",
        }
    }
}

/// One connection's guard, as `PRAGMA hermes_guard_status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardStatus {
    /// The database's pathname, as SQLite opened it.
    pub database: PathBuf,
    /// Whether the connection's generation is retired (sticky).
    pub retired: bool,
    /// What retired it.
    pub reason: Option<RetireReason>,
    /// Pinned identity of the main file.
    pub main: Option<FileId>,
    /// Pinned identity of the WAL, while one is open or held for capture.
    pub wal: Option<FileId>,
    /// Pinned identity of the `-shm` mapping.
    pub shm: Option<FileId>,
    /// The capture's directory, once written.
    pub capture: Option<PathBuf>,
    /// The last capture failure, while no capture exists.
    pub capture_error: Option<String>,
    /// Writes refused so far.
    pub refusals: u64,
    /// How far the retired WAL had been checkpointed into the main file when the loss was seen,
    /// as the connection's wal-index (`-shm`) recorded it; `None` while live or when unknown.
    #[serde(default)]
    pub backfill_at_loss: Option<Backfill>,
    /// The loss left the main file torn: it holds some, not all, of the retired WAL's pages, and
    /// the newer generation builds on it. The live file needs repair (docs/recovery.md).
    #[serde(default)]
    pub main_torn: bool,
}

/// A WAL's checkpoint progress, read from the wal-index header and checkpoint info in the `-shm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backfill {
    /// Valid frames in the WAL (`mxFrame`).
    pub frames: u32,
    /// Frames whose pages have been copied into the main file (`nBackfill`).
    pub backfilled: u32,
    /// Frames a checkpoint may have begun copying (`nBackfillAttempted`): when above
    /// `backfilled`, a checkpoint was cut short after writing some of their pages.
    pub attempted: u32,
}

impl Backfill {
    /// Whether losing the WAL at this point leaves the main file torn: a checkpoint had copied
    /// some of its frames but not all of them (a reader held it back), or was cut short. With
    /// nothing copied the main file is the older generation whole; with everything copied it is
    /// the retired generation whole.
    pub fn tears_main(&self) -> bool {
        let partly = self.backfilled > 0 && self.backfilled < self.frames;
        let cut_short = self.attempted > self.backfilled;
        partly || cut_short
    }
}

/// What an error from a guarded connection means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The WAL (or `-shm`) generation was lost; the retired bytes are captured next to the database.
    WalGenerationLost,
    /// The main file was replaced (e.g. a snapshot restore): reopen to see the new database.
    DatabaseReplaced,
    /// Anything else.
    Other,
}

impl ErrorClass {
    /// Classifies from the error and, when known, the connection's retirement reason.
    ///
    /// A refusal is `SQLITE_READONLY_DBMOVED`. A retired connection can also fail before the
    /// guard is asked — e.g. a second connection in the same process attaches to the unix VFS's
    /// shared mapping of an unlinked `-shm` and gets `SQLITE_IOERR_SHORT_READ` — so file-level
    /// failures on a connection known to be retired are classified by its reason too.
    pub fn from_parts(err: &rusqlite::Error, reason: Option<RetireReason>) -> ErrorClass {
        use rusqlite::ffi;
        let Some(e) = err.sqlite_error() else {
            return ErrorClass::Other;
        };
        let refused = e.extended_code == ffi::SQLITE_READONLY_DBMOVED;
        let file_level = matches!(
            e.extended_code & 0xff,
            ffi::SQLITE_IOERR
                | ffi::SQLITE_CORRUPT
                | ffi::SQLITE_NOTADB
                | ffi::SQLITE_PROTOCOL
                | ffi::SQLITE_CANTOPEN
                | ffi::SQLITE_READONLY
        );
        match reason {
            Some(RetireReason::WalLost | RetireReason::ShmLost) if refused || file_level => {
                ErrorClass::WalGenerationLost
            }
            Some(RetireReason::MainReplaced) if refused || file_level => {
                ErrorClass::DatabaseReplaced
            }
            None if refused => ErrorClass::DatabaseReplaced,
            _ => ErrorClass::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite_error(extended: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(extended), None)
    }

    #[test]
    fn a_refusal_is_classified_by_the_retirement_reason() {
        let refused = sqlite_error(rusqlite::ffi::SQLITE_READONLY_DBMOVED);
        assert_eq!(
            ErrorClass::from_parts(&refused, Some(RetireReason::WalLost)),
            ErrorClass::WalGenerationLost
        );
        assert_eq!(
            ErrorClass::from_parts(&refused, Some(RetireReason::ShmLost)),
            ErrorClass::WalGenerationLost
        );
        assert_eq!(
            ErrorClass::from_parts(&refused, Some(RetireReason::MainReplaced)),
            ErrorClass::DatabaseReplaced
        );
    }

    #[test]
    fn sqlites_own_dbmoved_without_a_guard_reason_means_replaced() {
        let refused = sqlite_error(rusqlite::ffi::SQLITE_READONLY_DBMOVED);
        assert_eq!(
            ErrorClass::from_parts(&refused, None),
            ErrorClass::DatabaseReplaced
        );
    }

    #[test]
    fn a_file_level_failure_counts_only_on_a_retired_connection() {
        let short_read = sqlite_error(rusqlite::ffi::SQLITE_IOERR_SHORT_READ);
        assert_eq!(ErrorClass::from_parts(&short_read, None), ErrorClass::Other);
        assert_eq!(
            ErrorClass::from_parts(&short_read, Some(RetireReason::ShmLost)),
            ErrorClass::WalGenerationLost
        );
    }

    #[test]
    fn constraint_errors_are_other_even_when_retired() {
        let constraint = sqlite_error(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE);
        assert_eq!(
            ErrorClass::from_parts(&constraint, Some(RetireReason::WalLost)),
            ErrorClass::Other
        );
    }
}
