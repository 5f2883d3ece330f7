//! What a connection's guard can tell about itself, and how to read an error it caused.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::identity::FileId;
use crate::paths::{path_display, path_from_parts, path_hex, MalformedPathHex};

/// Why a generation was retired (`reason` in the status and the manifest: `wal-lost`,
/// `shm-lost`, `main-replaced`).
///
/// The same words name what an error means ([`ErrorClass`]) and the store's typed errors
/// (`StoreError::WalLost`, `StoreError::MainReplaced`): a lost `-shm` is a lost WAL generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RetireReason {
    /// `<db>-wal` no longer resolves to the WAL this connection writes.
    WalLost,
    /// `<db>-shm` no longer resolves to the shared memory this connection maps.
    ShmLost,
    /// `<db>` no longer resolves to the main file this connection opened.
    MainReplaced,
    /// A WAL found at the open was not written on the main file now at the path (a restore
    /// after a crash): set aside, never replayed (manifest only; a connection is never retired
    /// for it).
    StaleWal,
    /// `<db>` is still the main file this connection opened, but its content was overwritten in
    /// place (a restore by copy, `cp backup.db state.db`): before a checkpoint writes into it,
    /// its first pages are neither what this WAL generation began on nor what its checkpoints
    /// wrote.
    MainOverwritten,
}

impl RetireReason {
    /// A sentence for a person.
    pub fn describe(self) -> &'static str {
        match self {
            RetireReason::WalLost => "the -wal file was unlinked or replaced under the connection",
            RetireReason::ShmLost => "the -shm file was unlinked or replaced under the connection",
            RetireReason::MainReplaced => "the database file was replaced under the connection",
            RetireReason::StaleWal => {
                "the -wal found at the open was written on another database file"
            }
            RetireReason::MainOverwritten => {
                "the database file was overwritten in place under the connection (a restore by \
                 copy): a checkpoint would mix its pages with this generation's"
            }
        }
    }
}

/// One connection's guard, as `PRAGMA hermes_guard_status` reports it.
///
/// In JSON, `database` and `capture` are display strings; when a path's bytes are not UTF-8 its
/// exact bytes are in `database_hex` / `capture_hex` (lowercase hex), which deserialization
/// prefers, so the paths round-trip byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "StatusJson", try_from = "StatusJson")]
#[non_exhaustive]
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
    pub backfill_at_loss: Option<Backfill>,
    /// The loss left the main file torn: it holds some, not all, of the retired WAL's pages, and
    /// the newer generation builds on it. The live file needs repair (docs/recovery.md).
    pub main_torn: bool,
    /// The lock shield holds its open-file-description read lock on the main file's SHARED
    /// range now, so a stray `close()` of the database file elsewhere in this process cannot
    /// make this connection look absent to other processes (WAL mode; released while the
    /// connection itself takes EXCLUSIVE).
    pub shield_active: bool,
    /// The lock shield holds its read lock on the `-shm` dead-man-switch byte (WAL mode).
    pub shield_shm_active: bool,
    /// Why the lock shield is off for this connection (`None` when it can be used): another
    /// VFS below the guard, SQLite's descriptor not matching the pinned file, a filesystem that
    /// is not local, a kernel or platform without OFD locks.
    pub shield_off_reason: Option<String>,
    /// Failed attempts to capture this retired generation so far (retried with a back-off).
    pub capture_attempts: u32,
    /// The directory whose deletion let this retired generation go uncaptured (no orphan
    /// capture directory was set); its descriptors are released.
    pub let_go: Option<PathBuf>,
    /// Process-wide: retired generations held uncaptured after their connections closed.
    pub held_generations: usize,
    /// Process-wide: the descriptors held for them (each held main file and pinned WAL).
    pub held_descriptors: usize,
    /// Process-wide: generations let go because their directory was deleted.
    pub generations_let_go: u64,
    /// Process-wide: capture-failure and let-go log lines left out by the rate limits.
    pub log_lines_suppressed: u64,
    /// A WAL found at the open that was not written on this database: set aside into a capture, or
    /// the open refused in the strict mode. `None`: nothing of the kind.
    pub stale_wal: Option<StaleWalStatus>,
    /// Connections of this process still open on this database whose generation is retired
    /// (this one included, when retired). Each holds its generation's files until it closes:
    /// close them (a pool drops each as it is returned). A new connection works meanwhile (the
    /// guard maps each `-shm` file on its own), except where SQLite's own mapping is kept (see
    /// docs/architecture.md, "The wal-index node"): there it is refused (`shm-lost`) until
    /// they are all closed.
    pub retired_connections_here: usize,
    /// Whether the shim keeps SQLite's WAL resets and checkpoints apart on this connection
    /// (SQLite's WAL-reset race, 3.7.0–3.51.2; `"on"` / `"off"` in JSON). On by default where
    /// the running SQLite has the race; `PRAGMA hermes_guard_wal_reset_guard = on|off` sets it.
    pub wal_reset_guard: bool,
    /// WAL resets of this connection's answered `SQLITE_BUSY` because a checkpoint was running
    /// (SQLite appended to the WAL instead; the next commit tries the reset again).
    pub wal_resets_deferred: u64,
    /// WAL resets of this connection's that went ahead with the checkpoint lock taken by the
    /// shim.
    pub wal_resets_guarded: u64,
    /// Checkpoints of this connection's that ended with the wal-index's `nBackfill` past its
    /// `mxFrame`: the race's damage, from whatever cause (logged at ERROR, and to `sqlite3_log`).
    pub wal_index_alarms: u64,
    /// The filesystem the database is on (`ext4`, `btrfs`, `nfs`, `fuse.sshfs`, ...), found once
    /// per mount; `None` when it could not be asked.
    pub filesystem: Option<String>,
    /// Whether SQLite's WAL mode is safe on that filesystem (every process on one host, with
    /// working shared memory and POSIX locks): `false` on network and cluster filesystems.
    pub wal_safe: Option<bool>,
}

