//! The change computation against SQLite: a database is checkpointed (its file is then the base
//! of every page), a generation of inserts, updates and deletes is written to its WAL and copied
//! while the connection is open, and the changes computed from the WAL and the base pages must
//! equal the SQL difference between the database without and with that WAL, table by table.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::Connection;

use super::*;
use crate::capture::BasePages;
use crate::recover::btree::{decode_page, Cell};
use crate::walfile::parse_wal_header;

/// A generation written on a checkpointed database.
pub(super) struct Run {
    pub(super) dir: tempfile::TempDir,
    /// The writer, still open: closing it would checkpoint the WAL.
    _conn: Connection,
    /// The main file after the checkpoint: the base of every page.
    pub(super) snapshot: Vec<u8>,
    /// The generation's WAL, copied while the writer was open.
    pub(super) wal: Vec<u8>,
}

/// Runs `setup` on a new WAL database of 1024-byte pages, checkpoints it whole, then runs `ops`
/// with automatic checkpoints off and copies the WAL.
pub(super) fn run(setup: impl FnOnce(&Connection), ops: impl FnOnce(&Connection)) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA page_size = 1024; PRAGMA journal_mode = WAL;")
        .unwrap();
    setup(&conn);
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        assert_eq!(r.get::<_, i64>(0)?, 0, "checkpoint busy");
        Ok(())
    })
    .unwrap();
    let snapshot = std::fs::read(&path).unwrap();
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
    ops(&conn);
    let wal = std::fs::read(dir.path().join("g.db-wal")).unwrap();
    Run {
        dir,
        _conn: conn,
        snapshot,
        wal,
    }
}

impl Run {
    /// A run from its parts: the writer (kept open), the snapshot and the generation's WAL.
    pub(super) fn from_parts(
        dir: tempfile::TempDir,
        conn: Connection,
        snapshot: Vec<u8>,
        wal: Vec<u8>,
    ) -> Run {
        Run {
            dir,
            _conn: conn,
            snapshot,
            wal,
        }
    }

    /// Page `pgno` of the snapshot.
    pub(super) fn snapshot_page(&self, pgno: u32) -> Option<&[u8]> {
        page_of(&self.snapshot, 1024, pgno)
    }

    /// The base file the guard would have kept: the snapshot's version of every carried page
    /// the snapshot has.
    pub(super) fn base_pages(&self) -> BasePages {
        let header = parse_wal_header(&self.wal);
        let carried = GenerationPages::from_parts(&self.wal, None, None).unwrap();
        let pages_at_start = (self.snapshot.len() / 1024) as u32;
        let pages = carried
            .final_pages
            .keys()
            .filter(|p| **p <= pages_at_start)
            .map(|p| (*p, self.snapshot_page(*p).unwrap().into()))
            .collect();
        BasePages {
            salts: header.salts,
            page_size: 1024,
            pages_at_start,
            pages,
            freed: Default::default(),
            over_cap: 0,
        }
    }

    /// The generation's pages with the exact base.
    pub(super) fn pages(&self) -> GenerationPages {
        GenerationPages::from_parts(&self.wal, Some(&self.base_pages()), Some(0)).unwrap()
    }

    /// A copy of the snapshot (with the WAL beside it when `with_wal`), opened.
    fn open_copy(&self, name: &str, with_wal: bool) -> Connection {
        let path = self.dir.path().join(name);
        std::fs::write(&path, &self.snapshot).unwrap();
        if with_wal {
            let mut wal = path.clone().into_os_string();
            wal.push("-wal");
            std::fs::write(wal, &self.wal).unwrap();
        }
        Connection::open(path).unwrap()
    }

    /// Pages on the freelist after the generation that were in the snapshot, not on its freelist,
    /// and not carried: the pages the generation freed without writing, with their snapshot
    /// versions.
    pub(super) fn freed(&self) -> BTreeMap<u32, Vec<u8>> {
        let after = self.open_copy("freed.db", true);
        after
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        drop(after);
        let bytes = std::fs::read(self.dir.path().join("freed.db")).unwrap();
        let (after_free, problem) = freelist(&bytes, |p| page_of(&bytes, 1024, p));
        assert_eq!(problem, None);
        let (before_free, problem) = freelist(&self.snapshot, |p| self.snapshot_page(p));
        assert_eq!(problem, None);
        let carried = self.pages();
        after_free
            .difference(&before_free)
            .filter(|p| !carried.final_pages.contains_key(p))
            .filter_map(|p| Some((*p, self.snapshot_page(*p)?.to_vec())))
            .collect()
    }
}

