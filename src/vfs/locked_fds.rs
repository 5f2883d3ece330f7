//! The descriptors on which the lock shield holds OFD locks, and what a forked child does with
//! them.
//!
//! An OFD lock belongs to the open file description, which `fork` shares: without more, a child
//! that unlocks (its close of an inherited connection) releases the parent's lock, and a child
//! that lives on after the parent exits keeps the parent's locks held for nobody. So the shield
//! lists every descriptor it may hold a lock on here, before it takes the lock, and the
//! `pthread_atfork` child handler ([`detach_in_child`]) gives each of the child's copies a
//! description of its own: the same file, opened again through `/proc/self/fd`, put in the same
//! descriptor number with `dup3`. The child's SQLite goes on using the same number, for the same
//! file, with no lock; the parent's description is referenced by the parent alone, so its locks
//! leave with it. (Closing a descriptor in the child drops no POSIX lock of the parent's: a child
//! inherits none.)
//!
//! A mapping holds its file's description too: the child's copy of the `-shm` mapping would keep
//! the parent's description, and its dead-man-switch lock, alive after the parent exits. So the
//! regions a guarded connection maps are listed as well ([`map_region`]), and the child maps each
//! again, at the same address with `MAP_FIXED`, from its own description: the same shared pages,
//! so the child's SQLite sees no difference. A region is listed only while a guarded connection
//! maps its node (the shield forgets them before the last one unmaps, [`forget_regions`]), so the
//! child never maps over an address SQLite has let go of.
//!
//! A fixed table of atomics, because the child handler may neither allocate nor lock: a fork
//! while another thread held a mutex would deadlock the child.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

/// How many descriptors may hold OFD locks at once in one process: a WAL-mode connection's main
/// file (the shield) and each `-shm` the process maps (the wal-index nodes, `wal_index/`). Beyond
/// it a connection goes without the shield, and a node is mapped untracked (a child that
/// outlives the process would keep its locks; logged: see [`register`]).
const SLOTS: usize = 4096;

const EMPTY: i32 = -1;

static LOCKED: [AtomicI32; SLOTS] = [const { AtomicI32::new(EMPTY) }; SLOTS];

/// How many slots of [`LOCKED`] were ever claimed (it only grows, past [`SLOTS`] when the table is
/// full): every listed descriptor is below it, so a look at the table reads only that many slots,
/// not all of them: a connection's open and close take and release a lock each, and a scan of the
/// whole table at each (a compare-and-swap per slot to unlist) made every open and close pay for
/// the table's size.
static LOCKED_USED: AtomicUsize = AtomicUsize::new(0);

/// The slots of [`LOCKED`] that were ever claimed.
fn locked() -> &'static [AtomicI32] {
    &LOCKED[..LOCKED_USED.load(Ordering::Acquire).min(SLOTS)]
}

/// The `-shm` regions mapped by guarded connections: address, length, file offset, and the
/// descriptor they were mapped from (published last, cleared first).
struct Region {
    addr: AtomicUsize,
    len: AtomicUsize,
    offset: AtomicUsize,
    fd: AtomicI32,
}

const REGION_SLOTS: usize = 4096;

/// How many slots of [`REGIONS`] were ever claimed (as [`LOCKED_USED`]).
static REGIONS_USED: AtomicUsize = AtomicUsize::new(0);

static REGIONS: [Region; REGION_SLOTS] = [const {
    Region {
        addr: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        offset: AtomicUsize::new(0),
        fd: AtomicI32::new(EMPTY),
    }
}; REGION_SLOTS];

