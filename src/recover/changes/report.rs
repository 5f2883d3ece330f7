//! The public face of the change computation: [`generation_changes`] reads a capture directory
//! alone (its WAL, its `<file>-base`, its main image for attribution) and reports, per table,
//! what the captured generation itself inserted, updated and deleted, and what cannot be decided.
//! It writes nothing.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::pages::capture_image;
use super::{compute, ChangesError, GenerationChanges, GenerationPages, RowChange, TableChanges};
use crate::recover::value::{utf8_text, Val};
use crate::recover::RecoverError;

/// What one retired generation changed, computed from its capture alone.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct GenerationChangesReport {
    /// The capture directory read.
    #[serde(serialize_with = "ser_path")]
    pub capture: PathBuf,
    /// The database the capture was taken of, as its manifest names it.
    pub database: String,
    /// Whether the capture holds a `<file>-base` (the base of each page the generation wrote).
    /// Without one, a page's base is known only when a checkpoint had copied it before the
    /// loss, so the tables the generation wrote are incomplete and their inserts undecided.
    pub has_base_file: bool,
    /// One entry per table with a change, an undecided row or an unknown base page, in
    /// root-page order.
    pub tables: Vec<TableChangesReport>,
    /// Pages holding rows (in their final or base version) that no table could be found for:
    /// any change on them is in no table's entry, so the report is incomplete.
    pub unattributed_pages: Vec<u32>,
    /// What a person should know: pages that did not decode, trees that could not be walked,
    /// bases that were not kept.
    pub notes: Vec<String>,
}

impl GenerationChangesReport {
    /// Every change is decided, every table complete and every page attributed: the report is
    /// exactly what the generation changed.
    pub fn is_complete(&self) -> bool {
        self.unattributed_pages.is_empty()
            && self.tables.iter().all(TableChangesReport::is_complete)
    }

    /// Rows the report cannot decide, over all tables.
    pub fn undecided(&self) -> u64 {
        self.tables.iter().map(|t| t.counts.undecided).sum()
    }

    /// The tables with unknown base pages (their changes may be missing rows).
    pub fn incomplete_tables(&self) -> impl Iterator<Item = &TableChangesReport> {
        self.tables
            .iter()
            .filter(|t| !t.unknown_base_pages.is_empty())
    }
}

/// What the generation did to one table.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct TableChangesReport {
    /// The table's name, as `sqlite_schema` has it.
    pub name: String,
    /// A `WITHOUT ROWID` table: its rows carry no rowid, their primary key's columns come first.
    pub without_rowid: bool,
    /// How many rows are in each list below.
    pub counts: ChangeCounts,
    /// Rows the generation inserted.
    pub inserts: Vec<ChangedRow>,
    /// Rows the generation updated: the row before it, and after.
    pub updates: Vec<UpdatedRow>,
    /// Rows the generation deleted (as they were before it).
    pub deletes: Vec<ChangedRow>,
    /// Rows the generation may have changed whose change cannot be decided, and why.
    pub undecided: Vec<UndecidedRow>,
    /// Pages of the table whose rows before the generation are not known: an update or delete
    /// of a row on one of them is not seen, so the table's changes are incomplete unless this is
    /// empty.
    pub unknown_base_pages: Vec<u32>,
}

impl TableChangesReport {
    /// Nothing undecided and no unknown base page.
    pub fn is_complete(&self) -> bool {
        self.undecided.is_empty() && self.unknown_base_pages.is_empty()
    }
}

/// The sizes of a table's change lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ChangeCounts {
    /// Rows inserted.
    pub inserted: u64,
    /// Rows updated.
    pub updated: u64,
    /// Rows deleted.
    pub deleted: u64,
    /// Rows undecided.
    pub undecided: u64,
}

/// A row as one version of the generation's pages holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ChangedRow {
    /// The rowid; `None` for a `WITHOUT ROWID` table.
    pub rowid: Option<i64>,
    /// The values in the record's order (for `WITHOUT ROWID`: the primary key's columns
    /// first), as stored, except that an `INTEGER PRIMARY KEY` column holds the rowid as
    /// `SELECT` shows it. Empty when the record could not be read (an undecided row).
    pub values: Vec<ShownValue>,
}

