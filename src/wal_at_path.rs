//! The stale-WAL judgement of what is at a database's path, read-only, for a person asking from
//! outside (`hermes-guard status <db>`): the judgement a guarded open makes, in its order (one
//! sequence, `wal_base/judge.rs`: the recorded pages first, the whole WAL only when they leave it
//! in doubt), from the WAL's record and the main file's pages now, without opening SQLite,
//! without a lock, writing nothing. A writer may be at work meanwhile: the answer is of the
//! moment it was read.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::identity::{identity_of_path, FileId};
use crate::paths::sidecar;
use crate::wal_base::{judge_wal, recorded_page_hash, MainNow, Mismatch, Verdict};

/// What is at a database's path, as the guard's open would judge its WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WalAtPath {
    /// No `-wal` beside the database.
    NoWal,
    /// A `-wal` with no valid frame: SQLite will ignore it.
    NothingToReplay,
    /// A WAL with frames but no record of the database file it was written on (written by
    /// unguarded processes only, or a filesystem without extended attributes): no judgement.
    NoRecord,
    /// A WAL of another generation than the recorded one (an unguarded process restarted it):
    /// no judgement.
    OtherGeneration {
        /// The salts the record names.
        recorded: [u32; 2],
        /// The salts of the WAL at the path.
        found: [u32; 2],
    },
    /// The WAL continues the main file at the path.
    Continues,
    /// The WAL was written on another main file (a restore replaced it): a guarded open sets it
    /// aside (or refuses, by its policy); a stock open would replay it onto the wrong file.
    Stale(Box<Mismatch>),
}

impl WalAtPath {
    /// A short name (`no-wal`, `nothing-to-replay`, `no-record`, `other-generation`,
    /// `continues`, `stale`).
    pub fn name(&self) -> &'static str {
        match self {
            WalAtPath::NoWal => "no-wal",
            WalAtPath::NothingToReplay => "nothing-to-replay",
            WalAtPath::NoRecord => "no-record",
            WalAtPath::OtherGeneration { .. } => "other-generation",
            WalAtPath::Continues => "continues",
            WalAtPath::Stale(_) => "stale",
        }
    }

    /// Whether it needs a person: only a stale WAL does.
    pub fn needs_attention(&self) -> bool {
        matches!(self, WalAtPath::Stale(_))
    }
}

/// Judges the `-wal` beside the database `db` against the main file at `db` now, reading both
/// and writing nothing. An error: `db` or its WAL cannot be read.
pub fn judge_wal_at_path(db: &Path) -> io::Result<WalAtPath> {
    let main = File::open(db)?;
    let wal = match File::open(sidecar(db, "-wal")) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(WalAtPath::NoWal),
        Err(e) => return Err(e),
    };
    let mut now = MainAt {
        db,
        main: &main,
        size: 0,
    };
    Ok(from_verdict(judge_wal(&wal, &mut now)?))
}

/// The main file at `db`, read through a descriptor of its own.
struct MainAt<'a> {
    db: &'a Path,
    main: &'a File,
    /// Its size, taken once before its pages are read.
    size: u64,
}

impl MainNow for MainAt<'_> {
    fn before_pages(&mut self) -> io::Result<()> {
        self.size = self.main.metadata()?.len();
        Ok(())
    }

    fn page_hash(&self, page: u32, page_size: u32) -> Option<String> {
        recorded_page_hash(page, page_size, self.size, |buf, offset| {
            self.main.read_exact_at(buf, offset)
        })
    }

    fn identity(&self) -> io::Result<Option<FileId>> {
        identity_of_path(self.db)
    }
}

fn from_verdict(verdict: Verdict) -> WalAtPath {
    match verdict {
        Verdict::NothingToReplay => WalAtPath::NothingToReplay,
        Verdict::NoRecord => WalAtPath::NoRecord,
        Verdict::OtherGeneration { recorded, found } => {
            WalAtPath::OtherGeneration { recorded, found }
        }
        Verdict::Continues { .. } => WalAtPath::Continues,
        Verdict::Stale(m) => WalAtPath::Stale(m),
    }
}
