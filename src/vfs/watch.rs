//! Directory watches that let a write transaction skip its three `stat` calls when nothing in the
//! database's directory has changed since the last full check.
//!
//! One non-blocking inotify instance per process watches each directory that holds a guarded
//! database. Unlinks, renames and creations in a directory are queued on that instance by the
//! kernel inside the very syscall that makes them, so draining it at the start of a transaction
//! (one `read` that normally returns `EAGAIN`) is as current as a `stat` would be — the fast path
//! adds no window a `stat` does not have. Any event in a directory bumps its generation; a
//! connection whose last full check saw the current generation knows its names still resolve to
//! what it pinned. Everything else falls back to the full check: an event, a queue overflow, a
//! filesystem whose changes may come from elsewhere (network, FUSE), no inotify at all, or a
//! process forked from the one that set the instance up (the instance is shared with the parent
//! across `fork`, so the child must not read it; a `MADV_WIPEONFORK` page tells the child it is
//! one without a syscall).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

/// A watched directory: the generation moves whenever anything in it is created, deleted or
/// renamed, or the directory itself is.
pub(crate) struct DirWatch {
    entry: Arc<Entry>,
}

struct Entry {
    dir: PathBuf,
    wd: i32,
    generation: AtomicU64,
}

enum State {
    Uninit,
    Ready(Watcher),
    /// No inotify here (or this is a forked child): every check is a full one.
    Unavailable,
}

struct Watcher {
    fd: OwnedFd,
    fork_marker: ForkMarker,
    by_dir: HashMap<PathBuf, (Arc<Entry>, usize)>,
    by_wd: HashMap<i32, Arc<Entry>>,
    buf: Vec<MaybeUninit<u8>>,
}

static STATE: Mutex<State> = Mutex::new(State::Uninit);

const DIR_EVENTS: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

impl DirWatch {
    /// Watches `dir`, or `None` when its changes cannot be trusted to show up here.
    pub(crate) fn new(dir: &Path) -> Option<DirWatch> {
        if !local_filesystem(dir) {
            return None;
        }
        let mut state = STATE.lock();
        if matches!(*state, State::Uninit) {
            *state = match Watcher::new() {
                Some(w) => State::Ready(w),
                None => State::Unavailable,
            };
        }
        let State::Ready(watcher) = &mut *state else {
            return None;
        };
        if let Some((entry, refs)) = watcher.by_dir.get_mut(dir) {
            *refs += 1;
            return Some(DirWatch {
                entry: entry.clone(),
            });
        }
        let wd = match inotify::add_watch(&watcher.fd, dir, DIR_EVENTS) {
            Ok(wd) => wd,
            Err(e) => {
                log::debug!(
                    "hermes-guard: no inotify watch on {} ({e}); full checks there",
                    dir.display()
                );
                return None;
            }
        };
        let entry = Arc::new(Entry {
            dir: dir.to_path_buf(),
            wd,
            generation: AtomicU64::new(0),
        });
        watcher.by_dir.insert(dir.to_path_buf(), (entry.clone(), 1));
        watcher.by_wd.insert(wd, entry.clone());
        Some(DirWatch { entry })
    }

    /// The directory's generation after draining every queued event, or `None` when the watch
    /// cannot vouch for the directory (the caller then does a full check).
    #[inline]
    pub(crate) fn current(&self) -> Option<u64> {
        let mut state = STATE.lock();
        let State::Ready(watcher) = &mut *state else {
            return None;
        };
        if !watcher.fork_marker.same_process() {
            log::debug!("hermes-guard: forked child; directory watches disabled, full checks");
            *state = State::Unavailable;
            return None;
        }
        watcher.drain();
        // A removed watch (directory deleted or unmounted) is gone from by_wd: never vouch.
        if !watcher.by_wd.contains_key(&self.entry.wd) {
            return None;
        }
        Some(self.entry.generation.load(Ordering::Acquire))
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        let mut state = STATE.lock();
        let State::Ready(watcher) = &mut *state else {
            return;
        };
        let Some((_, refs)) = watcher.by_dir.get_mut(&self.entry.dir) else {
            return;
        };
        *refs -= 1;
        if *refs == 0 {
            watcher.by_dir.remove(&self.entry.dir);
            if watcher
                .by_wd
                .get(&self.entry.wd)
                .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
            {
                watcher.by_wd.remove(&self.entry.wd);
                let _ = inotify::remove_watch(&watcher.fd, self.entry.wd);
            }
        }
    }
}

impl Watcher {
    fn new() -> Option<Watcher> {
        let fork_marker = ForkMarker::new()?;
        let fd = match inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(e) => {
                log::debug!("hermes-guard: inotify unavailable ({e}); full checks everywhere");
                return None;
            }
        };
        Some(Watcher {
            fd,
            fork_marker,
            by_dir: HashMap::new(),
            by_wd: HashMap::new(),
            buf: vec![MaybeUninit::uninit(); 4096],
        })
    }

    fn drain(&mut self) {
        let Watcher { fd, buf, by_wd, .. } = self;
        let bump_all = |by_wd: &HashMap<i32, Arc<Entry>>| {
            for entry in by_wd.values() {
                entry.generation.fetch_add(1, Ordering::AcqRel);
            }
        };
        let mut reader = inotify::Reader::new(&*fd, buf);
        loop {
            let (wd, flags) = match reader.next() {
                Ok(event) => (event.wd(), event.events()),
                // EAGAIN: nothing queued (the common case).
                Err(rustix::io::Errno::AGAIN) => return,
                // Anything else: assume every directory changed, and stop reading for now.
                Err(_) => {
                    bump_all(by_wd);
                    return;
                }
            };
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) || wd < 0 {
                bump_all(by_wd);
                continue;
            }
            if let Some(entry) = by_wd.get(&wd) {
                entry.generation.fetch_add(1, Ordering::AcqRel);
            }
            if flags.contains(ReadFlags::IGNORED) {
                by_wd.remove(&wd);
            }
        }
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
