//! `xClose`: the checks and captures a close owes, the held main file, the heal.

use std::ffi::c_int;
use std::sync::Arc;

use rusqlite::ffi;

use super::*;
use crate::vfs::held::{self, retry_pending_captures, Caller};
use crate::vfs::state::{ConnectionState, MainFile};

/// `xClose` (its C entry point is `entry::x_close`): the main file's shield and node let go of,
/// then the close the file's kind and state call for; at a main file's close, the pending
/// captures retried.
pub(super) fn close(c: Closing<'_>) -> c_int {
    let t = c.io.t;
    if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
        // Before SQLite's descriptor is closed or parked for reuse.
        state.shield().close();
        // A node SQLite did not unmap (it always does before a close): let go of, no delete.
        state.wal_index().unmap(false);
        state.closing_here();
    }
    let rc = match (t.kind, &t.state) {
        (Kind::Main, Some(state)) => close_main(c, state),
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
            c.close_sub()
        }
        _ => c.close_sub(),
    };
    if t.kind == Kind::Main {
        retry_pending_captures(Caller::Sqlite);
    }
    rc
}

/// A main file's close: held past it for a capture still owed, kept for an opener of this
/// process, or closed (after the heal, when nothing newer exists).
fn close_main(c: Closing<'_>, state: &Arc<ConnectionState>) -> c_int {
    let io = c.io;
    // An uncaptured generation that nothing newer touched is healed all the same (stock's
    // outcome): then there is nothing left to hold.
    if state.must_hold_main() && !state.heal_at_close(&Unlocked(io)) {
        return match keep_main(c, state) {
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
                io.close()
            }
        };
    }
    // Its WAL, with frames no checkpoint copied, left for an opener of this process inside its
    // open (`state/left.rs`): the main file is kept with it.
    if state.left_behind() {
        return match keep_main(c, state) {
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
                io.close()
            }
        };
    }
    // Its capture is written (or nothing was at stake): when nothing newer exists, the retired
    // generation goes back into the main file (`state/healing.rs`).
    state.heal_at_close(&Unlocked(io));
    state.main_closed();
    c.close_sub()
}

/// Keeps the main file SQLite is closing past its close, for a generation still to capture or a
/// WAL left for an opener: its locks go (nobody may wait on a kept handle) but the descriptor
/// stays, the file object moved out of SQLite's memory and read as the state's main image.
/// `Err`: it cannot be kept, and the caller closes it.
fn keep_main(c: Closing<'_>, state: &ConnectionState) -> Result<HeapFile, &'static str> {
    c.io.unlock(ffi::SQLITE_LOCK_NONE);
    let held = c.hold()?;
    state.set_main_image(Some(Box::new(MainImage(held.ptr))));
    Ok(held)
}

/// The wrapped main file at its close, for a heal: its own methods, through the guard's table
/// (the calls SQLite would make for a checkpoint).
pub(super) struct Unlocked<'a>(pub(super) Io<'a>);

impl MainFile for Unlocked<'_> {
    fn lock(&self, level: c_int) -> c_int {
        self.0.lock(level)
    }

    fn unlock(&self, level: c_int) -> c_int {
        self.0.unlock(level)
    }

    fn write_at(&self, bytes: &[u8], offset: i64) -> c_int {
        self.0.write(bytes, offset)
    }

    fn truncate(&self, size: i64) -> c_int {
        self.0.truncate(size)
    }

    fn sync(&self) -> c_int {
        self.0.sync(ffi::SQLITE_SYNC_NORMAL)
    }
}
