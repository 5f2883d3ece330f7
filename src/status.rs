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
    pub fn from_parts(err: &rusqlite::Error, reason: Option<RetireReason>) -> ErrorClass {
        let moved = matches!(
            err.sqlite_error(),
            Some(e) if e.extended_code == rusqlite::ffi::SQLITE_READONLY_DBMOVED
        );
        match (moved, reason) {
            (false, _) => ErrorClass::Other,
            (true, Some(RetireReason::WalLost | RetireReason::ShmLost)) => {
                ErrorClass::WalGenerationLost
            }
            (true, _) => ErrorClass::DatabaseReplaced,
        }
    }
}
