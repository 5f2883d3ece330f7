//! `<file>-base`: the base of the pages a captured WAL generation carries — each page as the main
//! file held it before the generation's first frame of it (kept by the guard at that frame,
//! `vfs/state/base_pages.rs`) — so that recovery can tell the generation's own changes from a
//! newer generation's (docs/plans/recovery-from-changes.md).
//!
//! The format (docs/capture-format.md, "`<file>-base`"), all integers little-endian:
//!
//! ```text
//! "hgbp" 0x01                      magic and format version
//! u32 page_size, u32 salt-1, u32 salt-2, u32 pages_at_start, u32 count
//! count × { u32 pgno, u8 flags, page_size bytes }   sorted by pgno; flags 1: freed in the
//!                                                    generation without being written
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};

use serde::{Deserialize, Serialize};

/// The magic at the start of a base file, with its format version.
const MAGIC: &[u8; 5] = b"hgbp\x01";
const HEADER: usize = MAGIC.len() + 5 * 4;

/// The kept pages of one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasePages {
    /// The WAL salts of the generation, as its frames carry them.
    pub salts: [u32; 2],
    /// The database's page size.
    pub page_size: u32,
    /// The main file's size in pages when the guard began keeping pages for the generation in
    /// the capturing process: a page beyond it was new in the generation (its base: absent).
    pub pages_at_start: u32,
    /// Each kept page, by page number.
    pub pages: BTreeMap<u32, Box<[u8]>>,
    /// Those of them the generation freed without writing them (a freelist leaf: SQLite does not
    /// write it), whose rows the generation deleted.
    pub freed: BTreeSet<u32>,
    /// Pages whose first frame came after the cap was reached, or whose read failed: not kept.
    pub over_cap: u64,
}

/// The manifest's `base_pages`: the base file beside the WAL, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BasePagesEntry {
    /// The file in the capture (`<file>-base`).
    pub file: String,
    /// Its size.
    pub bytes: u64,
    /// Its sha256, hex.
    pub sha256: String,
    /// The database's page size.
    pub page_size: u32,
    /// The WAL salts of the generation the pages are the base of (the WAL header's).
    pub salts: [u32; 2],
    /// The main file's size in pages when the keeping began.
    pub pages_at_start: u32,
    /// Pages kept.
    pub kept: u64,
    /// Pages the generation wrote first in this process whose base is not kept (the cap, or a
    /// failed read): their rows cannot be told apart by their base.
    pub over_cap: u64,
}

/// Writes `pages` in the base file format.
pub(crate) fn write(out: &mut impl Write, pages: &BasePages) -> io::Result<()> {
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    let count = u32::try_from(pages.pages.len()).map_err(io::Error::other)?;
    for word in [
        pages.page_size,
        pages.salts[0],
        pages.salts[1],
        pages.pages_at_start,
        count,
    ] {
        header.extend_from_slice(&word.to_le_bytes());
    }
    out.write_all(&header)?;
    for (pgno, page) in &pages.pages {
        if page.len() != pages.page_size as usize {
            return Err(io::Error::other(format!(
                "kept page {pgno} is {} bytes, not the page size {}",
                page.len(),
                pages.page_size
            )));
        }
        out.write_all(&pgno.to_le_bytes())?;
        out.write_all(&[u8::from(pages.freed.contains(pgno))])?;
        out.write_all(page)?;
    }
    Ok(())
}

