//! The checks: the lock-free gates every write passes (what this transaction or checkpoint has
//! already checked), the fast check the directory watch vouches for, the full check of the pins,
//! and the retirement it may find.

use std::path::Path;
use std::sync::atomic::Ordering;

use super::{ConnectionState, Gate, Site, LOCK_CHECKED, MAIN_CHECKED, NEVER_VOUCHED, WAL_CHECKED};
use crate::identity::{identity_of_path, stamp_of_path, FileId, PinnedWal};
use crate::status::{Backfill, RetireReason};

impl ConnectionState {
    /// Whether a main-file write, truncate or size hint may go ahead: the shim carries the gate
    /// out with `file::verdict`. Panic-free (atomics only), so the
    /// shim calls it outside `catch_unwind`.
    #[inline]
    pub(crate) fn main_write_gate(&self) -> Gate {
        self.checks.main_write_gate()
    }

    /// Whether a main-file write goes ahead with nothing to do first, as `file::write_gated`
    /// would decide it from [`ConnectionState::main_write_gate`] (in WAL mode) and
    /// [`ConnectionState::main_judge_due`]: not retired, checked (or the file is not in WAL mode),
    /// no judgement due. `false`: decide it in full. Panic-free (atomic loads only), so the shim
    /// calls it outside `catch_unwind`.
    #[inline(always)]
    pub(crate) fn main_write_goes(&self) -> bool {
        self.checks.main_write_goes()
    }

    /// Whether this connection holds the WAL write lock, taken while its generation was not
    /// retired: its WAL writes then follow the frame rule (`state/frames.rs`).
    #[inline(always)]
    pub(crate) fn write_lock_held(&self) -> bool {
        self.checks.write_lock_held()
    }

    /// Whether a WAL write at `offset` without the write lock may go ahead (the write lock's are
    /// the frame rule's, `state/frames.rs`): the shim carries the gate out with `file::verdict`.
    /// Panic-free (atomics only), so the shim calls it outside `catch_unwind`.
    #[inline]
    pub(crate) fn wal_write_gate(&self, offset: i64) -> Gate {
        self.checks.wal_write_gate(offset)
    }

    /// [`ConnectionState::check`]'s common case without its mutexes and without anything that can
    /// panic (the shim calls it outside `catch_unwind`): not retired, and the directory watch
    /// vouches with one `epoll_wait` that nothing on the path changed since the last full check
    /// that passed. `false`: nothing was decided, run [`ConnectionState::check`].
    ///
    /// "Not retired" costs no test of its own: a retirement sets `verified_changes` to
    /// [`NEVER_VOUCHED`], which no change count equals, and a full check that records a count
    /// re-reads `retired` after it (see [`ConnectionState::check`]).
    #[inline]
    pub(crate) fn check_fast(&self, site: Site) -> bool {
        if self.vouched_fast() {
            self.checked(site);
            true
        } else {
            false
        }
    }

    /// [`ConnectionState::check_fast`] without recording anything: for the watched locks, which
    /// record what their check allows only once the lock is taken ([`ConnectionState::write_lock`],
    /// [`ConnectionState::checkpoint_lock`]). Panic-free: atomics and one `epoll_wait`.
    #[inline(always)]
    pub(crate) fn vouched_fast(&self) -> bool {
        self.watches.vouched_fast()
    }

    /// [`ConnectionState::vouched_fast`] as of the watch's last drain, with no system call (see
    /// `FastWatch::current_as_of_last_drain`).
    pub(crate) fn vouched_as_of_last_drain(&self) -> bool {
        self.watches.vouched_as_of_last_drain()
    }

    #[inline]
    fn checked(&self, site: Site) {
        self.checks.checked(site);
    }

