//! The trampolines of the hot path: writes, truncates, syncs and the main file's locks.

use std::ffi::c_int;

use rusqlite::ffi;

use super::*;
use crate::capture::{FailedCommit, FIRST_BYTES};
use crate::vfs::boundary::{ffi_guard, ReadBuf, WriteBuf};
use crate::vfs::state::{ConnectionState, Gate, Site, FRAME_HEADER};
use crate::wal_base::RECORDED_PAGES;

io_entry! {
    x_truncate => truncate, (size: ffi::sqlite3_int64) -> c_int;
    x_sync => sync, (flags: c_int) -> c_int;
    /// No `catch_unwind` on the way through (see `gated_write`).
    x_lock => lock, (level: c_int) -> c_int;
    x_unlock => unlock, (level: c_int) -> c_int;
}

/// The `xRead` of a guarded main file: a read of one of the first 16 pages goes on to
/// `read_first_pages` (kept for the next write lock's judgement, `vfs/main_reads.rs`: a copy in
/// place that a page cache read from the old file would write back); every other read is a
/// compare and a tail call (R1's reads, above all).
#[inline(always)]
pub(super) fn read_main<const HEAP: bool>(
    file: Live<'_>,
    buf: ReadBuf<'_>,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    if ofst < i64::from(buf.amt()) * i64::from(RECORDED_PAGES) {
        // Same arguments: a tail call.
        return read_first_pages::<HEAP>(file, buf, ofst);
    }
    file.io_for::<HEAP>().read_sqlite(buf, ofst)
}

/// `x_read_main` of one of the first 16 pages: the read, and, under a settled wal-index header
/// (the same before and after it), the page kept. Out of line, so that the other reads push
/// nothing.
///
/// `extern "C"` with the caller's arguments, for a tail call.
#[inline(never)]
extern "C" fn read_first_pages<const HEAP: bool>(
    file: Live<'_>,
    buf: ReadBuf<'_>,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    let io = file.io_for::<HEAP>();
    let Some(state) = io.t.main_state() else {
        return io.read_sqlite(buf, ofst);
    };
    let amt = buf.amt();
    let before = state.stale_wal().settled_header();
    let (rc, read) = io.read_sqlite_seen(buf, ofst);
    if let (Some(before), Some(read)) = (before, read) {
        ffi_guard((), || state.stale_wal().main_read(&before, read, amt, ofst));
    }
    rc
}

/// The `xWrite` of a guarded main file, and of a WAL while its write gate is closed: the gate
/// (no `catch_unwind`: it is decided by panic-free code and only its slow verdicts enter
/// `ffi_guard`, see `verdict`), then the write.
///
/// A main-file write that goes ahead as it is (a checkpoint's after its first, checked at its
/// lock; any in rollback mode of a generation not retired) with no judgement due passes
/// straight down, as a tail call; every other write, and every WAL write, goes to
/// `write_gated_slow`, with the same arguments (a tail call too).
#[inline(always)]
pub(super) fn gated_write(file: Live<'_>, buf: WriteBuf<'_>, ofst: ffi::sqlite3_int64) -> c_int {
    let t = file.table();
    if let Some(state) = t.main_state() {
        if state.main_write_goes() {
            let rc = file.io().write_sqlite(buf, ofst);
            if rc == ffi::SQLITE_OK && state.wal_pinned() {
                // A checkpoint's copy: the pages' kept bases are the main file's no longer.
                state.main_written(ofst, buf.amt());
            }
            return rc;
        }
    }
    // Same arguments: a tail call.
    write_gated_slow(file, buf, ofst)
}

