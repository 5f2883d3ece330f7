//! The first bug rediscovery: the WAL-reset race (SQLite 3.7.0–3.51.2) with the guard's
//! rule off is found by the enumeration of `wal-reset` (2 preemptions), and with the rule on no
//! schedule loses a row. The rule is a process-wide setting: the test runs alone (`crate::alone`).
//!
//! On the bundled SQLite (3.54: the race fixed) no schedule loses a row without the rule. On SQLite
//! 3.50.2 — tests/explore.sh builds the tests without `bundled` and runs it with the
//! libsqlite3.so.0 of tests/unusual-sqlite-builds.sh, `EXPLORE_EXPECT_SQLITE=3.50.2` — the
//! enumeration without the rule finds the loss and prints its replay.

use hermes_guard::{set_wal_reset_guard, sqlite_has_wal_reset_race, WalResetGuard};
use hermes_guard_explore::{explore_dfs, scenarios, DfsSummary};

/// Every schedule within 2 preemptions of the first variant (a FULL checkpoint, then a PASSIVE
/// one), stopping at the first failing one.
fn enumerate(rule: WalResetGuard) -> DfsSummary {
    set_wal_reset_guard(rule);
    let sc = scenarios::find("wal-reset").expect("the scenario");
    explore_dfs(sc, 2, 1, usize::MAX, true)
}

#[test]
fn the_wal_reset_race_is_found_without_the_rule_and_not_with_it() {
    let _alone = crate::alone();
    if let Ok(expected) = std::env::var("EXPLORE_EXPECT_SQLITE") {
        assert_eq!(
            rusqlite::version(),
            expected,
            "the SQLite this test runs on"
        );
    }
    let affected = sqlite_has_wal_reset_race(rusqlite::version_number());

    let off = enumerate(WalResetGuard::Off);
    println!(
        "SQLite {}, the rule off: {} schedule(s) enumerated, {} failing",
        rusqlite::version(),
        off.schedules,
        off.failures.len()
    );
    if affected {
        let found = off.failures.first().unwrap_or_else(|| {
            panic!(
                "{} schedules and no loss: the explorer missed the race",
                off.schedules
            )
        });
        print!("{}", found.describe());
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.contains("neither live nor in a capture")),
            "{}",
            found.describe()
        );
    } else {
        assert!(off.complete && off.failures.is_empty());
    }

    set_wal_reset_guard(WalResetGuard::Auto);
    if !affected {
        // The race is fixed here: without the rule nothing was lost, the rule adds nothing.
        return;
    }
    let on = enumerate(WalResetGuard::On);
    println!(
        "SQLite {}, the rule on: {} schedule(s) enumerated (all of them: {}), {} failing",
        rusqlite::version(),
        on.schedules,
        on.complete,
        on.failures.len()
    );
    let shown: Vec<String> = on.failures.iter().map(|o| o.describe()).collect();
    assert!(shown.is_empty(), "{}", shown.join("\n"));
    assert!(on.complete && on.schedules > 1000, "{}", on.schedules);
    set_wal_reset_guard(WalResetGuard::Auto);
}
