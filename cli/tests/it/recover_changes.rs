//! Recovery of a lost generation under a newer one that deleted, updated, freed and merged
//! (docs/plans/recovery-from-changes.md, "Real-process tests"). A guarded writer W
//! (`wal_autocheckpoint=0`) commits acknowledged inserts, updates and deletes that live only in its
//! WAL; `<db>-wal` and `<db>-shm` are removed; a newer generation N (another process, stock or
//! guarded) opens the database, acts and checkpoints (PASSIVE and TRUNCATE, each test runs both);
//! W's next write is refused (1032) and captured; the operator runs `captures <db>` and every
//! `recover --apply` it lists, twice.
//!
//! After the runbook, every time: each acknowledged row of W and of N live exactly once (by
//! content), no row N deleted live, no old version of a row N updated live, W's changes applied
//! where N left the row as W found it and undecided (N's row stays, recover exits 3) where N
//! changed it too, `integrity_check` ok, and the second run changes nothing. What each scenario
//! does is in recover_changes_scenarios.rs, what is expected of it in recover_changes_model.rs,
//! the processes and the runbook in recover_changes_harness.rs.
//!
//! One run per checkpoint mode by default; `HERMES_GUARD_RUNS=20` runs 20 seeds (which rows are
//! touched) of each.

use crate::recover_changes_harness::check_scenario;
use crate::recover_changes_scenarios::Scenario;

/// The control: W and N only append; every row of both is live once, exit 0 (this holds before
/// the `changes` rule too: the checks themselves can pass).
#[test]
fn control_a_newer_generation_that_only_appends_keeps_every_row_of_both_stock_peer() {
    check_scenario(Scenario::Appends, "stock");
}

#[test]
fn control_a_newer_generation_that_only_appends_keeps_every_row_of_both_guarded_peer() {
    check_scenario(Scenario::Appends, "guard");
}

/// T1: N deletes 25 % of the jobs and 6 sessions (TEXT PRIMARY KEY) and marks 1/8 of the jobs
/// done. No job or session N deleted comes back, no `queued` version beside N's `done`, each of
/// W's 48 jobs and 4 sessions is live once, W's claims and deletes of rows N left alone are
/// applied, and its 5 edits of rows N changed are undecided: recover exits 3.
#[test]
fn t1_queue_keeps_the_newer_deletes_and_done_marks_and_leaves_conflicting_edits_undecided_stock_peer(
) {
    check_scenario(Scenario::Queue, "stock");
}

#[test]
fn t1_queue_keeps_the_newer_deletes_and_done_marks_and_leaves_conflicting_edits_undecided_guarded_peer(
) {
    check_scenario(Scenario::Queue, "guard");
}

/// T2: N deletes the 1,000 oldest rows, which W never touched (secure_delete off): none of them
/// comes back; W's 60 appends and 6 edits are applied; exit 0.
#[test]
fn t2_retention_cleanup_by_the_newer_generation_brings_none_of_the_deleted_rows_back_stock_peer() {
    check_scenario(Scenario::Retention, "stock");
}

#[test]
fn t2_retention_cleanup_by_the_newer_generation_brings_none_of_the_deleted_rows_back_guarded_peer()
{
    check_scenario(Scenario::Retention, "guard");
}

/// T3: N marks 30..90 % of the older rows done and deletes them (leaf merges, freed and reused
/// pages): none of W's 96 acknowledged rows is missing; `captures` counts 96 missing before
/// `--apply` and 0 after; exit 0.
#[test]
fn t3_rows_on_leaves_the_newer_generation_merged_and_freed_are_all_recovered_stock_peer() {
    check_scenario(Scenario::MergesAndFrees, "stock");
}

#[test]
fn t3_rows_on_leaves_the_newer_generation_merged_and_freed_are_all_recovered_guarded_peer() {
    check_scenario(Scenario::MergesAndFrees, "guard");
}

/// T4: W and N each append credits, 20 of them equal (account, amount, memo) under the same
/// rowid: every credit of both is live and each account's balance is exact; exit 0.
#[test]
fn t4_equal_credits_of_both_generations_under_the_same_rowid_are_all_kept_stock_peer() {
    check_scenario(Scenario::Ledger, "stock");
}

#[test]
fn t4_equal_credits_of_both_generations_under_the_same_rowid_are_all_kept_guarded_peer() {
    check_scenario(Scenario::Ledger, "guard");
}

/// T5: N writes through a hard link beside the database (33 changes): none is undone, W's
/// changes are applied; exit 0.
#[test]
fn t5_changes_made_through_a_hard_link_in_the_same_directory_are_not_undone_stock_peer() {
    check_scenario(Scenario::HardLinkSameDirectory, "stock");
}

#[test]
fn t5_changes_made_through_a_hard_link_in_the_same_directory_are_not_undone_guarded_peer() {
    check_scenario(Scenario::HardLinkSameDirectory, "guard");
}

/// T5: the same through a hard link in another directory.
#[test]
fn t5_changes_made_through_a_hard_link_in_another_directory_are_not_undone_stock_peer() {
    check_scenario(Scenario::HardLinkOtherDirectory, "stock");
}

#[test]
fn t5_changes_made_through_a_hard_link_in_another_directory_are_not_undone_guarded_peer() {
    check_scenario(Scenario::HardLinkOtherDirectory, "guard");
}

/// T6: W deletes a run of 300 rows (freeing leaves) that N does not touch: the deletes are
/// applied; exit 0.
#[test]
fn t6_the_lost_generations_deletes_that_freed_leaves_are_applied_stock_peer() {
    check_scenario(Scenario::OwnFrees, "stock");
}

#[test]
fn t6_the_lost_generations_deletes_that_freed_leaves_are_applied_guarded_peer() {
    check_scenario(Scenario::OwnFrees, "guard");
}

/// T7: a reader held W's PASSIVE checkpoint back to part of its WAL before the loss, so N
/// started from the pages it copied: nothing of it is inserted twice or undone, and the rest of
/// W's changes (those on pages it did not copy included) are applied; exit 0.
#[test]
fn t7_a_partly_backfilled_generation_is_recovered_without_duplicates_stock_peer() {
    check_scenario(Scenario::PartialBackfill, "stock");
}

#[test]
fn t7_a_partly_backfilled_generation_is_recovered_without_duplicates_guarded_peer() {
    check_scenario(Scenario::PartialBackfill, "guard");
}

/// T8: W rewrites more pages than the guard keeps the base of (1,024): its rows are applied or
/// undecided, never doubled, nothing N did is undone, and recover exits 3.
#[test]
fn t8_over_the_base_page_cap_rows_are_undecided_never_lost_and_nothing_newer_undone_stock_peer() {
    check_scenario(Scenario::OverTheCap, "stock");
}

#[test]
fn t8_over_the_base_page_cap_rows_are_undecided_never_lost_and_nothing_newer_undone_guarded_peer() {
    check_scenario(Scenario::OverTheCap, "guard");
}