    /// A transaction or checkpoint boundary: run the check now regardless of the flags.
    /// It skips the `stat` calls while the directory watch vouches that nothing on the path (nor
    /// the mount table) changed since the last full check (the close-time checkpoint is still
    /// preceded by a full check, through `SQLITE_FCNTL_HAS_MOVED`).
    pub(crate) fn check(&self, site: Site) -> Result<(), i32> {
        let (generation, changes) = self.watches.figures();
        let vouched = generation
            .is_some_and(|g| g == self.watches.verified_generation.load(Ordering::Acquire));
        if !vouched || self.is_retired() {
            if self.check_pins().is_some() {
                return Err(self.refuse());
            }
            if let Some(g) = generation {
                self.watches.verified_generation.store(g, Ordering::Release);
            }
        }
        self.record_vouch(generation, changes);
        self.checked(site);
        Ok(())
    }

    /// A full check, every `stat` whatever the watch says, which, passing, lets the watch vouch
    /// from then on as a check at a transaction boundary does (the close's first check,
    /// `SQLITE_FCNTL_HAS_MOVED`, then spares the checks after it their `stat` calls). The reason
    /// when the generation is retired.
    pub(crate) fn check_pins_vouching(&self) -> Option<RetireReason> {
        let (generation, changes) = self.watches.figures();
        if let Some(reason) = self.check_pins() {
            return Some(reason);
        }
        if let Some(g) = generation {
            self.watches.verified_generation.store(g, Ordering::Release);
        }
        self.record_vouch(generation, changes);
        self.share_vouch(generation, changes);
        None
    }

    /// After a check that passed: the fast path may vouch from the change count read before it.
    pub(super) fn record_vouch(&self, generation: Option<u64>, changes: Option<u64>) {
        if let (Some(_), Some(c)) = (generation, changes) {
            // Vouched for by the path's generations, or verified by `stat` just now: the path was
            // as pinned when `changes` was read, or `changes` has moved since.
            self.watches.verified_changes.store(c, Ordering::SeqCst);
            // A retirement stores `retired` and then `NEVER_VOUCHED`, all `SeqCst`: either this
            // load sees it, or its `NEVER_VOUCHED` lands after the store above. Either way the
            // fast path never vouches for a retired generation (belt and braces: retirements run
            // inside this connection's own calls).
            if self.checks.retired.load(Ordering::SeqCst) {
                self.watches
                    .verified_changes
                    .store(NEVER_VOUCHED, Ordering::SeqCst);
            }
        }
    }

    /// The WAL write lock was taken after its check passed (`held`), or released.
    ///
    /// `LOCK_CHECKED` never stays set on a retired generation, so the WAL's closed write gate
    /// (`wal_write_gate`) could even go by it alone (it tests `retired` first anyway): a retirement
    /// stores `retired` and then clears `LOCK_CHECKED`, and this stores `LOCK_CHECKED` and then
    /// loads `retired`, all `SeqCst`. In their single total order, either this load comes after the
    /// retirement's store (it sees `retired` and clears the flag again) or the retirement's clear
    /// comes after this store; either way the flag ends cleared. (Retirements run inside this
    /// connection's own calls, so this is belt and braces.)
    ///
    /// Taken, it records the check as the transaction's ([`WAL_CHECKED`] too, as a check at the
    /// WAL's first write would).
    #[inline]
    pub(crate) fn write_lock(&self, held: bool) {
        if held {
            self.frames.begin();
            self.checks
                .tx
                .fetch_or(LOCK_CHECKED | WAL_CHECKED, Ordering::SeqCst);
            if self.checks.retired.load(Ordering::SeqCst) {
                self.checks.tx.fetch_and(!LOCK_CHECKED, Ordering::SeqCst);
            }
        } else {
            self.end_of_transaction();
        }
    }

    /// The checkpoint lock was taken after its check passed (`held`: the checkpoint's main-file
    /// writes are checked), or not taken.
    #[inline]
    pub(crate) fn checkpoint_lock(&self, held: bool) {
        if held {
            // A checkpoint of this connection's may write the main file from here: its first
            // write judges the main file first, for an overwrite in place (`state/overwrite.rs`).
            self.checks.main_judge_due.store(true, Ordering::Relaxed);
            self.checks.main_written.store(true, Ordering::Release);
            self.checks.tx.fetch_or(MAIN_CHECKED, Ordering::AcqRel);
        } else {
            self.end_of_main_write();
        }
    }

