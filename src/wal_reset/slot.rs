//! A connection's part in the WAL-reset rule: on or off, whether SQLite holds the checkpoint
//! lock through it, the counters its status reports; and what counts as the race's damage in
//! the wal-index. Plain atomics, set only from inside the connection's own calls.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::status::Backfill;

/// One connection's state of the rule: plain atomics, set only from inside the connection's own
/// calls, read by its status.
pub(crate) struct WalResetSlot {
    /// The rule is on for this connection (decided at the open, `PRAGMA
    /// hermes_guard_wal_reset_guard` changes it).
    on: AtomicBool,
    /// SQLite holds the checkpoint lock through this connection (a checkpoint is running): its
    /// own RESTART/TRUNCATE asks for the read locks 1–4 then, and passes untouched.
    holds_ckpt: AtomicBool,
    /// The shim took the checkpoint lock for a WAL reset of this connection's, to be released
    /// with the read locks 1–4.
    took_ckpt: AtomicBool,
    /// Resets answered `SQLITE_BUSY` because the checkpoint lock was busy (SQLite appended).
    deferred: AtomicU64,
    /// Resets that went ahead with the checkpoint lock held by the shim.
    guarded: AtomicU64,
    /// Times the tripwire saw `nBackfill` past `mxFrame` at the end of a checkpoint.
    alarms: AtomicU64,
}

impl WalResetSlot {
    pub(crate) fn new() -> WalResetSlot {
        WalResetSlot {
            on: AtomicBool::new(super::wal_reset_guard_on()),
            holds_ckpt: AtomicBool::new(false),
            took_ckpt: AtomicBool::new(false),
            deferred: AtomicU64::new(0),
            guarded: AtomicU64::new(0),
            alarms: AtomicU64::new(0),
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub(crate) fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// SQLite asked for the checkpoint lock through this connection (`held`: it got it).
    #[inline]
    pub(crate) fn checkpoint_lock(&self, held: bool) {
        self.holds_ckpt.store(held, Ordering::Relaxed);
    }

    /// SQLite released the checkpoint lock; whether it held it (a checkpoint ends).
    #[inline]
    pub(crate) fn checkpoint_released(&self) -> bool {
        self.holds_ckpt.swap(false, Ordering::Relaxed)
    }

    /// Whether a request for the read locks 1–4 is a WAL reset the rule must order: the rule is
    /// on and this connection is not checkpointing (a RESTART/TRUNCATE checkpoint's request
    /// passes untouched).
    pub(crate) fn applies(&self) -> bool {
        self.is_on() && !self.holds_ckpt.load(Ordering::Relaxed)
    }

    /// A reset went ahead with the checkpoint lock the shim took.
    pub(crate) fn reset_guarded(&self) {
        self.took_ckpt.store(true, Ordering::Relaxed);
        self.guarded.fetch_add(1, Ordering::Relaxed);
    }

    /// The read locks 1–4 are released: whether the shim holds the checkpoint lock for them.
    pub(crate) fn take_own_ckpt(&self) -> bool {
        self.took_ckpt.swap(false, Ordering::Relaxed)
    }

    /// A reset was answered `SQLITE_BUSY`: the checkpoint lock was busy (`rc` its answer).
    pub(crate) fn reset_deferred(&self) -> u64 {
        self.deferred.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn deferred(&self) -> u64 {
        self.deferred.load(Ordering::Relaxed)
    }

    pub(crate) fn guarded(&self) -> u64 {
        self.guarded.load(Ordering::Relaxed)
    }

    pub(crate) fn alarms(&self) -> u64 {
        self.alarms.load(Ordering::Relaxed)
    }

    /// The tripwire saw the damage: the count, this one included.
    pub(crate) fn alarm(&self) -> u64 {
        self.alarms.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Whether the wal-index shows the race's damage: `nBackfill` past `mxFrame`, with `mxFrame` not
/// 0. `b` must have been read `mxFrame` first (as [`crate::vfs::state::WalIndex::backfill`]
/// does): then, while the caller holds the checkpoint lock (no checkpointer can raise
/// `nBackfill`), the one legitimate moment of `nBackfill > mxFrame` is inside a WAL reset, which
/// writes the header (`mxFrame` 0) before it zeroes `nBackfill` — so `mxFrame` reads 0 there.
pub(crate) fn shows_damage(b: &Backfill) -> bool {
    b.frames > 0 && b.backfilled > b.frames
}

#[cfg(test)]
mod tests {
    use super::shows_damage;
    use crate::status::Backfill;

    fn at(frames: u32, backfilled: u32) -> Backfill {
        Backfill {
            frames,
            backfilled,
            attempted: backfilled,
        }
    }

    #[test]
    fn nbackfill_past_a_nonzero_mxframe_is_damage() {
        assert!(shows_damage(&at(21, 63)));
    }

    #[test]
    fn a_reset_in_flight_with_mxframe_zero_is_no_alarm() {
        assert!(!shows_damage(&at(0, 63)));
    }

    #[test]
    fn a_partial_or_complete_checkpoint_is_no_alarm() {
        assert!(!shows_damage(&at(63, 21)));
        assert!(!shows_damage(&at(63, 63)));
    }
}
