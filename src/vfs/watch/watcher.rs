//! The process's watcher: one non-blocking inotify instance and an open `/proc/self/mountinfo`
//! in one epoll set, the watches it holds (by directory and by watch descriptor, with their
//! users), and the drain that turns what the kernel queued into generations.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rustix::event::epoll;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use super::epoll_wait::epoll_ready;
use super::page::{make_current, new_page, Shared};
use super::{names, Entry, EPOCH, INOTIFY_READY, MOUNTS_CHANGED};
use crate::vfs::fork::Origin;

/// The watcher of this process (`STATE`): never dropped (a forked child leaks the one it
/// inherited), so its descriptors and its page live for the rest of the process that made it.
pub(super) struct Watcher {
    /// Unique within a process and its descendants (a child's watchers are made after every one
    /// it inherited, from the copied counter).
    pub(super) epoch: u64,
    /// The process that made it (see `fork.rs`).
    pub(super) origin: Origin,
    /// The wipe-on-fork page (`page.rs`, never unmapped): tells a forked child that this
    /// watcher is its parent's, and holds the drain lock and the change count.
    pub(super) shared: &'static Shared,
    /// The kernel was seen to apply `madvise` advice, so the page is wiped in a child made by a
    /// raw `clone` too.
    pub(super) wipe_honoured: bool,
    inotify: OwnedFd,
    /// Holds `inotify` (readable) and `mountinfo` (`EPOLLPRI` after a mount-table change).
    pub(super) epoll: OwnedFd,
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
    pub(super) fn new() -> Option<Watcher> {
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
    pub(super) fn watch(&mut self, dir: &Path, events: WatchFlags) -> Option<Arc<Entry>> {
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
    pub(super) fn release(&mut self, entries: &[Arc<Entry>]) {
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
    pub(super) fn drain(&mut self) {
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
