//! hermes-guard: a SQLite VFS shim that makes a lost WAL generation loud and lossless.
//!
//! WAL-mode SQLite silently loses committed transactions when a connection's `-wal`, `-shm` or
//! main file is unlinked, renamed or replaced underneath it. Register the guard, open with
//! `vfs=hermes-guard`, and such a connection refuses every further write with
//! `SQLITE_READONLY_DBMOVED`, captures the retired generation next to the database, and never
//! checkpoints it over the newer one.
//!
//! ```
//! use hermes_guard::{ErrorClass, GuardExt};
//! use rusqlite::{Connection, OpenFlags};
//!
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("state.db");
//! hermes_guard::register()?; // once per process; idempotent
//! let conn = Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), hermes_guard::VFS_NAME)?;
//! conn.pragma_update(None, "journal_mode", "WAL")?;
//! conn.execute_batch("CREATE TABLE t (x)")?;
//!
//! if let Err(e) = conn.execute("INSERT INTO t VALUES (1)", []) {
//!     match conn.classify(&e) {
//!         ErrorClass::WalLost => { /* captured: see conn.guard_status()?.capture */ }
//!         ErrorClass::MainReplaced => { /* the file was restored: reopen */ }
//!         _ => return Err(e.into()),
//!     }
//! }
//! assert!(!conn.guard_status()?.retired);
//! hermes_guard::close(conn).map_err(|(_conn, e)| e)?; // settles only once a retired generation is captured
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The public surface
//!
//! This list is the one reference; the README and docs/decisions.md point here.
//!
//! - Turning the guard on: [`register`], [`register_as_default`], [`VFS_NAME`].
//! - On a connection: the [`GuardExt`] trait ([`GuardExt::guard_status`],
//!   [`GuardExt::ensure_captured`], [`GuardExt::classify`],
//!   [`GuardExt::capture_retired_generation`], [`GuardExt::is_retired`]); [`close`], which
//!   settles only once a retired generation is captured.
//! - Without rusqlite's types: the SQL functions `hermes_guard_status([schema])`,
//!   `hermes_guard_capture([schema])` and `hermes_guard_retry_pending()`, on every connection
//!   opened after [`register`] ([`sql_functions`]; [`sql_functions::install`] for one opened
//!   before); and [`raw`], the [`GuardExt`] calls on a `*mut sqlite3` (sqlx's, diesel's, any
//!   rusqlite's `handle()`).
//! - In a pool: [`pool`]'s three checks (`keep`, `check_out`, `check_new`) for any pool's hooks;
//!   with cargo feature `r2d2`, `pool::GuardedManager`, an r2d2 manager (or the wrapper of one)
//!   whose pool lets go of retired connections and opens healthy ones.
//! - Process-wide: [`retry_pending_captures`]; [`set_orphan_capture_dir`] (where a generation
//!   whose directory was deleted is captured; [`ORPHAN_DIR_ENV`] for extension hosts);
//!   [`set_stale_wal_policy`] / [`stale_wal_policy`] with [`StaleWalPolicy`] (set a stale WAL
//!   aside or refuse the open; [`STALE_WAL_ENV`] for extension hosts); [`set_wal_reset_guard`] /
//!   [`wal_reset_guard`] / [`wal_reset_guard_on`] with [`WalResetGuard`] (keeping SQLite's WAL
//!   resets and checkpoints apart where [`sqlite_has_wal_reset_race`]; [`WAL_RESET_GUARD_ENV`]
//!   for extension hosts); [`unsafe_fs_policy`] with [`UnsafeFsPolicy`] and [`UNSAFE_FS_ENV`]
//!   (WAL mode on a network filesystem: warn, refuse or allow; [`Filesystem`],
//!   [`filesystem_of_dir`]).
//! - What they report: [`GuardStatus`] (with [`Backfill`], [`StaleWalStatus`],
//!   [`StaleWalAction`]), [`RetireReason`], [`ErrorClass`], [`GuardError`], [`CaptureError`],
//!   [`FileId`].
//! - A capture's [`manifest`] ([`Manifest`] and its parts, [`Manifest::read`]).
//! - Recovery, as the `hermes-guard` CLI runs it: the [`recover`] module.
//! - From outside, read-only: [`judge_wal_at_path`] ([`WalAtPath`]), the stale-WAL judgement of
//!   what is at a database's path (`hermes-guard status`).
//! - Two helpers for applications built on the guard: [`identity_of_path`] and
//!   [`set_busy_timeout`].
//!
//! The session store (`SessionDb`) and its shared registry are an application of the guard, in
//! their own crate, `hermes-guard-store` (`store/`).
//!
//! The enums of the guard, the manifest and the store are `#[non_exhaustive]`; those of
//! [`recover`] ([`recover::RecoverError`], [`recover::MergeRule`], ...) are not yet. Fault
//! injection is behind the `test-hooks` feature and is not part of the surface.

