//! One B-tree page: its header (the type, the first freeblock, the cell count, the start of the
//! cell content area, the fragmented bytes and, on interior pages, the right-most child), its cell
//! pointer array and its cells. The header starts at byte 100 on page 1 (after the database
//! header), at byte 0 elsewhere; cell pointers are offsets from the start of the page either way.
//! Only the usable part of the page (page size − reserved bytes) is ever read.

use std::fmt;

use super::cell::{parse_cell, Cell};
use super::{BtreeError, DbGeometry};

/// The four kinds of B-tree page (the header's first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageKind {
    /// 0x02: keys (whole records) and left-child pointers of an index or `WITHOUT ROWID` tree.
    InteriorIndex,
    /// 0x05: rowids and left-child pointers of a table tree; no payload.
    InteriorTable,
    /// 0x0a: keys (whole records) of an index or `WITHOUT ROWID` tree.
    LeafIndex,
    /// 0x0d: the rows of a table tree, rowid and record.
    LeafTable,
}

impl PageKind {
    /// The kind of a header's type byte, or `None` for any other byte.
    pub(crate) fn from_byte(byte: u8) -> Option<PageKind> {
        match byte {
            0x02 => Some(PageKind::InteriorIndex),
            0x05 => Some(PageKind::InteriorTable),
            0x0a => Some(PageKind::LeafIndex),
            0x0d => Some(PageKind::LeafTable),
            _ => None,
        }
    }

    /// A leaf: no child pointers, 8-byte header.
    pub(crate) fn is_leaf(self) -> bool {
        matches!(self, PageKind::LeafIndex | PageKind::LeafTable)
    }

    /// A page of a table (rowid) tree rather than an index-format tree.
    pub(crate) fn is_table(self) -> bool {
        matches!(self, PageKind::InteriorTable | PageKind::LeafTable)
    }

    /// The header's length: 8 bytes on leaves, 12 on interior pages (the right-most child).
    pub(crate) fn header_len(self) -> usize {
        if self.is_leaf() {
            8
        } else {
            12
        }
    }
}

impl fmt::Display for PageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageKind::InteriorIndex => "interior index",
            PageKind::InteriorTable => "interior table",
            PageKind::LeafIndex => "leaf index",
            PageKind::LeafTable => "leaf table",
        })
    }
}

/// A decoded B-tree page; its cells borrow the page's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page<'a> {
    /// The page's number (1 is the first page of the file).
    pub(crate) pgno: u32,
    /// Its type.
    pub(crate) kind: PageKind,
    /// Offset of the first freeblock, 0 if none (kept as found; freeblocks hold no live cells).
    pub(crate) first_freeblock: u16,
    /// Where the cell content area starts (the stored 0 read as 65536).
    pub(crate) content_start: u32,
    /// Fragmented free bytes in the content area.
    pub(crate) fragmented_bytes: u8,
    /// Interior pages: the child holding the keys after the last cell's.
    pub(crate) right_child: Option<u32>,
    /// The cells in pointer-array order, which is key order.
    pub(crate) cells: Vec<Cell<'a>>,
}

/// Reads a big-endian u16 at `at`, or `None` past the end.
pub(super) fn be_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Reads a big-endian u32 at `at`, or `None` past the end.
pub(super) fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Decodes page `pgno` of a database of this geometry from its bytes (exactly one page). Every
/// field is checked before it is used; malformed bytes give an error, never a panic.
pub(crate) fn decode_page<'a>(
    bytes: &'a [u8],
    pgno: u32,
    geometry: &DbGeometry,
) -> Result<Page<'a>, BtreeError> {
    if pgno == 0 {
        return Err(BtreeError::PageNumberZero);
    }
    if bytes.len() != geometry.page_size() as usize {
        return Err(BtreeError::PageLength {
            pgno,
            len: bytes.len(),
            page_size: geometry.page_size(),
        });
    }
    let usable = geometry.usable();
    let data = bytes.get(..usable as usize).ok_or(BtreeError::PageLength {
        pgno,
        len: bytes.len(),
        page_size: geometry.page_size(),
    })?;
    let hdr = if pgno == 1 { 100 } else { 0 };
    let type_byte = *data.get(hdr).ok_or(BtreeError::PageLength {
        pgno,
        len: bytes.len(),
        page_size: geometry.page_size(),
    })?;
    let kind = PageKind::from_byte(type_byte).ok_or(BtreeError::PageType {
        pgno,
        offset: hdr,
        byte: type_byte,
    })?;
    // usable >= 480, so a 12-byte header at 100 always fits; still, nothing is assumed.
    let header_end = hdr + kind.header_len();
    let short = || BtreeError::CellTruncated {
        pgno,
        offset: hdr,
        field: "page header",
    };
    if header_end > data.len() {
        return Err(short());
    }
    let first_freeblock = be_u16(data, hdr + 1).ok_or_else(short)?;
    let cells = be_u16(data, hdr + 3).ok_or_else(short)?;
    let content_start = match be_u16(data, hdr + 5).ok_or_else(short)? {
        0 => 65536,
        n => u32::from(n),
    };
    let fragmented_bytes = *data.get(hdr + 7).ok_or_else(short)?;
    let right_child = if kind.is_leaf() {
        None
    } else {
        let child = be_u32(data, hdr + 8).ok_or_else(short)?;
        if child == 0 {
            return Err(BtreeError::ZeroPointer {
                pgno,
                offset: hdr + 8,
                field: "right-most child pointer",
            });
        }
        Some(child)
    };

    let pointers_end = header_end + 2 * usize::from(cells);
    if pointers_end > data.len() {
        return Err(BtreeError::CellCount {
            pgno,
            cells,
            end: pointers_end,
            usable,
        });
    }
    if (content_start as usize) < pointers_end || content_start > usable {
        return Err(BtreeError::ContentStart {
            pgno,
            start: content_start,
            min: pointers_end,
            max: usable,
        });
    }
    // SQLite's bounds for a cell's start (btreeInitPage's iCellFirst and iCellLast): after the
    // pointer array, and at least 4 bytes before the end of the usable bytes.
    let last = data.len().saturating_sub(4);
    let mut decoded = Vec::with_capacity(usize::from(cells));
    for index in 0..usize::from(cells) {
        let pointer = usize::from(be_u16(data, header_end + 2 * index).ok_or_else(short)?);
        if pointer < pointers_end || pointer > last {
            return Err(BtreeError::CellPointer {
                pgno,
                index,
                pointer,
                min: pointers_end,
                max: last,
            });
        }
        decoded.push(parse_cell(kind, data, pointer, pgno, geometry)?);
    }
    Ok(Page {
        pgno,
        kind,
        first_freeblock,
        content_start,
        fragmented_bytes,
        right_child,
        cells: decoded,
    })
}