/// An updated row: before and after the generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct UpdatedRow {
    /// The row before the generation (its base pages).
    pub old: ChangedRow,
    /// The row as the generation left it (its final pages).
    pub new: ChangedRow,
}

/// A row whose change cannot be decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct UndecidedRow {
    /// The row as far as it is known.
    pub row: ChangedRow,
    /// Why its change cannot be decided.
    pub reason: String,
}

/// A stored value. In JSON: `null`, a number, a string (UTF-8 text), or `{"text_hex": …}` for
/// text that is not UTF-8 and `{"blob": …}` for a blob, both in lowercase hex. Displayed as
/// `recover` shows values: `NULL`, `42`, `"text"`, `x'00ff'`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum ShownValue {
    /// NULL.
    Null,
    /// An integer.
    Integer(i64),
    /// A real (a NaN shows as `null` in JSON).
    Real(f64),
    /// Text that is valid UTF-8.
    Text(String),
    /// Text that is not UTF-8: its bytes in hex.
    TextHex {
        /// The bytes, lowercase hex.
        text_hex: String,
    },
    /// A blob: its bytes in hex.
    Blob {
        /// The bytes, lowercase hex.
        blob: String,
    },
}

impl From<&Val> for ShownValue {
    fn from(v: &Val) -> ShownValue {
        match v {
            Val::Null => ShownValue::Null,
            Val::Int(i) => ShownValue::Integer(*i),
            Val::Real(r) => ShownValue::Real(*r),
            Val::Text(t) => match std::str::from_utf8(t) {
                Ok(s) => ShownValue::Text(s.to_owned()),
                Err(_) => ShownValue::TextHex {
                    text_hex: crate::paths::hex(t),
                },
            },
            Val::Blob(b) => ShownValue::Blob {
                blob: crate::paths::hex(b),
            },
        }
    }
}

impl std::fmt::Display for ShownValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShownValue::Null => Val::Null.fmt(f),
            ShownValue::Integer(i) => Val::Int(*i).fmt(f),
            ShownValue::Real(r) => Val::Real(*r).fmt(f),
            ShownValue::Text(t) => write!(f, "{t:?}"),
            ShownValue::TextHex { text_hex } => write!(f, "CAST(x'{text_hex}' AS TEXT)"),
            ShownValue::Blob { blob } => write!(f, "x'{blob}'"),
        }
    }
}

impl From<&RowChange> for ChangedRow {
    fn from(r: &RowChange) -> ChangedRow {
        ChangedRow {
            rowid: r.rowid,
            values: r.values.iter().map(ShownValue::from).collect(),
        }
    }
}

impl From<&TableChanges> for TableChangesReport {
    fn from(t: &TableChanges) -> TableChangesReport {
        TableChangesReport {
            name: t.name.clone(),
            without_rowid: t.without_rowid,
            counts: ChangeCounts {
                inserted: t.inserts.len() as u64,
                updated: t.updates.len() as u64,
                deleted: t.deletes.len() as u64,
                undecided: t.undecided.len() as u64,
            },
            inserts: t.inserts.iter().map(ChangedRow::from).collect(),
            updates: t
                .updates
                .iter()
                .map(|(old, new)| UpdatedRow {
                    old: old.into(),
                    new: new.into(),
                })
                .collect(),
            deletes: t.deletes.iter().map(ChangedRow::from).collect(),
            undecided: t
                .undecided
                .iter()
                .map(|(row, reason)| UndecidedRow {
                    row: row.into(),
                    reason: reason.clone(),
                })
                .collect(),
            unknown_base_pages: t.unknown_base_pages.clone(),
        }
    }
}

