//! The shared-memory methods: the mapping (pins and the shield's node), the watched locks (the
//! WAL write lock and the checkpoint lock), the unmap.

use std::ffi::{c_int, c_void};

use rusqlite::ffi;

use super::reset_lock::{checkpoint_unlock, wal_reset_lock, wal_reset_unlock, RESET_N, RESET_OFST};
use super::*;
use crate::vfs::boundary::ffi_guard;
use crate::vfs::state::{DbState, Gate, Site};

pub(super) unsafe extern "C" fn x_shm_map(
    f: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: SQLite calls our methods only on our live files.
        let t = unsafe { table(f) };
        let sub = t.sub_object(f);
        let rc = sub_call!(t, sub, xShmMap, region, size, extend, pp);
        if let (Kind::Main, Some(state), ffi::SQLITE_OK) = (t.kind, &t.state, rc) {
            // SAFETY: on success the wrapped VFS stored the region's address (or NULL) in *pp.
            let addr = unsafe { *pp } as usize;
            if region > 0 && addr != 0 {
                state
                    .shield()
                    .mapped_region(region, size, addr, state.db_path());
            }
        }
        if let (Kind::Main, Some(state), ffi::SQLITE_OK, 0) = (t.kind, &t.state, rc, region) {
            // SAFETY: on success the wrapped VFS stored the region's address (or NULL) in *pp.
            let addr = unsafe { *pp } as *const u8;
            if !addr.is_null() {
                let node = if t.unix_prefix {
                    // SAFETY: the wrapped file was checked at its open to have the `unixFile`
                    // layout; xShmMap just succeeded.
                    unsafe { shm_node(sub, |fd| state.shm_joined_by_sibling(fd)) }
                } else {
                    Err("the wrapped file does not have the unix VFS's layout".into())
                };
                state.pin_shm(
                    || {
                        node.as_ref()
                            .ok()
                            .map(|(_, id, name)| (*id, Some(name.clone())))
                    },
                    Box::new(WalIndexView(addr)),
                );
                // Issue 19: the record reads the generation's salts from this mapping.
                state.stale_wal().mapped(addr);
                if state.shield().enabled() {
                    // The node's descriptor, `fstat`ed once for the pin too.
                    match shm_descriptor(node, state) {
                        Ok((fd, id)) => {
                            let region0 = (addr as usize, size.max(0) as usize);
                            state.shield().join_shm(fd, id, Some(region0))
                        }
                        Err(reason) => state.shield().disable(reason, state.db_path()),
                    }
                }
            }
        }
        rc
    })
}

/// No `catch_unwind` on the way through (see `x_write`): readers' locks pass straight down, and
/// around the two watched locks only atomics run outside `verdict_slow`. Installed on guarded main
/// files (and, in the heap layout, on every file: SQLite only calls it on main files).
pub(super) unsafe extern "C" fn x_shm_lock<const HEAP: bool>(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // Watched: the WAL write lock (0), the checkpoint lock (1), and (issue 27) the read locks
    // 1-4 together, `ofst` 4 and `n` 4, which SQLite asks for to reset the WAL. One compare
    // keeps them apart from what passes straight down: every read mark a read transaction takes
    // (`ofst` 3 to 7, `n` 1) has `ofst > n`; each watched request has `ofst <= n` (as has the
    // recovery lock, `ofst` 1 or 2 and `n` 7 or 6, which the slow branch passes down). The
    // rest of the test is `shm_lock_write_or_checkpoint_slot`'s.
    if ofst <= n {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { shm_lock_write_or_checkpoint_slot::<HEAP>(f, ofst, n, flags) };
    }
    // SAFETY: SQLite calls our methods only on our live files.
    let t = unsafe { table(f) };
    sub_call!(t, sub_object_for::<HEAP>(t, f), xShmLock, ofst, n, flags)
}

pub(super) const LOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE;

/// `x_shm_lock` with `ofst <= n`: `ofst` 0 or 1, or a request spanning several read locks. An
/// exclusive lock of one slot (at 0: the WAL write lock, which opens every write transaction;
/// at 1: the checkpoint lock, every checkpoint) goes on to `shm_lock_exclusive_checked`, as a
/// tail call; any other call at 0 (a release, above all) clears what the check of that lock
/// allowed first (clearing only ever costs a check more); one at 1 goes to `checkpoint_unlock`
/// (the same, and issue 27's tripwire); the read locks 1-4 (`ofst` 4, `n` 4) go to issue 27's
/// rule (`wal_reset.rs`); the rest passes down. Out of line so that the pass-through of every
/// other lock stays a few instructions; `extern "C"` (cannot unwind) with the caller's arguments, so that the caller
/// reaches it with a tail call. It stores flags and tail-calls, so it pushes nothing.
///
/// # Safety
/// `f` is one of our live files.
#[inline(never)]
pub(super) unsafe extern "C" fn shm_lock_write_or_checkpoint_slot<const HEAP: bool>(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // In SQLite's buffer, `x_shm_lock` is only installed on guarded main files (whose
    // `main_state` is set); on the heap, on every file. The exclusive lock of one slot (every
    // write transaction's) is told first, before the table is loaded: it needs none here.
    // SAFETY: as the caller promises.
    let guarded = || !HEAP || !unsafe { table(f) }.main_state.is_null();
    if flags == LOCK_EXCLUSIVE && n == 1 && guarded() {
        // SAFETY: `f` is the live file SQLite passed, its table's `main_state` is not NULL (tail
        // calls). `ofst <= n`: 0 or 1.
        return unsafe {
            if ofst == 0 {
                shm_lock_exclusive_checked::<HEAP, 0>(f)
            } else {
                shm_lock_exclusive_checked::<HEAP, 1>(f)
            }
        };
    }
    // SAFETY: as the caller promises.
    let t = unsafe { table(f) };
    if !HEAP || !t.main_state.is_null() {
        if flags == LOCK_EXCLUSIVE {
            if ofst == RESET_OFST && n == RESET_N {
                // SAFETY: as above.
                return unsafe { wal_reset_lock::<HEAP>(f, ofst, n, flags) };
            }
        } else if ofst == 0 {
            // SAFETY: not NULL (above), into the state the table holds.
            let state = unsafe { &*t.main_state };
            // Cleared whatever the release returns, as always; before it rather than after
            // (until it returns this connection writes nothing), so the call below is a tail
            // call.
            state.end_of_transaction();
        } else if ofst == 1 {
            // SAFETY: as above.
            return unsafe { checkpoint_unlock::<HEAP>(f, ofst, n, flags) };
        } else if ofst == RESET_OFST && n == RESET_N {
            // SAFETY: as above.
            return unsafe { wal_reset_unlock::<HEAP>(f, ofst, n, flags) };
        }
    }
    sub_call!(t, sub_object_for::<HEAP>(t, f), xShmLock, ofst, n, flags)
}

