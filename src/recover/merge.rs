//! The merge: per table, the rows a source generation committed that a target lacks.
//!
//! The rules are in docs/merge-rules.md.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{params_from_iter, Connection};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::schema::{quote, Schema, Table};
use super::RecoverError;

/// What to do when a row's declared primary key is in both generations with different content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConflictPolicy {
    /// Keep the live row; the conflict is reported.
    #[default]
    KeepLive,
    /// Overwrite the live row's other columns with the captured ones.
    TakeCapture,
}

/// How a merge runs.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// Conflicting primary keys.
    pub conflicts: ConflictPolicy,
    /// How long to wait for the live database's write lock.
    pub busy_timeout: Duration,
}

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            conflicts: ConflictPolicy::KeepLive,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// How a table's rows are told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RowIdentity {
    /// By the declared primary key (not a rowid alias).
    PrimaryKey,
    /// By the content of every column but the rowid, as a multiset.
    Content,
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
#[derive(Debug, Clone, Serialize)]
pub struct TableReport {
    /// The table.
    pub table: String,
    /// How its rows are identified.
    pub identity: RowIdentity,
    /// Rows read from the capture.
    pub in_capture: u64,
    /// Of those, already in the live database.
    pub already_live: u64,
    /// Of those, missing from the live database.
    pub to_insert: u64,
    /// Inserted (when applied).
    pub inserted: u64,
    /// Inserted under another rowid than the captured one (its own was taken).
    pub new_rowids: u64,
    /// Same primary key, different content.
    pub conflicts: u64,
    /// Conflicts overwritten with the captured row ([`ConflictPolicy::TakeCapture`]).
    pub replaced: u64,
    /// Rows the live schema refused (a UNIQUE or NOT NULL constraint), or whose parent row was.
    pub rejected: u64,
    /// The first few conflicting keys, for the operator.
    pub conflict_keys: Vec<String>,
    /// Parts of the table the capture could not read.
    pub unreadable: Vec<Unreadable>,
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
    /// `PRAGMA integrity_check` of the captured generation (`["ok"]` when clean).
    pub capture_integrity: Vec<String>,
    /// The tables merged, parents before children.
    pub tables: Vec<TableReport>,
    /// Tables not merged (only in the capture, virtual, columns the live table lacks).
    pub not_merged: Vec<NotMerged>,
    /// Full-text indexes rebuilt because no trigger of the live schema keeps them in step.
    pub fts_rebuilt: Vec<String>,
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::paths::path_display(p))
}

impl MergeReport {
    /// Rows missing from the live database (to insert, or inserted when applied).
    pub fn missing(&self) -> u64 {
        self.tables.iter().map(|t| t.to_insert).sum()
    }

    /// Rows inserted.
    pub fn inserted(&self) -> u64 {
        self.tables.iter().map(|t| t.inserted).sum()
    }

    /// Conflicting primary keys (whether or not they were overwritten).
    pub fn conflicts(&self) -> u64 {
        self.tables.iter().map(|t| t.conflicts).sum()
    }

    /// What a merge cannot settle by itself: conflicts kept live, rows the live schema refused,
    /// damaged parts of the capture, and tables not merged that may hold rows.
    pub fn left_over(&self) -> u64 {
        let tables: u64 = self
            .tables
            .iter()
            .map(|t| {
                t.conflicts.saturating_sub(t.replaced) + t.rejected + t.unreadable.len() as u64
            })
            .sum();
        tables + self.not_merged.iter().filter(|n| n.leaves_rows).count() as u64
    }

    /// Every captured row is already live and nothing is left over.
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
    /// Rows of it read from the capture.
    pub total: u64,
}

/// A value as SQLite stores it; text kept as bytes (they need not be UTF-8).
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Null,
    Int(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl From<ValueRef<'_>> for Val {
    fn from(v: ValueRef<'_>) -> Val {
        match v {
            ValueRef::Null => Val::Null,
            ValueRef::Integer(i) => Val::Int(i),
            ValueRef::Real(f) => Val::Real(f),
            ValueRef::Text(t) => Val::Text(t.to_vec()),
            ValueRef::Blob(b) => Val::Blob(b.to_vec()),
        }
    }
}