/// [`gated_write`] for the writes its first test does not let through: the gate, the hooks of
/// the overwrite judgement and of a new generation's WAL-base record, the write. `extern "C"`
/// with the caller's arguments, for a tail call.
#[inline(never)]
extern "C" fn write_gated_slow(
    file: Live<'_>,
    buf: WriteBuf<'_>,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    let io = file.io();
    let t = io.t;
    let Some(state) = &t.state else {
        return io.write_sqlite(buf, ofst);
    };
    if t.kind == Kind::Wal && state.write_lock_held() {
        return write_framed(io, state, buf, ofst, true);
    }
    let gate = match t.kind {
        Kind::Wal => state.wal_write_gate(ofst),
        // In WAL mode the main file is written only by checkpoints; in rollback mode the
        // RESERVED lock before any write was checked.
        _ if state.wal_pinned() || state.is_retired() => state.main_write_gate(),
        _ => Gate::Go,
    };
    let rc = verdict(state, gate, ffi::SQLITE_IOERR_WRITE);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    if t.kind == Kind::Wal {
        at_wal_header(state, buf, ofst);
    }
    // A checkpoint's first write judges the main file first, once the pins were checked (a file
    // taken away is retired for that, not as overwritten): an overwrite in place retires the
    // generation, and this write is refused.
    if t.kind == Kind::Main && state.main_judge_due() && state.wal_pinned() {
        shield_slow(|| state.judge_main(&io.main_image()));
        if state.is_retired() {
            return verdict(state, Gate::Refuse, ffi::SQLITE_IOERR_WRITE);
        }
    }
    let rc = io.write_sqlite(buf, ofst);
    if rc == ffi::SQLITE_OK && t.kind == Kind::Main && state.wal_pinned() {
        state.main_written(ofst, buf.amt());
    }
    rc
}

/// The `xWrite` of a WAL while its write gate is open (the write lock held, the generation not
/// retired, the main file not above SHARED): the frame rule around the wrapped write.
#[inline(always)]
pub(super) fn wal_write(file: Live<'_>, buf: WriteBuf<'_>, ofst: ffi::sqlite3_int64) -> c_int {
    let io = file.io();
    match &io.t.state {
        Some(state) => write_framed(io, state, buf, ofst, false),
        None => io.write_sqlite(buf, ofst),
    }
}

/// A WAL write under the write lock, by the frame rule (`state/frames.rs`): a new frame's
/// header held, to go down with its page as one write; any other write checked before it (a
/// header held before it written first, or with it when it is that header's page); the write
/// (after the WAL-base record's look at a new WAL header, when `header_hook`); and, when it
/// makes a commit frame whole, the files checked again — a commit whose files changed meanwhile
/// fails (`SQLITE_READONLY_DBMOVED`), never acknowledged.
#[inline(always)]
fn write_framed(
    io: Io<'_>,
    state: &ConnectionState,
    buf: WriteBuf<'_>,
    ofst: ffi::sqlite3_int64,
    header_hook: bool,
) -> c_int {
    let Some(bytes) = buf.bytes() else {
        return io.write_sqlite(buf, ofst);
    };
    let powersafe = buf.amt() == FRAME_HEADER
        && io.device_characteristics() & ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE != 0;
    let next = state.frames().next(bytes, ofst, powersafe);
    if next.new_frame {
        if let Ok(header) = <&[u8; FRAME_HEADER as usize]>::try_from(bytes) {
            ffi_guard((), || state.new_frame(header));
        }
    }
    if next.page_of == 1 || (next.page_of != 0 && next.page_of == state.frames().trunk_due()) {
        ffi_guard((), || state.freelist_page_written(next.page_of, bytes));
    }
    if next.hold && next.held_at < 0 {
        // Checked and written with its page, the next write.
        return ffi::SQLITE_OK;
    }
    let gate = if state.is_retired() {
        Gate::Refuse
    } else {
        Gate::Check(Site::WalWrite)
    };
    let rc = verdict(state, gate, ffi::SQLITE_IOERR_WRITE);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    if header_hook {
        at_wal_header(state, buf, ofst);
    }
    let rc = match next.held_at {
        at if at >= 0 && !next.hold && at + i64::from(FRAME_HEADER) == ofst => {
            let header = state.frames().held_header();
            frame_write::write_frame(io, &header, bytes, at)
        }
        at if at >= 0 => {
            let header = state.frames().held_header();
            let rc = io.write(&header, at);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            io.write_sqlite(buf, ofst)
        }
        _ => io.write_sqlite(buf, ofst),
    };
    if rc == ffi::SQLITE_OK && next.completes_commit && !state.check_fast(Site::WalWrite) {
        return commit_refused(io, state, ofst);
    }
    rc
}