/// What the generation captured in `capture_dir` changed, per table, from the capture alone:
/// the final version of each page its WAL carries against that page's base (`<file>-base`, or
/// a frame a checkpoint had copied), with the capture's main image used only to find which
/// table a page belongs to. Reads only; writes nothing.
///
/// Errors: the path is not a capture or its manifest cannot be read (as
/// [`crate::recover::read_manifest`] says); a captured file cannot be read
/// ([`RecoverError::Io`]); the WAL or base file does not give the generation's pages
/// ([`RecoverError::GenerationPages`]).
pub fn generation_changes(capture_dir: &Path) -> Result<GenerationChangesReport, RecoverError> {
    let manifest = crate::recover::read_manifest(capture_dir)?;
    let loaded = load(capture_dir, 0)?;
    let changes = loaded.changes;
    Ok(GenerationChangesReport {
        capture: capture_dir.to_path_buf(),
        database: manifest.database.clone(),
        has_base_file: loaded.has_base_file,
        tables: changes
            .tables
            .iter()
            .map(TableChangesReport::from)
            .collect(),
        unattributed_pages: changes.unattributed_pages,
        notes: changes.notes,
    })
}

/// The changes of a captured generation, with what reading them needs.
pub(crate) struct Loaded {
    /// The changes, text in UTF-8 whatever the database's encoding.
    pub(crate) changes: GenerationChanges,
    /// The capture holds a `<file>-base`.
    pub(crate) has_base_file: bool,
    /// `backfill_at_loss` is recorded: a row under a rowid the newer generation holds is
    /// provably not one it read.
    pub(crate) backfill_known: bool,
}

/// The changes of the generation captured in `capture_dir` after its first `merged_frames`
/// frames (frames an earlier merge of it took count as the newer generation's, as backfilled
/// frames do; 0: none).
pub(crate) fn load(capture_dir: &Path, merged_frames: u64) -> Result<Loaded, RecoverError> {
    let manifest = crate::recover::read_manifest(capture_dir)?;
    let lift = |e: ChangesError| match e {
        ChangesError::Manifest(e) => e,
        ChangesError::Read { path, source } => RecoverError::Io {
            path,
            operation: "read a captured file",
            source,
        },
        other => RecoverError::GenerationPages {
            capture: capture_dir.to_path_buf(),
            why: other.to_string(),
        },
    };
    let pages = GenerationPages::from_capture(capture_dir, merged_frames).map_err(lift)?;
    let image = capture_image(capture_dir).map_err(lift)?;
    let page_size = pages.geometry.page_size() as usize;
    let lookup = |pgno: u32| -> Option<Vec<u8>> {
        let image = image.as_ref()?;
        let at = (pgno as usize).checked_sub(1)?.checked_mul(page_size)?;
        image.get(at..at + page_size).map(<[u8]>::to_vec)
    };
    let mut changes = compute(&pages, Some(&lookup));
    let has_base_file = manifest.base_pages.is_some();
    if !has_base_file {
        changes.notes.insert(
            0,
            "the capture has no base file (<file>-base): the bases of the pages its generation \
             wrote are unknown, so its updates and deletes on them cannot be seen and its \
             inserts cannot be told from rows it moved"
                .to_owned(),
        );
    }
    if image.is_none() {
        changes.notes.push(
            "the capture has no main image: pages are attributed to tables from their content \
             alone"
                .to_owned(),
        );
    }
    as_utf8(&mut changes, pages.geometry.text_encoding());
    Ok(Loaded {
        changes,
        has_base_file,
        backfill_known: manifest.backfill_at_loss.is_some(),
    })
}

/// Text values of a UTF-16 database as UTF-8, as `SELECT` gives them to a UTF-8 caller (and as
/// `recover` compares and writes them); text that does not decode is left as stored.
fn as_utf8(changes: &mut GenerationChanges, text_encoding: u32) {
    if text_encoding != 2 && text_encoding != 3 {
        return;
    }
    let convert = |row: &mut RowChange| {
        for v in &mut row.values {
            if let Val::Text(t) = v {
                if let Some(utf8) = utf8_text(t, text_encoding) {
                    *t = utf8;
                }
            }
        }
    };
    for t in &mut changes.tables {
        t.inserts.iter_mut().for_each(convert);
        t.deletes.iter_mut().for_each(convert);
        for (old, new) in &mut t.updates {
            convert(old);
            convert(new);
        }
        for (row, _) in &mut t.undecided {
            convert(row);
        }
    }
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::paths::path_display(p))
}
