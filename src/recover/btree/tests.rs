//! The decoder against SQLite itself: databases made by the bundled SQLite (every page size from
//! 512 to 65536, reserved bytes, rowid and `INTEGER PRIMARY KEY` tables, a `TEXT PRIMARY KEY` and
//! its autoindex, a `WITHOUT ROWID` table, overflow rows up to 200 KB, payloads of every size
//! around the local-size thresholds) are decoded from their file's bytes, and every table's rows
//! must equal what `SELECT` returns, value for value and reals bit for bit; the trees and their
//! overflow chains must cover every page of the file exactly once. Damaged pages are in
//! damage_tests.rs.

use std::collections::BTreeSet;
use std::ffi::c_int;

use rusqlite::{params, Connection};

use super::*;
use crate::recover::value::{same_row, Val};

/// A database SQLite made, its connection still open for the oracle queries.
pub(super) struct Fixture {
    _dir: tempfile::TempDir,
    pub(super) conn: Connection,
    pub(super) bytes: Vec<u8>,
    pub(super) geometry: DbGeometry,
}

impl Fixture {
    /// Runs `fill` on a new rollback-journal database of this page size and reserved bytes,
    /// then reads the file (every commit is in it: no WAL).
    pub(super) fn new(page_size: u32, reserved: u8, fill: impl FnOnce(&Connection)) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("t.db")).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA page_size = {page_size}; PRAGMA journal_mode = DELETE;"
        ))
        .unwrap();
        if reserved > 0 {
            let mut n: c_int = reserved.into();
            let rc = crate::vfs::raw::reserve_bytes(&conn, &mut n);
            assert_eq!(rc, rusqlite::ffi::SQLITE_OK);
        }
        conn.execute_batch("BEGIN").unwrap();
        fill(&conn);
        conn.execute_batch("COMMIT").unwrap();
        let bytes = std::fs::read(dir.path().join("t.db")).unwrap();
        let geometry = DbGeometry::from_header(&bytes).unwrap();
        assert_eq!(geometry.page_size(), page_size);
        assert_eq!(geometry.usable(), page_size - u32::from(reserved));
        assert_eq!(geometry.text_encoding(), 1);
        Fixture {
            _dir: dir,
            conn,
            bytes,
            geometry,
        }
    }

    /// The page lookup over the file's bytes.
    pub(super) fn pages<'s>(&'s self) -> impl Fn(u32) -> Option<&'s [u8]> + 's {
        let size = self.geometry.page_size() as usize;
        move |pgno| {
            let start = (pgno as usize).checked_sub(1)? * size;
            self.bytes.get(start..start + size)
        }
    }

    /// (type, name, root page) of every schema object with a tree, read by decoding page 1's
    /// tree, which is itself checked against `SELECT … FROM sqlite_schema`.
    pub(super) fn schema(&self) -> Vec<(String, String, u32)> {
        let rows = self.check_table("sqlite_schema", 1, None);
        rows.into_iter()
            .filter_map(|r| match (&r.values[0], &r.values[1], &r.values[3]) {
                (Val::Text(t), Val::Text(n), Val::Int(root)) if *root > 0 => Some((
                    String::from_utf8(t.clone()).unwrap(),
                    String::from_utf8(n.clone()).unwrap(),
                    *root as u32,
                )),
                _ => None,
            })
            .collect()
    }

    /// The root page of `name`.
    pub(super) fn root(&self, name: &str) -> u32 {
        self.schema()
            .into_iter()
            .find(|(_, n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} in the schema"))
            .2
    }

    /// Decodes the table tree at `root` and asserts its rows equal `SELECT rowid, * FROM table`
    /// (the `INTEGER PRIMARY KEY` column `ipk`, stored as NULL, takes the rowid).
    pub(super) fn check_table(
        &self,
        table: &str,
        root: u32,
        ipk: Option<usize>,
    ) -> Vec<TableLeafRow> {
        let walk = table_rows(root, &self.geometry, self.pages()).unwrap();
        let want = select(
            &self.conn,
            &format!("SELECT rowid, * FROM \"{table}\" ORDER BY rowid"),
        );
        assert_eq!(walk.entries.len(), want.len(), "{table}: row count");
        for (row, want) in walk.entries.iter().zip(&want) {
            let mut got = vec![Val::Int(row.rowid)];
            got.extend(row.values.iter().cloned());
            if let Some(i) = ipk {
                assert_eq!(
                    got[i + 1],
                    Val::Null,
                    "{table}: the IPK column is stored as NULL"
                );
                got[i + 1] = Val::Int(row.rowid);
            }
            assert!(same_row(&got, want), "{table}: {got:?}\n!= {want:?}");
        }
        walk.entries
    }

    /// Decodes the index-format tree at `root` and asserts its keys equal `query`'s rows.
    pub(super) fn check_index(&self, root: u32, query: &str) -> usize {
        let walk = index_records(root, &self.geometry, self.pages()).unwrap();
        let want = select(&self.conn, query);
        assert_eq!(walk.entries.len(), want.len(), "{query}: key count");
        for (got, want) in walk.entries.iter().zip(&want) {
            assert!(same_row(got, want), "{query}: {got:?}\n!= {want:?}");
        }
        walk.entries.len()
    }

    /// Every schema tree (page 1's included) with its overflow chains, and the freelist, cover
    /// each page of the file exactly once; returns how many tree pages of each kind.
    pub(super) fn check_coverage(&self) -> [usize; 4] {
        let page_count = self.bytes.len() / self.geometry.page_size() as usize;
        let mut seen = BTreeSet::new();
        for p in self.freelist() {
            assert!(seen.insert(p), "free page {p} listed twice");
        }
        let mut kinds = [0usize; 4];
        let mut trees = vec![("table".to_string(), 1)];
        trees.extend(self.schema().into_iter().map(|(t, _, root)| (t, root)));
        for (kind, root) in trees {
            let (tree, overflow) = if kind == "table" && self.is_rowid_tree(root) {
                let w = table_rows(root, &self.geometry, self.pages()).unwrap();
                (w.tree_pages, w.overflow_pages)
            } else {
                let w = index_records(root, &self.geometry, self.pages()).unwrap();
                (w.tree_pages, w.overflow_pages)
            };
            for p in &tree {
                let page = decode_page(self.pages()(*p).unwrap(), *p, &self.geometry).unwrap();
                kinds[page.kind as usize] += 1;
            }
            for p in tree.into_iter().chain(overflow) {
                assert!(seen.insert(p), "page {p} reached twice");
            }
        }
        assert_eq!(seen, (1..=page_count as u32).collect::<BTreeSet<_>>());
        kinds
    }

    /// The free pages: the trunks from page 1's offset 32, each a next-trunk pointer, a count
    /// and that many leaf page numbers; their total is page 1's offset 36 and SQLite's
    /// `freelist_count`.
    fn freelist(&self) -> Vec<u32> {
        let be = |b: &[u8], at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
        let mut free = Vec::new();
        let mut trunk = be(&self.bytes, 32);
        while trunk != 0 {
            let page = self.pages()(trunk).unwrap();
            free.push(trunk);
            free.extend((0..be(page, 4) as usize).map(|i| be(page, 8 + 4 * i)));
            trunk = be(page, 0);
        }
        let count: i64 = self
            .conn
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .unwrap();
        assert_eq!(free.len() as i64, count);
        assert_eq!(be(&self.bytes, 36) as i64, count);
        free
    }

    fn is_rowid_tree(&self, root: u32) -> bool {
        let bytes = self.pages()(root).unwrap();
        decode_page(bytes, root, &self.geometry)
            .unwrap()
            .kind
            .is_table()
    }
}

