//! The file controls the guard answers or acts on (`VFSNAME`, `SIZE_HINT`, `HAS_MOVED`, the
//! commit boundary) and its pragmas.

use std::ffi::c_int;

use rusqlite::ffi;

use super::*;
use crate::capture::{self, Trigger};
use crate::vfs::boundary::{ffi_guard, Fcntl, PragmaArgs};
use crate::vfs::state::ConnectionState;

/// The file controls the guard answers or acts on run inside `ffi_guard`; every other one
/// (SQLite sends several per transaction) passes straight down: neither can panic.
pub(super) const ANSWERED: u64 = 1 << ffi::SQLITE_FCNTL_VFSNAME
    | 1 << ffi::SQLITE_FCNTL_SIZE_HINT
    | 1 << ffi::SQLITE_FCNTL_HAS_MOVED
    | 1 << ffi::SQLITE_FCNTL_PRAGMA
    | 1 << ffi::SQLITE_FCNTL_EXTERNAL_READER;

/// `xFileControl` of a guarded main file: as `x_file_control`, and the commit boundary, which
/// only stores atomics.
#[inline(always)]
pub(super) fn file_control_main<const HEAP: bool>(file: Live<'_>, fc: Fcntl<'_>) -> c_int {
    let op = fc.op();
    if op == ffi::SQLITE_FCNTL_COMMIT_PHASETWO {
        if let Some(state) = file.table().main_state() {
            // Sent after every commit, in every locking mode: the transaction is over.
            state.end_of_transaction();
        }
    } else if (op as u32) < 64 && ANSWERED & (1 << op) != 0 {
        // Same arguments: a tail call.
        return file_control_answered(file, fc);
    }
    file.io_for::<HEAP>().file_control(&fc)
}

/// `xFileControl` of every other file: the controls in [`ANSWERED`] go to
/// `file_control_answered`, the rest straight down.
#[inline(always)]
pub(super) fn file_control(file: Live<'_>, fc: Fcntl<'_>) -> c_int {
    let op = fc.op();
    if (op as u32) < 64 && ANSWERED & (1 << op) != 0 {
        // Same arguments: a tail call.
        return file_control_answered(file, fc);
    }
    file.io().file_control(&fc)
}

/// The file controls the guard answers or acts on, inside `ffi_guard`. `extern "C"` with the
/// caller's arguments, for a tail call (see `shm_lock_write_or_checkpoint_slot`).
#[cold]
#[inline(never)]
pub(super) extern "C" fn file_control_answered(file: Live<'_>, fc: Fcntl<'_>) -> c_int {
    let io = file.io();
    let t = io.t;
    ffi_guard(ffi::SQLITE_ERROR, || {
        match (fc.op(), t.kind, &t.state) {
            (ffi::SQLITE_FCNTL_VFSNAME, _, _) => {
                let rc = io.file_control(&fc);
                fc.chain_vfs_name(crate::vfs::VFS_NAME, rc).unwrap_or(rc)
            }
            (ffi::SQLITE_FCNTL_SIZE_HINT, Kind::Main, Some(state))
                if state.wal_pinned() || state.is_retired() =>
            {
                // A checkpoint's size hint may grow the main file before its first write.
                let rc = verdict(state, state.main_write_gate(), ffi::SQLITE_IOERR_WRITE);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                io.file_control(&fc)
            }
            (ffi::SQLITE_FCNTL_HAS_MOVED, Kind::Main, Some(state)) => {
                let rc = io.file_control(&fc);
                // Another connection of this process holds the same generation, so this close
                // cannot checkpoint (its EXCLUSIVE is refused in-process), and the watch vouches
                // for that connection's last full check: nothing was taken away
                // (`state/open_here.rs`).
                if state.close_left_to_sibling() {
                    return rc;
                }
                // SQLite asks this just before its close-time checkpoint: a retired generation
                // answers "moved" so that checkpoint (and the WAL delete after it) never runs. A
                // full check, after which the close's other checks go by the watch; a main file
                // overwritten in place retires it here too (judged once the pins hold: a file taken
                // away is retired for that).
                let mut moved = state.check_pins_vouching().is_some();
                if !moved && state.wal_pinned() {
                    judge_main_at_close(io, state);
                    moved = state.is_retired();
                }
                if moved {
                    let _ = state.ensure_captured(Trigger::Close);
                    if let Some(out) = fc.int_out() {
                        *out = 1;
                    }
                    return ffi::SQLITE_OK;
                }
                rc
            }
            (ffi::SQLITE_FCNTL_PRAGMA, Kind::Main, Some(state)) => {
                match fc.pragma().and_then(|az| pragma(state, az)) {
                    Some(rc) => rc,
                    None => io.file_control(&fc),
                }
            }
            (ffi::SQLITE_FCNTL_EXTERNAL_READER, Kind::Main, Some(state)) => {
                // The unix VFS answers from its own node, which a connection mapping through the
                // guard's does not have: the guard's node answers.
                match state.wal_index().external_reader() {
                    Some(Ok(reader)) => {
                        if let Some(out) = fc.int_out() {
                            *out = c_int::from(reader);
                        }
                        ffi::SQLITE_OK
                    }
                    Some(Err(rc)) => rc,
                    None => io.file_control(&fc),
                }
            }
            _ => io.file_control(&fc),
        }
    })
}

/// The read lock of slot 0 (`WAL_READ_LOCK(0)`): held shared by a reader that reads every page
/// from the main file.
const READ0: c_int = 3;

