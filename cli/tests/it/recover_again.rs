//! `recover --apply` run a second time on a capture already merged: it merges nothing, and says
//! why its numbers differ from the first run's.

use crate::common;
use crate::recover_cli::{cli, os};

use std::path::{Path, PathBuf};

use common::*;

/// A capture whose base is unknown: a guarded writer holds 20 rows of history and 4
/// rows only in its WAL when its `-wal` and `-shm` are unlinked; another process commits 10
/// rows and checkpoints them into the main file (rowids 21–30) before the writer's next write,
/// which is refused and captured. Read as image + WAL (the add-only rule, for a capture without
/// its base file), the delta calls rowids 21–24 changed (to the 4 retired rows) and 25–30
/// deleted: 10 rows undecided. The database and the capture.
pub(crate) fn newer_checkpointed_first(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("state.db");
    let conn = open_guarded(&path);
    checkpointed_history(&conn);
    for i in 0..4 {
        insert(&conn, &format!("retired {i}")).unwrap();
    }
    lose_sidecars(&path, false);
    assert_eq!(write_second_generation(&path, "stock", 10), 30);
    assert!(is_refusal(&insert(&conn, "after").unwrap_err()));
    let capture = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);
    (path, capture)
}

fn apply(capture: &Path, path: &Path, json: bool) -> (i32, String, String) {
    let mut args = vec![
        os("recover"),
        capture.as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--apply"),
    ];
    if json {
        args.push(os("--json"));
    }
    cli(&args)
}

#[test]
fn a_second_add_only_apply_says_the_generation_was_merged_and_why_fewer_rows_are_undecided() {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = newer_checkpointed_first(dir.path());
    without_base_file(&capture);

    let (code, out, err) = apply(&capture, &path, false);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("rule     add-only"), "{out}");
    assert!(
        out.contains(
            "10 row(s) undecided: the capture says its generation changed or deleted them"
        ) && out.contains(
            "; the captured version of 4 of them (rows it changed) was added beside the live \
             row under a new rowid (a later run counts those as already live);"
        ),
        "{out}"
    );
    assert!(out.contains("merged 4 row(s) into"), "{out}");

    let (code, out, err) = apply(&capture, &path, false);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "merged   this capture's WAL generation was already merged into this database on "
        ) && out.contains(
            " (from this capture, by an earlier `recover --apply`): its added rows are in and \
             are not inserted again; the counts below are what is left after that merge"
        ),
        "{out}"
    );
    assert!(out.contains("    6 row(s) undecided: "), "{out}");
    assert!(
        out.contains(
            "    4 row(s) the captured generation changed are no longer counted undecided: the \
             earlier merge added their captured version beside the live rows under new rowids, \
             so they count as already live now; the live rows beside them are kept as they were"
        ),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "nothing new merged into {}: this capture's generation was merged before (see \
             `merged` above) and nothing of it is missing now",
            path.display()
        )),
        "{out}"
    );

    let (code, out, err) = apply(&capture, &path, true);
    assert_eq!(code, 0, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            &doc["undecided"],
            &doc["added_beside_before"],
            &doc["inserted"]
        ),
        (&6.into(), &4.into(), &0.into()),
        "{doc}"
    );
    assert!(doc["merged_before"].is_string(), "{doc}");
    assert_eq!(
        count_like(&open_stock(&path), "retired %"),
        4,
        "each retired row once"
    );
}

/// The same capture with its base file: the retired generation's 4 inserts go in beside the
/// newer generation's rows of the same rowids, nothing is undecided, and a second run merges
/// nothing.
#[test]
fn a_second_apply_of_the_changes_rule_merges_nothing_and_says_the_generation_was_merged() {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = newer_checkpointed_first(dir.path());
    let (code, out, err) = apply(&capture, &path, true);
    assert_eq!(code, 0, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["rule"], "changes", "{doc}");
    assert_eq!(
        (&doc["inserted"], &doc["undecided"]),
        (&4.into(), &0.into()),
        "{doc}"
    );
    let (code, out, err) = apply(&capture, &path, true);
    assert_eq!(code, 0, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(doc["merged_before"].is_string(), "{doc}");
    assert_eq!(doc["inserted"], 0, "{doc}");
    let conn = open_stock(&path);
    assert_eq!(count_like(&conn, "retired %"), 4, "each retired row once");
    assert_eq!(count_like(&conn, "second generation %"), 10, "{doc}");
}
