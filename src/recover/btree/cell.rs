//! The cells of the four page types, and payloads that spill to overflow pages.
//!
//! - table leaf: payload size (varint), rowid (varint), the local payload, and the first overflow
//!   page (u32) if the payload does not fit;
//! - table interior: left child (u32), rowid (varint); no payload;
//! - index leaf: payload size, local payload, first overflow page if any;
//! - index interior: left child, then as an index leaf.
//!
//! How much of a payload of P bytes stays on the page is SQLite's rule (btreePayloadToLocal):
//! all of it if P ≤ maxLocal; else surplus = minLocal + (P − minLocal) mod (usable − 4), kept
//! if surplus ≤ maxLocal, minLocal otherwise. Table leaves use maxLeaf = usable − 35; index
//! pages maxLocal = (usable − 12)·64/255 − 23; both minLocal = (usable − 12)·32/255 − 23.
//! Each overflow page holds a 4-byte next-page pointer and usable − 4 bytes of payload.

use std::borrow::Cow;
use std::collections::HashSet;

use super::bigendian::be_u32;
use super::kind::PageKind;
use super::varint::read_varint;
use super::{BtreeError, DbGeometry};

/// SQLite's largest payload (`SQLITE_MAX_LENGTH`'s hard limit).
const MAX_PAYLOAD: u64 = i32::MAX as u64;

/// A cell of a B-tree page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell<'a> {
    /// A row of a table: its rowid and its record.
    TableLeaf {
        /// The rowid (the varint's 64 bits as a signed integer).
        rowid: i64,
        /// The record.
        payload: Payload<'a>,
    },
    /// A divider of a table tree: the keys ≤ `rowid` are under `left_child`.
    TableInterior {
        /// The child page holding the smaller keys.
        left_child: u32,
        /// The largest rowid under `left_child`.
        rowid: i64,
    },
    /// A key of an index or `WITHOUT ROWID` tree (a whole record).
    IndexLeaf {
        /// The key's record.
        payload: Payload<'a>,
    },
    /// A key of an index or `WITHOUT ROWID` tree that also divides it: the keys under
    /// `left_child` sort before it. It is an entry of the tree, not a copy of a leaf's.
    IndexInterior {
        /// The child page holding the smaller keys.
        left_child: u32,
        /// The key's record.
        payload: Payload<'a>,
    },
}

impl<'a> Cell<'a> {
    /// The cell's payload, if its kind has one.
    pub(crate) fn payload(&self) -> Option<&Payload<'a>> {
        match self {
            Cell::TableLeaf { payload, .. }
            | Cell::IndexLeaf { payload }
            | Cell::IndexInterior { payload, .. } => Some(payload),
            Cell::TableInterior { .. } => None,
        }
    }

    /// The cell's left child, on interior pages.
    pub(crate) fn left_child(&self) -> Option<u32> {
        match self {
            Cell::TableInterior { left_child, .. } | Cell::IndexInterior { left_child, .. } => {
                Some(*left_child)
            }
            Cell::TableLeaf { .. } | Cell::IndexLeaf { .. } => None,
        }
    }
}

/// A cell's payload: the bytes on its page and, if it is longer, where the rest starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Payload<'a> {
    /// The page the cell is on (for errors).
    pub(crate) pgno: u32,
    /// Where the cell starts in its page (for errors).
    pub(crate) cell_offset: usize,
    /// The whole payload's size.
    pub(crate) total: u32,
    /// The part stored in the cell.
    pub(crate) local: &'a [u8],
    /// The first overflow page, when `local` is shorter than `total`.
    pub(crate) first_overflow: Option<u32>,
}

/// How many of a `total`-byte payload's bytes a cell on a page of this kind keeps locally.
pub(crate) fn local_size(kind: PageKind, total: u64, geometry: &DbGeometry) -> u64 {
    // At least 480 (`DbGeometry`'s invariant), so none of these subtractions wraps.
    let usable = u64::from(geometry.usable());
    let min_local = (usable - 12) * 32 / 255 - 23;
    let max_local = if kind == PageKind::LeafTable {
        usable - 35
    } else {
        (usable - 12) * 64 / 255 - 23
    };
    if total <= max_local {
        return total;
    }
    let surplus = min_local + (total - min_local) % (usable - 4);
    if surplus <= max_local {
        surplus
    } else {
        min_local
    }
}