// Without the shim (not Linux) the capture machinery only the shim drives is unused.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

// The loadable extension and a bundled SQLite in one build: rusqlite's `loadable_extension`
// (the extension's) is unified into every package, and the CLI, the store and any program of the
// build panic at their first SQLite call ("SQLite API not initialized"). Stopped here instead.
#[cfg(all(feature = "loadable-extension", feature = "bundled"))]
compile_error!(
    "hermes-guard: the loadable extension (ext/, hermes-guard-ext) cannot be built in one cargo \
     invocation with the library's bundled SQLite (the CLI, the store, `cargo build --workspace`): \
     rusqlite's loadable_extension feature would be unified into the CLI, which would then panic at \
     its first SQLite call. Build them apart: `cargo build --release` (the library, the store and \
     the CLI: target/release/hermes-guard), then `cargo build --release -p hermes-guard-ext` \
     (the extension: target/release/libhermes_guard.so)."
);

// All `unsafe` lives under `src/vfs/`, but for the one `sqlite3_log` call in `src/sqlite_log.rs`
// (the lints deny an `unsafe` block without a SAFETY line).
mod capture;
pub mod digest;
mod error;
mod filesystem;
mod host;
mod identity;
pub mod paths;
mod permissions;
pub mod pool;
pub mod recover;
mod sqlite_log;
mod status;
#[cfg(not(target_os = "linux"))]
mod unsupported;
mod wal_base;
mod wal_base_record;
mod wal_reset;
#[cfg(not(target_os = "linux"))]
use unsupported as vfs;
// The shim needs Linux (inotify, epoll, /proc/self/mountinfo, MADV_WIPEONFORK); elsewhere the
// crate builds and `register` says so (`unsupported.rs`).
#[cfg(target_os = "linux")]
mod vfs;
mod wal_at_path;
mod walfile;

use std::path::PathBuf;

use rusqlite::Connection;

pub use capture::CaptureError;
pub use error::GuardError;
pub use filesystem::{
    of_dir as filesystem_of_dir, unsafe_fs_policy, Filesystem, UnsafeFsPolicy, UNSAFE_FS_ENV,
};
pub use host::set_python_host;
pub use identity::{identity_of_path, FileId};
pub use status::{Backfill, ErrorClass, GuardStatus, RetireReason, StaleWalAction, StaleWalStatus};
#[cfg(target_os = "linux")]
pub use vfs::{raw, sql_functions};
pub use vfs::{register, register_as_default, set_orphan_capture_dir, ORPHAN_DIR_ENV, VFS_NAME};
pub use wal_at_path::{judge_wal_at_path, WalAtPath};
pub use wal_base::{
    set_stale_wal_policy, stale_wal_policy, StaleWalPolicy, POLICY_ENV as STALE_WAL_ENV,
};
pub use wal_reset::{
    set_wal_reset_guard, sqlite_has_wal_reset_race, wal_reset_guard, wal_reset_guard_on,
    WalResetGuard, WAL_RESET_GUARD_ENV,
};