/// What the guard did with a WAL found at the open that was not written on the main file at
/// the path (`stale_wal` in the status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StaleWalStatus {
    /// `set-aside` (moved into a capture, the database opened as it is) or `refused` (the strict
    /// mode: nothing moved, the open failed with `SQLITE_CANTOPEN_DIRTYWAL`).
    pub action: StaleWalAction,
    /// The capture holding the stale WAL and `-shm` (display string; `capture_hex` has its
    /// exact bytes when they are not UTF-8).
    pub capture: Option<String>,
    /// Exact bytes of the capture's path in hex, only when not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_hex: Option<String>,
    /// The stale WAL's identity.
    pub wal: FileId,
    /// What did not match, for a person.
    pub detail: String,
}

impl StaleWalStatus {
    /// The capture's exact path.
    pub fn capture_path(&self) -> Option<PathBuf> {
        let display = self.capture.clone()?;
        path_from_parts(display, self.capture_hex.as_deref()).ok()
    }
}

/// See [`StaleWalStatus::action`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum StaleWalAction {
    /// Moved into a capture; the database opened as it is at the path.
    SetAside,
    /// The open was refused; nothing was moved.
    Refused,
}

/// A WAL's checkpoint progress, read from the wal-index header and checkpoint info in the `-shm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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

/// The JSON shape of [`GuardStatus`]: paths as display strings, plus their exact bytes in hex
/// only when those are not UTF-8.
#[derive(Serialize, Deserialize)]
struct StatusJson {
    database: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    database_hex: Option<String>,
    retired: bool,
    reason: Option<RetireReason>,
    main: Option<FileId>,
    wal: Option<FileId>,
    shm: Option<FileId>,
    capture: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capture_hex: Option<String>,
    capture_error: Option<String>,
    refusals: u64,
    #[serde(default)]
    backfill_at_loss: Option<Backfill>,
    #[serde(default)]
    main_torn: bool,
    #[serde(default)]
    shield_active: bool,
    #[serde(default)]
    shield_shm_active: bool,
    #[serde(default)]
    shield_off_reason: Option<String>,
    #[serde(default)]
    capture_attempts: u32,
    #[serde(default)]
    let_go: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    let_go_hex: Option<String>,
    #[serde(default)]
    held_generations: usize,
    #[serde(default)]
    held_descriptors: usize,
    #[serde(default)]
    generations_let_go: u64,
    #[serde(default)]
    log_lines_suppressed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stale_wal: Option<StaleWalStatus>,
    #[serde(default)]
    retired_connections_here: usize,
    /// `"on"` or `"off"`.
    #[serde(default)]
    wal_reset_guard: String,
    #[serde(default)]
    wal_resets_deferred: u64,
    #[serde(default)]
    wal_resets_guarded: u64,
    #[serde(default)]
    wal_index_alarms: u64,
    #[serde(default)]
    filesystem: Option<String>,
    #[serde(default)]
    wal_safe: Option<bool>,
}