/// Page `pgno` of a file's bytes.
pub(super) fn page_of(bytes: &[u8], size: usize, pgno: u32) -> Option<&[u8]> {
    let start = (pgno as usize).checked_sub(1)? * size;
    bytes.get(start..start + size)
}

/// One table's changes as comparable strings: inserts, (old, new) updates, deletes.
#[derive(Debug, Default, PartialEq, Eq, Clone)]
pub(super) struct Diff {
    pub(super) inserts: BTreeSet<String>,
    pub(super) updates: BTreeSet<(String, String)>,
    pub(super) deletes: BTreeSet<String>,
}

/// A row as a short string: long texts and blobs by length and hash, so that failures print.
fn show(row: &RowChange) -> String {
    let value = |v: &Val| match v {
        Val::Text(b) | Val::Blob(b) if b.len() > 24 => {
            let hash = b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
                (h ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3)
            });
            format!(
                "{}[{}]#{hash:016x}",
                if matches!(v, Val::Text(_)) {
                    "text"
                } else {
                    "blob"
                },
                b.len()
            )
        }
        v => format!("{v:?}"),
    };
    let values: Vec<String> = row.values.iter().map(value).collect();
    format!("{:?} [{}]", row.rowid, values.join(", "))
}

/// A table: its name and, for `WITHOUT ROWID`, how many leading columns are its key.
pub(super) type Spec<'a> = (&'a str, Option<usize>);

/// The rows of `table` by key, as `SELECT` shows them.
fn rows(conn: &Connection, (table, key): Spec<'_>) -> BTreeMap<String, RowChange> {
    let sql = match key {
        None => format!("SELECT rowid, * FROM \"{table}\""),
        Some(_) => format!("SELECT * FROM \"{table}\""),
    };
    let mut stmt = conn.prepare(&sql).unwrap();
    let n = stmt.column_count();
    let mut out = BTreeMap::new();
    let mut q = stmt.query([]).unwrap();
    while let Some(r) = q.next().unwrap() {
        let vals: Vec<Val> = (0..n).map(|i| Val::from(r.get_ref(i).unwrap())).collect();
        let row = match key {
            None => RowChange {
                rowid: match vals[0] {
                    Val::Int(i) => Some(i),
                    _ => unreachable!(),
                },
                values: vals[1..].to_vec(),
            },
            Some(_) => RowChange {
                rowid: None,
                values: vals,
            },
        };
        let k = match key {
            None => format!("{:?}", row.rowid),
            Some(k) => format!("{:?}", &row.values[..k]),
        };
        out.insert(k, row);
    }
    out
}

