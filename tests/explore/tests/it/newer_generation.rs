//! The rule that a capture's delta is replayed only from an image shown to be its own: with the
//! fault switch `capture-base-ignored` (the guard's `explore-faults` feature) the delta is
//! replayed whatever the capture's `base`, and `newer-checkpointed` loses the newer
//! generation's rows; with the rule (`add-only` when the base is not the capture's own) it does
//! not. The switch is process-wide: each test runs alone (`crate::alone`).
//!
//! The seeds are PCT seeds of `newer-checkpointed` that fail with the switch on (453 of the
//! first 2,000 do, every one with both files removed; 0 of them without it), one per kind of
//! newer writer and checkpoint, and both places the capture is taken: at the retired writer's
//! next write, refused, or at its close. With only the `-shm` removed, none fails even with the
//! switch: the frame rule keeps the retired writer from writing into the WAL it now shares.

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

/// Only the `-shm` unlinked, during W's commit of `w3`: N recovers W's WAL up to `w2`, commits
/// `n1`, `n2` in it and checkpoints them. Before the frame rule W then wrote `w3`'s frame over
/// `n1`'s, and only the base rule kept N's rows. Now W's commit is refused before a byte of it
/// lands — at seed 76 the loss comes before `w3`'s frame header, at seed 61 between the header
/// and its page — so N's rows are kept even with the base rule switched off, and `w3` is never
/// acknowledged.
#[test]
fn a_commit_in_flight_when_only_the_shm_goes_writes_nothing_over_the_newer_generation() {
    for (seed, loss_before) in [(76, "W xWrite wal@8272"), (61, "W xWrite wal@8296")] {
        let with = run(seed, true);
        assert_eq!(
            with.variant, "rm state.db-shm; N guarded, PASSIVE",
            "seed {seed} chooses another variant"
        );
        assert!(
            with.describe().contains(&format!("{loss_before}\n"))
                && with
                    .losses
                    .iter()
                    .any(|(what, _)| what == "rm state.db-shm"),
            "seed {seed} no longer loses the -shm during w3's commit:\n{}",
            with.describe()
        );
        assert!(
            with.violations.is_empty() && with.known.is_empty(),
            "seed {seed}, the base rule switched off:\n{}",
            with.describe()
        );
        assert!(
            !with.acked.iter().any(|(row, _)| row == "w3"),
            "seed {seed}: w3 acknowledged:\n{}",
            with.describe()
        );
        let without = run(seed, false);
        assert!(
            without.violations.is_empty() && without.known.is_empty(),
            "{}",
            without.describe()
        );
    }
}
