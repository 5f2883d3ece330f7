//! What one merge works with: the captured generation and the live database, the options, the
//! rule and what the ledger says of earlier merges. The merge's driver (`merge.rs`) and each
//! table's merge (`table/`) share it.

use std::path::Path;

use rusqlite::Connection;

use super::changes::Loaded;
use super::ledger::Generation;
use super::policy::RowPolicy;
use super::report::{MergeOptions, MergeRule};
use super::RecoverError;

/// The schema names of the capture and its image attached to the live connection for the
/// bulk path (see `table::bulk`).
pub(crate) const BULK_CAPTURE: &str = "hermes_guard_capture";
pub(crate) const BULK_IMAGE: &str = "hermes_guard_image";

pub(crate) struct Merge<'a> {
    /// The capture's generation as `main` (and, for a delta rule, its main image as `pre`).
    pub source: &'a Connection,
    pub source_path: &'a Path,
    pub target: &'a Connection,
    pub target_path: &'a Path,
    pub options: &'a MergeOptions,
    pub apply: bool,
    pub rule: MergeRule,
    pub rule_reason: String,
    /// The captured generation, recorded in the live database once its rows are in; `None`:
    /// nothing is recorded (a rebuild's new file).
    pub ledger: Option<Generation>,
    /// When, and from which capture, the ledger says this generation's added rows went in
    /// before (filled by the caller from [`super::ledger::Start`]).
    pub merged_before: Option<(String, String)>,
    /// WAL frames of the generation an earlier merge took, included in `pre` (0: the bare
    /// image; see [`super::ledger::Start`]).
    pub base_frames: u64,
    /// The capture and its image are attached to `target` as [`BULK_CAPTURE`] and
    /// [`BULK_IMAGE`], and the rule inserts added rows uncompared
    /// ([`RowPolicy::bulk_insert`]): they may go in with one `INSERT … SELECT` per table.
    pub bulk: bool,
    /// A `whole` merge after delta merges only of this generation: recorded even when it
    /// inserts nothing (see [`super::ledger::Start::widens_to_whole`]).
    pub widens_to_whole: bool,
    /// [`MergeRule::Changes`]: the generation's computed changes, and how to judge them.
    pub changes: Option<(&'a Loaded, ChangeContext)>,
}

impl Merge<'_> {
    pub(crate) fn sq(
        &self,
        what: impl Into<String>,
    ) -> impl FnOnce(rusqlite::Error) -> RecoverError + '_ {
        let what = what.into();
        move |e| RecoverError::sqlite(self.target_path, what, e)
    }

    /// How the merge's rule reads and judges the rows.
    pub(crate) fn policy(&self) -> RowPolicy {
        self.rule.policy()
    }

    pub(super) fn source_sq(
        &self,
        what: &'static str,
    ) -> impl FnOnce(rusqlite::Error) -> RecoverError + '_ {
        move |e| RecoverError::sqlite(self.source_path, what, e)
    }

    pub(super) fn different(&self, why: String) -> RecoverError {
        RecoverError::DifferentDatabase {
            database: self.target_path.to_path_buf(),
            capture: self.source_path.to_path_buf(),
            why,
        }
    }

    pub(crate) fn write_error(&self, e: rusqlite::Error, table: &str) -> RecoverError {
        if e.sqlite_error()
            .is_some_and(|s| s.extended_code == rusqlite::ffi::SQLITE_READONLY_DBMOVED)
        {
            let why = crate::GuardExt::guard_status(self.target)
                .ok()
                .and_then(|s| s.reason)
                .map_or("its files changed under the connection", |r| r.describe());
            return RecoverError::Retired {
                database: self.target_path.to_path_buf(),
                why: why.to_owned(),
            };
        }
        RecoverError::sqlite(self.target_path, format!("write into {table}"), e)
    }
}

/// What the whole capture says about how its rows are read and judged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChangeContext {
    /// The captured WAL was still at the database's path when the capture was taken (its
    /// `-shm` was lost): the newer generation read the captured commits, so an insert found
    /// live under its rowid with the same content is taken as already there.
    pub shared_wal: bool,
    /// `backfill_at_loss` is recorded. Without it, frames a checkpoint had copied before the
    /// loss read as the generation's changes, so an insert found live under its rowid with
    /// the same content may be the newer generation's copy of it: undecided.
    pub backfill_known: bool,
}
