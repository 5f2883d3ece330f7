//! The WAL-base record and a stale WAL's mismatch, as data: what a guarded writer records on
//! its WAL inode, and what a capture's manifest keeps (`stale_wal`) when a WAL was found beside
//! a main file it was not written on. Encoding the record and judging by it is `wal_base`'s.

use serde::{Deserialize, Serialize};

use crate::identity::FileId;

/// One recorded page of the main file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PageHash {
    /// 1-based page number.
    pub page: u32,
    /// [`crate::wal_base::page_hash`] of its first [`crate::wal_base::fragment_len`] bytes, hex.
    pub hash: String,
}

/// What a guarded writer records on its WAL when a generation starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WalBaseRecord {
    /// Format version: 1.
    pub v: u32,
    /// The generation's salts (`salt-1`, `salt-2` as the WAL header stores them, big-endian).
    pub salts: [u32; 2],
    /// The page size.
    pub page_size: u32,
    /// The main file the writer had open.
    pub main: Option<FileId>,
    /// Its first pages (fewer when the file is shorter).
    pub pages: Vec<PageHash>,
}

/// What did not match (`stale_wal` in the manifest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Mismatch {
    /// The record the WAL carries.
    pub recorded: WalBaseRecord,
    /// The salts of the WAL found at the path.
    pub wal_salts: [u32; 2],
    /// The main file now at the path.
    pub main_now: Option<FileId>,
    /// The first recorded page that is neither the recorded content nor one of the WAL's frames.
    pub page: u32,
    /// Its hash now (`None`: beyond the end of the file).
    pub page_hash_now: Option<String>,
    /// Frames of that page in the WAL it was compared with.
    pub page_frames_in_wal: usize,
    /// For a person.
    pub detail: String,
}
