//! The lock-free half of a directory watch: the transaction start's fast path, which asks the
//! watcher's epoll set without its mutex.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::epoll_wait::epoll_first_ready;
use super::page::{Shared, NO_WATCH};
#[cfg(doc)]
use super::DirWatch;

/// The lock-free half of a [`DirWatch`]: its watcher's wipe-on-fork page and epoll descriptor,
/// copied out so that the fast path borrows nothing. Both live for the rest of the process that
/// made them (see `DirWatch::epoll`). No watch ([`FastWatch::NONE`]) is a page whose gate word
/// is 0, as a forked child's reads: its drain lock is never taken, so it never vouches, and the
/// fast path needs no test of its own for it.
#[derive(Clone, Copy)]
pub(crate) struct FastWatch {
    pub(super) shared: &'static Shared,
    /// The epoll descriptor; used only once `shared`'s drain lock is taken (never for NONE's).
    pub(super) epoll: RawFd,
}

impl FastWatch {
    /// No watch: never vouches.
    pub(crate) const NONE: FastWatch = FastWatch {
        shared: &NO_WATCH,
        epoll: -1,
    };

    /// The transaction start's fast path: whether nothing changed since the change count was
    /// `verified` (a connection's, changed only by its own calls), without the watcher's mutex and without anything that can panic (it runs
    /// outside `catch_unwind`), for the common case — this process made the watch, no other
    /// thread is draining, and the epoll set has nothing ready. `false` means "ask
    /// [`DirWatch::current`]": no watch, a forked child, a drain in progress, readiness this
    /// call took from the set (left pending in the gate word for the next drain to handle), or a
    /// change count other than `verified` (some watch moved; [`DirWatch::current`] tells whether
    /// it is on this path).
    ///
    /// Sound because every readiness is handled under the drain lock, which this holds too: an
    /// event that left the set before this `epoll_wait` has either moved `changes` already or
    /// sits in the gate word's pending bits.
    ///
    /// Panic-free: atomics and one `epoll_wait` ([`epoll_first_ready`]: the raw syscall and one
    /// test of its result on x86_64, rustix's call elsewhere).
    #[inline(always)]
    pub(crate) fn current_fast(&self, verified: &AtomicU64) -> bool {
        let FastWatch { shared, epoll } = *self;
        // One compare-exchange stands for four tests: there is a watch (NONE's gate word is 0),
        // this is the process that made the page (the gate word of a forked child reads 0),
        // nobody is draining, nothing is pending.
        let Some(held) = shared.try_lock_fast() else {
            return false;
        };
        // A page whose drain lock was taken is a live watcher's (NONE's never is): `epoll` is its
        // epoll descriptor, open for the rest of this process (see `DirWatch::epoll`).
        let ready = epoll_first_ready(epoll, &held);
        if ready == 0 {
            // Loaded after the syscall rather than before: nothing needs to be kept across it.
            let vouched =
                held.page().changes.load(Ordering::Acquire) == verified.load(Ordering::Acquire);
            held.unlock(0);
            vouched
        } else {
            // Taken from the set (mountinfo's readiness resets when reported): left pending in
            // the gate word for the next drain, before anybody's check can vouch again.
            held.unlock(ready);
            false
        }
    }

    /// [`FastWatch::current_fast`] as of the last drain, with no `epoll_wait`: nothing pending,
    /// nobody draining, and no change counted since `verified`. An event the kernel queued since
    /// the last drain is not seen here; the next `current_fast` sees it. Atomics only.
    #[inline]
    pub(crate) fn current_as_of_last_drain(&self, verified: &AtomicU64) -> bool {
        let FastWatch { shared, .. } = *self;
        let Some(held) = shared.try_lock_fast() else {
            return false;
        };
        let vouched = shared.changes.load(Ordering::Acquire) == verified.load(Ordering::Acquire);
        held.unlock(0);
        vouched
    }
}
