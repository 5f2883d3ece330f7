//! A `-shm` that describes another WAL: the `-wal` alone was removed (or replaced) while some
//! connection held the `-shm`, and a new connection opened a new WAL beside it. SQLite trusts a
//! valid wal-index header: it would read the lost WAL's frames from the new file (a short read
//! in this process) or, in another process, write its own frames after a hole. Asked once, when a
//! connection first maps its `-shm` through the guard's node.

use std::os::unix::fs::FileExt;

use rusqlite::ffi;

use super::{ConnectionState, WalIndex};
use crate::walfile::{parse_wal_header, WAL_HEADER_SIZE};

/// The checkpoint lock's slot and read lock 1's: held shared while the verdict is confirmed, no
/// checkpoint can restart or truncate the WAL and no writer can reset it.
const CKPT: i32 = 1;
const READ1: i32 = 4;
const SHARED_LOCK: i32 = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_SHARED;
const SHARED_UNLOCK: i32 = ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_SHARED;

impl ConnectionState {
    /// Whether the wal-index `index` (this connection's node's region 0) describes a WAL other
    /// than the one this connection pinned: frames in it, and the pinned WAL's header not of
    /// that generation (other salts, or no valid header at all). A WAL whose header has the
    /// wal-index's salts is its WAL (a writer writes the header before the generation's first
    /// frame and the wal-index's frame count after). A difference is confirmed with the
    /// checkpoint lock and read lock 1 held shared, where a reset or a truncating checkpoint
    /// cannot run between the two reads; `false` whenever that cannot be had (busy, no WAL
    /// pinned): SQLite goes on as it would.
    pub(crate) fn wal_index_describes_another_wal(&self, index: &dyn WalIndex) -> bool {
        if !self.wal_header_differs(index) {
            return false;
        }
        let slot = &self.wal_index;
        if slot.lock(CKPT, 1, SHARED_LOCK) != Some(ffi::SQLITE_OK) {
            return false;
        }
        let confirmed = slot.lock(READ1, 1, SHARED_LOCK) == Some(ffi::SQLITE_OK) && {
            let differs = self.wal_header_differs(index);
            slot.lock(READ1, 1, SHARED_UNLOCK);
            differs
        };
        slot.lock(CKPT, 1, SHARED_UNLOCK);
        confirmed
    }

    /// The wal-index has frames, and the pinned WAL's header is not the generation's it
    /// describes. No lock: see [`ConnectionState::wal_index_describes_another_wal`].
    fn wal_header_differs(&self, index: &dyn WalIndex) -> bool {
        let (Some(backfill), Some(salts)) = (index.backfill(), index.salts()) else {
            return false;
        };
        if backfill.frames == 0 {
            return false;
        }
        let inner = self.inner.lock();
        let Some(wal) = inner.pins.wal.as_ref() else {
            return false;
        };
        let mut head = [0u8; WAL_HEADER_SIZE];
        let header = match wal.file().read_at(&mut head, 0) {
            Ok(n) => parse_wal_header(&head[..n]),
            Err(_) => return false,
        };
        !header.valid || header.salts != salts
    }
}
