//! The stale-WAL gate in its former order, for the connection explorer only (the
//! `explore-faults` feature's switch, read through `crate::testing::seam`): judged first, EXCLUSIVE after. Today's
//! order is in the parent module; this one is kept only to show that the explorer finds what it
//! broke (tests/explore/tests/it/stale_wal_order.rs).

use std::ffi::c_int;
use std::path::Path;

use rusqlite::ffi;

use super::{
    exclusive, in_use, jitter, judge, no_exclusive, open_wal, say, under_exclusive, MainLocks, Turn,
};
use crate::capture::{sidecar, ImageSource};
use crate::vfs::stale_wal::Holder;
use crate::wal_base::Verdict;

/// As `before_wal_open` was when it judged first and tried EXCLUSIVE after; `window` is called
/// between the judgement and the EXCLUSIVE attempt (the time the look and the `-shm` probe took).
pub(super) fn before_wal_open(
    state: &impl Holder,
    main: &dyn ImageSource,
    locks: &dyn MainLocks,
    wal_path: &Path,
    window: fn(),
) -> c_int {
    let db = state.db_path();
    let Some(wal) = open_wal(db, wal_path) else {
        return ffi::SQLITE_OK;
    };
    if Turn::taken(state.main_id()) {
        return ffi::SQLITE_BUSY;
    }
    match judge(db, main, &wal, true) {
        None | Some(Verdict::Stale(_)) => {}
        Some(verdict) => {
            say(db, &verdict);
            return ffi::SQLITE_OK;
        }
    }
    drop(wal);
    let shm_path = sidecar(db, "-shm");
    if in_use::shm_use(&shm_path).in_use() {
        return ffi::SQLITE_OK;
    }
    window();
    let Some(_turn) = Turn::take(state.main_id()) else {
        return ffi::SQLITE_BUSY;
    };
    match exclusive(locks, 10 + jitter() % 40) {
        ffi::SQLITE_OK => under_exclusive(state, main, locks, wal_path),
        ffi::SQLITE_BUSY if in_use::shm_use(&shm_path).in_use() => ffi::SQLITE_OK,
        ffi::SQLITE_BUSY => ffi::SQLITE_BUSY,
        rc => no_exclusive(db, wal_path, rc),
    }
}
