//! Directory watches that let a write transaction skip its three `stat` calls when nothing on the
//! database's path has changed since the last full check.
//!
//! One non-blocking inotify instance per process watches each directory that holds a guarded
//! database. Unlinks, renames and creations in a directory are queued on that instance by the
//! kernel inside the very syscall that makes them. Mounts and unmounts change what a path means
//! without any inotify event, so the instance sits in an epoll set together with an open
//! `/proc/self/mountinfo`, which polls `EPOLLPRI` once after each change of the mount table. A
//! transaction start asks that set (one `epoll_wait` with a zero timeout, normally empty), which is
//! as current as a `stat` would be — the fast path adds no window a `stat` does not have — and
//! reads the inotify queue only when it is ready. Any event in a directory bumps its generation; a
//! mount-table change bumps every generation; a connection whose last full check saw the current
//! generation knows its names still resolve to what it pinned. Everything else falls back to the
//! full check: an event, a queue overflow, a filesystem whose changes may come from elsewhere
//! (network, FUSE), no inotify, epoll or mountinfo at all.
//!
//! The instance, the epoll set and the mountinfo descriptor are open file descriptions that a
//! `fork` shares between parent and child. A child must never read, change or remove anything in
//! its parent's: every entry point first looks at a `MADV_WIPEONFORK` page (it reads as zero in a
//! forked child, no syscall), and a child forgets the inherited watcher without touching its
//! descriptors and makes its own on its next open. Each `DirWatch` carries the epoch of the
//! watcher that made it, so one inherited from the parent never vouches in the child and its drop
//! releases nothing.

use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::fs::inotify::WatchFlags;

mod epoll_wait;
mod fast;
mod names;
mod page;
mod watcher;

pub(crate) use self::fast::FastWatch;
pub(crate) use self::names::Creations;
pub(in crate::vfs) use self::page::install_child_hook;

use self::page::Shared;
use self::watcher::Watcher;

/// A watched directory: the generation moves whenever anything in it is created, deleted or
/// renamed, or the directory itself or any directory above it is moved or deleted. (A restore
/// that swaps `/srv/app` for a new tree changes what `/srv/app/data/state.db` resolves to
/// without any event inside `data`.)
pub(crate) struct DirWatch {
    /// The epoch of the watcher that made it: only that watcher, in this process, may vouch for
    /// it or release it.
    epoch: u64,
    /// That watcher's epoll set, for the lock-free fast path ([`FastWatch::current_fast`]). The
    /// descriptor stays open for the life of the process that made it: a `Watcher` is never
    /// dropped (`STATE` leaves `Ready` only through `forget_inherited`, which leaks it).
    epoll: RawFd,
    /// That watcher's wipe-on-fork page (never unmapped).
    shared: &'static Shared,
    /// The kernel was seen to honour the page's wipe ([`Watcher::wipe_honoured`]): only then may
    /// the lock-free fast path, which relies on it alone, vouch.
    wipe_honoured: bool,
    /// The database's directory first, then each of its ancestors up to `/`. SQLite hands the
    /// VFS a path with its symbolic links resolved, so these are the directories a `stat` of it
    /// walks through.
    entries: Vec<Arc<Entry>>,
}

struct Entry {
    dir: PathBuf,
    wd: i32,
    generation: AtomicU64,
    /// Still the watch of the directory `dir` names (not moved, deleted or dropped by the
    /// kernel). Once false, for good: its users fall back to full checks.
    current: AtomicBool,
    /// The creations of the tracked databases' names here (`names.rs`): whether a capture's image
    /// is its own generation's base.
    names: names::Names,
}

enum State {
    Uninit,
    Ready(Watcher),
    /// No inotify, epoll or mountinfo here: every check is a full one.
    Unavailable,
}

static STATE: Mutex<State> = Mutex::new(State::Uninit);

/// The last epoch handed to a watcher.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// `epoll` data of the two descriptors in the set.
const INOTIFY_READY: u64 = 1;
const MOUNTS_CHANGED: u64 = 2;

/// Forgets a watcher inherited across `fork` without touching it: its descriptors are the
/// parent's inotify instance, epoll set and mountinfo (reading them would take the parent's
/// events; removing a watch would blind the parent), and closing them is not safe either (a child
/// that closed every inherited descriptor may have reused their numbers). Leaked, once per fork.
/// No syscall: the fork marker is a memory read.
#[inline]
fn forget_inherited(state: &mut State) {
    if let State::Ready(watcher) = state {
        // The page first (one load; wiped by the kernel or by the atfork handler), then the
        // fork epoch and the pid (a raw `clone` child whose kernel did not wipe the page).
        if !watcher.shared.same_process() || !watcher.origin.current() {
            log::debug!("hermes-guard: forked child; the parent's directory watches are not used");
            if let State::Ready(inherited) = std::mem::replace(state, State::Uninit) {
                std::mem::forget(inherited);
            }
        }
    }
}

