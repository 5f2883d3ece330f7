//! Telling a forked child from the process that made something, without trusting any one signal.
//!
//! A child of `fork` shares its parent's open file descriptions (the directory watcher's inotify
//! instance and epoll set, the descriptors the lock shield locks) and has a copy of its memory.
//! It must never drain the parent's inotify queue, nor release, take or keep a lock on the
//! parent's behalf. Three signals tell it apart, each covering what another cannot:
//!
//! - **The `pthread_atfork` child handler** ([`install`]), which every `fork()` through the C
//!   library runs in the child (Python's `os.fork`, `multiprocessing`, gunicorn, Rust's
//!   `libc::fork`): it bumps the fork epoch ([`Origin::current_cheap`], one load), wipes the
//!   directory watcher's page in software (see `watch.rs`), and gives the child descriptions of
//!   its own for every descriptor the shield locks (see `locked_fds.rs`), so the parent's locks leave
//!   with the parent.
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
//! Safe API; the `unsafe` here is the `pthread_atfork` registration and the child handler's
//! system calls (async-signal-safe ones only: the child of a multi-threaded parent may do no
//! more).

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::Once;

/// Bumped in every child by the atfork handler: unchanged since a thing was made means no
/// `fork()` through the C library came in between.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// This process's pid as [`install`] and the child handler read it; a raw `clone` child keeps
/// its parent's here, which [`Origin::current`] tells by asking the kernel.
static PID: AtomicI32 = AtomicI32::new(0);

static INSTALL: Once = Once::new();

/// A private page advised `MADV_WIPEONFORK`, its first word 1 in this process and 0 in every
/// child (the kernel wipes it, for a raw `clone` too); NULL where the kernel does not honour the
/// advice ([`wipe_is_honoured`]). Mapped once at [`install`] and never unmapped.
static MARK: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

/// Maps [`MARK`]'s page; NULL when the wipe cannot be had or trusted.
fn map_mark() -> *mut AtomicU64 {
    use rustix::mm::{madvise, mmap_anonymous, Advice, MapFlags, ProtFlags};
    const PAGE: usize = 4096;
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let Ok(page) = (unsafe {
        mmap_anonymous(
            std::ptr::null_mut(),
            PAGE,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `page` is the mapping just created, of PAGE bytes.
    let advised = unsafe { madvise(page, PAGE, Advice::LinuxWipeOnFork) }.is_ok();
    if !advised || !wipe_is_honoured(page, PAGE) {
        // SAFETY: unmapping the mapping created above, unused elsewhere.
        let _ = unsafe { rustix::mm::munmap(page, PAGE) };
        return std::ptr::null_mut();
    }
    let mark = page as *mut AtomicU64;
    // SAFETY: page-aligned, writable, zero-filled: a valid `AtomicU64`, never unmapped.
    unsafe { (*mark).store(1, Ordering::Release) };
    mark
}

/// Whether this is the process that mapped [`MARK`]: `None` when there is no mark to ask.
fn marked_here() -> Option<bool> {
    let mark = MARK.load(Ordering::Acquire);
    // SAFETY: MARK is NULL or a page mapped at install and never unmapped (a child inherits the
    // mapping, wiped).
    (!mark.is_null()).then(|| unsafe { (*mark).load(Ordering::Acquire) } == 1)
}

/// What the child handler does besides the epoch: the watcher's page and the shield's
/// descriptors (set by those modules, called with no allocation and no lock).
type ChildHook = fn();
const CHILD_HOOKS: [ChildHook; 2] = [
    super::watch::wipe_in_child,
    super::locked_fds::detach_in_child,
];

/// Registers the child handler, once per process (a child inherits the registration). Called
/// at the guard's registration, before any file is opened through it.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        PID.store(
            rustix::process::getpid().as_raw_nonzero().get(),
            Ordering::Release,
        );
        MARK.store(map_mark(), Ordering::Release);
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
    MARK.store(std::ptr::null_mut(), Ordering::Release);
    for hook in CHILD_HOOKS {
        hook();
    }
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
pub(crate) fn wipe_is_honoured(page: *mut std::ffi::c_void, len: usize) -> bool {
    /// No kernel defines this advice.
    const NO_SUCH_ADVICE: std::ffi::c_int = -1;
    // SAFETY: `page` is the caller's own mapping of `len` bytes; a refused advice changes
    // nothing, and an accepted one (an emulator's no-op) changes nothing either.
    let rc = unsafe { libc::madvise(page, len, NO_SUCH_ADVICE) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
}