/// A commit frame made whole while the check after it could not vouch: the full check, and, if
/// the files changed, the commit failed with the reason said. Until the check vouches, the
/// transaction's frames are in doubt: the capture the check may take leaves them out
/// (`capture/unacknowledged.rs`), so the runbook never merges a commit the application was
/// told failed.
#[cold]
#[inline(never)]
fn commit_refused(io: Io<'_>, state: &ConnectionState, ofst: ffi::sqlite3_int64) -> c_int {
    let first = state.frames().first_write();
    let mut first_bytes = [0u8; FIRST_BYTES];
    // The write lock is still held: no writer of this generation wrote there since.
    let read = first.map(|from| {
        let at = i64::try_from(from).unwrap_or(i64::MAX);
        io.read(&mut first_bytes, at)
    });
    let in_doubt = first.filter(|_| read == Some(ffi::SQLITE_OK));
    if let Some(from) = in_doubt {
        ffi_guard((), || {
            state.commit_in_doubt(FailedCommit { from, first_bytes })
        });
    }
    let rc = verdict_slow(state, Gate::Check(Site::WalWrite), ffi::SQLITE_IOERR_WRITE);
    if rc != ffi::SQLITE_OK {
        ffi_guard((), || state.commit_not_acknowledged(ofst));
    } else if in_doubt.is_some() {
        ffi_guard((), || state.commit_vouched());
    }
    rc
}

/// The hook at the WAL header of a new generation, which a WAL-base record may wait for so that
/// it is written before the generation's first frame (the gate is closed for it;
/// `vfs/stale_wal/`).
fn at_wal_header(state: &ConnectionState, buf: WriteBuf<'_>, ofst: ffi::sqlite3_int64) {
    if ofst == 0 && buf.amt() >= 32 {
        if let Some(bytes) = buf.bytes() {
            let header = &bytes[..32];
            ffi_guard((), || state.stale_wal().at_wal_header(state, header));
        }
    }
}

#[inline(always)]
fn truncate(file: Live<'_>, size: ffi::sqlite3_int64) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_TRUNCATE, || {
        let io = file.io();
        let t = io.t;
        if let Some(state) = &t.state {
            let gate = if t.kind == Kind::Wal {
                // A truncate of the WAL always checks: the file may hold a newer generation's
                // frames past this connection's.
                if state.is_retired() {
                    Gate::Refuse
                } else {
                    Gate::Check(Site::WalWrite)
                }
            } else {
                state.main_write_gate()
            };
            let rc = verdict(state, gate, ffi::SQLITE_IOERR_TRUNCATE);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        io.truncate(size)
    })
}

#[inline(always)]
fn sync(file: Live<'_>, flags: c_int) -> c_int {
    let io = file.io();
    let t = io.t;
    let rc = io.sync(flags);
    if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
        // A checkpoint ends with a sync of the main file: the next one checks afresh.
        state.end_of_main_write();
        if rc == ffi::SQLITE_OK && state.stamp_due() {
            // The main file as this connection's checkpoint left it (one `stat` per
            // checkpoint): what a heal at close compares with (`state/healing.rs`).
            shield_slow(|| state.stamp_main());
        }
        // A restart may follow (or just happened): a WAL-base record is due.
        state.stale_wal().checkpoint_synced();
    }
    rc
}

#[inline(always)]
pub(super) fn lock(file: Live<'_>, level: c_int) -> c_int {
    let io = file.io();
    let t = io.t;
    if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
        // WAL mode takes EXCLUSIVE on the main file only to close, switch journal mode or
        // enter locking_mode=EXCLUSIVE. Rollback mode takes RESERVED for every write, and
        // EXCLUSIVE straight from SHARED to roll back a hot journal (which writes the main
        // file and deletes the journal by pathname): both are checked, once per lock.
        let gate = if state.wal_pinned() {
            if level == ffi::SQLITE_LOCK_EXCLUSIVE {
                if let Some(rc) = exclusive_beside_sibling(io, state) {
                    return rc;
                }
                // What the unix VFS's `unixIsSharingShmNode` tells it, which it cannot ask of the
                // guard's node: another process (or a stock connection here) maps the `-shm`.
                if ffi_guard(false, || state.wal_index().shared_with_others()) {
                    return ffi::SQLITE_BUSY;
                }
                Gate::Check(Site::MainWrite)
            } else {
                Gate::Go
            }
        } else if level >= ffi::SQLITE_LOCK_RESERVED {
            state.main_write_gate()
        } else {
            Gate::Go
        };
        let rc = verdict(state, gate, ffi::SQLITE_IOERR_LOCK);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let rc = lock_shielded(io, state, level);
        if rc == ffi::SQLITE_OK && level == ffi::SQLITE_LOCK_EXCLUSIVE && state.wal_pinned() {
            state.main_writes_may_follow();
        }
        return rc;
    }
    io.lock(level)
}

