//! What a merge is asked to do and what it reports.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// What to do when a row is in both generations with different content (the same declared
/// primary key, or a row the captured generation changed that the newer one changed too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConflictPolicy {
    /// Keep the live row; the conflict is reported.
    #[default]
    KeepLive,
    /// Take the captured row: overwrite (or put back, or delete) the live one.
    TakeCapture,
}

/// How a merge runs.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// Conflicting rows.
    pub conflicts: ConflictPolicy,
    /// How long to wait for the live database's write lock.
    pub busy_timeout: Duration,
    /// List every undecided row with its values ([`TableReport::undecided_rows`]), not only the
    /// first few keys.
    pub list_undecided: bool,
}

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            conflicts: ConflictPolicy::KeepLive,
            busy_timeout: Duration::from_secs(5),
            list_undecided: false,
        }
    }
}

/// Which rows of the capture are merged (docs/merge-rules.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeRule {
    /// The captured generation's own changes: its main image against the image with its WAL,
    /// in one rowid space. The live database descends from that image and never read the
    /// captured WAL: every row the generation added is inserted, however its content repeats.
    Delta,
    /// As [`MergeRule::Delta`], but a WAL file was at the database's path when the capture was
    /// taken (the captured one, after a lost `-shm`, or another put in its place), so the newer
    /// generation may have read some of the captured commits: a row the generation added that
    /// the live database holds under the same rowid (or key) with the same content is taken as
    /// already there.
    DeltaSharedWal,
    /// The live database does not descend from the captured image (the main file was replaced,
    /// or the live file is another file): every row of the captured generation is compared
    /// with the live row of the same rowid or key; nothing is deleted.
    Whole,
    /// The capture cannot show that its main image is the file its WAL generation was written on (a
    /// newer generation may have checkpointed into it), so its delta cannot tell what that
    /// generation changed or deleted. Only the rows it added or changed that the live database
    /// lacks are added (under a fresh rowid when theirs is taken); nothing is deleted or
    /// overwritten, and what a proven base would have changed or deleted is listed as undecided.
    AddOnly,
    /// The capture holds the base of every page its WAL carries (`<file>-base`), so what its
    /// generation itself inserted, updated and deleted is computed from those pages alone
    /// (`recover::generation_changes`), not read through the main image. An insert goes in
    /// (under a fresh rowid when the live rowid holds any row); an update or delete applies
    /// only where the live row is still the row the generation changed; anything else is
    /// undecided and left as it is live. A row the generation did not change is never touched.
    Changes,
}

impl MergeRule {
    /// One line for the operator.
    pub fn describe(self) -> &'static str {
        match self {
            MergeRule::Delta => {
                "the captured generation's own changes (its WAL against the main image it was \
                 written on)"
            }
            MergeRule::DeltaSharedWal => {
                "the captured generation's own changes; a row it added that is live under the \
                 same rowid with the same content counts as there (a WAL was at the path when it \
                 was captured)"
            }
            MergeRule::Whole => {
                "every row of the captured generation, compared with the live row of the same \
                 rowid or key (the live file does not descend from the captured image)"
            }
            MergeRule::AddOnly => {
                "only rows the captured generation wrote that the live database lacks are added; \
                 nothing is deleted or overwritten (the capture cannot show that its image is \
                 the file its WAL was written on)"
            }
            MergeRule::Changes => {
                "the captured generation's own inserts, updates and deletes, read from the pages \
                 its WAL carries against their kept bases: an update or delete only where the \
                 live row is still as that generation found it"
            }
        }
    }
}

/// How a table's rows are told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RowIdentity {
    /// By the declared primary key (not a rowid alias).
    PrimaryKey,
    /// By the rowid (no declared key, or `INTEGER PRIMARY KEY`).
    #[default]
    Rowid,
}

/// Rows of the source that could not be read (a damaged page).
#[derive(Debug, Clone, Serialize)]
pub struct Unreadable {
    /// The last rowid read before the damage (`None`: from the start).
    pub after_rowid: Option<i64>,
    /// The first rowid read after it (`None`: to the end).
    pub before_rowid: Option<i64>,
    /// At most this many rows lie in between, when both ends are known.
    pub at_most: Option<u64>,
    /// What SQLite said.
    pub error: String,
}

