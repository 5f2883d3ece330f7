//! Retired main files SQLite has closed whose generation is not captured yet: held, and retried
//! (per generation, with a back-off) at every open and close and on the application's request.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::ffi;

use super::*;
use crate::capture::Trigger;
use crate::vfs::fork::Origin;
use crate::vfs::state::DbState;

/// Retired main files SQLite has closed but whose generation is not captured yet.
pub(super) static PENDING: Mutex<Vec<Held>> = Mutex::new(Vec::new());
/// A held main file: its database's state, the file, and the process that holds it (a forked
/// child inherits the list but none of its generations).
pub(super) struct Held {
    pub(super) state: Arc<DbState>,
    pub(super) file: HeapFile,
    pub(super) owner: Origin,
}

pub(super) static PENDING_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Held main files whose generation is captured but whose close waits for the next call from
/// inside SQLite: in an `SQLITE_THREADSAFE=0` build the unix VFS's close edits its inode list with
/// no mutex, so it may only run on a thread SQLite is running on (see [`retry_pending_captures`]).
pub(super) static CLOSE_LATER: Mutex<Vec<HeapFile>> = Mutex::new(Vec::new());
pub(super) static CLOSE_LATER_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Where a retry of the pending captures is made from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Inside one of SQLite's calls into the VFS (an open or a close): SQLite's own thread.
    Sqlite,
    /// The application (`hermes_guard::retry_pending_captures`), on any thread.
    Application,
}

/// Whether the SQLite the guard runs in has no mutexes at all (`SQLITE_THREADSAFE=0`).
pub(super) fn single_threaded_sqlite() -> bool {
    // SAFETY: sqlite3_threadsafe only returns a compile-time constant.
    unsafe { ffi::sqlite3_threadsafe() == 0 }
}

/// Retries the capture of every held retired generation; returns how many are still uncaptured.
/// A held file whose capture is written is closed at once, except from the application's thread
/// in an `SQLITE_THREADSAFE=0` build, where its close waits for SQLite's next open or close (the
/// capture itself only reads through the held file object, which SQLite no longer uses).
/// Generations another process holds (this is its forked child) are left alone: not retried,
/// not counted.
pub(crate) fn retry_pending_captures(caller: Caller) -> usize {
    let close_now = caller == Caller::Sqlite || !single_threaded_sqlite();
    // WALs left for an opener that can no longer come (`held_for_opener.rs`): settled from SQLite's
    // thread (their main file objects may be closed).
    if caller == Caller::Sqlite || !single_threaded_sqlite() {
        super::held_for_opener::settle_unawaited();
    }
    if close_now && CLOSE_LATER_COUNT.load(Ordering::Acquire) > 0 {
        let parked = std::mem::take(&mut *CLOSE_LATER.lock());
        CLOSE_LATER_COUNT.store(0, Ordering::Release);
        for held in parked {
            held.close();
        }
    }
    if PENDING_COUNT.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let mut pending = PENDING.lock();
    // One entry at a time, each staying in the list until it is captured: a failure (or a
    // panic) of one never drops another.
    let mut i = 0;
    while i < pending.len() {
        let entry = &pending[i];
        if !entry.owner.current() {
            i += 1;
            continue;
        }
        // The application asked: at once. Inside SQLite's calls (every open and close of any
        // database): only the generations whose back-off has passed (`retry.rs`).
        let attempt = catch_unwind(AssertUnwindSafe(|| match caller {
            Caller::Application => entry.state.ensure_captured(Trigger::Close),
            Caller::Sqlite => entry.state.retry_capture(),
        }));
        // Captured, or let go (its directory deleted): the held file goes either way.
        if !matches!(attempt, Ok(Ok(_))) {
            i += 1;
            continue;
        }
        let Held { state, file, .. } = pending.swap_remove(i);
        state.main_released();
        if close_now {
            file.close();
        } else {
            let mut later = CLOSE_LATER.lock();
            later.push(file);
            CLOSE_LATER_COUNT.store(later.len(), Ordering::Release);
        }
    }
    PENDING_COUNT.store(pending.len(), Ordering::Release);
    pending.iter().filter(|e| e.owner.current()).count()
}

/// The retired generations this process holds uncaptured, and the descriptors held for them
/// (each held main file, and its pinned WAL while the state keeps it): for the status. A forked
/// child counts none of its parent's.
pub(crate) fn held() -> (usize, usize) {
    if PENDING_COUNT.load(Ordering::Acquire) == 0 {
        return (0, 0);
    }
    let pending = PENDING.lock();
    let mine = || pending.iter().filter(|e| e.owner.current());
    let descriptors = mine().map(|e| 1 + usize::from(e.state.holds_wal())).sum();
    (mine().count(), descriptors)
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
    let _ = catch_unwind(super::held_for_opener::at_exit);
    let _ = catch_unwind(|| {
        if PENDING_COUNT.load(Ordering::Acquire) == 0 {
            return;
        }
        let Some(pending) = PENDING.try_lock() else {
            return;
        };
        for entry in pending.iter().filter(|e| e.owner.current()) {
            let attempt = catch_unwind(AssertUnwindSafe(|| {
                entry.state.ensure_captured(Trigger::Close)
            }));
            let why = match attempt {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the last attempt failed unexpectedly".to_owned(),
            };
            let _ = catch_unwind(AssertUnwindSafe(|| say_lost(&entry.state, &why)));
        }
    });
}

/// The plain ERROR line of a generation that ends uncaptured with the process.
fn say_lost(state: &DbState, why: &str) {
    log::error!(
        "hermes-guard: this process is exiting with the retired generation of {} still \
         uncaptured ({}): the rows it committed after its last checkpoint are LOST with the \
         process (nothing could be written beside the database nor in the fallback capture \
         directory, {})",
        state.db_path().display(),
        state.capture_error().unwrap_or_else(|| why.to_owned()),
        crate::capture::fallback::ORPHAN_DIR_ENV
    );
}
