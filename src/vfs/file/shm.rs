//! The shared-memory methods: the mapping (the guard's own wal-index node, `vfs/wal_index/`, or
//! SQLite's where the guard cannot name the `-shm`; the pins), the watched locks (the WAL write
//! lock and the checkpoint lock), the unmap.

use std::ffi::{c_int, c_void};

use rusqlite::ffi;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::reset_lock::{checkpoint_unlock, wal_reset_lock, wal_reset_unlock, RESET_N, RESET_OFST};
use super::*;
use crate::status::Backfill;
use crate::vfs::boundary::{compile_option_used, ffi_guard, ShmOut};
use crate::vfs::main_reads::MappedIndex;
use crate::vfs::state::{ConnectionState, Gate, Site, WalIndex};
use crate::vfs::wal_index;

/// `xShmMap` of a guarded main file (inside `ffi_guard`: see `entry::x_shm_map`).
pub(super) fn map(
    file: Live<'_>,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: ShmOut<'_>,
) -> c_int {
    let io = file.io();
    let t = io.t;
    let (Kind::Main, Some(state)) = (t.kind, &t.state) else {
        return io.shm_map_sqlite(region, size, extend, out);
    };
    let slot = state.wal_index();
    if slot.is_unmapped() && !own_node_for(io, state) {
        slot.use_sqlite();
    }
    let (rc, node) = if slot.is_sqlite() {
        let rc = io.shm_map_sqlite(region, size, extend, out);
        (rc, None)
    } else {
        // Named before the slot's lock is taken (see `ShmSlot::map`).
        let file = slot.is_unmapped().then(|| shm_file(io, state));
        // Found at the path (no other connection here vouched for it): it may describe
        // another WAL than the one this connection opened.
        let by_path = matches!(&file, Some(Ok(f)) if f.known.is_none());
        let (mut addr, mut rc) = slot.map(file, region, size, extend != 0);
        if by_path && rc == ffi::SQLITE_OK && region == 0 && addr != 0 {
            let index = WalIndexView::at(addr as *const u8);
            if index.is_some_and(|index| state.wal_index_describes_another_wal(&index)) {
                (addr, rc) = fresh_shm(io, state, region, size, extend != 0);
            }
        }
        out.set(addr);
        (rc, slot.file())
    };
    if rc == ffi::SQLITE_OK && region == 0 {
        // On success the region's address (or NULL) is in SQLite's slot.
        let addr = out.get();
        if !addr.is_null() {
            pinned_at_map(io, state, node, addr);
        }
    }
    rc
}

/// Region 0 of the connection's mapping as its state reads it (the checkpoint progress and the
/// salts), through the one home of the header's reads (`vfs/main_reads.rs`).
struct WalIndexView(MappedIndex);

impl WalIndexView {
    /// The view of region 0 mapped at `addr` (just returned by this connection's `xShmMap`).
    fn at(addr: *const u8) -> Option<WalIndexView> {
        MappedIndex::new(addr).map(WalIndexView)
    }
}

impl WalIndex for WalIndexView {
    fn backfill(&self) -> Option<Backfill> {
        let header = self.0.header();
        header.is_init().then(|| {
            let (frames, backfilled, attempted) = header.backfill();
            Backfill {
                frames,
                backfilled,
                attempted,
            }
        })
    }

    fn salts(&self) -> Option<[u32; 2]> {
        let salts = self.0.header().salts();
        self.backfill().map(|_| salts)
    }
}

/// Region 0 is mapped: the `-shm` is pinned (the guard's node names it; SQLite's is read from its
/// private node), the stale-WAL record reads its salts from the mapping, the shield may hold the
/// main lock.
fn pinned_at_map(
    io: Io<'_>,
    state: &ConnectionState,
    own: Option<(crate::identity::FileId, std::ffi::CString)>,
    addr: *const u8,
) {
    let mapped = || match own {
        Some((id, path)) => Some((id, Some(PathBuf::from(OsStr::from_bytes(path.as_bytes()))))),
        None if io.t.unix_prefix => {
            // Its xShmMap just succeeded.
            io.shm_node(|_| None)
                .ok()
                .map(|(_, id, name)| (id, Some(name)))
        }
        None => None,
    };
    if let Some(view) = WalIndexView::at(addr) {
        state.pin_shm(mapped, Box::new(view));
    }
    // The WAL-base record reads the generation's salts from this mapping.
    state.stale_wal().mapped(addr);
    state.shield().shm_mapped();
}