/// One table of a merge.
#[derive(Debug, Clone, Serialize, Default)]
pub struct TableReport {
    /// The table.
    pub table: String,
    /// How its rows are identified.
    pub identity: RowIdentity,
    /// Rows of the table in the captured generation (image and WAL).
    pub in_capture: u64,
    /// Rows the captured generation added (delta rules; every row read under the whole rule).
    pub added: u64,
    /// Rows it changed.
    pub changed: u64,
    /// Rows it deleted.
    pub deleted: u64,
    /// Rows of the capture that need nothing: unchanged by the captured generation, or whose
    /// change is already in the live database (merged before, or read by the newer generation).
    pub already_live: u64,
    /// Added rows missing from the live database.
    pub to_insert: u64,
    /// Inserted (when applied).
    pub inserted: u64,
    /// Inserted under another rowid than the captured one (the newer generation used it).
    pub new_rowids: u64,
    /// Changed rows whose live row is still as the image had it: to be changed.
    pub to_update: u64,
    /// Updated (when applied).
    pub updated: u64,
    /// Deleted rows whose live row is still as the image had it: to be deleted.
    pub to_delete: u64,
    /// Deleted from the live database (when applied).
    pub removed: u64,
    /// Rows the newer generation changed too (or a declared key with other content).
    pub conflicts: u64,
    /// Conflicts resolved with the captured row ([`ConflictPolicy::TakeCapture`]).
    pub replaced: u64,
    /// Rows the live schema refused (a UNIQUE or NOT NULL constraint), or whose parent row was.
    pub rejected: u64,
    /// The first few conflicting keys, for the operator.
    pub conflict_keys: Vec<String>,
    /// Under [`MergeRule::AddOnly`]: rows the capture's delta says the captured generation changed
    /// or deleted, whose live row is kept as it is because the capture cannot show that its image
    /// was that generation's base.
    pub undecided: u64,
    /// The first few undecided keys.
    pub undecided_keys: Vec<String>,
    /// Of the undecided rows, those the captured generation changed whose captured content is
    /// added beside the live row under a fresh rowid (rowid tables; to be added, in a plan).
    pub undecided_added_beside: u64,
    /// [`MergeRule::AddOnly`]: rows the delta says the captured generation changed, which an
    /// earlier merge of this generation added under a new rowid (beside the live row, when it
    /// counted them undecided): found there with the captured content now, so counted in
    /// `already_live`, not in `undecided`. The live row they were added beside is kept.
    pub added_beside_before: u64,
    /// Every undecided row side by side, when [`MergeOptions::list_undecided`].
    pub undecided_rows: Vec<UndecidedRow>,
    /// Parts of the table the capture could not read.
    pub unreadable: Vec<Unreadable>,
    /// [`MergeRule::Changes`]: pages of the table whose rows before the captured generation
    /// are not known (no base kept, or not attributable): a change of a row on one of them is
    /// not seen, so the table's changes may be incomplete (counts in
    /// [`MergeReport::left_over`]).
    pub unknown_base_pages: Vec<u32>,
}

impl TableReport {
    pub(crate) fn new(table: &str, identity: RowIdentity) -> TableReport {
        TableReport {
            table: table.to_owned(),
            identity,
            ..TableReport::default()
        }
    }
}

/// A row the add-only rule left as it is, side by side: the image's row, the captured generation's,
/// and the live one. Values as SQL literals.
#[derive(Debug, Clone, Serialize)]
pub struct UndecidedRow {
    /// `rowid 21`, or the declared key's values.
    pub key: String,
    /// The row in the capture's image (its `pre`), the column names in [`UndecidedRow::columns`].
    pub image: Vec<String>,
    /// The row after the captured generation's commits; `None`: it deleted the row.
    pub captured: Option<Vec<String>>,
    /// The live row now; `None`: the live database has no row of that identity.
    pub live: Option<Vec<String>>,
    /// The columns.
    pub columns: Vec<String>,
    /// Why it is undecided, when the rule says more than the three rows show
    /// ([`MergeRule::Changes`]).
    pub reason: Option<String>,
}

/// A table that is not merged, and why.
#[derive(Debug, Clone, Serialize)]
pub struct NotMerged {
    /// The table.
    pub table: String,
    /// Why.
    pub reason: String,
    /// Whether rows may be left behind by it (counts in [`MergeReport::left_over`]).
    pub leaves_rows: bool,
}