    /// A write transaction committed or ended: the next write checks again.
    #[inline]
    pub(crate) fn end_of_transaction(&self) {
        self.checks.end_of_transaction();
    }

    /// A main-file write ended — a checkpoint (its lock released, or the main file synced) or a
    /// rollback-mode write (its lock dropped to SHARED): the next one checks.
    #[inline]
    pub(crate) fn end_of_main_write(&self) {
        self.checks.end_of_main_write();
    }

    /// A commit frame was made whole after this generation's files changed (the check after it
    /// retired the generation): SQLite is told the commit failed. Said at ERROR, with what
    /// became of its frames: no capture or heal of the generation holds them
    /// (`capture/unacknowledged.rs`), but a WAL left at the path is shared with the newer
    /// generation, which may have read them.
    pub(crate) fn commit_not_acknowledged(&self, frame_offset: i64) {
        let reason = self.inner.lock().loss.reason;
        let frames = if reason == Some(RetireReason::ShmLost) {
            "Its frames are in the WAL file still at the path, which a newer generation shares: \
             if that generation read the WAL after them, the rows are live there; otherwise it \
             writes over them. Check before retrying the transaction on a new connection"
        } else {
            "Its frames stay in the retired WAL only, and no capture of it holds them: retry the \
             transaction on a new connection"
        };
        log::error!(
            "hermes-guard: a commit to {} was failed, not acknowledged: its files changed while \
             its frames were written (the WAL's frame at byte {frame_offset}), so the application \
             gets SQLITE_READONLY_DBMOVED for it. {frames} (`hermes-guard captures {}` lists \
             what the retired generation holds)",
            self.paths.db.display(),
            self.paths.db.display()
        );
    }

    /// Compares each pinned identity with what its pathname resolves to now; at the first
    /// mismatch retires the generation (sticky), logs it at ERROR (and a torn main file), and
    /// returns the reason. A retired generation returns its reason at once. Up to three `stat`
    /// calls.
    ///
    /// Only from inside the connection's own calls (its VFS methods, its pragmas): a retirement
    /// closes the WAL's write gate, a slot SQLite reads without synchronisation, which is sound
    /// only because SQLite serialises the connection's calls (see [`WalGate`]).
    pub(crate) fn check_pins(&self) -> Option<RetireReason> {
        let mut inner = self.inner.lock();
        if inner.loss.reason.is_some() {
            return inner.loss.reason;
        }
        let moved = |pinned: Option<FileId>, path: &Path| match pinned {
            None => false,
            // A stat that fails for another reason (EACCES, EIO) proves nothing either way.
            Some(id) => identity_of_path(path).is_ok_and(|now| now != Some(id)),
        };
        // The main file's stamp, kept when the check passes: what a heal at close compares with
        // (`state/healing.rs`).
        let main_now = stamp_of_path(&self.paths.db);
        let main_moved = match inner.pins.main_id {
            None => false,
            Some(id) => main_now
                .as_ref()
                .is_ok_and(|now| now.map(|s| s.id) != Some(id)),
        };
        let reason = if main_moved {
            RetireReason::MainReplaced
        } else if moved(inner.pins.wal_id(), &self.paths.wal) {
            RetireReason::WalLost
        } else if moved(inner.pins.shm_id, self.shm_check_path(&inner)) {
            RetireReason::ShmLost
        } else {
            if let Ok(Some(stamp)) = &main_now {
                self.saw_links(&mut inner, stamp.links);
            }
            inner.pins.main_stamp = main_now.ok().flatten();
            self.checks.main_written.store(false, Ordering::Release);
            return None;
        };
        self.retire_locked(&mut inner, reason);
        Some(reason)
    }