/// `xLock(EXCLUSIVE)` in WAL mode while another connection of this process holds the same
/// generation (`state/open_here.rs`): SQLite's unix VFS refuses it in-process, without a syscall,
/// so it is asked first, with no check and no step-aside of the shield for a lock that is not
/// granted. `None` when the long way must be taken: nobody else holds the generation, or the
/// refusal came while the other connection let go (then it may have come from the kernel, against
/// this connection's own shield).
#[cold]
#[inline(never)]
fn exclusive_beside_sibling(io: Io<'_>, state: &ConnectionState) -> Option<c_int> {
    if !ffi_guard(false, || state.generation_held_by_sibling()) {
        return None;
    }
    let rc = io.lock(ffi::SQLITE_LOCK_EXCLUSIVE);
    match rc {
        ffi::SQLITE_BUSY if ffi_guard(false, || state.generation_held_by_sibling()) => Some(rc),
        ffi::SQLITE_BUSY => None,
        ffi::SQLITE_OK => {
            // Granted after all (the other connection let go meanwhile, and the shield held
            // nothing in the way): checked now, before anything can be written under it.
            let verdict = verdict(state, Gate::Check(Site::MainWrite), ffi::SQLITE_IOERR_LOCK);
            if verdict != ffi::SQLITE_OK {
                io.unlock(ffi::SQLITE_LOCK_SHARED);
                return Some(verdict);
            }
            let shield = state.shield();
            shield.set_level(ffi::SQLITE_LOCK_EXCLUSIVE);
            state.main_lock_level(true);
            state.main_writes_may_follow();
            if shield.engaged() {
                shield_slow(|| shield.reconcile());
            }
            Some(rc)
        }
        _ => Some(rc),
    }
}

/// `xLock` of a guarded main file, with the lock shield around it: it steps aside before an
/// EXCLUSIVE attempt (its OFD locks would conflict with this process's own write lock) and takes
/// back what the new level allows. Outside WAL mode the shield holds nothing and this is two
/// atomic loads and a store around the call.
#[inline(always)]
pub(super) fn lock_shielded(io: Io<'_>, state: &ConnectionState, level: c_int) -> c_int {
    let shield = state.shield();
    let engaged = shield.engaged();
    let stepping_aside = engaged && level == ffi::SQLITE_LOCK_EXCLUSIVE;
    if stepping_aside {
        shield_slow(|| shield.before_exclusive());
    }
    let rc = io.lock(level);
    if rc == ffi::SQLITE_OK {
        shield.set_level(level);
        state.main_lock_level(level > ffi::SQLITE_LOCK_SHARED);
    }
    if stepping_aside {
        shield_slow(|| shield.after_exclusive());
    } else if engaged && rc == ffi::SQLITE_OK {
        shield_slow(|| shield.reconcile());
    }
    rc
}

#[inline(always)]
pub(super) fn unlock(file: Live<'_>, level: c_int) -> c_int {
    let io = file.io();
    let t = io.t;
    let rc = io.unlock(level);
    if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
        let shield = state.shield();
        if rc == ffi::SQLITE_OK {
            shield.set_level(level);
            state.main_lock_level(level > ffi::SQLITE_LOCK_SHARED);
            if shield.engaged() {
                // Back to SHARED after EXCLUSIVE: the shield takes its locks back.
                shield_slow(|| shield.reconcile());
            }
        }
        if level <= ffi::SQLITE_LOCK_SHARED {
            // A rollback-mode write (or hot-journal rollback) is over.
            state.end_of_main_write();
        }
    }
    rc
}
