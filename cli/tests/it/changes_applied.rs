//! `recover --apply` of a capture that holds its base applies the captured generation's own
//! changes (the `changes` rule), whatever the newer generation did before the capture was taken.
//! The scenario of `changes_cli.rs`: a guarded writer W inserts 3 rows, updates 2 and deletes 151
//! (freeing leaves) in its WAL; its `-wal` and `-shm` are removed; a newer generation N, in
//! another process, deletes rows 10..=60 (which W never touched), updates rows 1..=4, inserts 5
//! rows (under the rowids W's inserts had) and checkpoints with TRUNCATE; W is refused and
//! captured. The operator runs `captures` and every `recover --apply` it lists, twice.

use std::collections::BTreeMap;
use std::path::Path;

use crate::changes_cli::{
    history, lost_generation_under, Newer, DELETED, HISTORY, INSERTED, UPDATED,
};
use crate::common::*;

/// Every live row, rowid → content.
fn live(path: &Path) -> BTreeMap<i64, String> {
    let conn = open_stock(path);
    let mut stmt = conn.prepare("SELECT id, content FROM messages").unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    rows
}

/// After the runbook: W's inserts live once each (beside N's rows of the same rowids), W's
/// updates and deletes applied, N's deletes, updates and inserts intact, and nothing else.
fn assert_both_generations_kept(path: &Path, log: &str) {
    let rows = live(path);
    let count = |content: &str| rows.values().filter(|c| *c == content).count();
    for content in INSERTED {
        assert_eq!(
            count(content),
            1,
            "W's insert {content:?} live once:\n{log}"
        );
    }
    for (rowid, content) in UPDATED {
        assert_eq!(rows.get(&rowid).map(String::as_str), Some(content), "{log}");
        assert_eq!(
            count(&history(rowid - 1)),
            0,
            "no old version of rowid {rowid}:\n{log}"
        );
    }
    for id in DELETED {
        assert_eq!(
            count(&history(id - 1)),
            0,
            "W's delete of {id} applied:\n{log}"
        );
    }
    for id in 10..=60 {
        assert_eq!(
            count(&history(id - 1)),
            0,
            "N's delete of {id} intact:\n{log}"
        );
    }
    for id in 1..=4 {
        assert_eq!(
            rows[&id], "second generation updated",
            "N's update of {id}:\n{log}"
        );
    }
    for i in 0..5 {
        assert_eq!(count(&format!("second generation {i}")), 1, "{log}");
    }
    let untouched = (1..=HISTORY)
        .filter(|id| !(1..=4).contains(id) && !(10..=60).contains(id) && !DELETED.contains(id))
        .filter(|id| !UPDATED.iter().any(|(r, _)| r == id));
    for id in untouched {
        assert_eq!(
            count(&history(id - 1)),
            1,
            "history row {id} live once:\n{log}"
        );
    }
    let expected = (HISTORY as usize - 4 - 51 - DELETED.count()) + 4 + 5 + INSERTED.len();
    assert_eq!(rows.len(), expected, "no row more:\n{log}");
    assert!(integrity_ok(&open_stock(path)), "{log}");
}

fn runbook_keeps_both_generations(vfs: &'static str) {
    let (dir, capture) = lost_generation_under(Newer::Changes(vfs));
    let path = dir.path().join("state.db");
    let (code, out, err) = hermes_guard_cli(&[
        "recover".as_ref(),
        capture.as_os_str(),
        "--into".as_ref(),
        path.as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["rule"], "changes", "{out}");
    let log = apply_every_listed_recovery(&path);
    assert_both_generations_kept(&path, &log);
    let before = live(&path);
    let again = apply_every_listed_recovery(&path);
    assert_eq!(
        live(&path),
        before,
        "a second run changes nothing:\n{again}"
    );
}

#[test]
fn recover_applies_the_lost_generations_own_changes_beside_a_stock_newer_generations() {
    runbook_keeps_both_generations("stock");
}

#[test]
fn recover_applies_the_lost_generations_own_changes_beside_a_guarded_newer_generations() {
    runbook_keeps_both_generations("guard");
}
