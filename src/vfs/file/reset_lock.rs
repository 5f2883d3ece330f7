//! The WAL-reset rule's `xShmLock` callbacks: SQLite's WAL-reset race (3.7.0–3.51.2), kept clear
//! of by the shim (the setting and the connection's slot: `crate::wal_reset`).
//!
//! A writer resets the WAL in `walRestartLog` (wal.c) while it holds the WAL write lock: it
//! asks for the read locks 1–4 exclusively (`xShmLock(4, 4, LOCK|EXCLUSIVE)`), rewrites the
//! wal-index header (new salts, `mxFrame` 0, `nBackfill` 0) and releases them; `SQLITE_BUSY`
//! there means "do not reset now": it appends to the WAL instead, which is always correct. A
//! checkpointer holds the checkpoint lock (CKPT, slot 1) from before it reads the WAL header
//! until `walCheckpoint` ends, but a PASSIVE checkpoint holds no read lock while it goes from
//! that header to its `nBackfill` check, so stock SQLite lets the reset fall in between.
//!
//! The rule: a connection that does not hold CKPT and asks for the read locks 1–4 gets them
//! only after the shim took CKPT for it, through the wrapped `xShmLock`, without waiting; CKPT
//! is released with the read locks. CKPT busy (a checkpoint running, in any process: it is a
//! real `fcntl` lock, byte 121 of the `-shm`) answers `SQLITE_BUSY`. A connection that holds
//! CKPT itself — a RESTART or TRUNCATE checkpoint asking for the same four read locks — passes
//! untouched. Two `fcntl` per reset; nothing on any other path.

use std::ffi::c_int;

use rusqlite::ffi;

use super::*;
use crate::vfs::boundary::ffi_guard;

/// `walRestartLog`'s request: `WAL_READ_LOCK(1)`, `WAL_NREADER - 1` locks.
pub(super) const RESET_OFST: c_int = 4;
pub(super) const RESET_N: c_int = 4;

/// The checkpoint lock's slot.
const CKPT: c_int = 1;

const UNLOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE;

/// `xShmLock(4, 4, LOCK|EXCLUSIVE)` of a guarded main file: a WAL reset (or a RESTART/TRUNCATE
/// checkpoint's wait for readers, which holds CKPT and passes untouched).
///
/// The three functions here are `extern "C"` with `x_shm_lock`'s own arguments so that
/// `shm_lock_write_or_checkpoint_slot` reaches them with a tail call and pushes nothing on the
/// hot path (see there).
/// Only for a guarded main file (its table's `main_state` set; on any other file the lock
/// passes down untouched).
#[cold]
#[inline(never)]
pub(super) extern "C" fn wal_reset_lock<const HEAP: bool>(
    file: Live<'_>,
    _ofst: c_int,
    _n: c_int,
    _flags: c_int,
) -> c_int {
    let io = file.io_for::<HEAP>();
    let Some(state) = io.t.main_state() else {
        return shm_lock_down(io, RESET_OFST, RESET_N, LOCK_EXCLUSIVE);
    };
    // The header this reset replaces: at its release, the main-file pages this connection read
    // under that header are judged again (a copy in place under a cache read from the old file).
    ffi_guard((), || state.stale_wal().before_reset());
    let slot = state.wal_reset();
    if !slot.applies() {
        return shm_lock_down(io, RESET_OFST, RESET_N, LOCK_EXCLUSIVE);
    }
    let rc = lock_without_waiting(io, CKPT, LOCK_EXCLUSIVE);
    if rc != ffi::SQLITE_OK {
        // A checkpoint is running (or CKPT could not be had at all): no reset now. SQLite
        // appends, and tries the reset again at a later commit.
        let n = slot.reset_deferred();
        ffi_guard((), || {
            log::debug!(
                "hermes-guard: WAL reset of {} deferred (the checkpoint lock is busy: {rc}); \
                 SQLite appends instead ({n} deferred on this connection)",
                state.db_path().display()
            )
        });
        return ffi::SQLITE_BUSY;
    }
    let rc = shm_lock_down(io, RESET_OFST, RESET_N, LOCK_EXCLUSIVE);
    if rc == ffi::SQLITE_OK {
        slot.reset_guarded();
    } else {
        // Readers hold the read locks: SQLite appends (BUSY), or fails the write (an error);
        // either way CKPT goes back now.
        shm_lock_down(io, CKPT, 1, UNLOCK_EXCLUSIVE);
    }
    rc
}

