//! The stale-WAL gate for a WAL that a guarded connection of this very process has open for
//! another main file.
//!
//! A WAL's path follows from its database's, so a connection of this process holding the WAL at
//! the path for a main file other than the one now at the path means that file was replaced
//! (renamed over, or unlinked and made again) while the connection ran: the WAL, and the `-shm`
//! beside it, are the old file's. Between processes the `-shm`'s locks keep a new opener out
//! while the old file's writer uses it; within one process they do not: the unix VFS keys a
//! `-shm` node by the main file's inode, so the opener of the new file gets a node of its own on
//! the same `-shm` file, and POSIX locks never conflict within a process. Both would then write
//! one WAL, which no main file can read, and the opener's checkpoint would copy the old file's
//! frames onto the new one. The gate's other tests cannot see it when the old file's writer has
//! written the generation's header but no frame yet (nothing to replay). So this WAL is set
//! aside whatever it holds, under EXCLUSIVE on the new file (which the old file's connections
//! do not hold), `-shm` and all: the opener gets a WAL and a `-shm` of its own, and the old
//! file's connection keeps writing, through its descriptors, into the set-aside inodes until the
//! guard refuses it (its file was replaced).

use std::ffi::c_int;
use std::path::Path;

use rusqlite::ffi;

use super::{exclusive, jitter, no_exclusive, open_wal, set_aside_or_refuse, BackToShared, Turn};
use super::{ImageSource, MainLocks};
use crate::identity::{identity_of_fd, FileId};
use crate::vfs::stale_wal::Holder;
use crate::wal_base::{look_at_wal, read_record, Mismatch, WalBaseRecord};

/// Before SQLite opens `wal_path`, which a guarded connection of this process has open for the
/// main file `other` (not the one now at the path): the WAL set aside (or the open refused in
/// the strict mode, or `SQLITE_BUSY` while another thread of this process sets it aside or the
/// new file is held).
pub(super) fn wal_of_a_replaced_file(
    state: &impl Holder,
    main: &dyn ImageSource,
    locks: &dyn MainLocks,
    wal_path: &Path,
    other: FileId,
) -> c_int {
    let db = state.db_path();
    let Some(main_now) = state.main_id() else {
        return ffi::SQLITE_OK;
    };
    let Some(_turn) = Turn::take(Some(main_now)) else {
        return ffi::SQLITE_BUSY;
    };
    match exclusive(locks, 10 + jitter() % 40) {
        ffi::SQLITE_OK => {}
        // Another connection holds the new file: one of this process went through this gate
        // first and set the WAL aside, or is on its way; ask again (the busy handler retries).
        ffi::SQLITE_BUSY => return ffi::SQLITE_BUSY,
        rc => return no_exclusive(db, wal_path, rc),
    }
    let _back_to_shared = BackToShared(locks);
    let Some(wal) = open_wal(db, wal_path) else {
        return ffi::SQLITE_OK;
    };
    // Still that WAL (the same inode the other connection holds)?
    let Ok(wal_id) = identity_of_fd(&wal) else {
        return ffi::SQLITE_OK;
    };
    if super::in_use::wal_open_here_for_another(main_now, wal_id) != Some(other) {
        return ffi::SQLITE_OK;
    }
    let header = look_at_wal(&wal, None).map(|l| l.header).ok();
    let (salts, page_size) = header.map_or(([0, 0], 0), |h| (h.salts, h.page_size));
    let recorded = read_record(std::os::fd::AsFd::as_fd(&wal)).unwrap_or(WalBaseRecord {
        v: 1,
        salts,
        page_size,
        main: Some(other),
        pages: Vec::new(),
    });
    let m = Mismatch {
        detail: format!(
            "a connection of this process still has this WAL open for the database file \
             {other}, not the one now at the path ({main_now}): the file was replaced while that \
             connection ran, and the WAL (salts {:08x} {:08x}) and its -shm are the old file's",
            salts[0], salts[1]
        ),
        recorded,
        wal_salts: salts,
        main_now: Some(main_now),
        page: 0,
        page_hash_now: None,
        page_frames_in_wal: 0,
    };
    set_aside_or_refuse(state, main, wal, wal_path, &m)
}
