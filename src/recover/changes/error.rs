//! Why a generation's pages could not be gathered. Once they are, nothing else is an error: a
//! page that does not decode or a tree that cannot be walked is a note, and its rows undecided.

use std::path::PathBuf;

use crate::recover::btree::BtreeError;

/// Why [`super::GenerationPages`] could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangesError {
    /// The WAL's header is not one SQLite accepts: it carries no frame.
    #[error(
        "the WAL header is not valid (magic, version, page size or checksum): no frame can be read"
    )]
    WalHeader,

    /// The WAL has no commit frame: the generation committed nothing.
    #[error("the WAL holds no committed transaction ({frames} valid frames, none a commit)")]
    NoCommit {
        /// Valid frames.
        frames: u64,
    },

    /// The kept base pages are of another page size than the WAL's.
    #[error("the base pages are of {base}-byte pages, the WAL of {wal}-byte pages")]
    PageSize {
        /// The WAL header's page size.
        wal: u32,
        /// The base file's.
        base: u32,
    },

    /// The kept base pages belong to another generation (other salts).
    #[error(
        "the base pages are of the generation with salts {base:08x?}, the WAL's are {wal:08x?}"
    )]
    Salts {
        /// The WAL header's salts.
        wal: [u32; 2],
        /// The base file's.
        base: [u32; 2],
    },

    /// A kept base page is not one page long.
    #[error("kept base page {pgno} is {len} bytes, not the page size {page_size}")]
    BasePageLength {
        /// The page.
        pgno: u32,
        /// Its length.
        len: usize,
        /// The page size.
        page_size: u32,
    },

    /// No version of page 1 (final or base) gives the database's geometry.
    #[error("page 1 (final or base version) gives no database geometry: {source}")]
    Geometry {
        /// What is wrong with page 1's header.
        #[source]
        source: BtreeError,
    },

    /// The geometry in page 1 disagrees with the WAL's page size.
    #[error("page 1 says {page1}-byte pages, the WAL {wal}-byte pages")]
    GeometryPageSize {
        /// Page 1's page size.
        page1: u32,
        /// The WAL header's.
        wal: u32,
    },

    /// A capture's file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// A capture's manifest could not be read or is not a capture's.
    #[error("the capture's manifest: {0}")]
    Manifest(#[from] crate::recover::RecoverError),

    /// A capture's `<file>-base` is not a base file.
    #[error("{path} is not a readable base file: {source}")]
    BaseFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: crate::capture::BaseFileError,
    },
}