/// A watched exclusive lock, one slot, of a guarded main file: `OFST` 0, the WAL write lock,
/// which opens every write transaction (and FULL/RESTART/TRUNCATE checkpoints), or `OFST` 1, the
/// checkpoint lock, which opens every checkpoint. The check (its fast path inlined here: atomics
/// and one `epoll_wait`, panic-free; a full check or a refusal in `verdict_slow`, inside
/// `ffi_guard`), the lock, and, once it is taken, the flags that say the transaction or the
/// checkpoint was checked ([`DbState::write_lock`], [`DbState::checkpoint_lock`]). The hot path
/// of the guard: every write transaction runs it (`OFST` is a constant: one function each, no
/// test of it at run time).
///
/// # Safety
/// `f` is one of our live files and its table's `main_state` is not NULL.
#[inline(never)]
pub(super) unsafe extern "C" fn shm_lock_exclusive_checked<const HEAP: bool, const OFST: c_int>(
    f: *mut ffi::sqlite3_file,
) -> c_int {
    // SAFETY: as the caller promises.
    let t = unsafe { table(f) };
    // SAFETY: as the caller promises: not NULL, into the state the table holds.
    let state = unsafe { &*t.main_state };
    let site = if OFST == 0 {
        Site::WalWrite
    } else {
        Site::CheckpointLock
    };
    // Both locks check: a write transaction's reads and its first frame rest on it (its frames
    // are checked again, each before it and its commit after it: `state/frames.rs`).
    let gate = if state.vouched_fast() {
        Gate::Go
    } else {
        Gate::Check(site)
    };
    if gate != Gate::Go {
        let rc = verdict_slow(state, gate, ffi::SQLITE_IOERR_SHMLOCK);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    let rc = sub_call!(
        t,
        sub_object_for::<HEAP>(t, f),
        xShmLock,
        OFST,
        1,
        LOCK_EXCLUSIVE
    );
    if OFST == 0 {
        state.write_lock(rc == ffi::SQLITE_OK);
        // Issue 19: a WAL-base record due (the connection's first write, or after a checkpoint)?
        if state.stale_wal().record_due() {
            record_at_write_lock(rc, state, sub_object_for::<HEAP>(t, f));
        }
    } else {
        state.checkpoint_lock(rc == ffi::SQLITE_OK);
        state.wal_reset().checkpoint_lock(rc == ffi::SQLITE_OK);
    }
    rc
}

/// [`StaleWalSlot::at_write_lock`](crate::vfs::stale_wal::StaleWalSlot::at_write_lock) on the
/// main file `sub` (the wrapped object): out of line, so that the image it reads through lives
/// in this frame and not in `shm_lock_exclusive_checked`'s (which then needs no stack frame of
/// its own beyond the registers it saves).
#[cold]
#[inline(never)]
fn record_at_write_lock(rc: c_int, state: &DbState, sub: *mut ffi::sqlite3_file) {
    state.stale_wal().at_write_lock(rc, state, &MainImage(sub));
}

pub(super) unsafe extern "C" fn x_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: SQLite calls our methods only on our live files.
        let t = unsafe { table(f) };
        let sub = t.sub_object(f);
        let mut delete = delete;
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            if delete != 0 && !state.may_delete_shm() {
                log::warn!(
                    "hermes-guard: not unlinking {}-shm at close: it is not the one this \
                     connection mapped",
                    state.db_path().display()
                );
                delete = 0;
            }
        }
        let mut left = None;
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            // The WAL is about to be let go of (a close, or a switch out of WAL mode): a full
            // check first, while the wal-index still shows how far the WAL was checkpointed.
            state.check_at_close();
            state.shm_unmapping(delete != 0);
            // Issue 19: the record stops reading this mapping.
            state.stale_wal().unmapping();
            // Before the unmap that may unlink the -shm (and, last, close the node's
            // descriptor): the DMS lock goes with the node's last guarded connection.
            left = state.shield().leave_shm();
        }
        let rc = sub_call!(t, sub, xShmUnmap, delete);
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            if rc == ffi::SQLITE_OK {
                state.shm_unmapped();
            } else {
                // Still mapped: still shielded.
                state.shield().rejoin_shm(left);
            }
        }
        rc
    })
}