impl From<GuardStatus> for StatusJson {
    fn from(s: GuardStatus) -> StatusJson {
        StatusJson {
            database: path_display(&s.database),
            database_hex: path_hex(&s.database),
            retired: s.retired,
            reason: s.reason,
            main: s.main,
            wal: s.wal,
            shm: s.shm,
            capture: s.capture.as_deref().map(path_display),
            capture_hex: s.capture.as_deref().and_then(path_hex),
            capture_error: s.capture_error,
            refusals: s.refusals,
            backfill_at_loss: s.backfill_at_loss,
            main_torn: s.main_torn,
            shield_active: s.shield_active,
            shield_shm_active: s.shield_shm_active,
            shield_off_reason: s.shield_off_reason,
            capture_attempts: s.capture_attempts,
            let_go: s.let_go.as_deref().map(path_display),
            let_go_hex: s.let_go.as_deref().and_then(path_hex),
            held_generations: s.held_generations,
            held_descriptors: s.held_descriptors,
            generations_let_go: s.generations_let_go,
            log_lines_suppressed: s.log_lines_suppressed,
            stale_wal: s.stale_wal,
            retired_connections_here: s.retired_connections_here,
            wal_reset_guard: if s.wal_reset_guard { "on" } else { "off" }.to_string(),
            wal_resets_deferred: s.wal_resets_deferred,
            wal_resets_guarded: s.wal_resets_guarded,
            wal_index_alarms: s.wal_index_alarms,
            filesystem: s.filesystem,
            wal_safe: s.wal_safe,
        }
    }
}

impl TryFrom<StatusJson> for GuardStatus {
    type Error = MalformedPathHex;

    fn try_from(j: StatusJson) -> Result<GuardStatus, MalformedPathHex> {
        Ok(GuardStatus {
            database: path_from_parts(j.database, j.database_hex.as_deref())?,
            retired: j.retired,
            reason: j.reason,
            main: j.main,
            wal: j.wal,
            shm: j.shm,
            capture: j
                .capture
                .map(|c| path_from_parts(c, j.capture_hex.as_deref()))
                .transpose()?,
            capture_error: j.capture_error,
            refusals: j.refusals,
            backfill_at_loss: j.backfill_at_loss,
            main_torn: j.main_torn,
            shield_active: j.shield_active,
            shield_shm_active: j.shield_shm_active,
            shield_off_reason: j.shield_off_reason,
            capture_attempts: j.capture_attempts,
            let_go: j
                .let_go
                .map(|d| path_from_parts(d, j.let_go_hex.as_deref()))
                .transpose()?,
            held_generations: j.held_generations,
            held_descriptors: j.held_descriptors,
            generations_let_go: j.generations_let_go,
            log_lines_suppressed: j.log_lines_suppressed,
            stale_wal: j.stale_wal,
            retired_connections_here: j.retired_connections_here,
            wal_reset_guard: j.wal_reset_guard == "on",
            wal_resets_deferred: j.wal_resets_deferred,
            wal_resets_guarded: j.wal_resets_guarded,
            wal_index_alarms: j.wal_index_alarms,
            filesystem: j.filesystem,
            wal_safe: j.wal_safe,
        })
    }
}

