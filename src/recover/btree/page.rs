//! One B-tree page: its header (the type, the first freeblock, the cell count, the start of the
//! cell content area, the fragmented bytes and, on interior pages, the right-most child), its cell
//! pointer array and its cells. The header starts at byte 100 on page 1 (after the database
//! header), at byte 0 elsewhere; cell pointers are offsets from the start of the page either way.
//! Only the usable part of the page (page size − reserved bytes) is ever read.

use super::bigendian::{be_u16, be_u32};
use super::cell::{parse_cell, Cell};
use super::kind::PageKind;
use super::{BtreeError, DbGeometry};

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

/// Decodes page `pgno` of a database of this geometry from its bytes (exactly one page). Every
/// field is checked before it is used; malformed bytes give an error, never a panic.
pub(crate) fn decode_page<'a>(
    bytes: &'a [u8],
    pgno: u32,
    geometry: &DbGeometry,
) -> Result<Page<'a>, BtreeError> {
    let data = usable_part(bytes, pgno, geometry)?;
    let header = Header::read(data, pgno, bytes.len(), geometry)?;
    let pointers_end = header.check_layout(data, pgno, geometry.usable())?;
    let cells = read_cells(data, pgno, &header, pointers_end, geometry)?;
    Ok(Page {
        pgno,
        kind: header.kind,
        first_freeblock: header.first_freeblock,
        content_start: header.content_start,
        fragmented_bytes: header.fragmented_bytes,
        right_child: header.right_child,
        cells,
    })
}

/// The usable part of a page's bytes (page size − reserved bytes), once the page number and the
/// length are checked.
fn usable_part<'a>(
    bytes: &'a [u8],
    pgno: u32,
    geometry: &DbGeometry,
) -> Result<&'a [u8], BtreeError> {
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
    bytes
        .get(..geometry.usable() as usize)
        .ok_or(BtreeError::PageLength {
            pgno,
            len: bytes.len(),
            page_size: geometry.page_size(),
        })
}

/// A page's header, as read from its usable bytes.
struct Header {
    /// Where the header starts: 100 on page 1, 0 elsewhere.
    at: usize,
    kind: PageKind,
    first_freeblock: u16,
    cells: u16,
    content_start: u32,
    fragmented_bytes: u8,
    right_child: Option<u32>,
}

impl Header {
    /// The header of page `pgno` in `data` (its usable bytes; `page_len` the whole page's length).
    fn read(
        data: &[u8],
        pgno: u32,
        page_len: usize,
        geometry: &DbGeometry,
    ) -> Result<Header, BtreeError> {
        let hdr = if pgno == 1 { 100 } else { 0 };
        let type_byte = *data.get(hdr).ok_or(BtreeError::PageLength {
            pgno,
            len: page_len,
            page_size: geometry.page_size(),
        })?;
        let kind = PageKind::from_byte(type_byte).ok_or(BtreeError::PageType {
            pgno,
            offset: hdr,
            byte: type_byte,
        })?;
        // usable >= 480, so a 12-byte header at 100 always fits; still, nothing is assumed.
        let short = || short_header(pgno, hdr);
        if hdr + kind.header_len() > data.len() {
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
        Ok(Header {
            at: hdr,
            kind,
            first_freeblock,
            cells,
            content_start,
            fragmented_bytes,
            right_child,
        })
    }

    /// Where the header ends and the cell pointer array starts.
    fn end(&self) -> usize {
        self.at + self.kind.header_len()
    }

    /// Checks that the cell pointer array and the content area fit the usable bytes; returns
    /// where the pointer array ends.
    fn check_layout(&self, data: &[u8], pgno: u32, usable: u32) -> Result<usize, BtreeError> {
        let pointers_end = self.end() + 2 * usize::from(self.cells);
        if pointers_end > data.len() {
            return Err(BtreeError::CellCount {
                pgno,
                cells: self.cells,
                end: pointers_end,
                usable,
            });
        }
        if (self.content_start as usize) < pointers_end || self.content_start > usable {
            return Err(BtreeError::ContentStart {
                pgno,
                start: self.content_start,
                min: pointers_end,
                max: usable,
            });
        }
        Ok(pointers_end)
    }
}

/// The header cut short at `hdr`.
fn short_header(pgno: u32, hdr: usize) -> BtreeError {
    BtreeError::CellTruncated {
        pgno,
        offset: hdr,
        field: "page header",
    }
}

/// The cells the pointer array (ending at `pointers_end`) points at, in its order.
fn read_cells<'a>(
    data: &'a [u8],
    pgno: u32,
    header: &Header,
    pointers_end: usize,
    geometry: &DbGeometry,
) -> Result<Vec<Cell<'a>>, BtreeError> {
    // SQLite's bounds for a cell's start (btreeInitPage's iCellFirst and iCellLast): after the
    // pointer array, and at least 4 bytes before the end of the usable bytes.
    let last = data.len().saturating_sub(4);
    let mut decoded = Vec::with_capacity(usize::from(header.cells));
    for index in 0..usize::from(header.cells) {
        let pointer = usize::from(
            be_u16(data, header.end() + 2 * index).ok_or_else(|| short_header(pgno, header.at))?,
        );
        if pointer < pointers_end || pointer > last {
            return Err(BtreeError::CellPointer {
                pgno,
                index,
                pointer,
                min: pointers_end,
                max: last,
            });
        }
        decoded.push(parse_cell(header.kind, data, pointer, pgno, geometry)?);
    }
    Ok(decoded)
}