/// Lists a region of `fd`'s shared memory, mapped at `addr` (`len` bytes of the file from
/// `offset`). One that does not start a page (a region inside a larger mapping of a system
/// whose pages are larger than a region) is covered by the one that does. `false` when the table
/// is full: the caller's shield then must not hold the node's lock.
pub(super) fn map_region(fd: c_int, addr: usize, len: usize, offset: usize) -> bool {
    if !addr.is_multiple_of(page_size()) {
        return true;
    }
    let listed = regions()
        .iter()
        .any(|r| r.fd.load(Ordering::Acquire) == fd && r.addr.load(Ordering::Acquire) == addr);
    if listed {
        return true;
    }
    // Claimed with a value no descriptor has, filled, then published with the descriptor.
    let claim = |r: &Region| {
        r.fd.load(Ordering::Acquire) == EMPTY
            && r.fd
                .compare_exchange(EMPTY, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    };
    let Some(r) = claim_slot(&REGIONS, &REGIONS_USED, claim) else {
        return false;
    };
    r.addr.store(addr, Ordering::Release);
    r.len.store(len, Ordering::Release);
    r.offset.store(offset, Ordering::Release);
    r.fd.store(fd, Ordering::Release);
    true
}

/// The slots of [`REGIONS`] that were ever claimed.
fn regions() -> &'static [Region] {
    &REGIONS[..REGIONS_USED.load(Ordering::Acquire).min(REGION_SLOTS)]
}

/// A free slot of `table` claimed with `claim`: one that was claimed before and freed, else the
/// next never used (`used` counts those); `None` when the table is full.
fn claim_slot<T>(
    table: &'static [T],
    used: &AtomicUsize,
    claim: impl Fn(&T) -> bool,
) -> Option<&'static T> {
    loop {
        let seen = used.load(Ordering::Acquire).min(table.len());
        if let Some(slot) = table[..seen].iter().find(|slot| claim(slot)) {
            return Some(slot);
        }
        // A slot never used: ours alone unless a look at the table since the count moved took
        // it first (then look again).
        let next = used.fetch_add(1, Ordering::AcqRel);
        let slot = table.get(next)?;
        if claim(slot) {
            return Some(slot);
        }
    }
}