/// Any other call with `ofst` 4 and `n` 4 (their release, above all): passed down, then the
/// CKPT the shim took for the reset, if it did, is released.
/// Only for a guarded main file (its table's `main_state` set; on any other file the lock
/// passes down untouched).
#[cold]
#[inline(never)]
pub(super) extern "C" fn wal_reset_unlock<const HEAP: bool>(
    file: Live<'_>,
    _ofst: c_int,
    _n: c_int,
    flags: c_int,
) -> c_int {
    let io = file.io_for::<HEAP>();
    let rc = shm_lock_down(io, RESET_OFST, RESET_N, flags);
    let Some(state) = io.t.main_state() else {
        return rc;
    };
    if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
        // The reset wrote the new generation's salts into the wal-index; its WAL-base record
        // is written now, before its first frame, rather than at the next write lock: a restore
        // in between would get that lock refused and leave the generation unrecorded, for the
        // next opener to replay onto the restored file.
        let main = io.main_image();
        ffi_guard((), || state.stale_wal().at_wal_reset(state, &main));
        if state.wal_reset().take_own_ckpt() {
            shm_lock_down(io, CKPT, 1, UNLOCK_EXCLUSIVE);
        }
    }
    rc
}

/// Any call at `ofst` 1 but the exclusive lock of one slot: a checkpoint's release of CKPT
/// above all (also a snapshot's shared CKPT, or the recovery lock's release). Clears what the
/// checkpoint's check allowed (as every release did before); at the release of a CKPT SQLite
/// took through this connection, runs the tripwire first, while CKPT is still held.
/// Only for a guarded main file (its table's `main_state` set; on any other file the lock
/// passes down untouched).
#[cold]
#[inline(never)]
pub(super) extern "C" fn checkpoint_unlock<const HEAP: bool>(
    file: Live<'_>,
    _ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    let io = file.io_for::<HEAP>();
    if let Some(state) = io.t.main_state() {
        state.end_of_main_write();
        if n == 1 && flags == UNLOCK_EXCLUSIVE && state.wal_reset().checkpoint_released() {
            ffi_guard((), || state.wal_index_tripwire());
        }
    }
    shm_lock_down(io, CKPT, n, flags)
}

/// `xShmLock(ofst, 1, flags)` on the wrapped file, never waiting: in a build with
/// `SQLITE_ENABLE_SETLK_TIMEOUT` the unix VFS retries a busy lock for as long as the file's
/// `iBusyTimeout` (`osSetPosixAdvisoryLock`), which SQLite sets with `SQLITE_FCNTL_LOCK_TIMEOUT`
/// around the calls it allows to block; the shim sets it to 0 for its own attempt and puts the
/// old value back (a build without it answers `SQLITE_NOTFOUND`, and never waits). Waiting here
/// would also invert SQLite's lock order (the writer holds the WAL write lock and a read lock;
/// CKPT comes before both).
pub(super) fn lock_without_waiting(io: Io<'_>, ofst: c_int, flags: c_int) -> c_int {
    if let Some(state) = io.t.main_state() {
        // The guard's node never waits.
        if let Some(rc) = state.wal_index().lock(ofst, 1, flags) {
            return rc;
        }
    }
    let mut timeout: c_int = 0;
    let set = io.lock_timeout(&mut timeout);
    let rc = io.shm_lock(ofst, 1, flags);
    if set == ffi::SQLITE_OK {
        // `timeout` now holds the old value: put it back.
        io.lock_timeout(&mut timeout);
    }
    rc
}
