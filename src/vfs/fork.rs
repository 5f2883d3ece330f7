//! Telling a forked child from the process that made something, without trusting any one signal.
//!
//! A child of `fork` shares its parent's open file descriptions (the directory watcher's inotify
//! instance and epoll set, the descriptors the lock shield locks) and has a copy of its memory.
//! It must never drain the parent's inotify queue, nor release, take or keep a lock on the
//! parent's behalf. Three signals tell it apart, each covering what another cannot:
//!
//! - **The `pthread_atfork` child handler** ([`install`]), which every `fork()` through the C
//!   library runs in the child (Python's `os.fork`, `multiprocessing`, gunicorn, Rust's
//!   `libc::fork`): it bumps the fork epoch ([`Origin::current_cheap`], one load), runs the hooks
//!   the rooms above registered ([`on_child`]: the directory watcher wipes its page in software,
//!   see `watch/page.rs`), and gives the child descriptions of its own for every descriptor the
//!   shield locks (see `locked_fds.rs`), so the parent's locks leave with the parent.
//! - **`MADV_WIPEONFORK`**, which the kernel honours for a raw `clone` too — trusted only once
//!   proven ([`wipe_is_honoured`]): an emulator that accepts `madvise` without doing it (qemu-user
//!   has) also accepts an advice that does not exist, which a real kernel refuses.
//! - **The pid** ([`Origin::current`]): the pid the atfork handler keeps, checked against a
//!   wipe-on-fork page of the process's own ([`MARK`]: 1 here, 0 in any child, a raw `clone`'s
//!   included) — no system call (a `getpid` beside every lock change of the shield was a tenth of a
//!   connection's open and close). Where the kernel does not honour the wipe, one
//!   `getpid` system call, so only on paths that already make system calls (a full check, a lock
//!   change of the shield), never on the transaction start's fast path.
//!
//! The wipe-on-fork pages themselves are made here, for this file's mark and the directory
//! watcher's page alike ([`WipeOnForkPage`], [`PageRef`]).
//!
//! Safe API; the `unsafe` here is the `pthread_atfork` registration, the wipe-on-fork pages'
//! mapping and references, and the child handler's system calls (async-signal-safe ones only:
//! the child of a multi-threaded parent may do no more).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

/// Bumped in every child by the atfork handler: unchanged since a thing was made means no
/// `fork()` through the C library came in between.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// This process's pid as [`install`] and the child handler read it; a raw `clone` child keeps
/// its parent's here, which [`Origin::current`] tells by asking the kernel.
static PID: AtomicI32 = AtomicI32::new(0);

static INSTALL: Once = Once::new();

/// A private page advised `MADV_WIPEONFORK`, its first word 1 in this process and 0 in every
/// child (the kernel wipes it, for a raw `clone` too); none where the kernel does not honour the
/// advice ([`wipe_is_honoured`]). Mapped once at [`install`] and never unmapped.
static MARK: PageRef<AtomicU64> = PageRef::none();

/// Maps [`MARK`]'s page; none when the wipe cannot be had or trusted.
fn map_mark() -> Option<&'static AtomicU64> {
    let page = WipeOnForkPage::<AtomicU64>::map()?;
    if !page.honoured() {
        return None;
    }
    let mark = page.leak();
    mark.store(1, Ordering::Release);
    Some(mark)
}

/// Whether this is the process that mapped [`MARK`]: `None` when there is no mark to ask.
fn marked_here() -> Option<bool> {
    MARK.get().map(|mark| mark.load(Ordering::Acquire) == 1)
}

/// What the child handler does besides the epoch: the hooks the rooms above registered
/// ([`on_child`]), then the shield's descriptors. Read with no allocation and no lock.
static CHILD_HOOKS: [OnceLock<fn()>; 2] = [const { OnceLock::new() }; 2];

/// Registers `hook` to run in the child of every `fork()` through the C library, before `fork`
/// returns there: it may neither allocate nor lock (atomics and async-signal-safe system calls
/// only). A child inherits the registrations.
pub(crate) fn on_child(hook: fn()) {
    if !CHILD_HOOKS.iter().any(|slot| slot.set(hook).is_ok()) {
        log::error!("hermes-guard: no room for another child-after-fork hook");
    }
}

/// Registers the child handler, once per process (a child inherits the registration). Called
/// at the guard's registration, before any file is opened through it.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        PID.store(
            rustix::process::getpid().as_raw_nonzero().get(),
            Ordering::Release,
        );
        MARK.set(map_mark());
        {
            // SAFETY: registers a handler that lives as long as the program (a function item of
            // this library, which is never unloaded while its VFS is registered: the VFS is
            // leaked on purpose).
            let rc = unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
            if rc != 0 {
                log::warn!(
                    "hermes-guard: pthread_atfork failed ({rc}): a forked child is told by the \
                     pid and the wipe-on-fork page only"
                );
            }
        }
    });
}

/// Runs in the child of every `fork()` through the C library, before `fork` returns there.
extern "C" fn child_after_fork() {
    EPOCH.fetch_add(1, Ordering::AcqRel);
    // getpid is async-signal-safe; rustix's is a raw system call.
    PID.store(
        rustix::process::getpid().as_raw_nonzero().get(),
        Ordering::Release,
    );
    // The kernel wiped the mark in this child; a new one is not mapped here (no allocation or
    // mmap in an atfork child): the child asks `getpid` from now on.
    MARK.set(None);
    for hook in CHILD_HOOKS.iter().filter_map(OnceLock::get) {
        hook();
    }
    super::locked_fds::detach_in_child();
}

