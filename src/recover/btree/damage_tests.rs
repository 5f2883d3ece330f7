//! Damaged databases give the typed error that names what is wrong: page 1's header, each field
//! of a page's header and cell pointer array, a cell cut off at the page's end, an overflow chain
//! with a page missing, a loop or an early end, a tree with a page missing, a loop or a page of
//! the other tree format, and a record whose header is longer than the record.

use super::tests::Fixture;
use super::*;
use crate::recover::value::Val;

#[test]
fn the_database_header_is_checked() {
    let f = Fixture::new(1024, 0, |conn| {
        conn.execute_batch("CREATE TABLE t(a)").unwrap()
    });
    let mut header = f.bytes[..100].to_vec();
    assert_eq!(
        DbGeometry::from_header(&header[..99]),
        Err(BtreeError::HeaderTooShort { len: 99 })
    );
    header[16..18].copy_from_slice(&1000u16.to_be_bytes());
    assert_eq!(
        DbGeometry::from_header(&header),
        Err(BtreeError::PageSize { size: 1000 })
    );
    header[16..18].copy_from_slice(&1u16.to_be_bytes());
    assert_eq!(DbGeometry::from_header(&header).unwrap().page_size(), 65536);
    header[16..18].copy_from_slice(&512u16.to_be_bytes());
    header[20] = 33;
    assert_eq!(
        DbGeometry::from_header(&header),
        Err(BtreeError::UsableSize {
            page_size: 512,
            reserved: 33,
            usable: 479
        })
    );
    header[0] = b's';
    assert_eq!(
        DbGeometry::from_header(&header),
        Err(BtreeError::NotADatabase)
    );
}

/// A 1024-byte database with a two-level table, an index, and a row with an overflow chain.
fn small() -> Fixture {
    Fixture::new(1024, 0, |conn| {
        conn.execute_batch("CREATE TABLE t(a); CREATE INDEX t_a ON t(a);")
            .unwrap();
        for i in 0..200i64 {
            conn.execute("INSERT INTO t VALUES (?1)", [format!("row {i:04}")])
                .unwrap();
        }
        conn.execute("INSERT INTO t VALUES (zeroblob(6000))", [])
            .unwrap();
    })
}

/// Decodes page `pgno` of `bytes` (a whole file).
fn page_of<'a>(bytes: &'a [u8], pgno: u32, geometry: &DbGeometry) -> Result<Page<'a>, BtreeError> {
    let size = geometry.page_size() as usize;
    decode_page(
        &bytes[(pgno as usize - 1) * size..pgno as usize * size],
        pgno,
        geometry,
    )
}

#[test]
fn damaged_page_fields_give_typed_errors() {
    let f = small();
    let g = f.geometry;
    let root = f.root("t");
    let at = (root as usize - 1) * 1024;
    let damaged = |offset: usize, bytes: &[u8]| {
        let mut copy = f.bytes.clone();
        copy[at + offset..at + offset + bytes.len()].copy_from_slice(bytes);
        page_of(&copy, root, &g).map(|_| ())
    };
    assert_eq!(
        page_of(&f.bytes, root, &g).unwrap().kind,
        PageKind::InteriorTable
    );
    assert_eq!(
        damaged(0, &[0x00]),
        Err(BtreeError::PageType {
            pgno: root,
            offset: 0,
            byte: 0
        })
    );
    assert_eq!(
        damaged(3, &[0x02, 0x00]),
        Err(BtreeError::CellCount {
            pgno: root,
            cells: 512,
            end: 12 + 1024,
            usable: 1024
        })
    );
    assert!(matches!(
        damaged(5, &[0x00, 0x05]),
        Err(BtreeError::ContentStart { start: 5, .. })
    ));
    assert!(matches!(
        damaged(12, &[0x00, 0x00]),
        Err(BtreeError::CellPointer {
            index: 0,
            pointer: 0,
            ..
        })
    ));
    assert!(matches!(
        damaged(12, &[0x03, 0xfd]),
        Err(BtreeError::CellPointer {
            index: 0,
            pointer: 1021,
            max: 1020,
            ..
        })
    ));
    assert!(matches!(
        damaged(8, &[0, 0, 0, 0]),
        Err(BtreeError::ZeroPointer { offset: 8, .. })
    ));
    assert_eq!(
        decode_page(&f.bytes[..1023], 1, &g),
        Err(BtreeError::PageLength {
            pgno: 1,
            len: 1023,
            page_size: 1024
        })
    );
    assert_eq!(
        decode_page(&f.bytes[..1024], 0, &g),
        Err(BtreeError::PageNumberZero)
    );
    // Page 1's header is at byte 100.
    assert_eq!(page_of(&f.bytes, 1, &g).unwrap().kind, PageKind::LeafTable);
    // A cell cut off at the page's end: the last cell of a leaf moved to its last byte.
    let leaf = page_of(&f.bytes, root, &g).unwrap().right_child.unwrap();
    let page = page_of(&f.bytes, leaf, &g).unwrap();
    let mut copy = f.bytes[(leaf as usize - 1) * 1024..leaf as usize * 1024].to_vec();
    let last_pointer = 8 + 2 * (page.cells.len() - 1);
    copy[last_pointer..last_pointer + 2].copy_from_slice(&1018u16.to_be_bytes());
    copy[1018..1024].copy_from_slice(&[0x7f, 0x05, 0x01, 0x01, 0x01, 0x01]);
    assert_eq!(
        decode_page(&copy, leaf, &g),
        Err(BtreeError::CellTruncated {
            pgno: leaf,
            offset: 1018,
            field: "payload"
        })
    );
}

