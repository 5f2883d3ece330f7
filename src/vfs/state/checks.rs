//! The lock-free half of a connection's checks: what the current transaction or checkpoint has
//! checked already, whether the generation is retired, and the main file's lock and write marks.
//! Atomics only, read by every write of the connection (`state/gates.rs` decides by them).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};

use super::{Gate, Site};

pub(super) const LOCK_CHECKED: u8 = 1;
pub(super) const WAL_CHECKED: u8 = 2;
pub(super) const MAIN_CHECKED: u8 = 4;

pub(super) struct Checks {
    /// Mirrors `inner.loss.reason.is_some()` so the write path can refuse without the mutex.
    pub(super) retired: AtomicBool,
    /// Mirrors `inner.pins.wal.is_some()`.
    pub(super) wal_pinned: AtomicBool,
    /// The main file is locked above SHARED: in WAL mode, `locking_mode=EXCLUSIVE` (SQLite
    /// then writes the WAL without its write lock), a journal-mode change or the close. The
    /// WAL's write gate is closed meanwhile (see [`super::WalGate`]).
    pub(super) main_above_shared: AtomicBool,
    /// What was checked in the current transaction or checkpoint, as bits, in one word so that
    /// its end is one store:
    ///
    /// - [`LOCK_CHECKED`]: the WAL write lock is held, its check passed and the generation is
    ///   not retired: every WAL write until its release follows the frame rule, checked again
    ///   before each frame and after each commit (`state/frames.rs`). Cleared at the release, at
    ///   the commit and at the retirement (see [`super::ConnectionState::write_lock`]).
    /// - [`WAL_CHECKED`]: without the write lock (`locking_mode=EXCLUSIVE` takes no shm locks),
    ///   a check passed for the WAL writes of the current transaction.
    /// - [`MAIN_CHECKED`]: a check passed for the current checkpoint (main-file writes).
    ///
    /// Only this connection's calls set bits; a retirement clears [`LOCK_CHECKED`] with an
    /// atomic read-modify-write, so no bit another writer cleared comes back.
    pub(super) tx: AtomicU8,
    /// Offset of the last WAL write. A transaction writes forwards; a write at or below an
    /// earlier one is a new transaction after a rollback (or a rewrite within one, which only
    /// costs an extra check).
    pub(super) last_wal_offset: AtomicI64,
    /// This connection may have written the main file since `Pins::main_stamp` was taken (set at
    /// the gate of every checkpoint and main-file write, cleared by a full check that passes).
    pub(super) main_written: AtomicBool,
    /// A checkpoint took its lock; its first main-file write judges the main file first, for an
    /// overwrite in place (`state/overwrite.rs`).
    pub(super) main_judge_due: AtomicBool,
    /// The writes refused (for the status).
    pub(super) refusals: AtomicU64,
}

impl Checks {
    pub(super) fn new() -> Checks {
        Checks {
            retired: AtomicBool::new(false),
            wal_pinned: AtomicBool::new(false),
            main_above_shared: AtomicBool::new(false),
            tx: AtomicU8::new(0),
            last_wal_offset: AtomicI64::new(i64::MAX),
            main_judge_due: AtomicBool::new(false),
            main_written: AtomicBool::new(true),
            refusals: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    pub(super) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// [`super::ConnectionState::main_write_gate`].
    #[inline]
    pub(super) fn main_write_gate(&self) -> Gate {
        if self.is_retired() {
            Gate::Refuse
        } else if self.tx.load(Ordering::Acquire) & MAIN_CHECKED != 0 {
            Gate::Go
        } else {
            Gate::Check(Site::MainWrite)
        }
    }

    /// [`super::ConnectionState::main_write_goes`].
    #[inline(always)]
    pub(super) fn main_write_goes(&self) -> bool {
        !self.is_retired()
            && (self.tx.load(Ordering::Acquire) & MAIN_CHECKED != 0
                || !self.wal_pinned.load(Ordering::Acquire))
            && !self.main_judge_due.load(Ordering::Relaxed)
    }

    /// [`super::ConnectionState::write_lock_held`].
    #[inline(always)]
    pub(super) fn write_lock_held(&self) -> bool {
        self.tx.load(Ordering::Acquire) & LOCK_CHECKED != 0
    }

    /// [`super::ConnectionState::wal_write_gate`].
    #[inline]
    pub(super) fn wal_write_gate(&self, offset: i64) -> Gate {
        if self.is_retired() {
            return Gate::Refuse;
        }
        let tx = self.tx.load(Ordering::Acquire);
        // No write lock (exclusive locking mode): the first write of a transaction checks. A
        // commit ends a transaction (`SQLITE_FCNTL_COMMIT_PHASETWO`); a rollback is seen when
        // the next transaction writes at or below where the last write was.
        let previous = self.last_wal_offset.swap(offset, Ordering::AcqRel);
        if tx & WAL_CHECKED != 0 && offset > previous {
            return Gate::Go;
        }
        Gate::Check(Site::WalWrite)
    }

    /// A check passed at `site`: recorded for the transaction (a WAL site) or the checkpoint,
    /// which may write the main file from here.
    #[inline]
    pub(super) fn checked(&self, site: Site) {
        let bit = match site {
            Site::WalWrite => WAL_CHECKED,
            Site::CheckpointLock | Site::MainWrite => {
                self.main_written.store(true, Ordering::Release);
                MAIN_CHECKED
            }
        };
        self.tx.fetch_or(bit, Ordering::AcqRel);
    }

    /// A checkpoint took its lock since the last judgement: judge before its first main-file
    /// write (cleared). One atomic load, a swap when set.
    #[inline]
    pub(super) fn take_main_judge_due(&self) -> bool {
        self.main_judge_due.load(Ordering::Relaxed)
            && self.main_judge_due.swap(false, Ordering::Relaxed)
    }

    /// A write transaction committed or ended: the next write checks again.
    #[inline]
    pub(super) fn end_of_transaction(&self) {
        // All three: new frames mean a later checkpoint has new pages to copy. (A retirement's
        // concurrent clear of LOCK_CHECKED clears no more than this.)
        self.tx.store(0, Ordering::Release);
    }

    /// A main-file write ended: the next one checks.
    #[inline]
    pub(super) fn end_of_main_write(&self) {
        if self.tx.load(Ordering::Acquire) & MAIN_CHECKED != 0 {
            self.tx.fetch_and(!MAIN_CHECKED, Ordering::AcqRel);
        }
    }
}
