//! The kind of a B-tree page, from its header's type byte.

use std::fmt;

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
