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
//! - **The pid** ([`Origin::current`]): one `getpid` system call, so only on paths that already
//!   make system calls (a full check, a lock change of the shield), never on the transaction
//!   start's fast path.
//!
//! Safe API; the `unsafe` here is the `pthread_atfork` registration and the child handler's
//! system calls (async-signal-safe ones only: the child of a multi-threaded parent may do no
//! more).

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Once;

/// Bumped in every child by the atfork handler: unchanged since a thing was made means no
/// `fork()` through the C library came in between.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// This process's pid as [`install`] and the child handler read it; a raw `clone` child keeps
/// its parent's here, which [`Origin::current`] tells by asking the kernel.
static PID: AtomicI32 = AtomicI32::new(0);

static INSTALL: Once = Once::new();

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

    /// This is the process that made the thing: no `fork()` since, and the kernel's pid is the
    /// one recorded then. One `getpid` system call.
    pub(crate) fn current(&self) -> bool {
        self.current_cheap() && rustix::process::getpid().as_raw_nonzero().get() == self.pid
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
