//! The tripwire that notices the WAL-reset race's damage in the wal-index, at the end of a
//! connection's checkpoint (the rule itself and the connection's slot: `crate::wal_reset`; its
//! `xShmLock` callbacks: `vfs/file/reset_lock.rs`).

use super::ConnectionState;
use crate::wal_reset::slot::{shows_damage, WalResetSlot};

impl ConnectionState {
    /// The WAL-reset rule's slot of this connection: on or off, and its counters.
    pub(crate) fn wal_reset(&self) -> &WalResetSlot {
        &self.wal_reset
    }

    /// The tripwire, at the end of this connection's checkpoint (the checkpoint lock still
    /// held): `nBackfill > mxFrame` in the wal-index, seen twice, is logged at ERROR (the first
    /// time for this connection; every time at debug), counted in the status and sent to
    /// `sqlite3_log`. No syscall: two reads of the mapping.
    pub(crate) fn wal_index_tripwire(&self) {
        let read = || {
            let inner = self.inner.lock();
            inner.wal_index.as_ref().and_then(|index| index.backfill())
        };
        let Some(first) = read().filter(shows_damage) else {
            return;
        };
        let Some(again) = read().filter(shows_damage) else {
            return;
        };
        let n = self.wal_reset.alarm();
        let message = format!(
            "hermes-guard: the wal-index of {} says {} WAL frames were checkpointed but the WAL \
             holds {} (first read: {} of {}): SQLite's WAL-reset race (fixed in 3.51.3) or \
             another process's damage; committed transactions may be invisible or lost — run \
             PRAGMA integrity_check and see docs/architecture.md (\"The WAL-reset race\")",
            self.paths.db.display(),
            again.backfilled,
            again.frames,
            first.backfilled,
            first.frames
        );
        if n == 1 {
            log::error!("{message}");
            crate::sqlite_log::wal_index_alarm(&message);
        } else {
            log::debug!("{message} (alarm {n} of this connection)");
        }
    }
}