/// The judgement of the main file at `SQLITE_FCNTL_HAS_MOVED`, which SQLite sends at the close
/// holding no lock of the WAL: another connection's checkpoint may be writing the very pages read
/// (and another's reset starting a generation, which the judgement's confirmation with the
/// wal-index sees: `state/overwrite.rs`). So it is made under `READ(0)` shared, taken through the
/// wrapped file without waiting and released at once: a checkpoint copies frames into the main file
/// (and truncates it) only while it holds `READ(0)` exclusively (`walCheckpoint`, every SQLite
/// version), so none writes it meanwhile; to others it is a reader of the main file, as common as
/// any. Busy, a checkpoint is copying now, so another connection holds the database and this close
/// will not have the EXCLUSIVE lock its own checkpoint needs: the judgement is deferred to that
/// lock, which makes the close's checkpoint judge before its first write
/// (`main_writes_may_follow`), under EXCLUSIVE. A wal-index in SQLite's heap
/// (`locking_mode=EXCLUSIVE` from the start: no mapping, and this connection holds EXCLUSIVE) is
/// judged as it is.
fn judge_main_at_close(io: Io<'_>, state: &ConnectionState) {
    if !state.stale_wal().is_mapped() || crate::vfs::state::overwrite::unconfirmed() {
        state.judge_main(&io.main_image());
        return;
    }
    let shared = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_SHARED;
    let rc = super::reset_lock::lock_without_waiting(io, READ0, shared);
    if rc != ffi::SQLITE_OK {
        log::debug!(
            "hermes-guard: the close's judgement of {} is deferred (a checkpoint is copying \
             frames: {rc}); a checkpoint of this close judges first",
            state.db_path().display()
        );
        return;
    }
    // Released whatever the judgement does (a panic is caught here, not above the lock).
    ffi_guard((), || state.judge_main(&io.main_image()));
    shm_lock_down(
        io,
        READ0,
        1,
        ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_SHARED,
    );
}

/// `PRAGMA hermes_guard_status`, `PRAGMA hermes_guard_capture` and `PRAGMA
/// hermes_guard_wal_reset_guard [= on|off|auto]`; `None` for any other pragma.
pub(super) fn pragma(state: &ConnectionState, az: PragmaArgs<'_>) -> Option<c_int> {
    let name = az.name();
    if name.eq_ignore_ascii_case(b"hermes_guard_wal_reset_guard") {
        let (rc, text) = wal_reset_pragma(state, az.arg());
        az.answer(&text);
        return Some(rc);
    }
    if name.eq_ignore_ascii_case(b"journal_mode") {
        let message = refuse_wal_here(state, az.arg()?)?;
        az.answer(&message);
        return Some(ffi::SQLITE_ERROR);
    }
    let reply = if name.eq_ignore_ascii_case(b"hermes_guard_status") {
        Ok(())
    } else if name.eq_ignore_ascii_case(b"hermes_guard_capture") {
        // The typed error stays on this thread for the library call that ran the pragma.
        state
            .ensure_captured(Trigger::Close)
            .map(|_| ())
            .map_err(capture::hand_over)
    } else {
        return None;
    };
    let (rc, text) = match reply
        .and_then(|()| serde_json::to_string(&state.status()).map_err(|e| e.to_string()))
    {
        Ok(json) => (ffi::SQLITE_OK, json),
        Err(message) => (ffi::SQLITE_ERROR, message),
    };
    az.answer(&text);
    Some(rc)
}

/// `PRAGMA journal_mode = WAL` on a filesystem where WAL is not safe, with
/// `HERMES_GUARD_UNSAFE_FS=refuse`: the error to fail it with; `None` lets it run.
fn refuse_wal_here(state: &ConnectionState, mode: &[u8]) -> Option<String> {
    if !mode.eq_ignore_ascii_case(b"wal") {
        return None;
    }
    let fs = state.wal_refused_on()?;
    Some(format!(
        "hermes-guard: refusing journal_mode=WAL for {}: it is on {}, where SQLite's WAL mode is \
         not safe (it needs every process on one host, with working shared memory and POSIX \
         locks); {}=refuse is set. Use a local filesystem or another journal mode",
        state.db_path().display(),
        fs.name,
        crate::filesystem::UNSAFE_FS_ENV
    ))
}

/// `PRAGMA hermes_guard_wal_reset_guard [= on|off|auto]`: sets the WAL-reset race's rule (the
/// resetting writer takes the checkpoint lock) for this connection when given a value (`auto`: as a
/// connection opened now would start), and answers what is in force, `on` or `off`.
fn wal_reset_pragma(state: &ConnectionState, arg: Option<&[u8]>) -> (c_int, String) {
    let set = match arg.map(|a| a.to_ascii_lowercase()).as_deref() {
        None => None,
        Some(b"on" | b"1" | b"true") => Some(true),
        Some(b"off" | b"0" | b"false") => Some(false),
        Some(b"auto") => Some(crate::wal_reset::wal_reset_guard_on()),
        Some(_) => {
            let message = "hermes_guard_wal_reset_guard takes on, off or auto";
            return (ffi::SQLITE_ERROR, message.into());
        }
    };
    if let Some(on) = set {
        state.wal_reset().set_on(on);
    }
    let now = if state.wal_reset().is_on() {
        "on"
    } else {
        "off"
    };
    (ffi::SQLITE_OK, now.into())
}
