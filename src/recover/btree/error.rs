//! The decoder's errors. Every one names where it was found (page number and byte offset in the
//! page, or offset in the record), because the pages come from files that may be damaged or
//! belong to another database: a malformed field is an answer, not a panic.

use super::kind::PageKind;

/// Why page 1's header, a page, a cell, an overflow chain or a tree could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BtreeError {
    /// Page 1 is shorter than the 100-byte database header.
    #[error("page 1 is {len} bytes, shorter than the 100-byte database header")]
    HeaderTooShort {
        /// Bytes given.
        len: usize,
    },

    /// Page 1 does not start with "SQLite format 3\0" (another file, or an encrypted database).
    #[error("page 1 does not start with the SQLite header string: not a plain SQLite database")]
    NotADatabase,

    /// The page size (page 1, offset 16) is not a power of two from 512 to 65536.
    #[error("the page size (page 1, offset 16) is {size}, not a power of two from 512 to 65536")]
    PageSize {
        /// The size (the stored 1 read as 65536).
        size: u32,
    },

    /// The reserved bytes (offset 20) leave fewer than 480 usable bytes per page, which SQLite
    /// never writes.
    #[error(
        "{reserved} reserved bytes per page (offset 20) leave {usable} usable bytes of a \
         {page_size}-byte page; SQLite needs at least 480"
    )]
    UsableSize {
        /// The page size.
        page_size: u32,
        /// The reserved bytes at the end of each page.
        reserved: u8,
        /// What remains.
        usable: u32,
    },

    /// Page number 0 does not exist (pages are numbered from 1).
    #[error("page number 0 does not exist (pages are numbered from 1)")]
    PageNumberZero,

    /// The bytes given for a page are not one page long.
    #[error("page {pgno} is {len} bytes, the database's page size is {page_size}")]
    PageLength {
        /// The page.
        pgno: u32,
        /// Bytes given.
        len: usize,
        /// The database's page size.
        page_size: u32,
    },

    /// The page's type byte is none of the four B-tree page types (an overflow, freelist or
    /// pointer-map page, or damage).
    #[error(
        "page {pgno}: byte {offset} is {byte:#04x}, not a B-tree page type (0x02, 0x05, 0x0a, 0x0d)"
    )]
    PageType {
        /// The page.
        pgno: u32,
        /// Where the type byte is (100 on page 1, else 0).
        offset: usize,
        /// The byte found.
        byte: u8,
    },

    /// The cell pointer array runs past the usable part of the page.
    #[error(
        "page {pgno}: {cells} cells need a cell pointer array ending at byte {end}, past the \
         {usable} usable bytes"
    )]
    CellCount {
        /// The page.
        pgno: u32,
        /// The cell count in the header.
        cells: u16,
        /// Where the pointer array would end.
        end: usize,
        /// The usable bytes of a page.
        usable: u32,
    },

    /// The start of the cell content area lies inside the header or pointer array, or past the
    /// usable bytes.
    #[error("page {pgno}: the cell content area starts at byte {start}, outside {min}..={max}")]
    ContentStart {
        /// The page.
        pgno: u32,
        /// The field's value (0 read as 65536).
        start: u32,
        /// The end of the cell pointer array.
        min: usize,
        /// The usable bytes of a page.
        max: u32,
    },

    /// A cell pointer points into the header, the pointer array, or past the usable bytes.
    #[error("page {pgno}: cell {index} points at byte {pointer}, outside {min}..={max}")]
    CellPointer {
        /// The page.
        pgno: u32,
        /// The cell's index in the pointer array.
        index: usize,
        /// The pointer's value.
        pointer: usize,
        /// The end of the pointer array.
        min: usize,
        /// The last byte a cell may start at (usable size − 4).
        max: usize,
    },

    /// A cell's field runs past the usable bytes of its page.
    #[error("page {pgno}: the cell at byte {offset} is cut off in its {field}")]
    CellTruncated {
        /// The page.
        pgno: u32,
        /// Where the cell starts.
        offset: usize,
        /// The field that does not fit.
        field: &'static str,
    },

    /// A child or overflow page pointer is 0.
    #[error("page {pgno}: the {field} at byte {offset} is page 0")]
    ZeroPointer {
        /// The page.
        pgno: u32,
        /// Where the pointer is.
        offset: usize,
        /// Which pointer.
        field: &'static str,
    },

    /// A cell's payload size is larger than SQLite allows (2^31 − 1 bytes).
    #[error(
        "page {pgno}: the cell at byte {offset} declares {size} bytes of payload, over 2^31 - 1"
    )]
    PayloadTooLarge {
        /// The page.
        pgno: u32,
        /// Where the cell starts.
        offset: usize,
        /// The size declared.
        size: u64,
    },

    /// A page of a cell's overflow chain is not among the pages given.
    #[error(
        "page {pgno}: the overflow chain of the cell at byte {offset} needs page {overflow}, \
         which is not available"
    )]
    OverflowMissing {
        /// The cell's page.
        pgno: u32,
        /// Where the cell starts.
        offset: usize,
        /// The overflow page wanted.
        overflow: u32,
    },

    /// A cell's overflow chain comes back to a page it already went through.
    #[error(
        "page {pgno}: the overflow chain of the cell at byte {offset} loops back to page \
         {overflow}"
    )]
    OverflowLoop {
        /// The cell's page.
        pgno: u32,
        /// Where the cell starts.
        offset: usize,
        /// The page met twice.
        overflow: u32,
    },

    /// A cell's overflow chain ends (next pointer 0) before the payload is complete.
    #[error(
        "page {pgno}: the overflow chain of the cell at byte {offset} ends at page {overflow} \
         with {missing} bytes of payload still to read"
    )]
    OverflowShort {
        /// The cell's page.
        pgno: u32,
        /// Where the cell starts.
        offset: usize,
        /// The chain's last page.
        overflow: u32,
        /// Payload bytes not found.
        missing: u64,
    },

    /// A page of a tree is not among the pages given.
    #[error("the tree rooted at page {root} needs page {pgno}, which is not available")]
    TreePageMissing {
        /// The tree's root page.
        root: u32,
        /// The page wanted.
        pgno: u32,
    },

    /// A tree reaches the same page twice.
    #[error("the tree rooted at page {root} reaches page {pgno} twice")]
    TreeLoop {
        /// The tree's root page.
        root: u32,
        /// The page met twice.
        pgno: u32,
    },

    /// A tree is deeper than SQLite's cursors can go (20 levels).
    #[error("the tree rooted at page {root} is deeper than 20 levels at page {pgno}")]
    TreeTooDeep {
        /// The tree's root page.
        root: u32,
        /// The page too deep.
        pgno: u32,
    },

    /// A table tree reaches an index page or the other way round.
    #[error(
        "the tree rooted at page {root} is a {expected} tree, but page {pgno} is a {found} page"
    )]
    TreeKind {
        /// The tree's root page.
        root: u32,
        /// The page of the wrong kind.
        pgno: u32,
        /// "table" or "index".
        expected: &'static str,
        /// The kind found.
        found: PageKind,
    },

    /// A cell's payload is not a well-formed record.
    #[error("page {pgno}: the record of the cell at byte {offset}: {source}")]
    Record {
        /// The cell's page.
        pgno: u32,
        /// Where the cell starts.
        offset: usize,
        /// What is wrong with the record.
        source: RecordError,
    },
}