/// The `-shm` at the path describes another WAL than the one this connection opened (its `-wal`
/// alone was removed or replaced while a connection held it): a fresh `-shm` for this
/// connection's generation, mapped instead, before SQLite reads a byte of the old one.
#[cold]
fn fresh_shm(
    io: Io<'_>,
    state: &ConnectionState,
    region: c_int,
    size: c_int,
    extend: bool,
) -> (usize, c_int) {
    log::warn!(
        "hermes-guard: the shared memory of {} describes a WAL that is no longer at {}-wal (the \
         WAL was removed or replaced while a connection held it): a fresh one is made for the \
         WAL there; connections of the old WAL are refused as its generation is lost",
        state.db_path().display(),
        state.db_path().display()
    );
    match shm_file(io, state) {
        Ok(file) => state.wal_index().map_fresh(file, region, size, extend),
        Err(rc) => (0, rc),
    }
}

/// Whether the connection maps the wal-index through the guard's own node: a unix-VFS main file
/// in SQLite's buffer, on 64-bit Linux, in a build of SQLite that names the `-shm` `<db>-shm`
/// ([`names_shm_beside_database`]).
fn own_node_for(io: Io<'_>, state: &ConnectionState) -> bool {
    wal_index::SUPPORTED
        && io.t.unix_prefix
        && io.t.heap.is_null()
        && names_shm_beside_database(io, state)
}