pub use manifest::Manifest;

pub mod manifest {
    //! A capture's `manifest.json` (`docs/capture-format.md`), as [`Manifest::read`] reads it.
    pub use crate::capture::{
        heal_state, BasePagesEntry, BaseVerdict, FailedCommitEntry, HealPhase, HealRecord,
        HealState, ImageMode, MainEntry, Manifest, ManifestError, PathGeneration, PutBack,
        ShmEntry, Trigger, WalEntry, HEALED_NAME,
    };
    pub use crate::wal_base::{Mismatch as StaleWalMismatch, WalBaseRecord};
    pub use crate::walfile::{MainHeader, WalHeader};
}

/// The guard's calls on a [`rusqlite::Connection`] opened through it: `use hermes_guard::GuardExt`
/// and call them on the connection. Each asks the guard of the connection's `main` database,
/// through `PRAGMA hermes_guard_status` / `hermes_guard_capture`, on the calling thread.
///
/// Sealed: implemented for `rusqlite::Connection` only.
pub trait GuardExt: sealed::Sealed {
    /// The guard's status. Runs the retirement check now.
    ///
    /// Fails with [`GuardError::NotGuarded`] on a connection not opened through the guard.
    fn guard_status(&self) -> Result<GuardStatus, GuardError>;

    /// Makes sure that, if the connection's generation is retired, it is captured; returns the
    /// status.
    ///
    /// Fails with [`GuardError::Capture`] when the capture cannot be written: the connection then
    /// keeps its descriptors so a retry can still succeed.
    fn ensure_captured(&self) -> Result<GuardStatus, GuardError>;

    /// What `err`, returned by this connection, means for the application.
    fn classify(&self, err: &rusqlite::Error) -> ErrorClass;

    /// Captures the retired generation whose WAL inode is `wal` (as [`GuardStatus::wal`]
    /// reported it), from the descriptor the connection holds; returns the capture's directory.
    ///
    /// Never guesses by pathname: for an identity the connection does not hold it fails with
    /// [`CaptureError::NotHeld`] and writes nothing; a live generation is not captured
    /// ([`CaptureError::NotRetired`]: a capture stands for its generation, and would miss every
    /// later commit), nor one whose WAL holds no frame ([`CaptureError::NothingAtStake`]).
    fn capture_retired_generation(&self, wal: FileId) -> Result<PathBuf, GuardError>;

    /// Whether the guard has retired this connection's generation, as far as it knows now: the
    /// flag its write path refuses by, read as it stands — no check, no SQL, no system call, no
    /// lock of the guard's (cheap enough for a pool's `has_broken`: `pool::GuardedManager`, cargo
    /// feature `r2d2`).
    ///
    /// Sticky once `true`. Until a write, a checkpoint, the close or [`GuardExt::guard_status`]
    /// of this connection runs the check that sees a loss, it stays `false`: a connection that
    /// only reads may sit on a lost generation with the flag down (the status checks). `false`
    /// on a connection not opened through the guard.
    fn is_retired(&self) -> bool;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for rusqlite::Connection {}
}

impl GuardExt for Connection {
    fn guard_status(&self) -> Result<GuardStatus, GuardError> {
        guard_pragma(self, "hermes_guard_status")
    }

    fn ensure_captured(&self) -> Result<GuardStatus, GuardError> {
        guard_pragma(self, "hermes_guard_capture")
    }

    fn classify(&self, err: &rusqlite::Error) -> ErrorClass {
        let reason = self.guard_status().ok().and_then(|s| s.reason);
        ErrorClass::from_parts(err, reason)
    }

    fn is_retired(&self) -> bool {
        vfs::retired_flag(self).unwrap_or(false)
    }

