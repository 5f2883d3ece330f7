//! The main files held for an opener: a close that left its WAL for an opener of this process
//! inside its open (`state/left.rs`) keeps its main file here, pinned. Held as the retired ones
//! are (`pending.rs`), settled by the opener's stale-WAL gate, or at any open or close once no
//! opener may come.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{pending, Held, HeldFile, HeldState};
use crate::capture::Trigger;
use crate::identity::FileId;
use crate::vfs::fork::Origin;

static LEFT: Mutex<Vec<Held>> = Mutex::new(Vec::new());
static LEFT_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The main file `file` of `state`, whose close left its WAL for an opener.
pub(crate) fn leave(state: Arc<dyn HeldState>, file: Box<dyn HeldFile>) {
    let mut left = LEFT.lock();
    left.push(Held {
        state,
        file,
        owner: Origin::here(),
    });
    LEFT_COUNT.store(left.len(), Ordering::Release);
}

/// Before an opener of the main file `main` looks at the WAL (its stale-WAL gate): every WAL left
/// for it is settled — let go when it is still at the path (the opener replays it), captured
/// from the kept descriptor when it was taken away.
pub(crate) fn settle_for_opener(main: FileId) {
    settle(|held| held.state.main_id() == Some(main));
}

/// At any open or close: the WALs left for an opener that can no longer come (it opened its WAL,
/// or closed) are settled as above.
pub(super) fn settle_unawaited() {
    settle(|held| !held.state.opener_inside_its_open());
}

fn settle(due: impl Fn(&Held) -> bool) {
    if LEFT_COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut left = LEFT.lock();
    let mut i = 0;
    while i < left.len() {
        if !left[i].owner.current() || !due(&left[i]) {
            i += 1;
            continue;
        }
        let held = left.swap_remove(i);
        let state = held.state.clone();
        let taken_away =
            catch_unwind(AssertUnwindSafe(|| state.left_wal_taken_away())).unwrap_or(false);
        if !taken_away || !catch_unwind(AssertUnwindSafe(|| state.pins_retired())).unwrap_or(false)
        {
            state.main_released();
            held.file.close_held();
            continue;
        }
        // Taken away: the frames are captured from the kept descriptors, or the generation is
        // held and retried as any retired one (`pending.rs`).
        match catch_unwind(AssertUnwindSafe(|| state.ensure_captured(Trigger::Close))) {
            Ok(Ok(_)) => {
                state.main_released();
                held.file.close_held();
            }
            _ => pending::push(held),
        }
    }
    LEFT_COUNT.store(left.len(), Ordering::Release);
}

/// At the process's exit: a WAL left for an opener and taken away since is captured (the
/// process's last chance); nothing is closed.
pub(super) fn at_exit() {
    if LEFT_COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let Some(left) = LEFT.try_lock() else {
        return;
    };
    for held in left.iter().filter(|h| h.owner.current()) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if held.state.left_wal_taken_away() && held.state.pins_retired() {
                if let Err(e) = held.state.ensure_captured(Trigger::Close) {
                    log::error!(
                        "hermes-guard: this process is exiting, and the WAL {} left with \
                         committed frames for another connection was taken away and cannot be \
                         captured ({e}): its rows are LOST with the process",
                        held.state.db_path().display()
                    );
                }
            }
        }));
    }
}