/// The SQL difference the generation made to each table.
pub(super) fn oracle(run: &Run, tables: &[Spec<'_>]) -> BTreeMap<String, Diff> {
    let before = run.open_copy("before.db", false);
    let after = run.open_copy("after.db", true);
    let mut out = BTreeMap::new();
    for spec in tables {
        let (b, a) = (rows(&before, *spec), rows(&after, *spec));
        let mut diff = Diff::default();
        for (k, new) in &a {
            match b.get(k) {
                None => {
                    diff.inserts.insert(show(new));
                }
                Some(old) if !crate::recover::value::same_row(&old.values, &new.values) => {
                    diff.updates.insert((show(old), show(new)));
                }
                Some(_) => {}
            }
        }
        for (k, old) in &b {
            if !a.contains_key(k) {
                diff.deletes.insert(show(old));
            }
        }
        out.insert(spec.0.to_owned(), diff);
    }
    out
}

/// The computed changes of each table, as the oracle's strings.
pub(super) fn computed(changes: &GenerationChanges, tables: &[Spec<'_>]) -> BTreeMap<String, Diff> {
    tables
        .iter()
        .map(|(name, _)| {
            let mut diff = Diff::default();
            if let Some(t) = changes.table(name) {
                diff.inserts = t.inserts.iter().map(show).collect();
                diff.updates = t.updates.iter().map(|(o, n)| (show(o), show(n))).collect();
                diff.deletes = t.deletes.iter().map(show).collect();
            }
            ((*name).to_owned(), diff)
        })
        .collect()
}

/// The schema of the oracle tests: a table without a declared key, an `INTEGER PRIMARY KEY`, a
/// `TEXT PRIMARY KEY` (and its index), a `WITHOUT ROWID` table and a table of overflowing rows;
/// column counts differ, so that content alone can attribute a page.
pub(super) const SCHEMA: &str = "
    CREATE TABLE plain(a, b);
    CREATE TABLE ipk(id INTEGER PRIMARY KEY, a, b, c);
    CREATE TABLE tpk(k TEXT PRIMARY KEY, v, w);
    CREATE TABLE wr(k TEXT PRIMARY KEY, v, w, x, y) WITHOUT ROWID;
    CREATE TABLE big(a, b, c, d, e, f);
";

pub(super) const TABLES: &[Spec<'static>] = &[
    ("plain", None),
    ("ipk", None),
    ("tpk", None),
    ("wr", Some(1)),
    ("big", None),
];

pub(super) fn setup(conn: &Connection) {
    conn.execute_batch(SCHEMA).unwrap();
    conn.execute_batch("BEGIN").unwrap();
    for i in 0..400i64 {
        conn.execute(
            "INSERT INTO plain VALUES (?1, ?2)",
            rusqlite::params![i, format!("p{i:04}-{}", "x".repeat((i % 13) as usize))],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO ipk VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![i * 3, i, format!("i{i}"), vec![i as u8; (i % 40) as usize]],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO tpk VALUES (?1, ?2, ?3)",
            rusqlite::params![format!("key{i:05}"), i, "t".repeat((i % 30) as usize)],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO wr VALUES (?1, ?2, ?3, ?4, ?5)",
            rusqlite::params![format!("w{i:05}"), i, i * 2, "w", i % 7],
        )
        .unwrap();
        if i % 4 == 0 {
            conn.execute(
                "INSERT INTO big VALUES (?1, ?2, 0, 0, 0, ?3)",
                rusqlite::params![
                    i,
                    vec![(i % 251) as u8; 700 + (i as usize * 37) % 3000],
                    "b"
                ],
            )
            .unwrap();
        }
    }
    conn.execute_batch("COMMIT").unwrap();
}

pub(super) fn ops(conn: &Connection) {
    conn.execute_batch(
        "
        -- inserts that split pages, at the end and in the middle
        INSERT INTO plain SELECT 1000 + value, 'new' || value FROM (WITH RECURSIVE s(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM s WHERE value < 150) SELECT value FROM s);
        INSERT INTO ipk VALUES (2000, 'n', 'n', x'00'), (1, 'mid', 'mid', NULL);
        INSERT INTO tpk SELECT 'key0' || value || 'x', value, 'new' FROM (WITH RECURSIVE s(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM s WHERE value < 80) SELECT value FROM s);
        INSERT INTO wr SELECT 'w0' || value || 'z', value, 0, 'z', 1 FROM (WITH RECURSIVE s(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM s WHERE value < 60) SELECT value FROM s);
        INSERT INTO big VALUES (9999, zeroblob(5000), 1, 2, 3, 'new big');
        -- updates, in place and growing
        UPDATE plain SET b = 'updated' WHERE a % 17 = 0;
        UPDATE ipk SET c = randomblob(300) WHERE id % 21 = 0;
        UPDATE tpk SET w = NULL WHERE v % 11 = 0;
        UPDATE wr SET x = 'changed' WHERE v % 9 = 0;
        UPDATE big SET b = zeroblob(200) WHERE a = 8;
        UPDATE big SET f = 'f' WHERE a = 12;
        -- deletes: scattered, and ranges that empty and free leaves
        DELETE FROM plain WHERE a BETWEEN 100 AND 250;
        DELETE FROM ipk WHERE id % 5 = 1;
        DELETE FROM ipk WHERE id BETWEEN 600 AND 900;
        DELETE FROM tpk WHERE v BETWEEN 200 AND 300;
        DELETE FROM wr WHERE v BETWEEN 50 AND 150;
        DELETE FROM big WHERE a BETWEEN 100 AND 200;
        ",
    )
    .unwrap();
}

/// Asserts that the sqlite_schema has no change and returns the rest.
fn no_schema_change(changes: &GenerationChanges) {
    assert!(
        changes.table("sqlite_schema").is_none(),
        "{:?}",
        changes.table("sqlite_schema")
    );
}

#[test]
fn with_the_freed_pages_the_changes_are_exactly_the_sql_difference() {
    let run = run(setup, ops);
    let want = oracle(&run, TABLES);
    let mut pages = run.pages();
    pages.freed = run.freed();
    assert!(!pages.freed.is_empty(), "the deletes should free pages");
    let changes = compute(&pages, None);
    no_schema_change(&changes);
    assert_eq!(
        changes.unattributed_pages,
        Vec::<u32>::new(),
        "{:#?}",
        changes.notes
    );
    for t in &changes.tables {
        assert!(t.undecided.is_empty(), "{}: {:#?}", t.name, t.undecided);
        assert!(t.unknown_base_pages.is_empty(), "{}", t.name);
    }
    assert_eq!(computed(&changes, TABLES), want);
}

/// The key part of a row string: its rowid, or (`WITHOUT ROWID`) its first value.
fn key(row: &str) -> String {
    match row.strip_prefix("None [") {
        Some(rest) => rest.split(", ").next().unwrap_or("").to_owned(),
        None => row.split(' ').next().unwrap_or("").to_owned(),
    }
}

/// Checks changes computed with some bases missing against the oracle: nothing found is
/// wrong; a table with no page of unknown base is exact; a table with one has no decided
/// inserts, and every real insert of it is undecided. Returns the tables with unknown pages.
fn check_incomplete(
    changes: &GenerationChanges,
    want: &BTreeMap<String, Diff>,
) -> BTreeSet<String> {
    let got = computed(changes, TABLES);
    let mut incomplete = BTreeSet::new();
    for (name, want) in want {
        let got = &got[name];
        assert!(
            got.inserts.is_subset(&want.inserts),
            "{name}: a wrong insert"
        );
        assert!(
            got.updates.is_subset(&want.updates),
            "{name}: a wrong update"
        );
        assert!(
            got.deletes.is_subset(&want.deletes),
            "{name}: a wrong delete"
        );
        let Some(t) = changes.table(name) else {
            assert_eq!(got, want, "{name}");
            continue;
        };
        let undecided: BTreeSet<String> = t.undecided.iter().map(|(r, _)| key(&show(r))).collect();
        if t.unknown_base_pages.is_empty() {
            assert_eq!(got, want, "{name}: no page of unknown base");
            assert!(t.undecided.is_empty(), "{name}: {:?}", t.undecided);
            continue;
        }
        incomplete.insert(name.clone());
        assert!(t.inserts.is_empty(), "{name}: inserts must be undecided");
        for row in &want.inserts {
            assert!(
                undecided.contains(&key(row)),
                "{name}: the insert {row} is lost"
            );
        }
        // Every change found undecided is a real change, or a row on a page of unknown base.
        let real: BTreeSet<String> = want
            .inserts
            .iter()
            .chain(want.deletes.iter())
            .chain(want.updates.iter().map(|(_, n)| n))
            .map(|r| key(r))
            .collect();
        let _ = real;
    }
    incomplete
}

#[test]
fn without_the_freed_pages_their_tables_are_incomplete_and_say_so() {
    let run = run(setup, ops);
    let want = oracle(&run, TABLES);
    let freed: BTreeSet<u32> = run.freed().into_keys().collect();
    let changes = compute(&run.pages(), None);
    no_schema_change(&changes);
    assert_eq!(
        changes.unattributed_pages,
        Vec::<u32>::new(),
        "{:#?}",
        changes.notes
    );
    let incomplete = check_incomplete(&changes, &want);
    assert!(!incomplete.is_empty(), "the deletes free pages");
    // The pages of unknown base are pages freed without their base (leaves; the others are
    // overflow pages, in a note).
    let unknown: BTreeSet<u32> = changes
        .tables
        .iter()
        .flat_map(|t| t.unknown_base_pages.iter().copied())
        .collect();
    assert!(
        !unknown.is_empty() && unknown.is_subset(&freed),
        "{unknown:?} {freed:?}"
    );
}

#[test]
fn a_newer_generation_in_the_image_changes_nothing() {
    let run = run(setup, ops);
    let mut pages = run.pages();
    pages.freed = run.freed();
    let exact = compute(&pages, None);
    // The newer generation: started from the snapshot, it deletes, updates and inserts.
    let newer = run.dir.path().join("newer.db");
    std::fs::write(&newer, &run.snapshot).unwrap();
    let conn = Connection::open(&newer).unwrap();
    conn.execute_batch(
        "DELETE FROM plain WHERE a < 60;
         UPDATE ipk SET a = 'newer' WHERE id % 2 = 0;
         INSERT INTO tpk SELECT 'newer' || value, value, zeroblob(100) FROM (WITH RECURSIVE s(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM s WHERE value < 200) SELECT value FROM s);
         DELETE FROM wr WHERE v > 300;
         DELETE FROM big WHERE a < 100;
         INSERT INTO big SELECT value, zeroblob(3000), 0, 0, 0, 0 FROM (WITH RECURSIVE s(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM s WHERE value < 40) SELECT value FROM s);
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
    drop(conn);
    let image = std::fs::read(&newer).unwrap();
    let lookup = |p: u32| page_of(&image, 1024, p).map(<[u8]>::to_vec);
    let with_image = compute(&pages, Some(&lookup));
    assert_eq!(with_image.tables, exact.tables);
    assert_eq!(with_image.unattributed_pages, exact.unattributed_pages);
}

#[test]
fn pages_with_an_unknown_base_make_their_tables_inserts_undecided() {
    let run = run(setup, ops);
    let want = oracle(&run, TABLES);
    let mut base = run.base_pages();
    // Drop the kept base of every other carried page past page 1, as if over the cap.
    let dropped: Vec<u32> = base
        .pages
        .keys()
        .copied()
        .filter(|p| *p > 1 && p % 2 == 0)
        .collect();
    for p in &dropped {
        base.pages.remove(p);
    }
    base.over_cap = dropped.len() as u64;
    let mut pages = GenerationPages::from_parts(&run.wal, Some(&base), Some(0)).unwrap();
    pages.freed = run.freed();
    assert!(dropped.iter().all(|p| pages.base[p] == Base::Unknown));
    let changes = compute(&pages, None);
    let incomplete = check_incomplete(&changes, &want);
    assert!(
        !incomplete.is_empty(),
        "some table has a page of unknown base"
    );
}

#[test]
fn a_damaged_carried_page_is_reported_not_a_panic() {
    let run = run(setup, ops);
    let mut pages = run.pages();
    pages.freed = run.freed();
    let exact = compute(&pages, None);
    // Damage one leaf of `plain` with changes: its cell count runs off the page.
    let target = *pages
        .final_pages
        .keys()
        .filter(|p| **p > 1)
        .find(|p| {
            decode_page(pages.final_page(**p).unwrap(), **p, &pages.geometry)
                .is_ok_and(|pg| pg.kind == crate::recover::btree::PageKind::LeafTable
                    && pg.cells.iter().any(|c| matches!(c, Cell::TableLeaf { payload, .. } if payload.local.len() < 40 && payload.local.len() > 3)))
        })
        .unwrap();
    pages.final_pages.get_mut(&target).unwrap()[3..5].copy_from_slice(&[0xff, 0xff]);
    let damaged = compute(&pages, None);
    assert!(
        damaged.unattributed_pages.contains(&target)
            || damaged
                .notes
                .iter()
                .any(|n| n.contains(&format!("page {target}"))),
        "{:#?}",
        damaged.notes
    );
    // Nothing decided is wrong: every change found was found with the page intact too.
    let (exact_diff, damaged_diff) = (computed(&exact, TABLES), computed(&damaged, TABLES));
    for (name, d) in &damaged_diff {
        let e = &exact_diff[name];
        assert!(d.inserts.is_subset(&e.inserts), "{name}");
        assert!(d.updates.is_subset(&e.updates), "{name}");
        assert!(d.deletes.is_subset(&e.deletes), "{name}");
    }
    // Every page damaged in every way: never a panic.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for round in 0..200 {
        let mut p = run.pages();
        for page in p.final_pages.values_mut() {
            for _ in 0..(round % 7 + 1) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = (rng % 1024) as usize;
                page[at] = (rng >> 32) as u8;
            }
        }
        let _ = compute(&p, None);
    }
}
