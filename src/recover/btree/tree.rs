//! Walking a whole tree from its root page: every row of a table tree (rowid and record, in
//! rowid order), or every key of an index-format tree (index or `WITHOUT ROWID` table, in key
//! order, interior keys included). Pages come from a lookup by number, so the same walk works on
//! a database file, an image or a set of WAL frames. A tree that loops, is deeper than SQLite
//! allows, mixes table and index pages or lacks a page is an error.

use std::collections::HashSet;

use super::cell::{Cell, Payload};
use super::page::decode_page;
use super::record::decode_record;
use super::{BtreeError, DbGeometry};
use crate::recover::value::Val;

/// SQLite's cursors go at most this deep (`BTCURSOR_MAX_DEPTH`); no file it wrote is deeper.
const MAX_DEPTH: usize = 20;

/// A row of a table tree.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TableLeafRow {
    /// The rowid.
    pub(crate) rowid: i64,
    /// The record's values as stored (an `INTEGER PRIMARY KEY` column is NULL here: its value
    /// is the rowid; a column added by `ALTER TABLE … ADD COLUMN` after the row was written is
    /// absent).
    pub(crate) values: Vec<Val>,
}

/// What a walk found: the entries, and the pages it read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Walk<T> {
    /// The rows or keys, in key order.
    pub(crate) entries: Vec<T>,
    /// The tree's own pages, root first, in the order visited.
    pub(crate) tree_pages: Vec<u32>,
    /// The overflow pages of its cells.
    pub(crate) overflow_pages: Vec<u32>,
}

/// Every row of the table tree rooted at `root`.
pub(crate) fn table_rows<'p>(
    root: u32,
    geometry: &DbGeometry,
    page: impl Fn(u32) -> Option<&'p [u8]>,
) -> Result<Walk<TableLeafRow>, BtreeError> {
    let (cells, tree_pages) = key_order_cells(root, geometry, &page, true)?;
    let mut overflow_pages = Vec::new();
    let mut entries = Vec::new();
    for cell in &cells {
        if let Cell::TableLeaf { rowid, payload } = cell {
            entries.push(TableLeafRow {
                rowid: *rowid,
                values: record(payload, geometry, &page, &mut overflow_pages)?,
            });
        }
    }
    Ok(Walk {
        entries,
        tree_pages,
        overflow_pages,
    })
}

/// Every key of the index-format tree rooted at `root` (an index, or a `WITHOUT ROWID` table
/// whose keys are its rows).
pub(crate) fn index_records<'p>(
    root: u32,
    geometry: &DbGeometry,
    page: impl Fn(u32) -> Option<&'p [u8]>,
) -> Result<Walk<Vec<Val>>, BtreeError> {
    let (cells, tree_pages) = key_order_cells(root, geometry, &page, false)?;
    let mut overflow_pages = Vec::new();
    let mut entries = Vec::new();
    for payload in cells.iter().filter_map(Cell::payload) {
        entries.push(record(payload, geometry, &page, &mut overflow_pages)?);
    }
    Ok(Walk {
        entries,
        tree_pages,
        overflow_pages,
    })
}

/// A payload's record, its overflow chain read through `page` (its pages appended to `chain`).
fn record<'p>(
    payload: &Payload<'_>,
    geometry: &DbGeometry,
    page: &impl Fn(u32) -> Option<&'p [u8]>,
    chain: &mut Vec<u32>,
) -> Result<Vec<Val>, BtreeError> {
    let bytes = payload.assemble_noting(geometry, page, chain)?;
    decode_record(&bytes).map_err(|source| BtreeError::Record {
        pgno: payload.pgno,
        offset: payload.cell_offset,
        source,
    })
}

/// The cells of the tree at `root` in key order (for index-format trees, interior keys between
/// their left child's and the next), and the tree's pages in the order visited.
fn key_order_cells<'p>(
    root: u32,
    geometry: &DbGeometry,
    page: &impl Fn(u32) -> Option<&'p [u8]>,
    table: bool,
) -> Result<(Vec<Cell<'p>>, Vec<u32>), BtreeError> {
    let mut walker = Walker {
        root,
        table,
        geometry,
        page,
        seen: HashSet::new(),
        cells: Vec::new(),
        pages: Vec::new(),
    };
    walker.descend(root, 0)?;
    Ok((walker.cells, walker.pages))
}

/// The state of one walk.
struct Walker<'w, 'p, F> {
    root: u32,
    /// A table tree (else index-format).
    table: bool,
    geometry: &'w DbGeometry,
    page: &'w F,
    /// The pages met so far, to stop at a loop.
    seen: HashSet<u32>,
    cells: Vec<Cell<'p>>,
    pages: Vec<u32>,
}

impl<'p, F: Fn(u32) -> Option<&'p [u8]>> Walker<'_, 'p, F> {
    /// Walks the subtree at `pgno`, `depth` levels below the root, in key order.
    fn descend(&mut self, pgno: u32, depth: usize) -> Result<(), BtreeError> {
        let root = self.root;
        if depth >= MAX_DEPTH {
            return Err(BtreeError::TreeTooDeep { root, pgno });
        }
        if !self.seen.insert(pgno) {
            return Err(BtreeError::TreeLoop { root, pgno });
        }
        let bytes = (self.page)(pgno).ok_or(BtreeError::TreePageMissing { root, pgno })?;
        let page = decode_page(bytes, pgno, self.geometry)?;
        if page.kind.is_table() != self.table {
            return Err(BtreeError::TreeKind {
                root,
                pgno,
                expected: if self.table { "table" } else { "index" },
                found: page.kind,
            });
        }
        self.pages.push(pgno);
        for cell in page.cells {
            if let Some(child) = cell.left_child() {
                self.descend(child, depth + 1)?;
            }
            if cell.payload().is_some() {
                self.cells.push(cell);
            }
        }
        if let Some(child) = page.right_child {
            self.descend(child, depth + 1)?;
        }
        Ok(())
    }
}