/// Whether the running SQLite opens `<db>-shm` for a WAL database (not a file in an
/// `SQLITE_SHM_DIRECTORY`, nor an 8.3 name). Neither shows in the public API (the directory is not
/// among the compile options): asked once per process, of SQLite's own node, on the first
/// connection that maps — its `xShmMap` of region 0 without extending, the name read from the
/// node, and its `xShmUnmap`. Undecided (SQLite's node for this connection, asked again at the
/// next) when that map fails.
fn names_shm_beside_database(io: Io<'_>, state: &ConnectionState) -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static ANSWER: AtomicU8 = AtomicU8::new(0);
    const YES: u8 = 1;
    const NO: u8 = 2;
    match ANSWER.load(Ordering::Acquire) {
        YES => return true,
        NO => return false,
        _ => {}
    }
    if compile_option_used(c"ENABLE_8_3_NAMES") {
        ANSWER.store(NO, Ordering::Release);
        return false;
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    let rc = io.shm_map(0, 32768, 0, &mut p);
    let name = if rc == ffi::SQLITE_OK || rc == ffi::SQLITE_READONLY {
        // Its xShmMap just succeeded.
        io.shm_node(|_| None).ok().map(|(_, _, name)| name)
    } else {
        None
    };
    io.shm_unmap(0);
    let Some(name) = name else {
        return false;
    };
    let beside = name == state.shm_path();
    ANSWER.store(if beside { YES } else { NO }, Ordering::Release);
    if !beside {
        log::info!(
            "hermes-guard: this SQLite keeps the shared memory of {} in {}: SQLite's own mapping \
             of it is used (a new connection after a loss waits for the lost generation's \
             connections to close)",
            state.db_path().display(),
            name.display()
        );
    }
    beside
}

/// What the guard's node opens for this connection: `<db>-shm` with the main file's mode and
/// owner, read-only where the URI says `readonly_shm`.
fn shm_file(io: Io<'_>, state: &ConnectionState) -> Result<wal_index::ShmFile, c_int> {
    let path = std::ffi::CString::new(state.shm_path().as_os_str().as_bytes())
        .map_err(|_| ffi::SQLITE_CANTOPEN)?;
    // The wrapped file has the `unixFile` layout (checked at its open: `own_node_for`).
    let mode_and_owner = io.mode_and_owner().ok_or(ffi::SQLITE_CANTOPEN)?;
    let readonly_shm = io.t.uri_boolean(c"readonly_shm");
    Ok(wal_index::ShmFile {
        known: state.sibling_shm_vouched(),
        path,
        mode_and_owner,
        readonly_shm,
    })
}

/// `xShmLock` down: the guard's node when the connection maps through it, else the wrapped file.
#[inline(always)]
pub(super) fn shm_lock_down(io: Io<'_>, ofst: c_int, n: c_int, flags: c_int) -> c_int {
    if let Some(state) = io.t.main_state() {
        if let Some(rc) = state.wal_index().lock(ofst, n, flags) {
            return rc;
        }
    }
    io.shm_lock(ofst, n, flags)
}

/// `xShmLock` (see `x_shm_lock`).
#[inline(always)]
fn shm_lock<const HEAP: bool>(file: Live<'_>, ofst: c_int, n: c_int, flags: c_int) -> c_int {
    // Watched: the WAL write lock (0), the checkpoint lock (1), and the read locks 1-4 together,
    // `ofst` 4 and `n` 4, which SQLite asks for to reset the WAL (for SQLite's WAL-reset race). One
    // compare keeps them apart from what passes straight down: every read mark a read transaction
    // takes (`ofst` 3 to 7, `n` 1) has `ofst > n`; each watched request has `ofst <= n` (as has the
    // recovery lock, `ofst` 1 or 2 and `n` 7 or 6, which the slow branch passes down). The rest of
    // the test is `shm_lock_write_or_checkpoint_slot`'s.
    if ofst <= n {
        // Same arguments: a tail call.
        return shm_lock_write_or_checkpoint_slot::<HEAP>(file, ofst, n, flags);
    }
    shm_lock_down(file.io_for::<HEAP>(), ofst, n, flags)
}

io_entry! {
    /// No `catch_unwind` on the way through (see `hot::gated_write`): readers' locks pass
    /// straight down, and around the two watched locks only atomics run outside `verdict_slow`.
    /// Installed on guarded main files (and, in the heap layout, on every file: SQLite only calls
    /// it on main files).
    x_shm_lock<const HEAP: bool> => shm_lock::<HEAP>, (ofst: c_int, n: c_int, flags: c_int) -> c_int;
    x_shm_unmap => shm_unmap, (delete: c_int) -> c_int;
}

pub(super) const LOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE;

/// `x_shm_lock` with `ofst <= n`: `ofst` 0 or 1, or a request spanning several read locks. An
/// exclusive lock of one slot (at 0: the WAL write lock, which opens every write transaction; at 1:
/// the checkpoint lock, every checkpoint) goes on to `shm_lock_exclusive_checked`, as a tail call;
/// any other call at 0 (a release, above all) clears what the check of that lock allowed first
/// (clearing only ever costs a check more); one at 1 goes to `checkpoint_unlock` (the same, and the
/// tripwire of the WAL-reset race); the read locks 1-4 (`ofst` 4, `n` 4) go to that race's rule, a
/// resetting writer takes the checkpoint lock (`wal_reset.rs`); the rest passes down. Out of line
/// so that the pass-through of every other lock stays a few instructions; `extern "C"` (cannot
/// unwind) with the caller's arguments, so that the caller reaches it with a tail call. It stores
/// flags and tail-calls, so it pushes nothing.
#[inline(never)]
pub(super) extern "C" fn shm_lock_write_or_checkpoint_slot<const HEAP: bool>(
    file: Live<'_>,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // In SQLite's buffer, `x_shm_lock` is only installed on guarded main files (whose
    // `main_state` is set); on the heap, on every file. The exclusive lock of one slot (every
    // write transaction's) is told first, before the table is loaded: it needs none here.
    let guarded = || !HEAP || file.table().main_state().is_some();
    if flags == LOCK_EXCLUSIVE && n == 1 && guarded() {
        // Tail calls. `ofst <= n`: 0 or 1.
        return if ofst == 0 {
            shm_lock_exclusive_checked::<HEAP, 0>(file)
        } else {
            shm_lock_exclusive_checked::<HEAP, 1>(file)
        };
    }
    let t = file.table();
    if let Some(state) = t.main_state() {
        if flags == LOCK_EXCLUSIVE {
            if ofst == RESET_OFST && n == RESET_N {
                return wal_reset_lock::<HEAP>(file, ofst, n, flags);
            }
        } else if ofst == 0 {
            // Cleared whatever the release returns, as always; before it rather than after
            // (until it returns this connection writes nothing), so the call below is a tail
            // call.
            state.end_of_transaction();
        } else if ofst == 1 {
            return checkpoint_unlock::<HEAP>(file, ofst, n, flags);
        } else if ofst == RESET_OFST && n == RESET_N {
            return wal_reset_unlock::<HEAP>(file, ofst, n, flags);
        }
    }
    shm_lock_down(file.io_for::<HEAP>(), ofst, n, flags)
}

/// A watched exclusive lock, one slot, of a guarded main file: `OFST` 0, the WAL write lock,
/// which opens every write transaction (and FULL/RESTART/TRUNCATE checkpoints), or `OFST` 1, the
/// checkpoint lock, which opens every checkpoint. The check (its fast path inlined here: atomics
/// and one `epoll_wait`, panic-free; a full check or a refusal in `verdict_slow`, inside
/// `ffi_guard`), the lock, and, once it is taken, the flags that say the transaction or the
/// checkpoint was checked ([`ConnectionState::write_lock`], [`ConnectionState::checkpoint_lock`]).
/// The hot path of the guard: every write transaction runs it (`OFST` is a constant: one function
/// each, no test of it at run time).
/// Only for a guarded main file (its table's `main_state` set; on any other file the lock passes
/// down).
#[inline(never)]
pub(super) extern "C" fn shm_lock_exclusive_checked<const HEAP: bool, const OFST: c_int>(
    file: Live<'_>,
) -> c_int {
    let io = file.io_for::<HEAP>();
    let Some(state) = io.t.main_state() else {
        return shm_lock_down(io, OFST, 1, LOCK_EXCLUSIVE);
    };
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
    let rc = shm_lock_down(io, OFST, 1, LOCK_EXCLUSIVE);
    if OFST == 0 {
        state.write_lock(rc == ffi::SQLITE_OK);
        // A WAL-base record due (the connection's first write, or after a checkpoint)?
        if state.stale_wal().record_due() {
            record_at_write_lock(rc, state, io);
        }
    } else {
        state.checkpoint_lock(rc == ffi::SQLITE_OK);
        state.wal_reset().checkpoint_lock(rc == ffi::SQLITE_OK);
    }
    rc
}

/// [`StaleWalSlot::at_write_lock`](crate::vfs::stale_wal::StaleWalSlot::at_write_lock) on the
/// main file's wrapped object: out of line, so that the image it reads through lives
/// in this frame and not in `shm_lock_exclusive_checked`'s (which then needs no stack frame of
/// its own beyond the registers it saves).
#[cold]
#[inline(never)]
fn record_at_write_lock(rc: c_int, state: &ConnectionState, io: Io<'_>) {
    state.stale_wal().at_write_lock(rc, state, &io.main_image());
}

#[inline(always)]
fn shm_unmap(file: Live<'_>, delete: c_int) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_SHMMAP, || {
        let io = file.io();
        let t = io.t;
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
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            // The WAL is about to be let go of (a close, or a switch out of WAL mode): a full
            // check first, while the wal-index still shows how far the WAL was checkpointed.
            state.check_at_close();
            state.shm_unmapping(delete != 0);
            // The WAL-base record stops reading this mapping.
            state.stale_wal().unmapping();
            state.shield().shm_unmapping();
            if state.wal_index().unmap(delete != 0) {
                state.shm_unmapped();
                return ffi::SQLITE_OK;
            }
        }
        let rc = io.shm_unmap(delete);
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            if rc == ffi::SQLITE_OK {
                state.shm_unmapped();
            } else {
                // Still mapped: still shielded.
                state.shield().shm_mapped();
            }
        }
        rc
    })
}
