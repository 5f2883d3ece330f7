//! What each merge rule does with the captured rows, written once per rule: the merge's steps
//! ask the rule's [`RowPolicy`], never the rule itself.

use super::report::MergeRule;

/// Where a rule reads the captured generation's rows from, and what it judges them against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowSource {
    /// The delta: the captured generation (`main`) against its main image (`pre`, the image
    /// plus the WAL prefix an earlier merge took): its added, changed and deleted rows.
    Delta,
    /// Every row of the captured generation, with no image; after an earlier merge of a WAL
    /// prefix, the rows as that prefix left them (`pre`) are left out. Nothing is deleted.
    Whole,
    /// The generation's own inserts, updates and deletes, computed from the pages its WAL
    /// carries and their kept bases (`recover::changes`); the image gives its schema only.
    Changes,
}

/// How one rule reads and judges the captured rows ([`MergeRule::policy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowPolicy {
    /// Where the rows come from.
    pub rows: RowSource,
    /// An added row found live under its own rowid (or key) with the same content is taken as
    /// already there.
    pub compare_added: bool,
    /// Changes and deletions are never applied and no live row is overwritten, whatever the
    /// conflict policy: only rows the live database lacks are added (`table/add_only.rs`).
    pub add_only: bool,
    /// Added rows may go in with one `INSERT … SELECT` per table from the attached capture
    /// (`table/bulk.rs`): each is read through the image and inserted uncompared.
    pub bulk_insert: bool,
}

impl MergeRule {
    /// The rule's policy: every rule's behaviour towards the rows, in one place.
    pub(crate) const fn policy(self) -> RowPolicy {
        match self {
            MergeRule::Delta => RowPolicy {
                rows: RowSource::Delta,
                compare_added: false,
                add_only: false,
                bulk_insert: true,
            },
            MergeRule::DeltaSharedWal => RowPolicy {
                rows: RowSource::Delta,
                compare_added: true,
                add_only: false,
                bulk_insert: false,
            },
            MergeRule::Whole => RowPolicy {
                rows: RowSource::Whole,
                compare_added: true,
                add_only: false,
                bulk_insert: false,
            },
            MergeRule::AddOnly => RowPolicy {
                rows: RowSource::Delta,
                compare_added: true,
                add_only: true,
                bulk_insert: false,
            },
            MergeRule::Changes => RowPolicy {
                rows: RowSource::Changes,
                compare_added: true,
                add_only: false,
                bulk_insert: false,
            },
        }
    }
}