/// Forgets every region of `fd`: no guarded connection maps the node any more, and its mappings
/// may go at any moment.
pub(super) fn forget_regions(fd: c_int) {
    for r in regions() {
        if r.fd.load(Ordering::Acquire) == fd {
            let _ =
                r.fd.compare_exchange(fd, EMPTY, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

/// A region slot being filled.
const CLAIMED: i32 = -2;

/// The system's page size (libc's `sysconf`: rustix's reads the auxiliary vector, which
/// valgrind's memcheck does not let it walk).
pub(super) fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: sysconf only reads a configuration value.
            let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let size = if size > 0 { size as usize } else { 4096 };
            PAGE.store(size, Ordering::Relaxed);
            size
        }
        size => size,
    }
}

/// Children that could not get a description of their own for some descriptor (its reopen
/// failed): read by the child's log at its first shield transition.
static DETACH_FAILURES: AtomicU32 = AtomicU32::new(0);

/// Lists `fd` before a lock is taken on it; `false` when the table is full (the lock must not be
/// taken: a child would share it).
pub(super) fn register(fd: c_int) -> bool {
    if locked().iter().any(|s| s.load(Ordering::Acquire) == fd) {
        return true;
    }
    claim_slot(&LOCKED, &LOCKED_USED, |slot| {
        slot.load(Ordering::Acquire) == EMPTY
            && slot
                .compare_exchange(EMPTY, fd, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    })
    .is_some()
}

/// Takes `fd` off the list once nothing is locked on it any more.
pub(super) fn unregister(fd: c_int) {
    for slot in locked() {
        if slot.load(Ordering::Acquire) == fd {
            let _ = slot.compare_exchange(fd, EMPTY, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

/// How many descriptors a forked child could not detach from its parent's description (logged
/// once by the caller, then reset).
pub(super) fn take_detach_failures() -> u32 {
    DETACH_FAILURES.swap(0, Ordering::AcqRel)
}

/// In a forked child (the atfork handler, see `fork.rs`): every listed descriptor gets a
/// description of its own, and the list is emptied (the child holds no lock). System calls that
/// are async-signal-safe only, no allocation.
pub(super) fn detach_in_child() {
    for slot in locked() {
        let fd = slot.swap(EMPTY, Ordering::AcqRel);
        if fd >= 0 && !(reopen_in_place(fd) && remap_regions(fd)) {
            DETACH_FAILURES.fetch_add(1, Ordering::AcqRel);
        }
    }
    for r in regions() {
        r.fd.store(EMPTY, Ordering::Release);
    }
}

/// Maps every listed region of `fd` again, in place, from the description now at `fd`.
fn remap_regions(fd: c_int) -> bool {
    // SAFETY: a plain query of a descriptor.
    let status = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if status < 0 {
        return false;
    }
    let prot = if status & libc::O_ACCMODE == libc::O_RDONLY {
        libc::PROT_READ
    } else {
        libc::PROT_READ | libc::PROT_WRITE
    };
    let mut all = true;
    for r in regions() {
        if r.fd.load(Ordering::Acquire) != fd {
            continue;
        }
        let addr = r.addr.load(Ordering::Acquire);
        let len = r.len.load(Ordering::Acquire);
        let offset = r.offset.load(Ordering::Acquire);
        // SAFETY: `addr..addr+len` is a shared mapping of this very file at `offset`, listed
        // while SQLite maps it (see the module's docs): replacing it with a mapping of the same
        // file, offset and protection gives the same shared pages at the same address.
        let placed = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                offset as libc::off_t,
            )
        };
        all &= placed == addr as *mut libc::c_void;
    }
    all
}

/// Opens the file behind `fd` again (a new open file description, with the same access mode)
/// and puts it in `fd`'s place, keeping its close-on-exec flag.
fn reopen_in_place(fd: c_int) -> bool {
    let mut path = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    path[..prefix.len()].copy_from_slice(prefix);
    let end = path.len() - 1;
    let digits = decimal(fd as u32, &mut path[prefix.len()..end]);
    path[prefix.len() + digits] = 0;
    // SAFETY: plain system calls on a descriptor number and a NUL-terminated path on the stack;
    // none of them touches memory of ours but `path`.
    unsafe {
        let status = libc::fcntl(fd, libc::F_GETFL);
        let fd_flags = libc::fcntl(fd, libc::F_GETFD);
        if status < 0 || fd_flags < 0 {
            return false;
        }
        let access = status & libc::O_ACCMODE;
        let fresh = libc::open(
            path.as_ptr().cast(),
            access | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_LARGEFILE,
        );
        if fresh < 0 {
            return false;
        }
        let cloexec = if fd_flags & libc::FD_CLOEXEC != 0 {
            libc::O_CLOEXEC
        } else {
            0
        };
        let placed = libc::dup3(fresh, fd, cloexec) == fd;
        libc::close(fresh);
        placed
    }
}

/// Writes `n` in decimal at the start of `out`; returns how many digits (at most 10).
fn decimal(mut n: u32, out: &mut [u8]) -> usize {
    let mut tmp = [0u8; 10];
    let mut len = 0;
    loop {
        tmp[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        out[i] = tmp[len - 1 - i];
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_writes_every_digit_in_order() {
        let mut out = [0u8; 10];
        for (n, text) in [(0, "0"), (7, "7"), (42, "42"), (u32::MAX, "4294967295")] {
            let len = decimal(n, &mut out);
            assert_eq!(&out[..len], text.as_bytes());
        }
    }

    #[test]
    fn a_descriptor_is_listed_once_and_unlisted() {
        let fd = 1_000_000;
        assert!(register(fd));
        assert!(register(fd));
        assert_eq!(
            LOCKED
                .iter()
                .filter(|s| s.load(Ordering::Acquire) == fd)
                .count(),
            1
        );
        unregister(fd);
        assert!(LOCKED.iter().all(|s| s.load(Ordering::Acquire) != fd));
    }
}
