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

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::event::epoll;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use super::fork::Origin;

mod epoll_wait;
mod names;
mod page;

pub(crate) use self::names::Creations;

use self::{epoll_wait::*, page::*};

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

struct Watcher {
    /// Unique within a process and its descendants (a child's watchers are made after every one
    /// it inherited, from the copied counter).
    epoch: u64,
    /// The process that made it (see `fork.rs`).
    origin: Origin,
    /// The wipe-on-fork page (`page.rs`, never unmapped): tells a forked child that this
    /// watcher is its parent's, and holds the drain lock and the change count.
    shared: &'static Shared,
    /// The kernel was seen to apply `madvise` advice, so the page is wiped in a child made by a
    /// raw `clone` too.
    wipe_honoured: bool,
    inotify: OwnedFd,
    /// Holds `inotify` (readable) and `mountinfo` (`EPOLLPRI` after a mount-table change).
    epoll: OwnedFd,
    /// `/proc/self/mountinfo`, never read: only polled through `epoll`.
    #[allow(dead_code)] // kept open for its readiness
    mountinfo: OwnedFd,
    /// The watch on the directory each path names now. An entry whose directory was moved or
    /// deleted is dropped from here (its path names something else, or nothing), so a later
    /// open at that path watches the directory that is there then.
    by_dir: HashMap<PathBuf, Arc<Entry>>,
    /// Every live watch: its entry, the events asked for so far, and how many DirWatches use it.
    by_wd: HashMap<i32, (Arc<Entry>, WatchFlags, usize)>,
    buf: Vec<MaybeUninit<u8>>,
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

/// The lock-free half of a [`DirWatch`]: its watcher's wipe-on-fork page and epoll descriptor,
/// copied out so that the fast path borrows nothing. Both live for the rest of the process that
/// made them (see `DirWatch::epoll`). No watch ([`FastWatch::NONE`]) is a page whose gate word
/// is 0, as a forked child's reads: its drain lock is never taken, so it never vouches, and the
/// fast path needs no test of its own for it.
#[derive(Clone, Copy)]
pub(crate) struct FastWatch {
    shared: &'static Shared,
    /// The epoll descriptor; used only once `shared`'s drain lock is taken (never for NONE's).
    epoll: RawFd,
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

/// Directory watches refused for want of `max_user_watches`.
static WATCHES_REFUSED: AtomicU64 = AtomicU64::new(0);

/// A watch the kernel refused: the user's inotify watches (`fs.inotify.max_user_watches`, shared
/// by every process of the user) are used up. Said at WARN at the 1st, 2nd, 4th, ... refusal;
/// the databases in `dir` are checked in full at every transaction start (three `stat`s).
fn out_of_watches(dir: &Path, held_here: usize) {
    let n = WATCHES_REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() {
        let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .map_or_else(|_| "?".into(), |s| s.trim().to_owned());
        log::warn!(
            "hermes-guard: no inotify watch on {}: the user's watches are used up \
             (fs.inotify.max_user_watches = {limit}; this process holds {held_here}); databases \
             there are checked in full at every write transaction (three stat calls) instead of \
             by the watch. Raise the limit (sysctl fs.inotify.max_user_watches) to restore the \
             fast path ({n} refused so far)",
            dir.display()
        );
    }
}

impl Watcher {
    fn new() -> Option<Watcher> {
        let page = new_page()?;
        let unavailable = |what: &str, e: rustix::io::Errno| {
            log::debug!("hermes-guard: {what} unavailable ({e}); full checks everywhere");
        };
        let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| unavailable("inotify", e))
            .ok()?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| unavailable("epoll", e))
            .ok()?;
        let mountinfo = rustix::fs::open(
            "/proc/self/mountinfo",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| unavailable("/proc/self/mountinfo", e))
        .ok()?;
        epoll::add(
            &epoll,
            &inotify,
            epoll::EventData::new_u64(INOTIFY_READY),
            epoll::EventFlags::IN,
        )
        .map_err(|e| unavailable("epoll of inotify", e))
        .ok()?;
        // mountinfo always polls readable; a mount-table change shows as EPOLLPRI (with
        // EPOLLERR), once per change: the poll that reports it resets it.
        epoll::add(
            &epoll,
            &mountinfo,
            epoll::EventData::new_u64(MOUNTS_CHANGED),
            epoll::EventFlags::PRI,
        )
        .map_err(|e| unavailable("epoll of mountinfo", e))
        .ok()?;
        // The watcher is complete (its page is never unmapped from here on): the atfork
        // handler wipes this page in a child.
        let wipe_honoured = page.honoured();
        let shared = page.leak();
        make_current(shared);
        Some(Watcher {
            epoch: EPOCH.fetch_add(1, Ordering::Relaxed) + 1,
            origin: Origin::here(),
            inotify,
            epoll,
            mountinfo,
            shared,
            wipe_honoured,
            by_dir: HashMap::new(),
            by_wd: HashMap::new(),
            buf: vec![MaybeUninit::uninit(); 4096],
        })
    }