/// Where a thing was made: the fork epoch and the pid then. No system call to take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Origin {
    epoch: u64,
    pid: i32,
}

impl Origin {
    /// This process, now.
    pub(crate) fn here() -> Origin {
        Origin {
            epoch: EPOCH.load(Ordering::Acquire),
            pid: PID.load(Ordering::Acquire),
        }
    }

    /// No `fork()` through the C library since: one load, for paths with no system call of
    /// their own. A raw `clone` child passes this test; [`Origin::current`] does not.
    #[inline]
    pub(crate) fn current_cheap(&self) -> bool {
        EPOCH.load(Ordering::Acquire) == self.epoch
    }

    /// This is the process that made the thing: no `fork()` since, and this process's pid is
    /// the one recorded then — by the wipe-on-fork mark when the kernel honours it (no system
    /// call), else one `getpid` system call.
    pub(crate) fn current(&self) -> bool {
        if !self.current_cheap() {
            return false;
        }
        match marked_here() {
            Some(here) => here && PID.load(Ordering::Acquire) == self.pid,
            None => rustix::process::getpid().as_raw_nonzero().get() == self.pid,
        }
    }
}

/// Whether `madvise` on this system really applies the advice it accepts: it must refuse an
/// advice that does not exist (BoringSSL's test for the same question). `page` is a mapping of
/// `len` bytes the caller owns; the call changes nothing when it is refused, and an emulator
/// that accepts it ignores every advice anyway.
fn wipe_is_honoured(page: *mut std::ffi::c_void, len: usize) -> bool {
    /// No kernel defines this advice.
    const NO_SUCH_ADVICE: std::ffi::c_int = -1;
    // SAFETY: `page` is the caller's own mapping of `len` bytes; a refused advice changes
    // nothing, and an accepted one (an emulator's no-op) changes nothing either.
    let rc = unsafe { libc::madvise(page, len, NO_SUCH_ADVICE) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
}

/// A type for which a page of zeros is a valid value: what a wipe-on-fork page holds.
///
/// # Safety
/// All-zero bytes are a valid `Self`, and `Self` fits in a page (its size and alignment at most
/// 4096 bytes); it is `Sync` (the page is shared by every thread of the process that made it).
pub(crate) unsafe trait ZeroedPage: Sync {}

// SAFETY: an atomic of zero bytes is 0; 8 bytes, aligned to 8.
unsafe impl ZeroedPage for AtomicU64 {}

/// One private anonymous page advised `MADV_WIPEONFORK`, holding a `T`: it reads as zero in a
/// forked child (wiped by the kernel where it honours the advice). Unmapped when dropped, unless
/// [leaked](WipeOnForkPage::leak).
pub(crate) struct WipeOnForkPage<T: ZeroedPage> {
    page: NonNull<T>,
    /// The kernel was seen to apply `madvise` advice ([`wipe_is_honoured`]), so the page is
    /// wiped in a child made by a raw `clone` too.
    honoured: bool,
}

impl<T: ZeroedPage> WipeOnForkPage<T> {
    const PAGE: usize = 4096;

    /// Maps the page (all zero: a valid `T`) and advises it; `None` when either is refused (the
    /// mapping then undone).
    pub(crate) fn map() -> Option<WipeOnForkPage<T>> {
        use rustix::mm::{madvise, mmap_anonymous, Advice, MapFlags, ProtFlags};
        const { assert!(size_of::<T>() <= 4096 && align_of::<T>() <= 4096) };
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
        let honoured = wipe_is_honoured(page, Self::PAGE);
        let page = NonNull::new(page as *mut T)?;
        Some(WipeOnForkPage { page, honoured })
    }

    /// Whether the kernel was seen to honour the advice.
    pub(crate) fn honoured(&self) -> bool {
        self.honoured
    }

    pub(crate) fn get(&self) -> &T {
        // SAFETY: page-aligned, writable, zero-filled (a valid `T`, `ZeroedPage`) and large
        // enough for one; mapped while `self` lives.
        unsafe { self.page.as_ref() }
    }

    /// The page, never unmapped from here on.
    pub(crate) fn leak(self) -> &'static T {
        let page = self.page;
        std::mem::forget(self);
        // SAFETY: as in `get`, and the mapping is never undone (its owner is forgotten).
        unsafe { page.as_ref() }
    }
}

impl<T: ZeroedPage> Drop for WipeOnForkPage<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping our own page; every reference to it borrowed `self`.
        let _ = unsafe { rustix::mm::munmap(self.page.as_ptr() as *mut c_void, Self::PAGE) };
    }
}

/// A place for a reference to a page that lives for the rest of the process (a leaked
/// [`WipeOnForkPage`]), read and written with atomics only (the child handler reads it).
pub(crate) struct PageRef<T>(AtomicPtr<T>);

impl<T: Sync> PageRef<T> {
    /// No page.
    pub(crate) const fn none() -> PageRef<T> {
        PageRef(AtomicPtr::new(std::ptr::null_mut()))
    }

    pub(crate) fn set(&self, page: Option<&'static T>) {
        let p = page.map_or(std::ptr::null_mut(), |r| r as *const T as *mut T);
        self.0.store(p, Ordering::Release);
    }

    #[inline]
    pub(crate) fn get(&self) -> Option<&'static T> {
        // SAFETY: NULL or a `&'static T` stored by `set`; only shared references are handed out.
        unsafe { self.0.load(Ordering::Acquire).as_ref() }
    }
}