/// Parses the cell at `offset` of page `pgno`, whose usable bytes are `data`.
pub(crate) fn parse_cell<'a>(
    kind: PageKind,
    data: &'a [u8],
    offset: usize,
    pgno: u32,
    geometry: &DbGeometry,
) -> Result<Cell<'a>, BtreeError> {
    let cut = |field| BtreeError::CellTruncated {
        pgno,
        offset,
        field,
    };
    let mut at = offset;
    let left_child = if kind.is_leaf() {
        None
    } else {
        let child = be_u32(data, at).ok_or_else(|| cut("left child pointer"))?;
        if child == 0 {
            return Err(BtreeError::ZeroPointer {
                pgno,
                offset: at,
                field: "left child pointer",
            });
        }
        at += 4;
        Some(child)
    };
    let mut varint = |field| -> Result<u64, BtreeError> {
        let (value, len) = data
            .get(at..)
            .and_then(read_varint)
            .ok_or_else(|| cut(field))?;
        at += len;
        Ok(value)
    };
    if let (PageKind::InteriorTable, Some(left_child)) = (kind, left_child) {
        let rowid = varint("rowid")? as i64;
        return Ok(Cell::TableInterior { left_child, rowid });
    }
    let total = varint("payload size")?;
    let rowid = if kind == PageKind::LeafTable {
        Some(varint("rowid")? as i64)
    } else {
        None
    };
    if total > MAX_PAYLOAD {
        return Err(BtreeError::PayloadTooLarge {
            pgno,
            offset,
            size: total,
        });
    }
    let local_len = local_size(kind, total, geometry) as usize;
    let local_end = at.checked_add(local_len).ok_or_else(|| cut("payload"))?;
    let local = data.get(at..local_end).ok_or_else(|| cut("payload"))?;
    let first_overflow = if (local_len as u64) < total {
        let page = be_u32(data, local_end).ok_or_else(|| cut("first overflow page"))?;
        if page == 0 {
            return Err(BtreeError::ZeroPointer {
                pgno,
                offset: local_end,
                field: "first overflow page",
            });
        }
        Some(page)
    } else {
        None
    };
    let payload = Payload {
        pgno,
        cell_offset: offset,
        total: total as u32,
        local,
        first_overflow,
    };
    // Only table leaves have a rowid here, only interior index pages a left child.
    Ok(match (rowid, left_child) {
        (Some(rowid), _) => Cell::TableLeaf { rowid, payload },
        (None, Some(left_child)) => Cell::IndexInterior {
            left_child,
            payload,
        },
        (None, None) => Cell::IndexLeaf { payload },
    })
}

impl<'a> Payload<'a> {
    /// The whole payload: the local bytes, then the overflow chain read through `page` (a
    /// page's bytes by number, `None` if it is not available). Borrowed when it has no overflow.
    pub(crate) fn assemble<'p>(
        &self,
        geometry: &DbGeometry,
        page: impl Fn(u32) -> Option<&'p [u8]>,
    ) -> Result<Cow<'a, [u8]>, BtreeError> {
        self.assemble_noting(geometry, page, &mut Vec::new())
    }

    /// As [`Payload::assemble`], also appending the overflow pages read to `chain`.
    pub(crate) fn assemble_noting<'p>(
        &self,
        geometry: &DbGeometry,
        page: impl Fn(u32) -> Option<&'p [u8]>,
        chain: &mut Vec<u32>,
    ) -> Result<Cow<'a, [u8]>, BtreeError> {
        let Some(first) = self.first_overflow else {
            return Ok(Cow::Borrowed(self.local));
        };
        let total = u64::from(self.total);
        let per_page = geometry.usable() as usize - 4;
        // Grows with the pages actually found, so a damaged size allocates nothing up front.
        let mut out = Vec::with_capacity(self.local.len() + per_page);
        out.extend_from_slice(self.local);
        let mut seen = HashSet::new();
        let mut next = first;
        loop {
            if !seen.insert(next) {
                return Err(BtreeError::OverflowLoop {
                    pgno: self.pgno,
                    offset: self.cell_offset,
                    overflow: next,
                });
            }
            let missing = || BtreeError::OverflowMissing {
                pgno: self.pgno,
                offset: self.cell_offset,
                overflow: next,
            };
            let bytes = page(next).ok_or_else(missing)?;
            if bytes.len() != geometry.page_size() as usize {
                return Err(BtreeError::PageLength {
                    pgno: next,
                    len: bytes.len(),
                    page_size: geometry.page_size(),
                });
            }
            chain.push(next);
            let remaining = total.saturating_sub(out.len() as u64);
            let take = per_page.min(remaining as usize);
            let content = bytes.get(4..4 + take).ok_or_else(missing)?;
            out.extend_from_slice(content);
            if out.len() as u64 >= total {
                // The last page's next pointer is not read: the size says where the chain ends.
                return Ok(Cow::Owned(out));
            }
            let after = be_u32(bytes, 0).ok_or_else(missing)?;
            if after == 0 {
                return Err(BtreeError::OverflowShort {
                    pgno: self.pgno,
                    offset: self.cell_offset,
                    overflow: next,
                    missing: total.saturating_sub(out.len() as u64),
                });
            }
            next = after;
        }
    }
}