#[test]
fn damaged_trees_and_chains_give_typed_errors() {
    let f = small();
    let g = f.geometry;
    let root = f.root("t");
    let index_root = f.root("t_a");
    let walk = table_rows(root, &g, f.pages()).unwrap();
    assert_eq!(walk.entries.len(), 201);
    let chain = walk.overflow_pages.clone();
    // The big row's cell: 6000 bytes of blob and a 3-byte header, on 1020-byte overflow pages.
    let last_leaf = *walk.tree_pages.last().unwrap();
    let big = page_of(&f.bytes, last_leaf, &g).unwrap();
    let payload = big
        .cells
        .iter()
        .find_map(|c| c.payload().filter(|p| p.first_overflow.is_some()))
        .unwrap();
    assert_eq!(payload.total, 6003);
    let overflow: usize = 6003 - payload.local.len();
    assert_eq!(chain.len(), overflow.div_ceil(1020));
    assert!(chain.len() >= 4, "{chain:?}");
    assert_eq!(payload.first_overflow, Some(chain[0]));
    let whole = payload.assemble(&g, f.pages()).unwrap();
    assert_eq!(whole.len(), 6003);
    assert_eq!(decode_record(&whole), Ok(vec![Val::Blob(vec![0; 6000])]));
    let with = |pgno: u32, offset: usize, bytes: &[u8]| {
        let mut copy = f.bytes.clone();
        let at = (pgno as usize - 1) * 1024 + offset;
        copy[at..at + bytes.len()].copy_from_slice(bytes);
        copy
    };
    let rows = |bytes: Vec<u8>, missing: u32| {
        let bytes = &bytes;
        let pages = move |p: u32| {
            let start = (p as usize).checked_sub(1)? * 1024;
            (p != missing)
                .then(|| bytes.get(start..start + 1024))
                .flatten()
        };
        table_rows(root, &g, pages).map(|w| w.entries.len())
    };
    // The overflow chain: a page missing, a loop, an early end.
    let (pgno, offset) = (last_leaf, payload.cell_offset);
    assert_eq!(
        rows(f.bytes.clone(), chain[2]),
        Err(BtreeError::OverflowMissing {
            pgno,
            offset,
            overflow: chain[2]
        })
    );
    assert_eq!(
        rows(with(chain[2], 0, &chain[1].to_be_bytes()), 0),
        Err(BtreeError::OverflowLoop {
            pgno,
            offset,
            overflow: chain[1]
        })
    );
    assert_eq!(
        rows(with(chain[1], 0, &[0; 4]), 0),
        Err(BtreeError::OverflowShort {
            pgno,
            offset,
            overflow: chain[1],
            missing: (overflow - 2 * 1020) as u64
        })
    );
    // The tree: a missing leaf, a child pointing back at the root, a child in the index.
    let leaf = walk.tree_pages[1];
    assert_eq!(
        rows(f.bytes.clone(), leaf),
        Err(BtreeError::TreePageMissing { root, pgno: leaf })
    );
    assert_eq!(
        rows(with(root, 8, &root.to_be_bytes()), 0),
        Err(BtreeError::TreeLoop { root, pgno: root })
    );
    let index_kind = page_of(&f.bytes, index_root, &g).unwrap().kind;
    assert_eq!(
        rows(with(root, 8, &index_root.to_be_bytes()), 0),
        Err(BtreeError::TreeKind {
            root,
            pgno: index_root,
            expected: "table",
            found: index_kind
        })
    );
    // A record whose header claims more than the payload: the first cell of the first leaf.
    let first = page_of(&f.bytes, leaf, &g).unwrap();
    let Cell::TableLeaf { payload, .. } = &first.cells[0] else {
        panic!("a table leaf")
    };
    let record_at = payload.cell_offset + 2;
    assert!(matches!(
        rows(with(leaf, record_at, &[0x7f]), 0),
        Err(BtreeError::Record {
            source: RecordError::HeaderSize { size: 127, .. },
            ..
        })
    ));
}
