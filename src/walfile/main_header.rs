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
    let raw_page_size = be_u16_at(bytes, 16);
    let page_size = if raw_page_size == 1 {
        MAX_PAGE_SIZE
    } else {
        u32::from(raw_page_size)
    };
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