/// What an error from a guarded connection means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The WAL generation was lost ([`RetireReason::WalLost`] or [`RetireReason::ShmLost`]); the
    /// retired bytes are captured next to the database.
    WalLost,
    /// The main file was replaced ([`RetireReason::MainReplaced`], e.g. a snapshot restore):
    /// reopen to see the new database.
    MainReplaced,
    /// The open was refused in the strict stale-WAL mode (`SQLITE_CANTOPEN_DIRTYWAL`): the WAL
    /// beside the database was not written on it ([`GuardStatus::stale_wal`] says what).
    StaleWal,
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
        if e.extended_code == ffi::SQLITE_CANTOPEN_DIRTYWAL {
            return ErrorClass::StaleWal;
        }
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
                ErrorClass::WalLost
            }
            Some(RetireReason::MainReplaced | RetireReason::MainOverwritten)
                if refused || file_level =>
            {
                ErrorClass::MainReplaced
            }
            None if refused => ErrorClass::MainReplaced,
            _ => ErrorClass::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_with_non_utf8_paths_round_trips_through_json() {
        use std::os::unix::ffi::OsStrExt;
        let status = GuardStatus {
            database: PathBuf::from(std::ffi::OsStr::from_bytes(b"/srv/\xff/state.db")),
            retired: true,
            reason: Some(RetireReason::WalLost),
            main: None,
            wal: None,
            shm: None,
            capture: Some(PathBuf::from(std::ffi::OsStr::from_bytes(
                b"/srv/\xff/state.db.retired-wal-20261130-005320-1",
            ))),
            capture_error: None,
            refusals: 1,
            backfill_at_loss: Some(Backfill {
                frames: 9,
                backfilled: 4,
                attempted: 4,
            }),
            main_torn: true,
            shield_active: true,
            shield_shm_active: true,
            stale_wal: None,
            retired_connections_here: 0,
            wal_reset_guard: true,
            wal_resets_deferred: 2,
            wal_resets_guarded: 3,
            wal_index_alarms: 0,
            filesystem: None,
            wal_safe: None,
            shield_off_reason: None,
            capture_attempts: 0,
            let_go: None,
            held_generations: 0,
            held_descriptors: 0,
            generations_let_go: 0,
            log_lines_suppressed: 0,
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["database"], "/srv/\u{fffd}/state.db");
        assert_eq!(json["database_hex"], "2f7372762fff2f73746174652e6462");
        let back: GuardStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, status);
    }

    #[test]
    fn a_status_with_utf8_paths_has_no_hex_keys() {
        let status = GuardStatus {
            database: PathBuf::from("/srv/state.db"),
            retired: false,
            reason: None,
            main: None,
            wal: None,
            shm: None,
            capture: None,
            capture_error: None,
            refusals: 0,
            backfill_at_loss: None,
            main_torn: false,
            shield_active: false,
            shield_shm_active: false,
            shield_off_reason: Some("the filesystem is not local".into()),
            capture_attempts: 3,
            let_go: Some(PathBuf::from("/tmp/gone")),
            held_generations: 2,
            held_descriptors: 4,
            generations_let_go: 7,
            log_lines_suppressed: 11,
            stale_wal: None,
            retired_connections_here: 0,
            wal_reset_guard: true,
            wal_resets_deferred: 2,
            wal_resets_guarded: 3,
            wal_index_alarms: 0,
            filesystem: Some("ext4".into()),
            wal_safe: Some(true),
        };
        let json = serde_json::to_value(&status).unwrap();
        assert!(json.get("database_hex").is_none() && json.get("capture_hex").is_none());
        assert_eq!(json["database"], "/srv/state.db");
    }

    #[test]
    fn the_wal_reset_guard_reads_on_or_off_in_json_and_a_status_without_it_reads_off() {
        let json = serde_json::json!({
            "database": "/srv/state.db", "retired": false, "reason": null, "main": null,
            "wal": null, "shm": null, "capture": null, "capture_error": null, "refusals": 0,
            "backfill_at_loss": null, "main_torn": false, "shield_active": false,
            "shield_shm_active": false, "wal_reset_guard": "on", "wal_resets_deferred": 4,
        });
        let status: GuardStatus = serde_json::from_value(json.clone()).unwrap();
        assert!(status.wal_reset_guard);
        assert_eq!(status.wal_resets_deferred, 4);
        assert_eq!(
            serde_json::to_value(&status).unwrap()["wal_reset_guard"],
            "on"
        );
        let mut older = json;
        older.as_object_mut().unwrap().remove("wal_reset_guard");
        let status: GuardStatus = serde_json::from_value(older).unwrap();
        assert!(!status.wal_reset_guard);
        assert_eq!(
            serde_json::to_value(&status).unwrap()["wal_reset_guard"],
            "off"
        );
    }

    #[test]
    fn a_wal_checkpointed_partly_or_cut_short_tears_the_main_file() {
        let progress = |frames, backfilled, attempted| Backfill {
            frames,
            backfilled,
            attempted,
        };
        assert!(!progress(10, 0, 0).tears_main(), "nothing copied");
        assert!(!progress(10, 10, 10).tears_main(), "everything copied");
        assert!(progress(10, 4, 4).tears_main(), "held back by a reader");
        assert!(
            progress(10, 0, 6).tears_main(),
            "cut short before recording"
        );
        assert!(!progress(0, 0, 0).tears_main(), "an empty WAL");
    }

    fn sqlite_error(extended: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(extended), None)
    }

    #[test]
    fn a_refusal_is_classified_by_the_retirement_reason() {
        let refused = sqlite_error(rusqlite::ffi::SQLITE_READONLY_DBMOVED);
        assert_eq!(
            ErrorClass::from_parts(&refused, Some(RetireReason::WalLost)),
            ErrorClass::WalLost
        );
        assert_eq!(
            ErrorClass::from_parts(&refused, Some(RetireReason::ShmLost)),
            ErrorClass::WalLost
        );
        assert_eq!(
            ErrorClass::from_parts(&refused, Some(RetireReason::MainReplaced)),
            ErrorClass::MainReplaced
        );
    }

    #[test]
    fn sqlites_own_dbmoved_without_a_guard_reason_means_replaced() {
        let refused = sqlite_error(rusqlite::ffi::SQLITE_READONLY_DBMOVED);
        assert_eq!(
            ErrorClass::from_parts(&refused, None),
            ErrorClass::MainReplaced
        );
    }

    #[test]
    fn a_file_level_failure_counts_only_on_a_retired_connection() {
        let short_read = sqlite_error(rusqlite::ffi::SQLITE_IOERR_SHORT_READ);
        assert_eq!(ErrorClass::from_parts(&short_read, None), ErrorClass::Other);
        assert_eq!(
            ErrorClass::from_parts(&short_read, Some(RetireReason::ShmLost)),
            ErrorClass::WalLost
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
