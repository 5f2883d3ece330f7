//! The wipe-on-fork page: the fork marker, the drain lock and the change count every
//! `DirWatch` of one watcher shares, without a mutex.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::event::epoll;

use crate::vfs::fork::{self, PageRef, WipeOnForkPage, ZeroedPage};

/// The start of the wipe-on-fork page: what the fast path of every `DirWatch` of one watcher
/// shares. All zero in a forked child (`MADV_WIPEONFORK`), whatever it was in the parent.
#[repr(C)]
pub(super) struct Shared {
    /// 1 in the process that made the page.
    pub(super) alive: AtomicU64,
    /// The drain lock and the readiness a fast path took from the set and left for the next
    /// drain, in one word: [`GATE_FREE`] or [`GATE_HELD`], and the pending readiness
    /// (`INOTIFY_READY | MOUNTS_CHANGED`) shifted by [`PENDING_SHIFT`]. 0 (neither free nor
    /// held) only in a forked child, where the page was wiped. The lock is held across every
    /// `epoll_wait` on the set and the handling of what it returned.
    pub(super) gate: AtomicU64,
    /// Moves whenever any watch of this watcher can vouch for less than before: a generation
    /// moved, or an entry stopped being current. One load tells the fast path that nothing
    /// changed anywhere since a full check, without walking a path's entries.
    pub(super) changes: AtomicU64,
    /// The fast path's event slot: written by the kernel (and read) only by the thread holding
    /// the drain lock in `gate`. Here rather than on the fast path's stack, so that the fast
    /// path has no stack frame and its caller can reach the lock with a tail call.
    pub(super) slot: UnsafeCell<[MaybeUninit<epoll::Event>; 1]>,
}

// SAFETY: every field but `slot` is an atomic; `slot` is only used by the holder of the drain
// lock (see `FastWatch::current_fast`), one thread at a time.
unsafe impl Sync for Shared {}

/// The drain lock is free (and the page is this process's).
pub(super) const GATE_FREE: u64 = 1;
/// The drain lock is held.
pub(super) const GATE_HELD: u64 = 2;
/// Where the pending readiness sits in the gate word.
pub(super) const PENDING_SHIFT: u32 = 2;

/// The page of `FastWatch::NONE` (no watch): all zero for ever, as a forked child reads a page
/// (neither free nor held), so its drain lock is never taken.
pub(super) static NO_WATCH: Shared = Shared {
    alive: AtomicU64::new(0),
    gate: AtomicU64::new(0),
    changes: AtomicU64::new(0),
    slot: UnsafeCell::new([MaybeUninit::uninit()]),
};

impl Shared {
    #[inline]
    pub(super) fn same_process(&self) -> bool {
        self.alive.load(Ordering::Acquire) == 1
    }

    /// The fast path's lock: taken only when the lock is free and nothing is pending (and so
    /// never in a forked child, whose word reads 0).
    #[inline]
    pub(super) fn try_lock_fast(&self) -> Option<FastHeld<'_>> {
        self.gate
            .compare_exchange(GATE_FREE, GATE_HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(FastHeld(self))
    }

    /// Releases the drain lock, leaving `pending` readiness for the next drain.
    #[inline]
    fn unlock_drain(&self, pending: u64) {
        self.gate
            .store(GATE_FREE | pending << PENDING_SHIFT, Ordering::Release);
    }

    /// Waits for the drain lock (fast paths hold it for one syscall) and takes what is pending;
    /// released when the guard drops, unwinding included. Only called by the watcher of this
    /// process (its page is not wiped: the word is never 0 here).
    pub(super) fn lock_drain(&self) -> DrainGuard<'_> {
        loop {
            let word = self.gate.load(Ordering::Relaxed);
            if word & GATE_FREE != 0
                && self
                    .gate
                    .compare_exchange(word, GATE_HELD, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return DrainGuard {
                    shared: self,
                    pending: word >> PENDING_SHIFT,
                };
            }
            std::thread::yield_now();
        }
    }
}

/// The drain lock, taken by a fast path ([`Shared::try_lock_fast`]): only this thread uses the
/// page's event slot while it exists. Released explicitly ([`FastHeld::unlock`]), with what the
/// fast path leaves pending; nothing on the fast path unwinds.
pub(super) struct FastHeld<'a>(&'a Shared);

impl FastHeld<'_> {
    /// The page's event slot, this thread's while the lock is held.
    #[inline(always)]
    pub(super) fn slot(&self) -> *mut [MaybeUninit<epoll::Event>; 1] {
        self.0.slot.get()
    }

    #[inline(always)]
    pub(super) fn page(&self) -> &Shared {
        self.0
    }

    /// Releases the drain lock, leaving `pending` readiness for the next drain.
    #[inline(always)]
    pub(super) fn unlock(self, pending: u64) {
        self.0.unlock_drain(pending);
    }
}

/// The drain lock, and the readiness that was pending when it was taken (handled by the
/// holder: the lock is released with nothing pending).
pub(super) struct DrainGuard<'a> {
    pub(super) shared: &'a Shared,
    pub(super) pending: u64,
}

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        self.shared.unlock_drain(0);
    }
}

// SAFETY: all-zero bytes are a valid `Shared` (atomics at 0, an uninitialised slot), which is
// `Sync` (above) and far smaller than a page, aligned to 8.
unsafe impl ZeroedPage for Shared {}

/// The page of this process's current watcher, for [`wipe_in_child`].
pub(super) static CURRENT_PAGE: PageRef<Shared> = PageRef::none();

/// In a forked child (the atfork handler runs it, registered by [`install_child_hook`]): wipes the current
/// watcher's page as `MADV_WIPEONFORK` would, so that nothing of the parent's watcher vouches or
/// drains here. Atomics only (async-signal-safe); earlier pages were wiped in their own turn.
fn wipe_in_child() {
    if let Some(page) = CURRENT_PAGE.get() {
        page.alive.store(0, Ordering::Release);
        page.gate.store(0, Ordering::Release);
    }
}

/// A watcher's wipe-on-fork page, live (the drain lock free, `alive` 1); `None` when the page
/// cannot be had. The page is unmapped when dropped: [`WipeOnForkPage::leak`] keeps it for the
/// watcher, which is never dropped.
pub(super) fn new_page() -> Option<WipeOnForkPage<Shared>> {
    let page = WipeOnForkPage::<Shared>::map()?;
    if !page.honoured() {
        log::warn!(
            "hermes-guard: madvise(MADV_WIPEONFORK) is accepted here but not applied (an \
             emulator such as qemu-user?): the lock-free check at transaction start is off, \
             and each write transaction asks the directory watcher under its lock instead"
        );
    }
    // A forked child's copy reads all zero again.
    page.get().gate.store(GATE_FREE, Ordering::Release);
    page.get().alive.store(1, Ordering::Release);
    Some(page)
}

/// The page becomes the current watcher's: the atfork handler wipes it in a child
/// ([`install_child_hook`]).
pub(super) fn make_current(page: &'static Shared) {
    CURRENT_PAGE.set(Some(page));
}

/// Registers the wipe of the current watcher's page in a forked child ([`wipe_in_child`]): once,
/// at the guard's registration, before any watcher exists (not at the first watcher, where a
/// fork from another thread could leave the child a registration stuck half-way).
pub(in crate::vfs) fn install_child_hook() {
    fork::on_child(wipe_in_child);
}