/// The plan of a merge, or what it did.
#[derive(Debug, Clone, Serialize)]
pub struct MergeReport {
    /// The capture merged from.
    #[serde(serialize_with = "ser_path")]
    pub capture: PathBuf,
    /// The live database merged into.
    #[serde(serialize_with = "ser_path")]
    pub database: PathBuf,
    /// Whether it was applied (committed); otherwise a plan: nothing was written.
    pub applied: bool,
    /// Which rows are merged.
    pub rule: MergeRule,
    /// Why that rule applies.
    pub rule_reason: String,
    /// When this capture's rows were inserted before (from the live database's
    /// `hermes_guard_merges`): its added rows are not inserted again.
    pub merged_before: Option<String>,
    /// With `merged_before`: the capture that merged this generation then (another capture of
    /// the same generation, or this one).
    pub merged_from: Option<String>,
    /// WAL frames of the captured generation an earlier merge of it (another copy of the
    /// capture, which could read fewer commits) took: the delta is taken from there on. 0: from
    /// the captured image.
    pub delta_from_frame: u64,
    /// `PRAGMA integrity_check` of the captured generation (`["ok"]` when clean).
    pub capture_integrity: Vec<String>,
    /// Schema objects only in the capture, created in the live database (`type name`).
    pub created: Vec<String>,
    /// The tables merged, parents before children.
    pub tables: Vec<TableReport>,
    /// Tables not merged (virtual, columns the live table lacks, dropped by the newer
    /// generation).
    pub not_merged: Vec<NotMerged>,
    /// Full-text indexes rebuilt because no trigger of the live schema keeps them in step.
    pub fts_rebuilt: Vec<String>,
    /// The captured generation was healed into the live file at close (the capture's
    /// `healed.json`): what its record says. Nothing is merged from such a capture.
    pub healed_at_close: Option<String>,
    /// Another capture of this WAL generation whose heal at close put its rows back into the
    /// live file (as far as `delta_from_frame`, or as far as this capture reaches when
    /// `healed_at_close` says so): those rows are not merged again.
    pub healed_by: Option<String>,
    /// [`MergeRule::Changes`]: pages holding rows that no table could be found for; a change
    /// on one of them is in no table's report (counts in [`MergeReport::left_over`]).
    pub unattributed_pages: Vec<u32>,
    /// [`MergeRule::Changes`]: what the change computation found that a person should know.
    pub change_notes: Vec<String>,
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::paths::path_display(p))
}

impl MergeReport {
    pub(crate) fn new(capture: &Path, database: &Path, rule: MergeRule, why: String) -> Self {
        MergeReport {
            capture: capture.to_path_buf(),
            database: database.to_path_buf(),
            applied: false,
            rule,
            rule_reason: why,
            merged_before: None,
            merged_from: None,
            delta_from_frame: 0,
            capture_integrity: Vec::new(),
            created: Vec::new(),
            tables: Vec::new(),
            not_merged: Vec::new(),
            fts_rebuilt: Vec::new(),
            healed_at_close: None,
            healed_by: None,
            unattributed_pages: Vec::new(),
            change_notes: Vec::new(),
        }
    }

    /// Rows missing from the live database, or still to change or delete in it (to do, or
    /// done when applied).
    pub fn missing(&self) -> u64 {
        self.tables
            .iter()
            .map(|t| t.to_insert + t.to_update + t.to_delete)
            .sum()
    }

    /// Rows inserted.
    pub fn inserted(&self) -> u64 {
        self.tables.iter().map(|t| t.inserted).sum()
    }

    /// Rows inserted, updated or deleted, conflicts taken from the capture included.
    pub fn changed(&self) -> u64 {
        self.tables
            .iter()
            .map(|t| t.inserted + t.updated + t.removed + t.replaced)
            .sum()
    }

    /// Rows the add-only rule kept as they are live (see [`TableReport::undecided`]).
    pub fn undecided(&self) -> u64 {
        self.tables.iter().map(|t| t.undecided).sum()
    }

    /// Rows an earlier merge of this generation added beside the live ones, no longer counted
    /// undecided (see [`TableReport::added_beside_before`]).
    pub fn added_beside_before(&self) -> u64 {
        self.tables.iter().map(|t| t.added_beside_before).sum()
    }

    /// Conflicting rows (whether or not they were resolved with the captured row).
    pub fn conflicts(&self) -> u64 {
        self.tables.iter().map(|t| t.conflicts).sum()
    }

    /// What a merge cannot settle by itself: conflicts kept live, rows the live schema refused,
    /// damaged parts of the capture, and tables not merged that may hold rows; under
    /// [`MergeRule::Changes`] also the undecided rows and each page whose rows' change cannot
    /// be seen (an unknown base, no table found).
    pub fn left_over(&self) -> u64 {
        let changes = self.rule == MergeRule::Changes;
        let tables: u64 = self
            .tables
            .iter()
            .map(|t| {
                let undecided = if changes {
                    t.undecided + t.unknown_base_pages.len() as u64
                } else {
                    0
                };
                t.conflicts.saturating_sub(t.replaced)
                    + t.rejected
                    + t.unreadable.len() as u64
                    + undecided
            })
            .sum();
        tables
            + self.not_merged.iter().filter(|n| n.leaves_rows).count() as u64
            + self.unattributed_pages.len() as u64
    }

    /// Everything of the capture is already in the live database and nothing is left over.
    pub fn nothing_to_do(&self) -> bool {
        self.missing() == 0 && self.conflicts() == 0 && self.left_over() == 0
    }
}

/// Progress of a long merge.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    /// The table being merged.
    pub table: &'a str,
    /// Rows of it done.
    pub done: u64,
    /// Rows of it in the capture.
    pub total: u64,
}
