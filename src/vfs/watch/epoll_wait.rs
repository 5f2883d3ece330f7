//! The epoll set's questions: the fast path's (one `epoll_pwait`, written out on x86_64) and
//! the drain's (rustix's call).

use std::os::fd::{BorrowedFd, RawFd};

use rustix::event::epoll;
use rustix::event::Timespec;

use super::page::FastHeld;
use super::{INOTIFY_READY, MOUNTS_CHANGED};

/// The fast path's question to the epoll set, without waiting: the readiness of the first ready
/// source (`INOTIFY_READY` or `MOUNTS_CHANGED`), 0 when none is, both when the call fails. One
/// event slot (the caller's, uninitialised): a second ready source stays in the set for the
/// drain that any readiness leads to.
///
/// On x86_64 Linux, the raw `epoll_pwait` system call, written out as rustix writes its own
/// (`syscall5`: the same registers, clobbers and options), then one test of its result: rustix's
/// general-purpose `epoll::wait` spends a dozen instructions more per transaction decoding the
/// result and bounds-checking the slice, and carries a panic path the fast path does not want
/// (see docs/decisions.md). Elsewhere, rustix's call. Panic-free either way.
///
/// `epoll` is the raw descriptor of the epoll set of the live watcher whose page's drain lock
/// `held` is; the event slot is that page's.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[inline(always)]
pub(super) fn epoll_first_ready(epoll: RawFd, held: &FastHeld<'_>) -> u64 {
    // SAFETY: the drain lock is held (`held`): the page's slot is this thread's until it goes.
    let slot = unsafe { &mut *held.slot() };
    let ret: isize;
    // SAFETY: epoll_pwait(epfd, events, maxevents = 1, timeout = 0, sigmask = NULL): `epoll` is
    // an open epoll descriptor, and `slot` has room for the one event the kernel may write. The
    // `syscall` instruction touches no user memory but that, no stack, restores the flags and
    // clobbers rcx and r11, which are declared.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_epoll_pwait as isize => ret,
            in("rdi") epoll as usize,
            in("rsi") slot.as_mut_ptr(),
            in("rdx") 1usize,
            in("r10") 0usize,
            in("r8") 0usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack, preserves_flags),
        );
    }
    match ret {
        0 => 0,
        // SAFETY: the kernel wrote the one event it reported.
        1 => ready_bits(unsafe { slot[0].assume_init_ref() }),
        _ => INOTIFY_READY | MOUNTS_CHANGED,
    }
}

/// See the x86_64 Linux version above.
#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
#[inline(always)]
pub(super) fn epoll_first_ready(epoll: RawFd, held: &FastHeld<'_>) -> u64 {
    // SAFETY: the drain lock is held (`held`): the page's slot is this thread's until it goes.
    let slot = unsafe { &mut *held.slot() };
    // SAFETY: as the caller promises, an open epoll descriptor (so not -1).
    let epoll = unsafe { BorrowedFd::borrow_raw(epoll) };
    match epoll::wait(epoll, slot, Some(&ZERO_TIMEOUT)) {
        Ok((ready, _)) => ready.first().map_or(0, ready_bits),
        Err(_) => INOTIFY_READY | MOUNTS_CHANGED,
    }
}

/// The readiness bits of a reported event.
#[inline(always)]
pub(super) fn ready_bits(event: &epoll::Event) -> u64 {
    // Copied out first: the event is a packed struct.
    let data = event.data;
    match data.u64() & (INOTIFY_READY | MOUNTS_CHANGED) {
        // Every source is registered with its bit: not expected, assume both.
        0 => INOTIFY_READY | MOUNTS_CHANGED,
        bits => bits,
    }
}

/// The timeout of a poll: none.
#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
pub(super) const ZERO_TIMEOUT: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// The drain's question to the epoll set, without waiting: every ready source's bits
/// (`INOTIFY_READY | MOUNTS_CHANGED`), all of them when the call fails (assume everything
/// changed). Through rustix's call: the drain is off the hot path (the fast path asks with
/// [`epoll_first_ready`]).
#[inline]
pub(super) fn epoll_ready(epoll: BorrowedFd<'_>) -> u64 {
    let empty = || epoll::Event {
        flags: epoll::EventFlags::empty(),
        data: epoll::EventData::new_u64(0),
    };
    let mut ready = [empty(), empty()];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match epoll::wait(epoll, &mut ready, Some(&zero)) {
        Ok(n) => ready.iter().take(n).fold(0, |bits, event| {
            // Copied out first: the event is a packed struct.
            let data = event.data;
            bits | (data.u64() & (INOTIFY_READY | MOUNTS_CHANGED))
        }),
        Err(_) => INOTIFY_READY | MOUNTS_CHANGED,
    }
}
