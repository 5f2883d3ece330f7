//! Property test (`proptest`) of the change computation: random sequences of inserts, updates
//! and deletes (values from empty to overflowing, key ranges that empty and free leaves) over one
//! to three tables (a rowid table, an `INTEGER PRIMARY KEY` table, a `WITHOUT ROWID` table), in
//! one generation over a checkpointed base. With the exact base (and the pages the generation
//! freed) the changes must be exactly the SQL difference. Cases are few and small so that the
//! module runs in seconds.

use proptest::prelude::*;
use rusqlite::{params, Connection};

use super::tests::{computed, oracle, page_of, run, Spec};
use super::*;

/// The tables, with their `WITHOUT ROWID` key width; column counts differ, so that content
/// alone can attribute a page.
const TABLES: &[(&str, &str, Spec<'static>)] = &[
    ("r", "CREATE TABLE r(a, b)", ("r", None)),
    (
        "i",
        "CREATE TABLE i(id INTEGER PRIMARY KEY, a, b, c)",
        ("i", None),
    ),
    (
        "w",
        "CREATE TABLE w(k PRIMARY KEY, a, b, c, d) WITHOUT ROWID",
        ("w", Some(1)),
    ),
];

/// One statement of the generation.
#[derive(Debug, Clone)]
enum Op {
    Insert { table: usize, key: i64, size: usize },
    Update { table: usize, key: i64, size: usize },
    Delete { table: usize, from: i64, len: i64 },
}

impl Op {
    /// The same statement on table `table % tables`.
    fn on(self, tables: usize) -> Op {
        match self {
            Op::Insert { table, key, size } => Op::Insert {
                table: table % tables,
                key,
                size,
            },
            Op::Update { table, key, size } => Op::Update {
                table: table % tables,
                key,
                size,
            },
            Op::Delete { table, from, len } => Op::Delete {
                table: table % tables,
                from,
                len,
            },
        }
    }
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..60, 1 => 60usize..400, 1 => 900usize..3000]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, 0i64..400, size())
            .prop_map(|(table, key, size)| Op::Insert { table, key, size }),
        3 => (0usize..3, 0i64..400, size())
            .prop_map(|(table, key, size)| Op::Update { table, key, size }),
        2 => (0usize..3, 0i64..400, 1i64..80)
            .prop_map(|(table, from, len)| Op::Delete { table, from, len }),
    ]
}

/// Applies `op` (a statement that matches no row, or whose key is taken, does nothing).
fn apply(conn: &Connection, op: &Op, seq: usize) {
    let blob = |size: usize| vec![(seq % 251) as u8; size];
    match *op {
        Op::Insert { table, key, size } => {
            let sql = [
                "INSERT INTO r VALUES (?1, ?2)",
                "INSERT OR IGNORE INTO i VALUES (?1, ?2, 'x', 0)",
                "INSERT OR IGNORE INTO w VALUES (?1, ?2, 'y', 1, NULL)",
            ][table];
            conn.execute(sql, params![key, blob(size)]).unwrap();
        }
        Op::Update { table, key, size } => {
            let sql = [
                "UPDATE r SET b = ?2 WHERE a = ?1",
                "UPDATE i SET a = ?2 WHERE id = ?1",
                "UPDATE w SET a = ?2 WHERE k = ?1",
            ][table];
            conn.execute(sql, params![key, blob(size)]).unwrap();
        }
        Op::Delete { table, from, len } => {
            let sql = [
                "DELETE FROM r WHERE a BETWEEN ?1 AND ?2",
                "DELETE FROM i WHERE id BETWEEN ?1 AND ?2",
                "DELETE FROM w WHERE k BETWEEN ?1 AND ?2",
            ][table];
            conn.execute(sql, params![from, from + len]).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_generations_compute_exactly_their_sql_difference(
        tables in 1usize..=3,
        fill in prop::collection::vec((0usize..3, 0i64..400, size()), 0..250),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let run = run(
            |conn| {
                for (_, sql, _) in &TABLES[..tables] {
                    conn.execute_batch(sql).unwrap();
                }
                conn.execute_batch("BEGIN").unwrap();
                for (seq, (table, key, size)) in fill.iter().enumerate() {
                    let op = Op::Insert { table: *table, key: *key, size: *size }.on(tables);
                    apply(conn, &op, seq);
                }
                conn.execute_batch("COMMIT").unwrap();
            },
            |conn| {
                for (seq, op) in ops.iter().enumerate() {
                    apply(conn, &op.clone().on(tables), seq + 1000);
                }
            },
        );
        if crate::walfile::summarize_wal(&run.wal).commits == 0 {
            // Nothing changed, so nothing was written.
            return Ok(());
        }
        let specs: Vec<Spec<'_>> = TABLES[..tables].iter().map(|t| t.2).collect();
        let want = oracle(&run, &specs);
        let mut pages = run.pages();
        pages.freed = run.freed();
        // The schema's pages the generation did not write (page 1 among them, when neither the
        // size nor the freelist changed) are read in the image: here the snapshot.
        let image = |p: u32| page_of(&run.snapshot, 1024, p).map(<[u8]>::to_vec);
        let changes = compute(&pages, Some(&image));
        prop_assert_eq!(&changes.unattributed_pages, &Vec::<u32>::new(), "{:#?}", changes.notes);
        for t in &changes.tables {
            prop_assert!(t.undecided.is_empty(), "{}: {:?}", t.name, t.undecided);
            prop_assert!(t.unknown_base_pages.is_empty(), "{}", t.name);
        }
        prop_assert_eq!(computed(&changes, &specs), want);
        // Without the image: the same when the generation wrote page 1 (structure and content
        // attribute every page); else no schema, and nothing is decided.
        let alone = compute(&pages, None);
        if pages.final_pages.contains_key(&1) {
            prop_assert_eq!(alone.tables, changes.tables);
        } else {
            prop_assert!(alone.tables.is_empty());
            prop_assert!(alone.notes.iter().any(|n| n.contains("no version of the schema")));
        }
    }
}