impl ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Val::Null => ValueRef::Null,
            Val::Int(i) => ValueRef::Integer(*i),
            Val::Real(f) => ValueRef::Real(*f),
            Val::Text(t) => ValueRef::Text(t),
            Val::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl std::fmt::Display for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Val::Null => f.write_str("NULL"),
            Val::Int(i) => write!(f, "{i}"),
            Val::Real(r) => write!(f, "{r}"),
            Val::Text(t) => write!(f, "{:?}", String::from_utf8_lossy(t)),
            Val::Blob(b) => write!(f, "x'{}'", crate::paths::hex(b)),
        }
    }
}

/// Where a source rowid went in the target.
#[derive(Debug, Clone, Copy)]
enum Mapped {
    Live(i64),
    /// To be inserted (a plan): its rowid is not known yet.
    Pending(u64),
    /// Refused by the live schema.
    Rejected,
}

type Key = [u8; 32];

fn feed(h: &mut Sha256, v: &Val) {
    match v {
        Val::Null => h.update([0u8]),
        Val::Int(i) => {
            h.update([1u8]);
            h.update(i.to_le_bytes());
        }
        Val::Real(r) => {
            h.update([2u8]);
            h.update(r.to_bits().to_le_bytes());
        }
        Val::Text(t) => {
            h.update([3u8]);
            h.update((t.len() as u64).to_le_bytes());
            h.update(t);
        }
        Val::Blob(b) => {
            h.update([4u8]);
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        }
    }
}

/// A row's content key: its values with pending parents told apart.
fn content_key(values: &[Option<&Val>], pending: &[(usize, u64)]) -> Key {
    let mut h = Sha256::new();
    for (i, v) in values.iter().enumerate() {
        match pending.iter().find(|(at, _)| *at == i) {
            Some((_, n)) => {
                h.update([5u8]);
                h.update(n.to_le_bytes());
            }
            None => feed(&mut h, v.unwrap_or(&Val::Null)),
        }
    }
    h.finalize().into()
}

struct SourceRow {
    rowid: Option<i64>,
    values: Vec<Val>,
}

/// Reads every row of `table` (columns `cols`) that SQLite can read: in rowid order, and after a
/// damaged page, from the end backwards, so only the damaged range is missed — and reported.
fn read_rows(
    conn: &Connection,
    table: &Table,
    cols: &[String],
) -> (Vec<SourceRow>, Vec<Unreadable>) {
    let col_list = cols.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ");
    let name = quote(&table.name);
    let mut rows = Vec::new();
    let mut unreadable = Vec::new();
    let Some(rowid) = table.rowid_name() else {
        let sql = format!("SELECT {col_list} FROM main.{name}");
        if let Err(e) = scan(conn, &sql, &[], cols.len(), false, &mut rows) {
            unreadable.push(Unreadable {
                after_rowid: None,
                before_rowid: None,
                at_most: None,
                error: e.to_string(),
            });
        }
        return (rows, unreadable);
    };
    let sql = format!("SELECT {rowid}, {col_list} FROM main.{name} ORDER BY {rowid}");
    let Err(e) = scan(conn, &sql, &[], cols.len(), true, &mut rows) else {
        return (rows, unreadable);
    };
    let after = rows.last().and_then(|r: &SourceRow| r.rowid);
    let mut tail = Vec::new();
    let sql = format!(
        "SELECT {rowid}, {col_list} FROM main.{name} WHERE {rowid} > ?1 ORDER BY {rowid} DESC"
    );
    let tail_result = scan(
        conn,
        &sql,
        &[Val::Int(after.unwrap_or(i64::MIN))],
        cols.len(),
        true,
        &mut tail,
    );
    let before = tail.last().and_then(|r| r.rowid);
    if tail_result.is_err() || after.is_none() {
        unreadable.push(Unreadable {
            after_rowid: after,
            before_rowid: if tail_result.is_err() { before } else { None },
            at_most: match (after, before) {
                (Some(a), Some(b)) if tail_result.is_err() => {
                    Some(b.saturating_sub(a).saturating_sub(1).max(0) as u64)
                }
                _ => None,
            },
            error: e.to_string(),
        });
    } else {
        log::warn!(
            "hermes-guard: reading {} stopped after rowid {after:?} ({e}) but every later row \
             read backwards",
            table.name
        );
    }
    tail.reverse();
    rows.extend(tail);
    (rows, unreadable)
}

