//! The overwrite judgement under churn: with the fault switch `judgement-unconfirmed` (the
//! guard's `explore-faults` feature) the close judges the main file without `READ(0)` shared and
//! nothing confirms the frames' progress with the wal-index's salts, and `churn` (nothing taken
//! away) retires the reader's healthy connection as `main-overwritten` and captures it; with
//! today's judgement nothing is logged, retired or captured. The switch is process-wide (and
//! handed to the reader's process): each test runs alone (`crate::alone`).
//!
//! The seeds are PCT seeds of `churn` that fail with the switch on (2 of the first 500; the
//! enumeration within 1 preemption finds 15 of 2,946), one per kind of RESTART writer: the
//! reader's close comes while a RESTART writer's next commit has reset the wal-index (progress
//! 0, new salts) and not yet written the WAL's new header, so the main file's checkpointed pages
//! read as written by nobody ("none of the 0 frame(s) its checkpoints copied has it").

use hermes_guard_explore::{faults, run_one, scenarios, Outcome};

fn run(seed: u64, fault: bool) -> Outcome {
    let _alone = crate::alone();
    let sc = scenarios::find("churn").expect("the scenario");
    if fault {
        assert!(faults::switch_on("judgement-unconfirmed"));
    }
    let o = run_one(sc, seed);
    faults::switch_off();
    o
}

/// `seed` of `churn` in `variant`: with the switch, the reader (another process) logs a
/// `main-overwritten` retirement and leaves a capture, nothing having been taken away; without
/// it, no line, no capture, no refusal.
fn false_retirement_only_with_the_switch(seed: u64, variant: &str) {
    let with = run(seed, true);
    print!("{}", with.describe());
    assert_eq!(with.variant, variant, "seed {seed} chooses another variant");
    assert!(
        with.violations
            .iter()
            .any(|v| v.contains("was overwritten in place under this connection")),
        "seed {seed} with the unconfirmed judgement no longer retires the reader:\n{}",
        with.describe()
    );
    assert!(
        with.violations
            .iter()
            .any(|v| v.contains("capture(s) without any loss")),
        "{}",
        with.describe()
    );
    let without = run(seed, false);
    assert!(without.violations.is_empty(), "{}", without.describe());
    assert_eq!((without.captures, without.refusals), (0, 0));
}

/// W2 guarded: the reader's close between W2's reset of the wal-index and its WAL header.
#[test]
fn a_reader_closing_inside_a_guarded_writers_wal_reset_is_not_retired() {
    false_retirement_only_with_the_switch(355, "W2 guarded, R 2 cycles");
}

/// W2 stock: the same window, opened by a stock writer's reset.
#[test]
fn a_reader_closing_inside_a_stock_writers_wal_reset_is_not_retired() {
    false_retirement_only_with_the_switch(443, "W2 stock, R 2 cycles");
}