/// Every row of `query`, each value as SQLite returns it.
pub(super) fn select(conn: &Connection, query: &str) -> Vec<Vec<Val>> {
    let mut stmt = conn.prepare(query).unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| {
        (0..n)
            .map(|i| r.get_ref(i).map(Val::from))
            .collect::<Result<Vec<_>, _>>()
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// A small deterministic generator (the tests need variety, not randomness).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// A value of any storage class, integers of every serial width.
    fn value(&mut self) -> Val {
        let ints = [
            0,
            1,
            -1,
            127,
            -128,
            32767,
            -32768,
            8388607,
            -8388608,
            i32::MAX as i64,
            i32::MIN as i64,
            (1 << 47) - 1,
            -(1 << 47),
            i64::MAX,
            i64::MIN,
        ];
        match self.next() % 8 {
            0 => Val::Null,
            1 => Val::Int(ints[(self.next() % ints.len() as u64) as usize]),
            2 => Val::Int(self.next() as i64 - (1 << 52)),
            3 => Val::Real(f64::from_bits(self.next() << 11) - 0.5),
            4 => Val::Real(-0.0),
            5 => {
                let len = (self.next() % 40) as usize;
                Val::Text((0..len).map(|_| b'a' + (self.next() % 26) as u8).collect())
            }
            6 => {
                let len = (self.next() % 60) as usize;
                Val::Blob(self.bytes(len))
            }
            _ => Val::Text("é€𝄞".repeat((self.next() % 5) as usize).into_bytes()),
        }
    }
}

/// The schemas of plan step 2, filled: a rowid table, an `INTEGER PRIMARY KEY` table deep
/// enough for interior pages at every size, a `TEXT PRIMARY KEY` table (its autoindex), a
/// `WITHOUT ROWID` table, and overflow rows of 5 KB to 200 KB in both tree formats.
fn fill_all(conn: &Connection) {
    conn.execute_batch(
        "CREATE TABLE plain(a, b, c);
         CREATE TABLE ipk(id INTEGER PRIMARY KEY, a, b);
         CREATE TABLE tpk(k TEXT PRIMARY KEY, v);
         CREATE TABLE wr(k TEXT, n INTEGER, v, PRIMARY KEY (k, n)) WITHOUT ROWID;
         CREATE TABLE big(a, b);",
    )
    .unwrap();
    let mut g = Lcg(42);
    for _ in 0..300 {
        conn.execute(
            "INSERT INTO plain VALUES (?1, ?2, ?3)",
            params![g.value(), g.value(), g.value()],
        )
        .unwrap();
    }
    for i in 0..1500i64 {
        conn.execute(
            "INSERT INTO ipk VALUES (?1, ?2, ?3)",
            params![i * 7919 - 5_000_000, g.value(), i],
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO ipk VALUES (?1, 'min', 0), (?2, 'max', 0)",
        params![i64::MIN, i64::MAX],
    )
    .unwrap();
    for i in 0..300usize {
        // Keys of 1 to ~3000 bytes: long ones overflow the index cells on small pages.
        let key = format!(
            "{i:05}-{}",
            "k".repeat(if i % 50 == 7 { 3000 } else { i % 40 })
        );
        conn.execute("INSERT INTO tpk VALUES (?1, ?2)", params![key, g.value()])
            .unwrap();
        let v = if i % 60 == 5 {
            Val::Blob(g.bytes(5000 + 997 * i))
        } else {
            g.value()
        };
        conn.execute(
            "INSERT INTO wr VALUES (?1, ?2, ?3)",
            params![format!("w{}", i % 17), i as i64, v],
        )
        .unwrap();
    }
    for (i, len) in [5_000usize, 20_000, 65_000, 70_000, 131_072, 200_000]
        .into_iter()
        .enumerate()
    {
        let text = Val::Text((0..len).map(|j| b'a' + ((i + j) % 26) as u8).collect());
        conn.execute(
            "INSERT INTO big VALUES (?1, ?2)",
            params![g.bytes(len), text],
        )
        .unwrap();
    }
}

/// Checks every table of `fill_all`'s schema and the coverage of the file.
fn check_all(f: &Fixture) {
    f.check_table("plain", f.root("plain"), None);
    f.check_table("ipk", f.root("ipk"), Some(0));
    let tpk = f.check_table("tpk", f.root("tpk"), None);
    let keys = f.check_index(
        f.root("sqlite_autoindex_tpk_1"),
        "SELECT k, rowid FROM tpk ORDER BY k",
    );
    assert_eq!(keys, tpk.len(), "one autoindex key per row");
    f.check_index(f.root("wr"), "SELECT k, n, v FROM wr ORDER BY k, n");
    f.check_table("big", f.root("big"), None);
    let kinds = f.check_coverage();
    if f.geometry.page_size() <= 4096 {
        assert!(
            kinds.iter().all(|&n| n > 0),
            "every page kind decoded: {kinds:?}"
        );
    }
}

#[test]
fn every_page_size_decodes_as_sqlite_reads_it() {
    for page_size in [512, 1024, 4096, 65536] {
        check_all(&Fixture::new(page_size, 0, fill_all));
    }
}

#[test]
fn reserved_bytes_shrink_the_usable_page() {
    for (page_size, reserved) in [(512, 32), (4096, 100), (65536, 255)] {
        check_all(&Fixture::new(page_size, reserved, fill_all));
    }
}

/// Payloads of every size from 0 to past two overflow pages, on the smallest usable page (480
/// bytes), in a table leaf, an index and a `WITHOUT ROWID` tree: each local-size threshold
/// (maxLocal, the surplus rule's wrap-around at multiples of usable − 4) is crossed.
#[test]
fn every_payload_size_around_the_local_thresholds() {
    let f = Fixture::new(512, 32, |conn| {
        conn.execute_batch(
            "CREATE TABLE sizes(b);
             CREATE INDEX sizes_b ON sizes(b);
             CREATE TABLE wsizes(k INTEGER PRIMARY KEY, b) WITHOUT ROWID;",
        )
        .unwrap();
        let mut g = Lcg(7);
        for len in 0..1500usize {
            let b = g.bytes(len);
            conn.execute("INSERT INTO sizes VALUES (?1)", [&b]).unwrap();
            conn.execute("INSERT INTO wsizes VALUES (?1, ?2)", params![len as i64, b])
                .unwrap();
        }
    });
    f.check_table("sizes", f.root("sizes"), None);
    f.check_index(f.root("sizes_b"), "SELECT b, rowid FROM sizes ORDER BY b");
    f.check_index(f.root("wsizes"), "SELECT k, b FROM wsizes ORDER BY k");
    f.check_coverage();
}

#[test]
fn local_sizes_match_sqlite_constants() {
    let g4096 = DbGeometry::new(4096, 0).unwrap();
    let g480 = DbGeometry::new(512, 32).unwrap();
    // usable 4096: maxLeaf 4061, maxLocal 1002, minLocal 489, 4092 bytes per overflow page.
    assert_eq!(local_size(PageKind::LeafTable, 4061, &g4096), 4061);
    assert_eq!(local_size(PageKind::LeafTable, 4062, &g4096), 489);
    assert_eq!(
        local_size(PageKind::LeafTable, 489 + 4092 + 100, &g4096),
        589
    );
    assert_eq!(local_size(PageKind::LeafIndex, 1002, &g4096), 1002);
    assert_eq!(local_size(PageKind::InteriorIndex, 1003, &g4096), 489);
    assert_eq!(
        local_size(PageKind::LeafIndex, 489 + 4092 + 513, &g4096),
        1002
    );
    assert_eq!(
        local_size(PageKind::LeafIndex, 489 + 4092 + 514, &g4096),
        489
    );
    // usable 480 (a 512-byte page with 32 reserved): maxLeaf 445, maxLocal 94, minLocal 35,
    // 476 bytes per overflow page.
    assert_eq!(local_size(PageKind::LeafTable, 445, &g480), 445);
    assert_eq!(local_size(PageKind::LeafTable, 446, &g480), 35);
    assert_eq!(local_size(PageKind::LeafTable, 35 + 476 + 10, &g480), 45);
    assert_eq!(local_size(PageKind::LeafIndex, 94, &g480), 94);
    assert_eq!(local_size(PageKind::LeafIndex, 95, &g480), 35);
    assert_eq!(
        local_size(PageKind::InteriorIndex, 35 + 476 + 50, &g480),
        85
    );
}
