//! Retired main files SQLite has closed whose generation is not captured yet: held, and retried
//! (per generation, with a back-off) at every open and close and on the application's request.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Caller, Held, HeldFile, HeldState};
use crate::capture::Trigger;
use crate::vfs::fork::Origin;

/// Retired main files SQLite has closed but whose generation is not captured yet.
static PENDING: Mutex<Vec<Held>> = Mutex::new(Vec::new());
static PENDING_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Held main files whose generation is captured but whose close waits for the next call from
/// inside SQLite: in an `SQLITE_THREADSAFE=0` build the unix VFS's close edits its inode list with
/// no mutex, so it may only run on a thread SQLite is running on (see
/// [`super::retry_pending_captures`]).
static CLOSE_LATER: Mutex<Vec<Box<dyn HeldFile>>> = Mutex::new(Vec::new());
static CLOSE_LATER_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The main file `file` of `state`, closed by SQLite with its retired generation uncaptured:
/// held by this process, its capture retried.
pub(crate) fn hold(state: Arc<dyn HeldState>, file: Box<dyn HeldFile>) {
    push(Held {
        state,
        file,
        owner: Origin::here(),
    });
}

/// A held main file into the list (a WAL left for an opener and taken away, whose capture failed).
pub(super) fn push(held: Held) {
    let mut pending = PENDING.lock();
    pending.push(held);
    PENDING_COUNT.store(pending.len(), Ordering::Release);
}

/// [`super::retry_pending_captures`] over this list; `close_now`: a captured one's file is closed
/// at once, else parked until SQLite's next open or close.
pub(super) fn retry(caller: Caller, close_now: bool) -> usize {
    if close_now && CLOSE_LATER_COUNT.load(Ordering::Acquire) > 0 {
        let parked = std::mem::take(&mut *CLOSE_LATER.lock());
        CLOSE_LATER_COUNT.store(0, Ordering::Release);
        for held in parked {
            held.close_held();
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
            file.close_held();
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
pub(crate) fn counts() -> (usize, usize) {
    if PENDING_COUNT.load(Ordering::Acquire) == 0 {
        return (0, 0);
    }
    let pending = PENDING.lock();
    let mine = || pending.iter().filter(|e| e.owner.current());
    let descriptors = mine().map(|e| 1 + usize::from(e.state.holds_wal())).sum();
    (mine().count(), descriptors)
}

/// The last attempt at every generation of this list (see [`super::at_exit`]).
pub(super) fn at_exit() {
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
        let _ = catch_unwind(AssertUnwindSafe(|| say_lost(&*entry.state, &why)));
    }
}

/// The plain ERROR line of a generation that ends uncaptured with the process.
fn say_lost(state: &dyn HeldState, why: &str) {
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
