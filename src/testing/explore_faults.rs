//! Fault switches for the connection explorer (tests/explore), compiled only with the
//! `explore-faults` feature, which only tests/explore enables: each puts back a bug the guard
//! once had, so that the explorer can show it finds it. All off until switched on.
//!
//! - [`set_stale_wal_judged_before_exclusive`]: the stale-WAL gate in its former order — the quick
//!   look and "is the `-shm` in use" first, EXCLUSIVE on the main file only after
//!   (`src/vfs/stale_wal/gate/old_order.rs`). A `-shm` in use let the WAL be replayed without a
//!   judgement (a restore under a running app undone), and the time the look took was a window in
//!   which a stock opener took SHARED first and replayed the WAL (a restore a guarded opener saw
//!   first undone). The window is a real time span, which one step of the explorer does not have:
//!   the switch takes a function the gate calls there (the explorer's yield point).
//! - [`set_capture_base_ignored`]: recovery's former rule — a capture's delta is replayed
//!   (updates and deletions) whatever its manifest says of its base, so a newer generation's
//!   rows checkpointed into the captured image read as deleted by the captured generation.
//! - [`set_changes_ignored`]: recovery without the `changes` rule — a capture whose base is not its
//!   own is merged `add-only` even when it holds the base of its pages (`<file>-base`), never by
//!   the `changes` rule: rows a newer generation deleted or updated on the pages the captured WAL
//!   carries come back (deleted rows inserted again, old versions inserted beside the new).
//! - [`set_judgement_unconfirmed`]: the overwrite judgement's former reading — the close judges
//!   the main file without `READ(0)` shared, and no judgement confirms the frames' progress
//!   with the wal-index's salts: a checkpoint copying, or a reset starting a generation, under
//!   the judgement made a healthy connection look overwritten (`main-overwritten`).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

/// The window function (`None`: the switch is off).
static STALE_WAL_JUDGED_BEFORE_EXCLUSIVE: RwLock<Option<fn()>> = RwLock::new(None);

/// Switches the stale-WAL gate to its former order, judging before it tries EXCLUSIVE
/// (`Some(window)`: `window` is called between the judgement and the EXCLUSIVE attempt) or back
/// to today's (`None`), for the whole process.
pub fn set_stale_wal_judged_before_exclusive(window: Option<fn()>) {
    *STALE_WAL_JUDGED_BEFORE_EXCLUSIVE.write() = window;
}

/// The window function when the old order is switched on.
pub(crate) fn stale_wal_judged_before_exclusive() -> Option<fn()> {
    *STALE_WAL_JUDGED_BEFORE_EXCLUSIVE.read()
}

/// Whether recovery ignores the capture's `base` (`true`) or honours it (`false`).
static CAPTURE_BASE_IGNORED: AtomicBool = AtomicBool::new(false);

/// Switches recovery to its former rules (`true`: a capture's delta is replayed whatever its
/// base) or back to today's, for the whole process.
pub fn set_capture_base_ignored(ignored: bool) {
    CAPTURE_BASE_IGNORED.store(ignored, Ordering::Release);
}

/// Whether the switch is on.
pub(crate) fn capture_base_ignored() -> bool {
    CAPTURE_BASE_IGNORED.load(Ordering::Acquire)
}

/// Whether the overwrite judgement goes without its lock and confirmation (`true`) or with
/// them (`false`).
static JUDGEMENT_UNCONFIRMED: AtomicBool = AtomicBool::new(false);

/// Switches the overwrite judgement to its former form (`true`: the close judges without `READ(0)`
/// shared, the wal-index's salts are not compared) or back to today's, for the whole process.
pub fn set_judgement_unconfirmed(on: bool) {
    JUDGEMENT_UNCONFIRMED.store(on, Ordering::Release);
}

/// Whether the switch is on.
pub(crate) fn judgement_unconfirmed() -> bool {
    JUDGEMENT_UNCONFIRMED.load(Ordering::Acquire)
}

/// Whether recovery never picks the `changes` rule (`true`: `add-only` instead) or picks it
/// for a capture that holds its pages' base (`false`).
static CHANGES_IGNORED: AtomicBool = AtomicBool::new(false);

/// Switches recovery to its rules without the `changes` rule (`true`: a capture whose base is
/// not its own is merged `add-only`, whatever `<file>-base` it holds) or back to today's, for
/// the whole process.
pub fn set_changes_ignored(ignored: bool) {
    CHANGES_IGNORED.store(ignored, Ordering::Release);
}

/// Whether the switch is on.
pub(crate) fn changes_ignored() -> bool {
    CHANGES_IGNORED.load(Ordering::Acquire)
}
