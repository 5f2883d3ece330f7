//! A bug rediscovery: the stale-WAL gate in its old order (judged first, EXCLUSIVE after), put back
//! by the fault switch `judged-before-exclusive` (the guard's `explore-faults` feature), is found
//! by the explorer; today's order is not. The switch is process-wide: each test runs alone
//! (`crate::alone`).
//!
//! The seeds are what the CI run of tests/explore.sh finds with the switch on (PCT, seeds
//! 0..4000): `restore-openers` fails at seeds 1632, 2815 and 3701 (and the enumeration within
//! 2 preemptions at its 2,002nd schedule), `restore-running` at seed 354 (1 of its first 600
//! seeds since the guard maps the wal-index itself; showing nothing, not even a known bug,
//! without the switch).

use hermes_guard_explore::{faults, run_one, scenarios, Outcome};

fn run(scenario: &str, seed: u64, fault: bool) -> Outcome {
    let _alone = crate::alone();
    let sc = scenarios::find(scenario).expect("a scenario");
    if fault {
        assert!(faults::switch_on("judged-before-exclusive"));
    }
    let o = run_one(sc, seed);
    faults::switch_off();
    o
}

/// `scenario` at `seed`: with the switch, a violation saying `what`; without, nothing at all.
fn found_only_with_the_switch(scenario: &str, seed: u64, what: &str) {
    let with = run(scenario, seed, true);
    print!("{}", with.describe());
    assert!(
        with.violations.iter().any(|v| v.contains(what)),
        "{scenario} seed {seed} with the old order no longer shows `{what}`:\n{}",
        with.describe()
    );
    let without = run(scenario, seed, false);
    assert!(
        without.violations.is_empty() && without.known.is_empty(),
        "{}",
        without.describe()
    );
}

/// Two openers after a restore, one stock: the guarded one judges the stale WAL first, and in
/// the window before its EXCLUSIVE attempt the stock one takes SHARED and replays the WAL onto
/// the restored file; the guarded one then finds the `-shm` in use and goes on.
#[test]
fn the_old_order_lets_a_stock_opener_undo_a_restore_the_guard_saw_first() {
    found_only_with_the_switch(
        "restore-openers",
        1632,
        "the restore it saw first was undone",
    );
}

/// A backup renamed over the file under a running guarded writer: the new opener's quick look
/// leaves the WAL in doubt, the `-shm` is in use (by the writer), and the old order goes on
/// without asking for EXCLUSIVE on the restored inode, which was free: the opener reads the
/// writer's WAL as its own and its rows come back over the restored file (the restore undone).
/// (The seed was 1010, `w3` overwritten, while the unix VFS gave the opener in the writer's
/// process a `-shm` node of its own, with no lock between the two; since the guard maps the
/// wal-index per `-shm` file, the two share one node, as two processes share the file.)
#[test]
fn the_old_order_replays_a_running_apps_wal_onto_a_restored_file() {
    found_only_with_the_switch("restore-running", 354, "the restore was undone");
}
