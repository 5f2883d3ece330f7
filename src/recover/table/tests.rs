//! One table's merge on real files: the delta, the bulk path, the statements.

use std::path::Path;

use rusqlite::Connection;

use super::*;
use crate::recover::context::{BULK_CAPTURE, BULK_IMAGE};
use crate::recover::report::MergeOptions;

const T: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);";

/// A capture (`main`: image + generation) with its image attached as `pre`, and a live
/// database, on files in `dir`.
fn databases(dir: &Path, image: &str, generation: &str, live: &str) -> (Connection, Connection) {
    let (cap, img, target) = (dir.join("cap.db"), dir.join("img.db"), dir.join("live.db"));
    for (path, sql) in [
        (&img, format!("{T}{image}")),
        (&cap, format!("{T}{image}{generation}")),
        (&target, format!("{T}{image}{live}")),
    ] {
        Connection::open(path).unwrap().execute_batch(&sql).unwrap();
    }
    let source = Connection::open(&cap).unwrap();
    source
        .execute("ATTACH DATABASE ?1 AS pre", [img.to_str().unwrap()])
        .unwrap();
    let target = Connection::open(&target).unwrap();
    target
        .execute(
            &format!("ATTACH DATABASE ?1 AS {BULK_CAPTURE}"),
            [cap.to_str().unwrap()],
        )
        .unwrap();
    target
        .execute(
            &format!("ATTACH DATABASE ?1 AS {BULK_IMAGE}"),
            [img.to_str().unwrap()],
        )
        .unwrap();
    (source, target)
}

fn merge_t(source: &Connection, target: &Connection, bulk: bool) -> TableReport {
    let options = MergeOptions::default();
    let m = Merge {
        source,
        source_path: Path::new("cap"),
        target,
        target_path: Path::new("live"),
        options: &options,
        apply: true,
        rule: MergeRule::Delta,
        rule_reason: String::new(),
        ledger: None,
        merged_before: None,
        base_frames: 0,
        bulk,
        widens_to_whole: false,
        changes: None,
    };
    let (captured, image, live) = (
        Schema::read(source).unwrap(),
        Schema::read_in(source, "pre").unwrap(),
        Schema::read(target).unwrap(),
    );
    let mut t = TableMerge::new(
        &live.tables["t"],
        &captured.tables["t"],
        image.tables.get("t"),
        &live,
        MergeRule::Delta,
        false,
    );
    let mut remaps = Remaps::default();
    target.execute_batch("BEGIN").unwrap();
    t.merge_rows(&m, &mut remaps, &mut |_| {}).unwrap();
    t.merge_deletions(&m, &remaps).unwrap();
    target.execute_batch("COMMIT").unwrap();
    t.report
}

fn rows(conn: &Connection) -> Vec<(i64, String)> {
    let mut stmt = conn
        .prepare("SELECT id, v FROM main.t ORDER BY id")
        .unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

#[test]
fn the_delta_is_taken_against_the_image_and_judged_against_the_live_row() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = databases(
        dir.path(),
        "INSERT INTO t VALUES (1, 'kept'), (2, 'to change'), (3, 'to delete');",
        "UPDATE t SET v = 'changed' WHERE id = 2; DELETE FROM t WHERE id = 3;
         INSERT INTO t VALUES (4, 'same'), (5, 'captured five');",
        // The newer generation reused rowid 4 for a row with the same content.
        "INSERT INTO t VALUES (4, 'same');",
    );
    let r = merge_t(&source, &target, true);
    assert_eq!((r.added, r.changed, r.deleted), (2, 1, 1), "{r:?}");
    assert_eq!(
        (r.inserted, r.new_rowids, r.updated, r.removed),
        (2, 1, 1, 1)
    );
    assert_eq!((r.in_capture, r.already_live), (4, 1), "{r:?}");
    assert_eq!(
        rows(&target),
        [
            (1, "kept".to_owned()),
            (2, "changed".to_owned()),
            (4, "same".to_owned()),
            (5, "captured five".to_owned()),
            (6, "same".to_owned()),
        ]
    );
}

#[test]
fn added_rows_above_the_live_rowids_go_in_at_once_and_row_by_row_give_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let added = "INSERT INTO t VALUES (10, 'ten'), (11, 'eleven');";
    let (source, target) = databases(dir.path(), "INSERT INTO t VALUES (1, 'one');", added, "");
    let bulk = merge_t(&source, &target, true);
    let at_once = rows(&target);
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = databases(dir.path(), "INSERT INTO t VALUES (1, 'one');", added, "");
    let by_row = merge_t(&source, &target, false);
    assert_eq!(at_once, rows(&target));
    assert_eq!((bulk.added, bulk.inserted), (2, 2));
    assert_eq!((by_row.added, by_row.inserted), (2, 2));
    assert_eq!(bulk.in_capture, 3);
}

#[test]
fn statements_name_the_rowid_only_where_it_is_not_a_column() {
    let table = |without_rowid: bool, pk: &[(&str, &str, i64)]| Table {
        name: "t".into(),
        without_rowid,
        columns: pk
            .iter()
            .map(|(n, ty, p)| crate::recover::schema::Column {
                name: (*n).into(),
                decl_type: (*ty).into(),
                pk: *p,
                generated: false,
                stored: true,
                default: None,
            })
            .collect(),
        foreign_keys: Vec::new(),
    };
    let cols = |t: &Table| t.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let plain = table(false, &[("a", "TEXT", 0)]);
    let (insert, select) = statements(
        &plain,
        &cols(&plain),
        Some("rowid"),
        RowIdentity::Rowid,
        &[],
    );
    assert_eq!(
        insert,
        "INSERT INTO main.\"t\" (\"a\", rowid) VALUES (?1, ?2)"
    );
    assert_eq!(select, "SELECT \"a\" FROM main.\"t\" WHERE rowid = ?1");
    let keyed = table(true, &[("k", "TEXT", 1), ("j", "INT", 2), ("v", "", 0)]);
    let (insert, select) = statements(
        &keyed,
        &cols(&keyed),
        None,
        RowIdentity::PrimaryKey,
        &[0, 1],
    );
    assert_eq!(
        insert,
        "INSERT INTO main.\"t\" (\"k\", \"j\", \"v\") VALUES (?1, ?2, ?3)"
    );
    assert_eq!(
        select,
        "SELECT \"k\", \"j\", \"v\" FROM main.\"t\" WHERE \"k\" IS ?1 AND \"j\" IS ?2"
    );
}

#[test]
fn rows_on_taken_rowids_move_and_the_rest_go_at_once_as_row_by_row_would() {
    let image = "INSERT INTO t VALUES (1, 'one');";
    let added = "INSERT INTO t VALUES (2, 'two'), (3, 'three'), (4, 'four'), (5, 'five');";
    let newer = "INSERT INTO t VALUES (2, 'newer two'), (3, 'newer three');";
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = databases(dir.path(), image, added, newer);
    let bulk = merge_t(&source, &target, true);
    let at_once = rows(&target);
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = databases(dir.path(), image, added, newer);
    let by_row = merge_t(&source, &target, false);
    assert_eq!(at_once, rows(&target));
    assert_eq!(
        at_once,
        [
            (1, "one".to_owned()),
            (2, "newer two".to_owned()),
            (3, "newer three".to_owned()),
            (4, "four".to_owned()),
            (5, "five".to_owned()),
            (6, "two".to_owned()),
            (7, "three".to_owned()),
        ]
    );
    for r in [&bulk, &by_row] {
        assert_eq!((r.added, r.inserted, r.new_rowids), (4, 4, 2), "{r:?}");
    }
}