const DIR_EVENTS: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

/// On an ancestor only its own move or deletion matters: its other entries are not on the path.
const ANCESTOR_EVENTS: WatchFlags = WatchFlags::DELETE_SELF
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

impl DirWatch {
    /// Watches `dir` and its ancestors, or `None` when its changes cannot be trusted to show up
    /// here.
    pub(crate) fn new(dir: &Path) -> Option<DirWatch> {
        if !local_filesystem(dir) {
            return None;
        }
        Self::new_local(dir)
    }

    /// [`DirWatch::new`] for a directory the caller knows to be on a local filesystem
    /// ([`crate::filesystem::Filesystem::local`]).
    pub(crate) fn new_local(dir: &Path) -> Option<DirWatch> {
        let mut state = STATE.lock();
        forget_inherited(&mut state);
        if matches!(*state, State::Uninit) {
            *state = match Watcher::new() {
                Some(w) => State::Ready(w),
                None => State::Unavailable,
            };
        }
        let State::Ready(watcher) = &mut *state else {
            return None;
        };
        // Events already queued may say a path's watch is stale (its directory moved away).
        watcher.drain();
        let mut entries = Vec::new();
        for (i, path) in dir.ancestors().enumerate() {
            let events = if i == 0 { DIR_EVENTS } else { ANCESTOR_EVENTS };
            match watcher.watch(path, events) {
                Some(entry) => entries.push(entry),
                None => {
                    watcher.release(&entries);
                    return None;
                }
            }
        }
        Some(DirWatch {
            epoch: watcher.epoch,
            epoll: watcher.epoll.as_raw_fd(),
            shared: watcher.shared,
            wipe_honoured: watcher.wipe_honoured,
            entries,
        })
    }

    /// The watcher-wide change count; read by a full check before its drain and its `stat`s
    /// (see [`FastWatch::current_fast`]).
    #[inline]
    pub(crate) fn changes(&self) -> u64 {
        self.shared.changes.load(Ordering::Acquire)
    }

    /// The lock-free half of this watch, for the transaction start's fast path; none (never
    /// vouches: every transaction start asks [`DirWatch::current`], which checks the pid) where
    /// the wipe-on-fork page could not be proven to work.
    pub(crate) fn fast(&self) -> FastWatch {
        if !self.wipe_honoured {
            return FastWatch::NONE;
        }
        FastWatch {
            shared: self.shared,
            epoll: self.epoll,
        }
    }

    /// The sum of the path's generations, `None` if a watch on it can no longer vouch.
    #[inline]
    /// The generation as the last drain left it (no `epoll_wait`): right after
    /// [`DirWatch::new_local`], which drains, what [`DirWatch::current`] would say.
    pub(crate) fn generation_as_drained(&self) -> Option<u64> {
        self.sum()
    }

    fn sum(&self) -> Option<u64> {
        let mut sum = 0u64;
        for entry in &self.entries {
            // A removed watch (directory deleted or unmounted), or one on a directory its path
            // no longer names: never vouch again.
            if !entry.current.load(Ordering::Acquire) {
                return None;
            }
            // Generations only grow, so an event anywhere on the path changes the sum.
            sum = sum.wrapping_add(entry.generation.load(Ordering::Acquire));
        }
        Some(sum)
    }

    /// A figure that changes whenever the directory or one above it changed, or the mount table
    /// did, after draining every queued event; `None` when the watch cannot vouch for the path
    /// (the caller then does a full check).
    #[inline]
    pub(crate) fn current(&self) -> Option<u64> {
        self.after_drain(DirWatch::sum)
    }

    /// `then` of this watch once its watcher drained every queued event; `None` without a
    /// watcher, or in a forked child (made by the parent's watcher: never vouches here).
    #[inline]
    pub(super) fn after_drain<R>(&self, then: impl FnOnce(&DirWatch) -> Option<R>) -> Option<R> {
        let mut state = STATE.lock();
        forget_inherited(&mut state);
        let State::Ready(watcher) = &mut *state else {
            return None;
        };
        if watcher.epoch != self.epoch {
            return None;
        }
        watcher.drain();
        then(self)
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        let mut state = STATE.lock();
        forget_inherited(&mut state);
        match &mut *state {
            State::Ready(watcher) if watcher.epoch == self.epoch => watcher.release(&self.entries),
            // Inherited from a parent (whose instance is not ours to change), or its watcher is
            // gone: nothing of this process to release.
            _ => {}
        }
    }
}

/// Filesystems whose every change passes through this kernel, so inotify sees it
/// (`crate::filesystem`'s classification, remembered per device).
pub(super) fn local_filesystem(dir: &Path) -> bool {
    crate::filesystem::of_dir(dir).is_some_and(|f| f.local)
}