    /// Retires the generation for `reason` (sticky; `inner` is this state's, locked, and not
    /// retired yet): the WAL's write gate closes, the fast check stops vouching, and the
    /// retirement is logged at ERROR (and a torn main file).
    pub(super) fn retire_locked(&self, inner: &mut super::Inner, reason: RetireReason) {
        inner.loss.reason = Some(reason);
        self.checks.retired.store(true, Ordering::SeqCst);
        // The retired WAL must outlive SQLite's descriptor of it: a descriptor of the guard's
        // own from now on (a `dup`; failing that, tried again before SQLite's close).
        if let Some(Err(e)) = inner.pins.wal.as_mut().map(PinnedWal::own) {
            log::warn!(
                "hermes-guard: cannot take a descriptor of the retired WAL {}: {e}; tried again \
                 before its close",
                self.paths.wal.display()
            );
        }
        // The WAL's writes go through the gate from now on, and it refuses them: its first
        // test is this flag (see `write_lock`).
        inner.sync_wal_gate(self.checks.main_above_shared.load(Ordering::Acquire));
        self.checks.tx.fetch_and(!LOCK_CHECKED, Ordering::SeqCst);
        // The fast check no longer vouches (see `check_fast` and `check`).
        self.watches.stop_vouching();
        if self.directory_deleted() {
            // Deleted on purpose, most likely: said once, at WARN, where the capture is decided
            // (`state/capturing.rs`), not as a loss.
            log::info!(
                "hermes-guard: {} is retired for this connection: {}; its directory was deleted",
                self.paths.db.display(),
                reason.describe()
            );
        } else {
            log::error!(
                "hermes-guard: {} is retired for this connection: {}; its writes are refused \
                 (SQLite says \"attempt to write a readonly database\", SQLITE_READONLY_DBMOVED) \
                 so that nothing lands on a file nobody will read again. {}; close every \
                 connection of this database in this process (a pool's idle ones too) and \
                 reopen it",
                self.paths.db.display(),
                reason.describe(),
                where_the_rows_are(&self.paths.db, reason, inner.worth_capturing())
            );
        }
        crate::sqlite_log::retired(&self.paths.db, reason);
        if !matches!(
            reason,
            RetireReason::MainReplaced | RetireReason::MainOverwritten
        ) {
            inner.loss.backfill_at_loss = inner.wal_index.as_ref().and_then(|i| i.backfill());
            if let Some(b) = inner.loss.backfill_at_loss.filter(Backfill::tears_main) {
                log::error!(
                    "hermes-guard: {} was lost while only partly checkpointed ({} of its {} frames \
                     copied into the main file, {} attempted): the live database file now holds \
                     a torn mix of pages that the newer generation builds on. Stop its writers, \
                     run PRAGMA integrity_check on it, and rebuild it from the capture of this \
                     generation (`hermes-guard help recovery`, \"A torn main file\")",
                    self.paths.wal.display(),
                    b.backfilled,
                    b.frames,
                    b.attempted
                );
            }
        }
    }
}

/// The retirement line's word on the generation's committed rows: captured (a capture is taken
/// whenever the retired generation holds anything to save), or where they are when it holds
/// nothing — its WAL has no frame, so nothing of it is outside the database file.
fn where_the_rows_are(db: &Path, reason: RetireReason, at_stake: bool) -> String {
    if at_stake {
        return format!(
            "Its committed rows are captured beside the database (`hermes-guard captures {}` \
             lists them)",
            db.display()
        );
    }
    match reason {
        RetireReason::ShmLost => "Nothing is captured: its WAL, left at the path, holds no frame \
             now, so every row it committed is in the live database (checkpointed, by this \
             connection or by the newer generation, which read them from that WAL)"
            .to_owned(),
        _ => "Nothing is captured: its WAL held no frame when it was lost, so every row it \
             committed had been checkpointed into the database file"
            .to_owned(),
    }
}
