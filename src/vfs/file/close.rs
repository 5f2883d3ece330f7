//! `xClose`: the checks and captures a close owes, the held main file, the heal.

use std::ffi::{c_int, c_void};

use rusqlite::ffi;

use super::*;
use crate::vfs::boundary::ffi_guard;
use crate::vfs::held::{self, retry_pending_captures, Caller};
use crate::vfs::state::MainFile;

pub(super) unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_CLOSE, || {
        // SAFETY: SQLite closes each file it opened exactly once: the table is ours again (it
        // clears pMethods after this call and never reads the table afterwards).
        let t = unsafe { Box::from_raw((*f).pMethods as *mut FileTable) };
        let sub = t.sub_object(f);
        let heap = (!t.heap.is_null()).then_some(HeapFile {
            ptr: t.heap,
            layout: t.sub_layout,
            path: None,
            leak_at_close: false,
        });
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            // Before SQLite's descriptor is closed or parked for reuse.
            state.shield().close();
            // A node SQLite did not unmap (it always does before a close): let go of, no delete.
            state.wal_index().unmap(false);
            state.closing_here();
        }
        let rc = match (t.kind, &t.state) {
            // An uncaptured generation that nothing newer touched is healed all the same (stock's
            // outcome): then there is nothing left to hold.
            (Kind::Main, Some(state))
                if state.must_hold_main() && !state.heal_at_close(&Unlocked { t: &t, sub }) =>
            {
                // SAFETY: `f` is the open file SQLite is closing, this table's.
                match unsafe { keep_main(&t, f, sub, heap, state) } {
                    Ok(held) => {
                        log::error!(
                            "hermes-guard: {} closed with its retired generation uncaptured; its \
                             descriptors are held and the capture is retried at the next open or \
                             close in this process, at its exit, or on request ({}); \
                             `hermes-guard held` shows where its bytes are while the process lives",
                            state.db_path().display(),
                            crate::host::retry_hint()
                        );
                        held::hold(state.clone(), Box::new(held));
                        ffi::SQLITE_OK
                    }
                    Err(why) => {
                        log::error!(
                            "hermes-guard: {} closed with its retired generation uncaptured, and \
                             its main file cannot be held past the close ({why}): the retired \
                             generation can no longer be captured",
                            state.db_path().display()
                        );
                        state.main_closed();
                        sub_call!(&t, sub, xClose)
                    }
                }
            }
            // Its WAL, with frames no checkpoint copied, left for an opener of
            // this process inside its open (`state/left.rs`): the main file is kept with it.
            (Kind::Main, Some(state)) if state.left_behind() => {
                // SAFETY: `f` is the open file SQLite is closing, this table's.
                match unsafe { keep_main(&t, f, sub, heap, state) } {
                    Ok(held) => {
                        held::leave(state.clone(), Box::new(held));
                        ffi::SQLITE_OK
                    }
                    Err(why) => {
                        log::warn!(
                            "hermes-guard: {} closes leaving committed frames in its WAL for \
                             another connection's open, and its main file cannot be kept past \
                             the close ({why}): if the WAL is taken away before that open, its \
                             frames are in no file",
                            state.db_path().display()
                        );
                        state.main_closed();
                        sub_call!(&t, sub, xClose)
                    }
                }
            }
            (Kind::Main, Some(state)) => {
                // Its capture is written (or nothing was at stake): when nothing newer exists,
                // the retired generation goes back into the main file (`state/healing.rs`).
                state.heal_at_close(&Unlocked { t: &t, sub });
                state.main_closed();
                close_sub(&t, sub, heap)
            }
            (Kind::Wal, Some(state)) => {
                // SQLite lets go of the WAL here whatever it asked before: with
                // `SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE` it never sent `SQLITE_FCNTL_HAS_MOVED`. A WAL
                // retired since the last check is found now, while its descriptor and the main
                // file are still open, and captured (or held, see `wal_closing`).
                state.check_at_close();
                // Before the table goes (at the end of this call).
                state.detach_wal_gate();
                // Before SQLite's descriptor goes: a pin that borrows it lets go or owns a dup.
                state.wal_closing();
                close_sub(&t, sub, heap)
            }
            _ => close_sub(&t, sub, heap),
        };
        if t.kind == Kind::Main {
            retry_pending_captures(Caller::Sqlite);
        }
        rc
    })
}

/// Keeps the main file SQLite is closing past its close, for a generation still to capture or a
/// WAL left for an opener: its locks go (nobody may wait on a kept handle) but the descriptor
/// stays, the file object moved out of SQLite's memory and read as the state's main image.
/// `Err`: it cannot be kept, and the caller closes it.
///
/// # Safety
///
/// `f` is the open file SQLite is closing, `t`'s, and `heap` its heap object if it has one.
unsafe fn keep_main(
    t: &FileTable,
    f: *mut ffi::sqlite3_file,
    sub: *mut ffi::sqlite3_file,
    heap: Option<HeapFile>,
    state: &DbState,
) -> Result<HeapFile, &'static str> {
    sub_call!(t, sub, xUnlock, ffi::SQLITE_LOCK_NONE);
    // SAFETY: the caller's contract.
    let held = unsafe { t.hold(f, heap) }?;
    state.set_main_image(Some(Box::new(MainImage(held.ptr))));
    Ok(held)
}

/// The wrapped main file at its close, for a heal: its own methods, through the guard's table
/// (the calls SQLite would make for a checkpoint).
pub(super) struct Unlocked<'a> {
    pub(super) t: &'a FileTable,
    pub(super) sub: *mut ffi::sqlite3_file,
}

impl MainFile for Unlocked<'_> {
    fn lock(&self, level: c_int) -> c_int {
        sub_call!(self.t, self.sub, xLock, level)
    }

    fn unlock(&self, level: c_int) -> c_int {
        sub_call!(self.t, self.sub, xUnlock, level)
    }

    fn write_at(&self, bytes: &[u8], offset: i64) -> c_int {
        let Ok(len) = c_int::try_from(bytes.len()) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        sub_call!(
            self.t,
            self.sub,
            xWrite,
            bytes.as_ptr() as *const c_void,
            len,
            offset
        )
    }

    fn truncate(&self, size: i64) -> c_int {
        sub_call!(self.t, self.sub, xTruncate, size)
    }

    fn sync(&self) -> c_int {
        sub_call!(self.t, self.sub, xSync, ffi::SQLITE_SYNC_NORMAL)
    }
}
