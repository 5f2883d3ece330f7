//! The process-wide lists of main files held past SQLite's close, in a room below the shim's
//! callbacks (`file/`) and the connection's state (`state/`): each entry is a connection's state
//! and its main file object, seen through [`HeldState`] and [`HeldFile`] (which `file/held.rs`
//! implements), so this room names neither.
//!
//! - `pending.rs`: retired main files whose generation is not captured yet, and their retries;
//! - `for_opener.rs`: main files whose close left their WAL for an opener of this process inside
//!   its open (`state/left.rs`), settled into the pending list when their WAL was taken away.
//!
//! This file: the entry, and what runs over both lists (the retry at every open and close and
//! on the application's request, and the last attempt at the process's exit).

use std::panic::catch_unwind;
use std::path::Path;
use std::sync::Arc;

use crate::capture::{CaptureError, Trigger};
use crate::identity::FileId;
use crate::vfs::boundary::single_threaded_sqlite;
use crate::vfs::fork::Origin;

mod for_opener;
mod pending;

pub(crate) use self::for_opener::{leave, settle_for_opener};
pub(crate) use self::pending::{counts, hold};

/// What the held lists need of a held main file's connection state (its `ConnectionState`).
pub(crate) trait HeldState: Send + Sync {
    fn db_path(&self) -> &Path;
    fn main_id(&self) -> Option<FileId>;
    /// Whether the WAL's pin holds a descriptor of it (one more held descriptor).
    fn holds_wal(&self) -> bool;
    /// Captures the retired generation at once (`Ok` also when nothing is at stake).
    fn ensure_captured(&self, trigger: Trigger) -> Result<(), CaptureError>;
    /// [`HeldState::ensure_captured`] once the back-off has passed.
    fn retry_capture(&self) -> Result<(), CaptureError>;
    /// Why the last capture failed, if it did.
    fn capture_error(&self) -> Option<String>;
    /// The held main file is let go.
    fn main_released(&self);
    /// An opener of this process is still inside its open, for which the WAL was left.
    fn opener_inside_its_open(&self) -> bool;
    /// The WAL left for an opener was taken away (gone from the path with frames the main file
    /// does not hold).
    fn left_wal_taken_away(&self) -> bool;
    /// The pins vouch for nothing any more: the generation is retired (the check made now).
    fn pins_retired(&self) -> bool;
}

/// A held main file object, closed (and freed) once its list lets it go.
pub(crate) trait HeldFile: Send {
    fn close_held(self: Box<Self>);
}

/// A held main file: its database's state, the file, and the process that holds it (a forked
/// child inherits the lists but none of their generations).
struct Held {
    state: Arc<dyn HeldState>,
    file: Box<dyn HeldFile>,
    owner: Origin,
}

/// Where a retry of the pending captures is made from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Inside one of SQLite's calls into the VFS (an open or a close): SQLite's own thread.
    Sqlite,
    /// The application (`hermes_guard::retry_pending_captures`), on any thread.
    Application,
}

/// Retries the capture of every held retired generation; returns how many are still uncaptured.
/// A held file whose capture is written is closed at once, except from the application's thread
/// in an `SQLITE_THREADSAFE=0` build, where its close waits for SQLite's next open or close (the
/// capture itself only reads through the held file object, which SQLite no longer uses).
/// Generations another process holds (this is its forked child) are left alone: not retried,
/// not counted.
pub(crate) fn retry_pending_captures(caller: Caller) -> usize {
    let close_now = caller == Caller::Sqlite || !single_threaded_sqlite();
    // WALs left for an opener that can no longer come (`for_opener.rs`): settled from SQLite's
    // thread (their main file objects may be closed).
    if caller == Caller::Sqlite || !single_threaded_sqlite() {
        for_opener::settle_unawaited();
    }
    pending::retry(caller, close_now)
}

/// At a normal process exit (`atexit`, registered with the VFS): one last attempt at every held
/// generation's capture (the fallback capture directory included); each that still fails is said
/// plainly at ERROR, on its own line — its rows end with the process. Only the process that holds
/// a generation speaks for it (a forked child that exits says nothing about its parent's).
/// Nothing here touches thread-local storage (it may be torn down already): each entry carries
/// what it needs. Panic-free, entry by entry; skipped if another thread holds the list (a process
/// exiting under a running capture). The held files are not closed: the process is ending.
pub(crate) extern "C" fn at_exit() {
    // Probe descriptors of `-shm`s nobody holds any more are closed.
    let _ = catch_unwind(crate::vfs::in_use::release_idle_probes);
    // A WAL a close left for an opener of this process, and taken away since, is captured.
    let _ = catch_unwind(for_opener::at_exit);
    let _ = catch_unwind(pending::at_exit);
}
