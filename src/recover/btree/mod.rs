//! A decoder of SQLite's B-tree pages, pure (bytes in, values out; no SQLite, no I/O): page
//! headers and cell pointers, the cells of the four page types, local payload sizes and overflow
//! chains, records and serial types, and walks of whole trees from a root page.
//!
//! Its consumer is the `changes` merge rule (docs/plans/recovery-from-changes.md, step 6), which
//! reads a table's rows from the base and final versions of the pages a generation wrote, pages
//! no SQLite connection can be pointed at. Those pages may be damaged or belong to another table,
//! so every field is checked and a malformed one is a [`BtreeError`], never a panic.
//!
//! A record's values are what is stored, which is not always what `SELECT` shows: an
//! `INTEGER PRIMARY KEY` column is stored as NULL (its value is the rowid); a column of REAL
//! affinity may hold an integral real as an integer (SQLite turns it back into a real when it
//! reads the column); a row written before an `ALTER TABLE … ADD COLUMN` lacks the new column
//! (SQLite shows its default). Comparing stored values is exact for telling whether a row changed;
//! turning them into a table's values needs the table's declaration.
//!
//! Left out, as the rows do not need them: freeblocks (free space inside a page; its first
//! freeblock is reported, the chain is not followed), freelist and pointer-map pages (not B-tree
//! pages: decoding one is a page-type error), and the text encoding's conversion (text is kept as
//! the stored bytes; [`DbGeometry::text_encoding`] says which encoding they are in).

// The change computation (`recover/changes/`) uses most of it; a few items — the index walk,
// the overflow assembler, the text encoding, `local_size` — only its tests use so far.
#![cfg_attr(not(test), allow(dead_code, unused_imports))]

mod bigendian;
mod cell;
mod error;
mod kind;
mod page;
mod record;
mod tree;
mod varint;

#[cfg(test)]
mod damage_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub(crate) use cell::{local_size, Cell};
pub(crate) use error::{BtreeError, RecordError};
pub(crate) use kind::PageKind;
pub(crate) use page::{decode_page, Page};
pub(crate) use record::{body_len, decode_record};
pub(crate) use tree::{index_records, table_rows, TableLeafRow};
pub(crate) use varint::{read_varint, write_varint};

/// The sizes every page of a database shares, from page 1's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DbGeometry {
    page_size: u32,
    usable: u32,
    text_encoding: u32,
}

/// The first 16 bytes of every SQLite database file.
const MAGIC: &[u8; 16] = b"SQLite format 3\0";

impl DbGeometry {
    /// The geometry in page 1's first 100 bytes (more may be given): the page size (offset 16,
    /// big-endian; 1 means 65536), the reserved bytes at the end of each page (offset 20) and the
    /// text encoding (offset 56).
    pub(crate) fn from_header(page1: &[u8]) -> Result<DbGeometry, BtreeError> {
        let header = page1
            .get(..100)
            .ok_or(BtreeError::HeaderTooShort { len: page1.len() })?;
        if !header.starts_with(MAGIC) {
            return Err(BtreeError::NotADatabase);
        }
        let raw = u16::from_be_bytes([header[16], header[17]]);
        let page_size = if raw == 1 { 65536 } else { u32::from(raw) };
        let reserved = header[20];
        let text_encoding = u32::from_be_bytes([header[56], header[57], header[58], header[59]]);
        let mut geometry = DbGeometry::new(page_size, reserved)?;
        geometry.text_encoding = text_encoding;
        Ok(geometry)
    }

    /// A geometry from a page size (a power of two from 512 to 65536) and the reserved bytes per
    /// page, which must leave at least 480 usable bytes (SQLite's minimum). Text is UTF-8.
    pub(crate) fn new(page_size: u32, reserved: u8) -> Result<DbGeometry, BtreeError> {
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(BtreeError::PageSize { size: page_size });
        }
        let usable = page_size - u32::from(reserved);
        if usable < 480 {
            return Err(BtreeError::UsableSize {
                page_size,
                reserved,
                usable,
            });
        }
        Ok(DbGeometry {
            page_size,
            usable,
            text_encoding: 1,
        })
    }

    /// Bytes per page.
    pub(crate) fn page_size(&self) -> u32 {
        self.page_size
    }

    /// The bytes of a page the B-tree uses: the page size less the reserved bytes (which belong
    /// to extensions such as checksums or encryption).
    pub(crate) fn usable(&self) -> u32 {
        self.usable
    }

    /// The text encoding of the database's text values as stored: 1 UTF-8, 2 UTF-16le,
    /// 3 UTF-16be (0 in a database with no schema yet).
    pub(crate) fn text_encoding(&self) -> u32 {
        self.text_encoding
    }
}
