//! Fault switches for the connection explorer (tests/explore, issue 38), compiled only with the
//! `explore-faults` feature, which only tests/explore enables: each puts back a bug the guard
//! once had, so that the explorer can show it finds it. All off until switched on.
//!
//! - [`set_stale_wal_judged_before_exclusive`]: the stale-WAL gate in its order before issue
//!   33 — the quick look and "is the `-shm` in use" first, EXCLUSIVE on the main file only
//!   after (`src/vfs/stale_wal_gate/old_order.rs`). A `-shm` in use let the WAL be replayed
//!   without a judgement (a restore under a running app undone), and the time the look took
//!   was a window in which a stock opener took SHARED first and replayed the WAL (a restore a
//!   guarded opener saw first undone). The window is a real time span, which one step of the
//!   explorer does not have: the switch takes a function the gate calls there (the explorer's
//!   yield point).

use std::sync::atomic::{AtomicUsize, Ordering};

/// The window function, as a `usize` (0: the switch is off).
static STALE_WAL_JUDGED_BEFORE_EXCLUSIVE: AtomicUsize = AtomicUsize::new(0);

/// Switches the stale-WAL gate to its order before issue 33 (`Some(window)`: `window` is called
/// between the judgement and the EXCLUSIVE attempt) or back to today's (`None`), for the whole
/// process.
pub fn set_stale_wal_judged_before_exclusive(window: Option<fn()>) {
    STALE_WAL_JUDGED_BEFORE_EXCLUSIVE.store(window.map_or(0, |f| f as usize), Ordering::Release);
}

/// The window function when the old order is switched on.
pub(crate) fn stale_wal_judged_before_exclusive() -> Option<fn()> {
    let f = STALE_WAL_JUDGED_BEFORE_EXCLUSIVE.load(Ordering::Acquire);
    // SAFETY: a non-zero value was stored from a `fn()` by the setter above.
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, fn()>(f) })
}
