//! The row changes of one retired WAL generation, computed from pages alone: the final version
//! of each page the generation wrote (its last frame at or before the last commit) and the base
//! of each (what the page was when the newer generation started from it), decoded with
//! [`super::btree`]. Per table: the rows the generation inserted, updated (old and new row) and
//! deleted, and the rows it may have changed that cannot be decided from what is known.
//!
//! No row is ever read through a page the WAL does not carry: the capture's main image (the
//! newer generation's file) is consulted only to find which tree a page hangs under, never for
//! rows (docs/plans/recovery-from-changes.md, §3, "Rejected: a base database").
//!
//! - [`pages`]: the inputs, [`GenerationPages`], from a WAL's bytes and the kept base pages, or
//!   from a capture directory; the freelists.
//! - [`schema`]: the tables and indexes of the generation, from its `sqlite_schema` pages.
//! - [`attribution`]: which tree each version (final, base) of each page belongs to.
//! - [`compute`]: the rows of each table's base and final pages, and their differences.
//!
//! Values are stored values (`btree`'s notes), with one substitution made here because the
//! schema says it: an `INTEGER PRIMARY KEY` column, stored as NULL, holds the rowid, as `SELECT`
//! shows it. Left as stored, for the applier to map: a REAL-affinity column's integral value
//! stored as an integer, columns missing from rows written before an `ALTER TABLE … ADD
//! COLUMN`, and text in a UTF-16 database's encoding.

mod attribution;
mod compute;
mod error;
mod pages;
mod report;
mod schema;

#[cfg(test)]
mod capture_tests;
#[cfg(test)]
mod guarded_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub(crate) use compute::compute;
pub(crate) use error::ChangesError;
pub(crate) use pages::GenerationPages;
#[cfg(test)]
pub(crate) use pages::{freelist, Base};
pub use report::{
    generation_changes, ChangeCounts, ChangedRow, GenerationChangesReport, ShownValue,
    TableChangesReport, UndecidedRow, UpdatedRow,
};
pub(crate) use report::{load, Loaded};

use crate::recover::value::Val;

/// A row as one version of a page holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RowChange {
    /// The rowid, for a rowid table; `None` for a `WITHOUT ROWID` table.
    pub(crate) rowid: Option<i64>,
    /// The row's values in the record's order (for a `WITHOUT ROWID` table: the primary key's
    /// columns first, then the others), as stored, except that an `INTEGER PRIMARY KEY` column
    /// holds the rowid. Empty when the record could not be read (an undecided row).
    pub(crate) values: Vec<Val>,
}

/// What the generation did to one table's rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct TableChanges {
    /// The table's name, as `sqlite_schema` has it.
    pub(crate) name: String,
    /// Its root page.
    pub(crate) root: u32,
    /// A `WITHOUT ROWID` table (rows keyed by their primary key, not a rowid).
    pub(crate) without_rowid: bool,
    /// Rows in the final pages that the base pages lack.
    pub(crate) inserts: Vec<RowChange>,
    /// Rows in both, with other values: (old, as the base holds it; new, as the final pages do).
    pub(crate) updates: Vec<(RowChange, RowChange)>,
    /// Rows in the base pages that the final pages lack.
    pub(crate) deletes: Vec<RowChange>,
    /// Rows the generation may have changed whose change cannot be decided, and why.
    pub(crate) undecided: Vec<(RowChange, String)>,
    /// Pages of the table whose base rows are not known: final pages whose base is unknown or
    /// could not be attributed, and pages the generation freed without writing whose base was
    /// not given. Their base rows are in no set, so an update or delete of one of them is not
    /// seen at all (and the table's inserts are undecided: a row moved from such a page would
    /// look like one). The table's changes are complete only when this is empty.
    pub(crate) unknown_base_pages: Vec<u32>,
}

impl TableChanges {
    /// No change of any kind.
    pub(crate) fn is_empty(&self) -> bool {
        self.inserts.is_empty()
            && self.updates.is_empty()
            && self.deletes.is_empty()
            && self.undecided.is_empty()
            && self.unknown_base_pages.is_empty()
    }
}

/// The row changes of one generation.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct GenerationChanges {
    /// One entry per table with a change or an undecided row, in root-page order.
    pub(crate) tables: Vec<TableChanges>,
    /// Pages (carried or freed) holding rows in their final or base version that no tree could
    /// be found for: their rows are in no table's changes, so any change on them is undecided.
    pub(crate) unattributed_pages: Vec<u32>,
    /// What was found along the way that a person should know (pages that did not decode,
    /// schema objects that could not be read, trees that could not be walked).
    pub(crate) notes: Vec<String>,
}

impl GenerationChanges {
    /// The changes of the table `name`, if it has any.
    #[cfg(test)]
    pub(crate) fn table(&self, name: &str) -> Option<&TableChanges> {
        self.tables.iter().find(|t| t.name == name)
    }
}
