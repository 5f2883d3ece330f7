//! The rule that a capture's delta is replayed only from an image shown to be its own: with the
//! fault switch `capture-base-ignored` (the guard's `explore-faults` feature) the delta is
//! replayed whatever the capture's `base`, and `newer-checkpointed` loses the newer
//! generation's rows; with the rule (`add-only` when the base is not the capture's own) it does
//! not. The switch is process-wide: each test runs alone (`crate::alone`).
//!
//! The seeds are PCT seeds of `newer-checkpointed` that fail with the switch on (473 of the
//! first 2,000 do, 12 of them showing only bug 7; 0 of them without it, bug 7 apart), one per
//! kind of newer writer and checkpoint, and both places the capture is taken: at the retired
//! writer's next write, refused, or at its close.

use hermes_guard_explore::{faults, run_one, scenarios, Outcome};

fn run(seed: u64, fault: bool) -> Outcome {
    let _alone = crate::alone();
    let sc = scenarios::find("newer-checkpointed").expect("the scenario");
    if fault {
        assert!(faults::switch_on("capture-base-ignored"));
    }
    let o = run_one(sc, seed);
    faults::switch_off();
    o
}

/// `seed` of `newer-checkpointed` in `variant`: with the switch, `n1` and `n2` (the newer
/// generation's rows, acknowledged and checkpointed) are gone after `recover --apply`; without
/// it, nothing is wrong, and the capture is there.
fn newer_rows_lost_only_with_the_switch(seed: u64, variant: &str) {
    let with = run(seed, true);
    print!("{}", with.describe());
    assert_eq!(with.variant, variant, "seed {seed} chooses another variant");
    for row in ["n1", "n2"] {
        assert!(
            with.violations
                .iter()
                .any(|v| v.contains(&format!("after recover --apply, row {row} is live 0 times"))),
            "seed {seed} with the delta replayed whatever the base no longer loses {row}:\n{}",
            with.describe()
        );
    }
    let without = run(seed, false);
    assert!(
        without.violations.is_empty() && without.known.is_empty(),
        "{}",
        without.describe()
    );
    assert!(without.captures >= 1, "seed {seed}: no capture");
}

/// Both files unlinked, then N (guarded) commits and checkpoints (PASSIVE) before W does
/// anything: W's next write is refused and captured, its main image the newer file; the delta
/// of W's WAL (its page of `t`, without `n1`, `n2`) read as their deletion.
#[test]
fn a_newer_guarded_generation_checkpointed_before_the_refusal_is_kept() {
    newer_rows_lost_only_with_the_switch(
        8,
        "rm state.db-wal + rm state.db-shm; N guarded, PASSIVE",
    );
}

/// The same with a stock N and a TRUNCATE checkpoint.
#[test]
fn a_newer_stock_generation_truncated_into_the_file_before_the_refusal_is_kept() {
    newer_rows_lost_only_with_the_switch(
        20,
        "rm state.db-wal + rm state.db-shm; N stock, TRUNCATE",
    );
}

/// W is never refused: its close finds the loss and captures the generation after N's commits
/// and checkpoint. At seed 95 (N guarded, TRUNCATE) the loss comes during W's commit of `w4`,
/// which lands in the retired WAL (docs/architecture.md, "A loss during a transaction"); at seed
/// 84 (N stock, PASSIVE) after both of W's commits, as its close begins.
#[test]
fn a_newer_generation_checkpointed_before_the_writers_close_is_kept() {
    newer_rows_lost_only_with_the_switch(
        95,
        "rm state.db-wal + rm state.db-shm; N guarded, TRUNCATE",
    );
    newer_rows_lost_only_with_the_switch(84, "rm state.db-wal + rm state.db-shm; N stock, PASSIVE");
}

/// Only the `-shm` unlinked, during W's commit of `w3` (before its frame's header is written):
/// N recovers W's WAL up to `w2`, commits `n1`, `n2` in it and checkpoints them; W then writes
/// `w3`'s frame over `n1`'s and is refused at `w4`. The capture's WAL is W's, its image N's file.
#[test]
fn a_newer_generation_in_the_same_wal_is_kept() {
    newer_rows_lost_only_with_the_switch(76, "rm state.db-shm; N guarded, PASSIVE");
}