    fn is_live(&self, entry: &Arc<Entry>) -> bool {
        self.by_wd
            .get(&entry.wd)
            .is_some_and(|(live, _, _)| Arc::ptr_eq(live, entry))
    }

    /// One more user of the watch on the directory `dir` names now, with at least `events`.
    fn watch(&mut self, dir: &Path, events: WatchFlags) -> Option<Arc<Entry>> {
        let known = self.by_dir.get(dir).filter(|e| self.is_live(e)).cloned();
        let asked = known
            .as_ref()
            .and_then(|e| self.by_wd.get(&e.wd))
            .map(|(_, mask, _)| *mask);
        if asked.is_none_or(|mask| !mask.contains(events)) {
            // MASK_ADD: the inode may already be watched (by another path, or for other
            // events); its watch is widened, never narrowed.
            let wd = match inotify::add_watch(&self.inotify, dir, events | WatchFlags::MASK_ADD) {
                Ok(wd) => wd,
                Err(rustix::io::Errno::NOSPC) => {
                    out_of_watches(dir, self.by_wd.len());
                    return None;
                }
                Err(e) => {
                    log::debug!(
                        "hermes-guard: no inotify watch on {} ({e}); full checks there",
                        dir.display()
                    );
                    return None;
                }
            };
            let entry = match self.by_wd.get_mut(&wd) {
                Some((entry, mask, _)) => {
                    *mask |= events;
                    entry.clone()
                }
                None => {
                    let entry = Arc::new(Entry {
                        dir: dir.to_path_buf(),
                        wd,
                        generation: AtomicU64::new(0),
                        current: AtomicBool::new(true),
                        names: names::Names::default(),
                    });
                    self.by_wd.insert(wd, (entry.clone(), events, 0));
                    entry
                }
            };
            if let Some(old) = self.by_dir.insert(dir.to_path_buf(), entry.clone()) {
                if !Arc::ptr_eq(&old, &entry) {
                    // The path names another directory now.
                    old.current.store(false, Ordering::Release);
                    self.changed();
                }
            }
        }
        let entry = self.by_dir.get(dir)?.clone();
        if let Some((_, _, users)) = self.by_wd.get_mut(&entry.wd) {
            *users += 1;
        }
        Some(entry)
    }

    /// Drops one use of each of `entries`, removing the watches nobody uses any more.
    fn release(&mut self, entries: &[Arc<Entry>]) {
        for entry in entries {
            if !self.is_live(entry) {
                continue;
            }
            let Some((_, _, users)) = self.by_wd.get_mut(&entry.wd) else {
                continue;
            };
            *users -= 1;
            if *users == 0 {
                self.by_wd.remove(&entry.wd);
                self.forget_path(entry);
                let _ = inotify::remove_watch(&self.inotify, entry.wd);
            }
        }
    }