    fn capture_retired_generation(&self, wal: FileId) -> Result<PathBuf, GuardError> {
        let database = PathBuf::from(self.path().unwrap_or_default());
        let status = self.guard_status()?;
        if status.wal != Some(wal) {
            return Err(CaptureError::NotHeld {
                database,
                identity: wal,
            }
            .into());
        }
        if !status.retired {
            return Err(CaptureError::NotRetired { database }.into());
        }
        match self.ensure_captured()?.capture {
            Some(dir) => Ok(dir),
            None => Err(CaptureError::NothingAtStake { database }.into()),
        }
    }
}

/// Closes `conn`, but only once a retired generation is safely captured. On failure the
/// connection is handed back, still open, so the caller can retry.
// The shape of `rusqlite::Connection::close`, so callers can treat both alike.
#[allow(clippy::result_large_err)]
pub fn close(conn: Connection) -> Result<(), (Connection, GuardError)> {
    if let Err(e) = conn.ensure_captured() {
        if !matches!(e, GuardError::NotGuarded { .. }) {
            return Err((conn, e));
        }
    }
    conn.close()
        .map_err(|(conn, e)| (conn, GuardError::Sqlite(e)))
}

/// Retries the captures of retired generations whose connections were closed (dropped) while
/// their capture could not be written. Returns how many remain uncaptured.
pub fn retry_pending_captures() -> usize {
    vfs::retry_pending_captures()
}

/// Runs one of the guard's pragmas on `conn`'s main database and reads its JSON status. A
/// capture failure comes back as the [`CaptureError`] the VFS kept on this thread.
fn guard_pragma(conn: &Connection, pragma: &str) -> Result<GuardStatus, GuardError> {
    let database = || PathBuf::from(conn.path().unwrap_or_default());
    let json: Option<String> =
        match conn.query_row(&format!("PRAGMA main.{pragma}"), [], |r| r.get(0)) {
            Ok(json) => Some(json),
            Err(rusqlite::Error::QueryReturnedNoRows) => None,
            Err(rusqlite::Error::SqliteFailure(e, Some(message)))
                if e.code == rusqlite::ErrorCode::Unknown =>
            {
                let database = database();
                return Err(match capture::take_handed_over(&database) {
                    Some(typed) => GuardError::Capture(typed),
                    None => GuardError::CaptureRefused { database, message },
                });
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

/// Sets `conn`'s busy timeout with `PRAGMA busy_timeout`, which every SQLite has. rusqlite 0.43's
/// `Connection::busy_timeout` goes through `sqlite3_set_clientdata` (SQLite 3.44), so a program
/// calling it cannot even link against an older system SQLite (Debian 12's 3.40.1) when built
/// without `bundled`; recovery and the session store set theirs with this one.
pub fn set_busy_timeout(conn: &Connection, timeout: std::time::Duration) -> rusqlite::Result<()> {
    let ms = i64::try_from(timeout.as_millis())
        .unwrap_or(i64::MAX)
        .min(i64::from(i32::MAX));
    conn.pragma_update(None, "busy_timeout", ms)
}

/// Hooks for this crate's own tests (the `test-hooks` feature); not part of the API.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod test_hooks {
    pub use crate::capture::base_file::read as read_base_pages;
    pub use crate::capture::BasePages;
    pub use crate::identity::identity_of_path;
    pub use crate::testing::capture_faults::{clear_capture_fault, inject_capture_fault};
    pub use crate::walfile::{parse_main_header, summarize_wal, WalScanner, WalSummary};
}

/// The connection explorer's fault switches (the `explore-faults` feature); not part of the API.
#[cfg(feature = "explore-faults")]
#[doc(hidden)]
pub use testing::explore_faults;
mod testing;

/// The README's code blocks, compiled by `cargo test` so its example keeps up with the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// docs/hosts.md's code blocks (the README's hosts in full), compiled likewise.
#[cfg(doctest)]
#[doc = include_str!("../docs/hosts.md")]
struct HostsDoctests;