/// Why a payload is not a well-formed record. Offsets are from the start of the record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RecordError {
    /// The record is empty or its header-size varint is cut off.
    #[error("the header size is missing or cut off")]
    HeaderSizeTruncated,

    /// The header size is smaller than its own varint or larger than the record.
    #[error("the header size is {size}, the record is {len} bytes and the varint takes {varint}")]
    HeaderSize {
        /// The declared header size.
        size: u64,
        /// The record's length.
        len: usize,
        /// Bytes taken by the header-size varint.
        varint: usize,
    },

    /// A serial type's varint runs past the header's end.
    #[error("the serial type at byte {offset} runs past the header's end ({header})")]
    SerialTypeTruncated {
        /// Where the varint starts.
        offset: usize,
        /// The header's size.
        header: usize,
    },

    /// Serial types 10 and 11 are reserved and never written to a file.
    #[error("column {column} has the reserved serial type {serial_type}")]
    ReservedSerialType {
        /// The column's index.
        column: usize,
        /// The serial type.
        serial_type: u64,
    },

    /// A column's value runs past the end of the record.
    #[error("column {column} needs {need} bytes at byte {offset}, the record is {len} bytes")]
    BodyTruncated {
        /// The column's index.
        column: usize,
        /// Bytes its serial type needs.
        need: u64,
        /// Where its value starts.
        offset: usize,
        /// The record's length.
        len: usize,
    },

    /// Bytes follow the last column's value (SQLite never writes them).
    #[error("the values end at byte {end}, the record is {len} bytes")]
    TrailingBytes {
        /// Where the last value ends.
        end: usize,
        /// The record's length.
        len: usize,
    },
}
