//! The 100-byte header of a main database file.

use serde::{Deserialize, Serialize};

use super::{be_u16_at, be_u32_at, page_size_ok, MAX_PAGE_SIZE};

/// Size in bytes of the main database file header.
const MAIN_HEADER_SIZE: usize = 100;

/// Magic string at the start of every SQLite database file.
pub(super) const MAIN_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// The decoded fields of interest from the 100-byte main database header.
///
/// Fields are filled in on a best-effort basis even when `valid` is false
/// (fields beyond the end of a short input read as 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MainHeader {
    /// True iff at least 100 bytes were given, the magic is
    /// `"SQLite format 3\0"`, and the page size is a power of two in
    /// `512..=65536`.
    pub valid: bool,
    /// Page size in bytes (the on-disk value 1 means 65536).
    pub page_size: u32,
    /// File format write version (1 = legacy/rollback, 2 = WAL).
    pub write_version: u8,
    /// File format read version (1 = legacy/rollback, 2 = WAL).
    pub read_version: u8,
    /// In-header database size in pages (offset 28).
    pub page_count: u32,
    /// File change counter (offset 24).
    pub change_counter: u32,
    /// True iff both the read and write versions are 2 (WAL mode).
    pub wal_mode: bool,
}

/// Decodes the 100-byte main database header at the start of `bytes`.
///
/// Needs at least 100 bytes; short or invalid input yields `valid: false`
/// with best-effort fields. Never panics.
pub fn parse_main_header(bytes: &[u8]) -> MainHeader {
    let page_size = page_size_field(be_u16_at(bytes, 16));
    let write_version = bytes.get(18).copied().unwrap_or(0);
    let read_version = bytes.get(19).copied().unwrap_or(0);
    let valid = bytes.len() >= MAIN_HEADER_SIZE
        && bytes.get(..MAIN_MAGIC.len()) == Some(&MAIN_MAGIC[..])
        && page_size_ok(page_size);
    MainHeader {
        valid,
        page_size,
        write_version,
        read_version,
        page_count: be_u32_at(bytes, 28),
        change_counter: be_u32_at(bytes, 24),
        wal_mode: write_version == 2 && read_version == 2,
    }
}

/// A 16-bit page-size field as SQLite writes it, in the database header (offset 16, big-endian)
/// and in the wal-index header (`szPage`): 1 means 65536, any other value is the size. The one
/// decoder of that field: a second one once read `00 01` as no page size at all.
pub(crate) fn page_size_field(raw: u16) -> u32 {
    if raw == 1 {
        MAX_PAGE_SIZE
    } else {
        u32::from(raw)
    }
}

/// The page size the database header at the start of `page1` gives, when it is a legal one (a
/// power of two from 512 to 65536).
pub(crate) fn main_header_page_size(page1: &[u8]) -> Option<u32> {
    let raw = page1.get(16..18)?;
    let n = page_size_field(u16::from_be_bytes([raw[0], raw[1]]));
    super::page_size_ok(n).then_some(n)
}

#[cfg(test)]
mod page_size_tests {
    use super::*;

    #[test]
    fn every_legal_page_size_decodes_from_the_header_field_65536_included() {
        for n in (9..=16).map(|k| 1u32 << k) {
            let raw = if n == 65536 { 1u16 } else { n as u16 };
            let mut page1 = vec![0u8; 100];
            page1[16..18].copy_from_slice(&raw.to_be_bytes());
            assert_eq!(main_header_page_size(&page1), Some(n), "{n}");
        }
        assert_eq!(main_header_page_size(&[0u8; 100]), None);
        assert_eq!(main_header_page_size(&[0u8; 17]), None);
    }
}
