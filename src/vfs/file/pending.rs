//! Retired main files SQLite has closed whose generation is not captured yet: held, and retried
//! (per generation, with a back-off) at every open and close and on the application's request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::ffi;

use super::*;
use crate::capture::Trigger;
use crate::vfs::state::DbState;

/// Retired main files SQLite has closed but whose generation is not captured yet.
pub(super) static PENDING: Mutex<Vec<(Arc<DbState>, HeapFile)>> = Mutex::new(Vec::new());
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
pub(crate) fn retry_pending_captures(caller: Caller) -> usize {
    let close_now = caller == Caller::Sqlite || !single_threaded_sqlite();
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
    let mut kept = Vec::new();
    for (state, held) in pending.drain(..) {
        // The application asked: at once. Inside SQLite's calls (every open and close of any
        // database): only the generations whose back-off has passed (`retry.rs`).
        let attempt = match caller {
            Caller::Application => state.ensure_captured(Trigger::Close),
            Caller::Sqlite => state.retry_capture(),
        };
        // Captured, or let go (its directory deleted): the held file goes either way.
        match attempt {
            Ok(_) => {
                state.main_closed();
                if close_now {
                    held.close();
                } else {
                    let mut later = CLOSE_LATER.lock();
                    later.push(held);
                    CLOSE_LATER_COUNT.store(later.len(), Ordering::Release);
                }
            }
            Err(_) => kept.push((state, held)),
        }
    }
    *pending = kept;
    PENDING_COUNT.store(pending.len(), Ordering::Release);
    pending.len()
}

/// The retired generations this process holds uncaptured, and the descriptors held for them
/// (each held main file, and its pinned WAL while the state keeps it): for the status.
pub(crate) fn held() -> (usize, usize) {
    if PENDING_COUNT.load(Ordering::Acquire) == 0 {
        return (0, 0);
    }
    let pending = PENDING.lock();
    let descriptors = pending
        .iter()
        .map(|(state, _)| 1 + usize::from(state.holds_wal()))
        .sum();
    (pending.len(), descriptors)
}

/// At a normal process exit (`atexit`, registered with the VFS): one last attempt at every held
/// generation's capture (the fallback capture directory included); each that still fails is said
/// plainly at ERROR — its rows end with the process. Panic-free; skipped if another thread holds
/// the list (a process exiting under a running capture).
pub(crate) extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        crate::vfs::in_use::release_idle_probes();
        if PENDING_COUNT.load(Ordering::Acquire) == 0 || PENDING.is_locked() {
            return;
        }
        if retry_pending_captures(Caller::Application) == 0 {
            return;
        }
        let Some(pending) = PENDING.try_lock() else {
            return;
        };
        for (state, _) in pending.iter() {
            log::error!(
                "hermes-guard: this process is exiting with the retired generation of {} still \
                 uncaptured ({}): the rows it committed after its last checkpoint are LOST with \
                 the process (nothing could be written beside the database nor in the fallback \
                 capture directory, {})",
                state.db_path().display(),
                state.capture_error().unwrap_or_default(),
                crate::capture::fallback::ORPHAN_DIR_ENV
            );
        }
    });
}