fn scan(
    conn: &Connection,
    sql: &str,
    params: &[Val],
    ncols: usize,
    with_rowid: bool,
    out: &mut Vec<SourceRow>,
) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare(sql)?;
    let mut q = stmt.query(params_from_iter(params))?;
    while let Some(r) = q.next()? {
        let off = usize::from(with_rowid);
        let rowid = if with_rowid { r.get(0)? } else { None };
        let mut values = Vec::with_capacity(ncols);
        for i in 0..ncols {
            values.push(Val::from(r.get_ref(i + off)?));
        }
        out.push(SourceRow { rowid, values });
    }
    Ok(())
}

/// Tables in an order where a parent comes before the tables that refer to it.
fn parents_first(tables: &[&Table]) -> Vec<String> {
    let names: HashSet<String> = tables.iter().map(|t| t.name.to_lowercase()).collect();
    let mut done: Vec<String> = Vec::new();
    let mut left: Vec<&Table> = tables.to_vec();
    left.sort_by(|a, b| a.name.cmp(&b.name));
    while !left.is_empty() {
        let ready = left.iter().position(|t| {
            t.foreign_keys.iter().all(|fk| {
                let p = fk.parent.to_lowercase();
                p == t.name.to_lowercase() || !names.contains(&p) || done.contains(&p)
            })
        });
        // A cycle: take the first; its references are translated where already known.
        let t = left.remove(ready.unwrap_or(0));
        done.push(t.name.to_lowercase());
    }
    done
}

pub(crate) struct Merge<'a> {
    pub source: &'a Connection,
    pub source_path: &'a Path,
    pub target: &'a Connection,
    pub target_path: &'a Path,
    pub options: &'a MergeOptions,
    pub apply: bool,
}