/// Why bytes are not a base file: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BaseFileError {
    /// The file does not start with the magic and format version.
    #[error("not a hermes-guard base file (its magic is not hgbp, version 1)")]
    Magic,
    /// The file ends inside its header.
    #[error("the header is cut short at {len} bytes")]
    HeaderCut {
        /// The file's length.
        len: usize,
    },
    /// The header's page size is not a power of two from 512 to 65536.
    #[error("page size {page_size} is not one SQLite uses")]
    PageSize {
        /// The header's page size.
        page_size: u32,
    },
    /// The bytes after the header are not the header's count of pages.
    #[error(
        "{count} pages of {page_size} bytes need {need} bytes after the header; the file has {has}"
    )]
    Length {
        /// The header's count of pages.
        count: u32,
        /// The header's page size.
        page_size: u32,
        /// The bytes those pages need.
        need: usize,
        /// The bytes there are.
        has: usize,
    },
    /// A page's number is not above the one before it.
    #[error("page {pgno} is out of order (after page {last})")]
    OutOfOrder {
        /// The page.
        pgno: u32,
        /// The page before it.
        last: u32,
    },
    /// A page's flags are neither 0 nor 1.
    #[error("page {pgno} has unknown flags {flags}")]
    Flags {
        /// The page.
        pgno: u32,
        /// Its flags.
        flags: u8,
    },
}

/// Reads a base file's bytes; the error says what is wrong and where.
pub fn read(bytes: &[u8]) -> Result<BasePages, BaseFileError> {
    let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err(BaseFileError::Magic);
    };
    let word = |i: usize| -> Result<u32, BaseFileError> {
        rest.get(i * 4..i * 4 + 4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .ok_or(BaseFileError::HeaderCut { len: bytes.len() })
    };
    let (page_size, salts, pages_at_start, count) =
        (word(0)?, [word(1)?, word(2)?], word(3)?, word(4)?);
    if !(512..=65_536).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(BaseFileError::PageSize { page_size });
    }
    let record = 5 + page_size as usize;
    let body = &bytes[HEADER..];
    if body.len() != record * count as usize {
        return Err(BaseFileError::Length {
            count,
            page_size,
            need: record * count as usize,
            has: body.len(),
        });
    }
    let mut pages = BTreeMap::new();
    let mut freed = BTreeSet::new();
    let mut last = 0u32;
    for r in body.chunks_exact(record) {
        let pgno = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
        if pgno <= last {
            return Err(BaseFileError::OutOfOrder { pgno, last });
        }
        last = pgno;
        match r[4] {
            0 => {}
            1 => {
                freed.insert(pgno);
            }
            flags => return Err(BaseFileError::Flags { pgno, flags }),
        }
        pages.insert(pgno, r[5..].to_vec().into_boxed_slice());
    }
    Ok(BasePages {
        salts,
        page_size,
        pages_at_start,
        pages,
        freed,
        over_cap: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BasePages {
        let mut pages = BTreeMap::new();
        pages.insert(2, vec![2u8; 512].into_boxed_slice());
        pages.insert(7, vec![7u8; 512].into_boxed_slice());
        BasePages {
            salts: [11, 12],
            page_size: 512,
            pages_at_start: 9,
            pages,
            freed: BTreeSet::from([7]),
            over_cap: 0,
        }
    }

    #[test]
    fn a_written_base_file_reads_back_the_same_pages() {
        let mut bytes = Vec::new();
        write(&mut bytes, &sample()).unwrap();
        assert_eq!(bytes.len(), HEADER + 2 * (5 + 512));
        assert_eq!(read(&bytes).unwrap(), sample());
    }

    #[test]
    fn a_cut_or_foreign_file_is_refused_with_a_reason() {
        let mut bytes = Vec::new();
        write(&mut bytes, &sample()).unwrap();
        let cut = read(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(matches!(cut, BaseFileError::Length { count: 2, .. }));
        assert!(cut.to_string().contains("need"));
        let foreign = read(b"SQLite format 3\0").unwrap_err();
        assert_eq!(foreign, BaseFileError::Magic);
        assert!(foreign.to_string().contains("magic"));
        let short = read(&bytes[..10]).unwrap_err();
        assert_eq!(short, BaseFileError::HeaderCut { len: 10 });
        assert!(short.to_string().contains("cut short"));
    }

    #[test]
    fn a_page_of_the_wrong_size_is_not_written() {
        let mut pages = sample();
        pages.pages.insert(3, vec![0u8; 100].into_boxed_slice());
        assert!(write(&mut Vec::new(), &pages).is_err());
    }
}
