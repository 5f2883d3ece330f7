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
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::event::{epoll, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

/// A watched directory: the generation moves whenever anything in it is created, deleted or
/// renamed, or the directory itself or any directory above it is moved or deleted. (A restore
/// that swaps `/srv/app` for a new tree changes what `/srv/app/data/state.db` resolves to
/// without any event inside `data`.)
pub(crate) struct DirWatch {
    /// The epoch of the watcher that made it: only that watcher, in this process, may vouch for
    /// it or release it.
    epoch: u64,
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
    /// Tells a forked child that this watcher is its parent's.
    fork_marker: ForkMarker,
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
        if !watcher.fork_marker.same_process() {
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
            entries,
        })
    }

    /// A figure that changes whenever the directory or one above it changed, or the mount table
    /// did, after draining every queued event; `None` when the watch cannot vouch for the path
    /// (the caller then does a full check).
    #[inline]
    pub(crate) fn current(&self) -> Option<u64> {
        let mut state = STATE.lock();
        forget_inherited(&mut state);
        let State::Ready(watcher) = &mut *state else {
            return None;
        };
        if watcher.epoch != self.epoch {
            // Made by the parent's watcher (this process is a forked child): never vouches here.
            return None;
        }
        watcher.drain();
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

impl Watcher {
    fn new() -> Option<Watcher> {
        let fork_marker = ForkMarker::new()?;
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
        Some(Watcher {
            epoch: EPOCH.fetch_add(1, Ordering::Relaxed) + 1,
            inotify,
            epoll,
            mountinfo,
            fork_marker,
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
                    });
                    self.by_wd.insert(wd, (entry.clone(), events, 0));
                    entry
                }
            };
            if let Some(old) = self.by_dir.insert(dir.to_path_buf(), entry.clone()) {
                if !Arc::ptr_eq(&old, &entry) {
                    // The path names another directory now.
                    old.current.store(false, Ordering::Release);
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
    /// once, normally with nothing; the inotify queue is read only when it holds events.
    fn drain(&mut self) {
        let mut ready = [MaybeUninit::<epoll::Event>::uninit(); 2];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let (mut inotify_ready, mut mounts_changed) = (false, false);
        match epoll::wait(&self.epoll, &mut ready, Some(&zero)) {
            Ok((events, _)) => {
                for event in events.iter() {
                    let data = event.data;
                    match data.u64() {
                        INOTIFY_READY => inotify_ready = true,
                        MOUNTS_CHANGED => mounts_changed = true,
                        _ => {}
                    }
                }
            }
            // Unknown: assume everything changed and read the queue.
            Err(_) => (inotify_ready, mounts_changed) = (true, true),
        }
        if mounts_changed {
            self.mounts_changed();
        }
        if inotify_ready {
            self.read_events();
        }
    }

    /// The mount table changed: any path may now resolve through another mount, with no event
    /// on any watched directory. Every generation moves (each connection's next check is a full
    /// one), and a path opened from now on is watched afresh (the kernel returns the existing
    /// watch where the path still names the same directory).
    fn mounts_changed(&mut self) {
        log::debug!("hermes-guard: the mount table changed; full checks at the next transactions");
        bump_all(&self.by_wd);
        self.by_dir.clear();
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
                let (wd, flags) = match reader.next() {
                    Ok(event) => (event.wd(), event.events()),
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
                let Some((entry, _, _)) = by_wd.get(&wd) else {
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

fn bump_all(by_wd: &HashMap<i32, (Arc<Entry>, WatchFlags, usize)>) {
    for (entry, _, _) in by_wd.values() {
        entry.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// Filesystems whose every change passes through this kernel, so inotify sees it.
fn local_filesystem(dir: &Path) -> bool {
    const LOCAL: [i64; 8] = [
        0xEF53,     // ext2/3/4
        0x58465342, // xfs
        0x9123683E, // btrfs
        0x01021994, // tmpfs
        0x794C7630, // overlayfs
        0xF2F52010, // f2fs
        0x2FC12FC1, // zfs
        0x858458F6, // ramfs
    ];
    match rustix::fs::statfs(dir) {
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between platforms
        Ok(st) => LOCAL.contains(&(st.f_type as i64)),
        Err(_) => false,
    }
}

/// One anonymous page marked `MADV_WIPEONFORK`: it reads as zero in a forked child.
struct ForkMarker {
    page: *mut AtomicU64,
}

// SAFETY: the page is process-private memory accessed only through an atomic.
unsafe impl Send for ForkMarker {}

impl ForkMarker {
    const PAGE: usize = 4096;

    fn new() -> Option<ForkMarker> {
        use rustix::mm::{madvise, mmap_anonymous, Advice, MapFlags, ProtFlags};
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let page = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                Self::PAGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .ok()?;
        // SAFETY: `page` is the mapping just created, of PAGE bytes.
        if unsafe { madvise(page, Self::PAGE, Advice::LinuxWipeOnFork) }.is_err() {
            // SAFETY: unmapping the mapping created above, unused elsewhere.
            let _ = unsafe { rustix::mm::munmap(page, Self::PAGE) };
            return None;
        }
        let page = page as *mut AtomicU64;
        // SAFETY: page-aligned, writable, and large enough for a u64.
        unsafe { (*page).store(1, Ordering::Release) };
        Some(ForkMarker { page })
    }

    #[inline]
    fn same_process(&self) -> bool {
        // SAFETY: the mapping lives as long as the marker (never unmapped while in use).
        unsafe { (*self.page).load(Ordering::Acquire) == 1 }
    }
}

impl Drop for ForkMarker {
    fn drop(&mut self) {
        // SAFETY: unmapping our own page; no reference to it outlives the marker.
        let _ = unsafe { rustix::mm::munmap(self.page as *mut _, Self::PAGE) };
    }
}