impl Merge<'_> {
    fn sq(&self, what: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> RecoverError + '_ {
        let what = what.into();
        move |e| RecoverError::sqlite(self.target_path, what, e)
    }

    /// Plans, and when `apply`, inserts. The caller holds the transactions (`BEGIN IMMEDIATE` on
    /// the target to apply) and commits.
    pub fn run(
        &self,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<MergeReport, RecoverError> {
        let source = Schema::read(self.source)
            .map_err(|e| RecoverError::sqlite(self.source_path, "read the captured schema", e))?;
        let target = Schema::read(self.target).map_err(self.sq("read the live schema"))?;

        let app_id =
            |c: &Connection| c.query_row("PRAGMA main.application_id", [], |r| r.get::<_, i64>(0));
        let (a, b) = (
            app_id(self.source).unwrap_or(0),
            app_id(self.target).map_err(self.sq("read application_id"))?,
        );
        if a != 0 && b != 0 && a != b {
            return Err(RecoverError::DifferentDatabase {
                database: self.target_path.to_path_buf(),
                capture: self.source_path.to_path_buf(),
                why: format!("application_id {b:#x} where the capture has {a:#x}"),
            });
        }

        let mut report = MergeReport {
            capture: self.source_path.to_path_buf(),
            database: self.target_path.to_path_buf(),
            applied: false,
            capture_integrity: Vec::new(),
            tables: Vec::new(),
            not_merged: Vec::new(),
            fts_rebuilt: Vec::new(),
        };
        let mut common: Vec<&Table> = Vec::new();
        let mut names: Vec<&String> = source.tables.keys().collect();
        names.sort();
        for key in names {
            let table = &source.tables[key];
            match target.tables.get(key) {
                None => report.not_merged.push(NotMerged {
                    table: table.name.clone(),
                    reason: "only in the capture: the live database has no such table".into(),
                    leaves_rows: table_has_rows(self.source, table),
                }),
                Some(live) => {
                    let missing: Vec<&str> = table
                        .columns
                        .iter()
                        .filter(|c| !c.generated && !live.has_column(&c.name))
                        .map(|c| c.name.as_str())
                        .collect();
                    if !missing.is_empty() {
                        report.not_merged.push(NotMerged {
                            table: table.name.clone(),
                            reason: format!("the live table has no column {}", missing.join(", ")),
                            leaves_rows: table_has_rows(self.source, table),
                        });
                    } else if live.declared_key() != table.declared_key()
                        || live.rowid_alias().map(str::to_lowercase)
                            != table.rowid_alias().map(str::to_lowercase)
                    {
                        report.not_merged.push(NotMerged {
                            table: table.name.clone(),
                            reason: "its primary key differs in the live schema".into(),
                            leaves_rows: table_has_rows(self.source, table),
                        });
                    } else {
                        common.push(live);
                    }
                }
            }
        }
        if common.is_empty() && !source.tables.is_empty() {
            return Err(RecoverError::DifferentDatabase {
                database: self.target_path.to_path_buf(),
                capture: self.source_path.to_path_buf(),
                why: "it has none of the captured tables".into(),
            });
        }
        for v in &source.virtuals {
            let reason = match &v.content {
                Some(c) => format!(
                    "a full-text index over {c}: it follows {c} through the live schema's \
                     triggers, or is rebuilt"
                ),
                None => "a virtual table: its rows are not merged".into(),
            };
            let leaves_rows = v.content.is_none()
                && self
                    .source
                    .query_row(
                        &format!("SELECT EXISTS (SELECT 1 FROM main.{})", quote(&v.name)),
                        [],
                        |r| r.get::<_, bool>(0),
                    )
                    .unwrap_or(true);
            report.not_merged.push(NotMerged {
                table: v.name.clone(),
                reason,
                leaves_rows,
            });
        }

        let mut maps: HashMap<String, HashMap<i64, Mapped>> = HashMap::new();
        let mut pending = 0u64;
        for key in parents_first(&common) {
            let live = &target.tables[&key];
            let captured = &source.tables[&key];
            let t = self.table(live, captured, &target, &mut maps, &mut pending, progress)?;
            report.tables.push(t);
        }

        if self.apply {
            for v in &target.virtuals {
                let Some(content) = &v.content else { continue };
                let touched = report.tables.iter().any(|t| {
                    t.table.eq_ignore_ascii_case(content) && (t.inserted + t.replaced) > 0
                });
                if touched && !target.trigger_feeds(content, &v.name) {
                    let q = quote(&v.name);
                    self.target
                        .execute(&format!("INSERT INTO main.{q}({q}) VALUES ('rebuild')"), [])
                        .map_err(self.sq(format!("rebuild the full-text index {}", v.name)))?;
                    report.fts_rebuilt.push(v.name.clone());
                }
            }
        }
        report.applied = self.apply;
        Ok(report)
    }

    #[allow(clippy::too_many_arguments)]
    fn table(
        &self,
        live: &Table,
        captured: &Table,
        target: &Schema,
        maps: &mut HashMap<String, HashMap<i64, Mapped>>,
        pending: &mut u64,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<TableReport, RecoverError> {
        let lname = live.name.to_lowercase();
        // Captured columns, by the live table's spelling.
        let cols: Vec<String> = captured
            .columns
            .iter()
            .filter(|c| !c.generated)
            .map(|c| {
                live.columns
                    .iter()
                    .find(|l| l.name.eq_ignore_ascii_case(&c.name))
                    .map(|l| l.name.clone())
                    .unwrap_or_else(|| c.name.clone())
            })
            .collect();
        let alias = live.rowid_alias().map(str::to_owned);
        let alias_at = alias
            .as_ref()
            .and_then(|a| cols.iter().position(|c| c.eq_ignore_ascii_case(a)));
        let key_cols = live.declared_key();
        let identity = if key_cols.is_some() {
            RowIdentity::PrimaryKey
        } else {
            RowIdentity::Content
        };
        // Columns that refer to a parent's rowid alias: their values follow the parent's rows.
        let mut follows: Vec<(usize, String)> = Vec::new();
        for fk in &live.foreign_keys {
            let parent = fk.parent.to_lowercase();
            let Some(p) = target.tables.get(&parent) else {
                continue;
            };
            let Some(p_alias) = p.rowid_alias() else {
                continue;
            };
            if p.declared_key().is_some() {
                continue;
            }
            let to_alias = fk
                .to
                .as_deref()
                .is_none_or(|to| to.eq_ignore_ascii_case(p_alias));
            if let (true, Some(at)) = (
                to_alias,
                cols.iter().position(|c| c.eq_ignore_ascii_case(&fk.from)),
            ) {
                follows.push((at, parent));
            }
        }

        let (rows, unreadable) = read_rows(self.source, captured, &cols);
        for u in &unreadable {
            log::warn!(
                "hermes-guard: {}: table {}: rows after rowid {:?} and before {:?} could not be \
                 read: {}",
                self.source_path.display(),
                live.name,
                u.after_rowid,
                u.before_rowid,
                u.error
            );
        }
        let mut report = TableReport {
            table: live.name.clone(),
            identity,
            in_capture: rows.len() as u64,
            already_live: 0,
            to_insert: 0,
            inserted: 0,
            new_rowids: 0,
            conflicts: 0,
            replaced: 0,
            rejected: 0,
            conflict_keys: Vec::new(),
            unreadable,
        };
        let total = report.in_capture;
        let tname = quote(&live.name);
        let col_list = cols.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ");
        let marks = (1..=cols.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let insert_sql =
            format!("INSERT OR IGNORE INTO main.{tname} ({col_list}) VALUES ({marks})");
        let compare: Vec<usize> = (0..cols.len()).filter(|i| Some(*i) != alias_at).collect();

        // Content identity: the live rows' content keys, each with its rowids.
        let mut live_index: HashMap<Key, VecDeque<i64>> = HashMap::new();
        let rowid = live.rowid_name();
        if identity == RowIdentity::Content {
            let rowid = rowid.unwrap_or("rowid");
            let sel: Vec<String> = compare.iter().map(|i| quote(&cols[*i])).collect();
            let sql = format!(
                "SELECT {rowid}{}{} FROM main.{tname} ORDER BY {rowid}",
                if sel.is_empty() { "" } else { ", " },
                sel.join(", ")
            );
            let mut stmt = self
                .target
                .prepare(&sql)
                .map_err(self.sq(format!("read {}", live.name)))?;
            let mut q = stmt
                .query([])
                .map_err(self.sq(format!("read {}", live.name)))?;
            while let Some(r) = q.next().map_err(self.sq(format!("read {}", live.name)))? {
                let id: i64 = r.get(0).map_err(self.sq("read a rowid"))?;
                let mut vals = Vec::with_capacity(compare.len());
                for i in 0..compare.len() {
                    vals.push(Val::from(
                        r.get_ref(i + 1).map_err(self.sq("read a value"))?,
                    ));
                }
                let refs: Vec<Option<&Val>> = vals.iter().map(Some).collect();
                live_index
                    .entry(content_key(&refs, &[]))
                    .or_default()
                    .push_back(id);
            }
        }

        let key_at: Vec<usize> = key_cols
            .iter()
            .flatten()
            .filter_map(|k| cols.iter().position(|c| c.eq_ignore_ascii_case(k)))
            .collect();
        let key_where = key_at
            .iter()
            .enumerate()
            .map(|(n, i)| format!("{} IS ?{}", quote(&cols[*i]), n + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        let mut map: HashMap<i64, Mapped> = HashMap::new();
        for (done, row) in rows.into_iter().enumerate() {
            if done % 512 == 0 {
                progress(&Progress {
                    table: &live.name,
                    done: done as u64,
                    total,
                });
            }
            let mut values = row.values;
            // Follow the parents' rows.
            let mut pending_at: Vec<(usize, u64)> = Vec::new();
            let mut orphan = false;
            for (at, parent) in &follows {
                let Val::Int(old) = values[*at] else { continue };
                let mapped = if parent == &lname {
                    map.get(&old).copied()
                } else {
                    maps.get(parent).and_then(|m| m.get(&old)).copied()
                };
                match mapped {
                    Some(Mapped::Live(new)) => values[*at] = Val::Int(new),
                    Some(Mapped::Pending(n)) => pending_at.push((*at, n)),
                    Some(Mapped::Rejected) => orphan = true,
                    None => {}
                }
            }
            let cmp_vals: Vec<Option<&Val>> = compare.iter().map(|i| Some(&values[*i])).collect();
            let cmp_pending: Vec<(usize, u64)> = pending_at
                .iter()
                .filter_map(|(at, n)| compare.iter().position(|c| c == at).map(|p| (p, *n)))
                .collect();

            let existing: Option<i64> = match identity {
                RowIdentity::Content => {
                    let key = content_key(&cmp_vals, &cmp_pending);
                    live_index.get_mut(&key).and_then(VecDeque::pop_front)
                }
                RowIdentity::PrimaryKey => {
                    if !pending_at.is_empty() && pending_at.iter().any(|(a, _)| key_at.contains(a))
                    {
                        None
                    } else {
                        let sql = format!("SELECT {col_list} FROM main.{tname} WHERE {key_where}");
                        let key_vals: Vec<&Val> = key_at.iter().map(|i| &values[*i]).collect();
                        let mut stmt = self
                            .target
                            .prepare_cached(&sql)
                            .map_err(self.sq(format!("look up {}", live.name)))?;
                        let mut q = stmt
                            .query(params_from_iter(key_vals))
                            .map_err(self.sq(format!("look up {}", live.name)))?;
                        match q
                            .next()
                            .map_err(self.sq(format!("look up {}", live.name)))?
                        {
                            None => None,
                            Some(r) => {
                                let mut same = cmp_pending.is_empty();
                                for (i, v) in values.iter().enumerate() {
                                    let l = Val::from(r.get_ref(i).map_err(self.sq("read"))?);
                                    if !same_value(&l, v) {
                                        same = false;
                                    }
                                }
                                if same {
                                    Some(0)
                                } else {
                                    report.conflicts += 1;
                                    if report.conflict_keys.len() < 5 {
                                        report.conflict_keys.push(
                                            key_at
                                                .iter()
                                                .map(|i| values[*i].to_string())
                                                .collect::<Vec<_>>()
                                                .join(", "),
                                        );
                                    }
                                    if self.apply
                                        && self.options.conflicts == ConflictPolicy::TakeCapture
                                        && pending_at.is_empty()
                                        && !orphan
                                    {
                                        self.replace(live, &cols, &key_at, &values)?;
                                        report.replaced += 1;
                                    }
                                    // Counted: neither live nor to insert.
                                    continue;
                                }
                            }
                        }
                    }
                }
            };
            if let Some(live_id) = existing {
                report.already_live += 1;
                if let (Some(old), RowIdentity::Content) = (row.rowid, identity) {
                    map.insert(old, Mapped::Live(live_id));
                }
                continue;
            }
            report.to_insert += 1;
            if orphan {
                report.rejected += 1;
                if let Some(old) = row.rowid {
                    map.insert(old, Mapped::Rejected);
                }
                continue;
            }
            if !self.apply {
                *pending += 1;
                if let Some(old) = row.rowid {
                    map.insert(old, Mapped::Pending(*pending));
                }
                continue;
            }
            // Keep the captured rowid when it is free; otherwise a fresh one.
            if let (Some(at), Some(rid)) = (alias_at, rowid) {
                if let Val::Int(old) = values[at] {
                    let taken: bool = self
                        .target
                        .prepare_cached(&format!(
                            "SELECT EXISTS (SELECT 1 FROM main.{tname} WHERE {rid} = ?1)"
                        ))
                        .and_then(|mut s| s.query_row([old], |r| r.get(0)))
                        .map_err(self.sq(format!("look up {}", live.name)))?;
                    if taken {
                        values[at] = Val::Null;
                    }
                }
            }
            let changed = {
                let mut stmt = self
                    .target
                    .prepare_cached(&insert_sql)
                    .map_err(self.sq(format!("insert into {}", live.name)))?;
                stmt.execute(params_from_iter(values.iter()))
                    .map_err(|e| self.write_error(e, &live.name))?
            };
            if changed == 0 {
                report.rejected += 1;
                if let Some(old) = row.rowid {
                    map.insert(old, Mapped::Rejected);
                }
                continue;
            }
            report.inserted += 1;
            let new = self.target.last_insert_rowid();
            if let Some(old) = row.rowid {
                if identity == RowIdentity::Content {
                    if alias_at.is_some() && new != old {
                        report.new_rowids += 1;
                    }
                    map.insert(old, Mapped::Live(new));
                }
            }
        }
        progress(&Progress {
            table: &live.name,
            done: total,
            total,
        });
        maps.insert(lname, map);
        Ok(report)
    }

    fn replace(
        &self,
        live: &Table,
        cols: &[String],
        key_at: &[usize],
        values: &[Val],
    ) -> Result<(), RecoverError> {
        let others: Vec<usize> = (0..cols.len()).filter(|i| !key_at.contains(i)).collect();
        if others.is_empty() {
            return Ok(());
        }
        let set = others
            .iter()
            .enumerate()
            .map(|(n, i)| format!("{} = ?{}", quote(&cols[*i]), n + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let cond = key_at
            .iter()
            .enumerate()
            .map(|(n, i)| format!("{} IS ?{}", quote(&cols[*i]), others.len() + n + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        let params: Vec<&Val> = others
            .iter()
            .chain(key_at.iter())
            .map(|i| &values[*i])
            .collect();
        self.target
            .prepare_cached(&format!(
                "UPDATE main.{} SET {set} WHERE {cond}",
                quote(&live.name)
            ))
            .and_then(|mut s| s.execute(params_from_iter(params)))
            .map_err(|e| self.write_error(e, &live.name))?;
        Ok(())
    }

    fn write_error(&self, e: rusqlite::Error, table: &str) -> RecoverError {
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
        RecoverError::sqlite(self.target_path, format!("insert into {table}"), e)
    }
}

fn same_value(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Real(x), Val::Real(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

fn table_has_rows(conn: &Connection, table: &Table) -> bool {
    conn.query_row(
        &format!("SELECT EXISTS (SELECT 1 FROM main.{})", quote(&table.name)),
        [],
        |r| r.get(0),
    )
    .unwrap_or(true)
}

/// Every row of `PRAGMA foreign_key_check`, as `table rowid → parent`.
pub(crate) fn foreign_key_violations(conn: &Connection) -> rusqlite::Result<HashSet<String>> {
    let mut stmt = conn.prepare("PRAGMA main.foreign_key_check")?;
    let rows = stmt.query_map([], |r| {
        Ok(format!(
            "{} rowid {} → {}",
            r.get::<_, String>(0)?,
            r.get::<_, Option<i64>>(1)?
                .map_or("-".to_owned(), |i| i.to_string()),
            r.get::<_, String>(2)?
        ))
    })?;
    rows.collect()
}