    /// `entry`'s path no longer names its directory.
    fn forget_path(&mut self, entry: &Arc<Entry>) {
        entry.current.store(false, Ordering::Release);
        if self
            .by_dir
            .get(&entry.dir)
            .is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            self.by_dir.remove(&entry.dir);
        }
    }

    /// Takes in everything that happened since the last call: one `epoll_wait` that returns at
    /// once, normally with nothing, plus whatever a fast path took from the set and left in
    /// the gate word; the inotify queue is read only when it holds events. Holds the drain lock
    /// throughout, so no fast path vouches between an event leaving the set and its generation
    /// moving.
    fn drain(&mut self) {
        let held = self.shared.lock_drain();
        let ready = held.pending | epoll_ready(self.epoll.as_fd());
        if ready & MOUNTS_CHANGED != 0 {
            self.mounts_changed();
        }
        if ready & INOTIFY_READY != 0 {
            self.read_events();
        }
        if ready != 0 {
            // Before the drain lock is released (the guard drops after this).
            self.changed();
        }
    }

    /// The mount table changed: any path may now resolve through another mount, with no event
    /// on any watched directory. Every generation moves (each connection's next check is a full
    /// one), and a path opened from now on is watched afresh (the kernel returns the existing
    /// watch where the path still names the same directory).
    ///
    /// The creation counts are not blinded: an inotify watch is on the directory's inode, and
    /// the kernel queues a creation in it whichever mount the creating path went through. A
    /// newer generation that writes this connection's main file creates its `-wal` or `-shm`
    /// beside that file, in the watched directory, and is counted; one that a mount sends to
    /// another directory writes another main file, which the capture does not read.
    fn mounts_changed(&mut self) {
        log::debug!("hermes-guard: the mount table changed; full checks at the next transactions");
        move_all(&self.by_wd);
        self.by_dir.clear();
        crate::filesystem::forget_mounts();
    }

    fn read_events(&mut self) {
        let mut moved = Vec::new();
        {
            let Watcher {
                inotify,
                buf,
                by_wd,
                ..
            } = self;
            let mut reader = inotify::Reader::new(&*inotify, buf);
            loop {
                let (wd, flags, entry) = match reader.next() {
                    Ok(event) => {
                        let (wd, flags) = (event.wd(), event.events());
                        let made = flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO);
                        let entry = by_wd.get(&wd).map(|(e, _, _)| e);
                        if let (true, Some(entry), Some(name)) = (made, entry, event.file_name()) {
                            entry.names.created(name);
                        }
                        (wd, flags, entry.cloned())
                    }
                    // EAGAIN: nothing queued (the common case).
                    Err(rustix::io::Errno::AGAIN) => break,
                    // Anything else: assume every directory changed, and stop reading for now.
                    Err(_) => {
                        bump_all(by_wd);
                        break;
                    }
                };
                if flags.contains(ReadFlags::QUEUE_OVERFLOW) || wd < 0 {
                    bump_all(by_wd);
                    continue;
                }
                let Some(entry) = entry else {
                    continue;
                };
                entry.generation.fetch_add(1, Ordering::AcqRel);
                if flags.intersects(ReadFlags::MOVE_SELF | ReadFlags::DELETE_SELF) {
                    moved.push(entry.clone());
                }
                if flags.contains(ReadFlags::IGNORED) {
                    // The kernel dropped the watch: its users can never be vouched for again.
                    let (entry, _, _) = by_wd.remove(&wd).expect("looked up above");
                    moved.push(entry);
                }
            }
        }
        for entry in moved {
            self.forget_path(&entry);
        }
    }
}

/// The watch may have missed events: every directory's creation counts are blinded, and every
/// generation moves.
fn bump_all(by_wd: &HashMap<i32, (Arc<Entry>, WatchFlags, usize)>) {
    for (entry, _, _) in by_wd.values() {
        entry.names.blinded();
    }
    move_all(by_wd);
}

/// Every generation moves: each connection's next transaction does the full check.
fn move_all(by_wd: &HashMap<i32, (Arc<Entry>, WatchFlags, usize)>) {
    for (entry, _, _) in by_wd.values() {
        entry.generation.fetch_add(1, Ordering::AcqRel);
    }
}

impl Watcher {
    /// Something some watch vouches for moved: every fast path asks the full way next time.
    fn changed(&self) {
        self.shared.changes.fetch_add(1, Ordering::AcqRel);
    }
}

/// Filesystems whose every change passes through this kernel, so inotify sees it
/// (`crate::filesystem`'s classification, remembered per device).
pub(super) fn local_filesystem(dir: &Path) -> bool {
    crate::filesystem::of_dir(dir).is_some_and(|f| f.local)
}
