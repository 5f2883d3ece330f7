//! One table of a merge: its added, changed and deleted rows, each judged against the live row
//! of the same identity and written (when applied) through prepared statements.

mod act;
mod add_only;
mod bulk;
mod changes;
mod remaps;

pub(crate) use remaps::Remaps;

use super::context::Merge;
use super::policy::RowPolicy;
use super::report::{ConflictPolicy, MergeRule, Progress, RowIdentity, TableReport, Unreadable};
use super::rows::Scan;
use super::schema::{Schema, Table};
use super::sql::quote;
use super::value::Val;
use super::RecoverError;

/// A live table that refers to this one: `child.from` holds a value of this table's `to`.
struct Referrer {
    child: String,
    from: String,
    /// Position of the referenced column in the merged columns; `None`: the rowid.
    to_at: Option<usize>,
}

/// The plan of one table's merge, then its report.
pub(crate) struct TableMerge<'t> {
    /// The live table (or, when it is still to be created, the captured one).
    live: &'t Table,
    captured: &'t Table,
    /// The table in the capture's main image, when the delta is taken against it.
    image: Option<&'t Table>,
    /// Under the `whole` rule after an earlier merge of part of this generation: the table as
    /// that merged prefix left it; its rows as they were there are not merged again.
    whole_base: Option<&'t Table>,
    /// The live table does not exist yet (a plan of a table to be created): nothing is live.
    live_absent: bool,
    /// Captured columns (generated ones left out), as the live table spells them.
    cols: Vec<String>,
    /// The same columns as the capture spells them.
    src_cols: Vec<String>,
    identity: RowIdentity,
    key_at: Vec<usize>,
    /// The rowid alias among `cols`.
    alias_at: Option<usize>,
    /// The live table's rowid name, for a rowid table whose rowid is not a column.
    rowid_col: Option<&'static str>,
    /// Columns that refer to a parent's rowid, with the parent (lower case).
    follows: Vec<(usize, String)>,
    /// Other tables follow this one's rowids: moved rows are recorded.
    referenced: bool,
    referrers: Vec<Referrer>,
    /// What the merge's rule does with the rows.
    policy: RowPolicy,
    /// `INSERT` of the merged columns (and the rowid, for a rowid table whose rowid is not a
    /// column).
    insert_sql: String,
    /// `SELECT` of the merged columns of the live row of an identity (`?1`, ...).
    live_sql: String,
    /// Rows of the table in the capture's image.
    image_rows: u64,
    /// The next rowid for a row whose own is taken (see `act::fresh_rowid`).
    next_fresh: Option<i64>,
    pub report: TableReport,
}

impl<'t> TableMerge<'t> {
    /// `live` and `captured` are compatible (checked by the caller); `image` is the table in
    /// the capture's main image when the rule is a delta and the image has it.
    pub fn new(
        live: &'t Table,
        captured: &'t Table,
        image: Option<&'t Table>,
        target: &Schema,
        rule: MergeRule,
        live_absent: bool,
    ) -> TableMerge<'t> {
        let src: Vec<&str> = captured
            .columns
            .iter()
            .filter(|c| !c.generated)
            .map(|c| c.name.as_str())
            .collect();
        let cols: Vec<String> = src
            .iter()
            .map(|c| {
                live.columns
                    .iter()
                    .find(|l| l.name.eq_ignore_ascii_case(c))
                    .map_or_else(|| (*c).to_owned(), |l| l.name.clone())
            })
            .collect();
        let position = |name: &str| cols.iter().position(|c| c.eq_ignore_ascii_case(name));
        let key = live.declared_key();
        let identity = if key.is_some() {
            RowIdentity::PrimaryKey
        } else {
            RowIdentity::Rowid
        };
        let key_at: Vec<usize> = key.iter().flatten().filter_map(|k| position(k)).collect();
        let alias_at = live.rowid_alias().and_then(position);
        let rowid_col = match (identity, alias_at) {
            (RowIdentity::Rowid, None) => live.rowid_name(),
            _ => None,
        };
        let follows = rowid_references(live, target)
            .into_iter()
            .filter_map(|(from, parent)| position(&from).map(|at| (at, parent)))
            .collect();
        let lname = live.name.to_lowercase();
        let referrers = target
            .tables
            .values()
            .flat_map(|t| {
                t.foreign_keys
                    .iter()
                    .filter(|fk| fk.parent.eq_ignore_ascii_case(&lname))
                    .map(|fk| Referrer {
                        child: t.name.clone(),
                        from: fk.from.clone(),
                        to_at: match &fk.to {
                            Some(to) if Some(to.as_str()) != live.rowid_alias() => position(to),
                            _ => key_at
                                .first()
                                .copied()
                                .filter(|_| key_at.len() == 1)
                                .or(alias_at),
                        },
                    })
            })
            .collect();
        let image = image.filter(|i| {
            i.declared_key() == captured.declared_key() && i.without_rowid == captured.without_rowid
        });
        let (insert_sql, live_sql) = statements(live, &cols, rowid_col, identity, &key_at);
        TableMerge {
            image_rows: 0,
            next_fresh: None,
            insert_sql,
            live_sql,
            live,
            captured,
            policy: rule.policy(),
            image,
            whole_base: None,
            live_absent,
            cols,
            src_cols: src.into_iter().map(str::to_owned).collect(),
            identity,
            key_at,
            alias_at,
            rowid_col,
            follows,
            referenced: false,
            referrers,
            report: TableReport::new(&live.name, identity),
        }
    }

    /// The lower-case names of the parents whose rowids this table follows.
    pub fn parents(&self) -> impl Iterator<Item = &str> {
        self.follows.iter().map(|(_, p)| p.as_str())
    }

    /// The lower-case names of every table this one declares a foreign key to.
    pub fn parents_declared(&self) -> impl Iterator<Item = String> + '_ {
        self.live
            .foreign_keys
            .iter()
            .map(|fk| fk.parent.to_lowercase())
    }

    pub fn set_referenced(&mut self) {
        self.referenced = true;
    }

    /// Under the `whole` rule, after an earlier merge of this generation took a WAL prefix:
    /// `base` is the table in `pre` (the image plus that prefix); a captured row the same as its
    /// row there was merged then, and is left out.
    pub fn set_whole_base(&mut self, base: Option<&'t Table>) {
        self.whole_base = base.filter(|b| {
            self.image.is_none()
                && b.declared_key() == self.captured.declared_key()
                && b.without_rowid == self.captured.without_rowid
        });
    }

    /// Added and changed rows (parents first).
    pub fn merge_rows(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<(), RecoverError> {
        let from = format!("main.{}", quote(&self.captured.name));
        self.count_image_rows(m);
        let total = self.image_rows;
        let rowid = self.captured.rowid_name().map(|r| format!("a.{r}"));
        let a_cols = self.select_cols("a", None);
        let mut done = 0u64;
        let table = self.live.name.clone();
        let mut tick = |done: &mut u64| {
            *done += 1;
            if (*done).is_multiple_of(512) {
                progress(&Progress {
                    table: &table,
                    done: *done,
                    total: total.max(*done),
                });
            }
        };
        let (added_filter, image_from) = self.added_filter();
        let bulk = if m.bulk && self.bulk_ready(m, remaps) {
            self.bulk_added(m, remaps)?
        } else {
            None
        };
        let added = Scan {
            conn: m.source,
            select: a_cols.clone(),
            from: format!("{from} AS a"),
            filter: added_filter,
            rowid: rowid.clone(),
            ncols: self.cols.len(),
            nbefore: 0,
        };
        let mut unreadable = if let Some(unreadable) = bulk {
            unreadable
        } else {
            added.for_each(&mut |row| {
                tick(&mut done);
                self.added(m, remaps, row)
            })?
        };
        if let (Some(image), Some(image_from)) = (self.image, image_from) {
            let changed = Scan {
                conn: m.source,
                select: format!("{a_cols}, {}", self.select_cols("b", Some(image))),
                from: format!("{from} AS a JOIN {image_from} ON {}", self.matches(image)),
                filter: self.differs(image),
                rowid: rowid.clone(),
                ncols: self.cols.len(),
                nbefore: self.cols.len(),
            };
            unreadable.extend(changed.for_each(&mut |row| {
                tick(&mut done);
                self.changed(m, remaps, row)
            })?);
        }
        // With an image, completed by the deletions below.
        self.report.in_capture = self.report.added;
        self.unreadable(m, unreadable);
        let n = self.image_rows + self.report.added;
        progress(&Progress {
            table: &self.live.name,
            done: n,
            total: n,
        });
        Ok(())
    }

    /// The rows of the table in the capture's image, when the delta is taken against it.
    fn count_image_rows(&mut self, m: &Merge<'_>) {
        if let Some(image) = self.image {
            self.image_rows = m
                .source
                .query_row(
                    &format!("SELECT COUNT(*) FROM pre.{}", quote(&image.name)),
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map_or(0, |n| n.max(0) as u64);
        }
    }

    /// Which captured rows (`a`) are added: those the image lacks (or, after an earlier merge
    /// of a WAL prefix under the `whole` rule, those not as that prefix left them); with the
    /// image's `FROM` when the changed rows are read against it.
    fn added_filter(&self) -> (String, Option<String>) {
        match self.image {
            Some(image) => (
                format!(
                    "NOT EXISTS (SELECT 1 FROM {} WHERE {})",
                    image_from("pre", image),
                    self.matches(image)
                ),
                Some(image_from("pre", image)),
            ),
            None => match self.whole_base {
                Some(base) => (
                    format!(
                        "NOT EXISTS (SELECT 1 FROM {} WHERE {} AND NOT {})",
                        image_from("pre", base),
                        self.matches(base),
                        self.differs(base)
                    ),
                    None,
                ),
                None => ("1".to_owned(), None),
            },
        }
    }

    /// Logs and reports the captured rows that could not be read.
    fn unreadable(&mut self, m: &Merge<'_>, unreadable: Vec<Unreadable>) {
        for u in &unreadable {
            log::warn!(
                "hermes-guard: {}: table {}: rows after rowid {:?} and before {:?} could not be \
                 read: {}",
                m.source_path.display(),
                self.live.name,
                u.after_rowid,
                u.before_rowid,
                u.error
            );
        }
        self.report.unreadable.extend(unreadable);
    }

    /// Deleted rows (children first).
    pub fn merge_deletions(&mut self, m: &Merge<'_>, remaps: &Remaps) -> Result<(), RecoverError> {
        let Some(image) = self.image else {
            return Ok(());
        };
        let deleted = Scan {
            conn: m.source,
            select: self.select_cols("b", Some(image)),
            from: image_from("pre", image),
            filter: format!(
                "NOT EXISTS (SELECT 1 FROM main.{} AS a WHERE {})",
                quote(&self.captured.name),
                self.matches(image)
            ),
            rowid: image.rowid_name().map(|r| format!("b.{r}")),
            ncols: self.cols.len(),
            nbefore: 0,
        };
        let unreadable = deleted.for_each(&mut |row| self.deleted(m, remaps, row))?;
        self.report.unreadable.extend(unreadable);
        // The image's rows, less those the generation deleted, plus those it added; those it
        // left as they were need nothing.
        let r = &mut self.report;
        let kept = self.image_rows.saturating_sub(r.deleted);
        r.in_capture = kept + r.added;
        r.already_live += kept.saturating_sub(r.changed);
        Ok(())
    }

    /// `x."c1", x."c2", ...`; columns the image lacks as NULL.
    fn select_cols(&self, alias: &str, image: Option<&Table>) -> String {
        self.src_cols
            .iter()
            .map(|c| match image {
                Some(i) if !i.has_column(c) => "NULL".to_owned(),
                _ => format!("{alias}.{}", quote(c)),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The image's row `b` is the captured row `a`: same rowid, or same declared key.
    fn matches(&self, image: &Table) -> String {
        match (
            self.identity,
            image.rowid_name(),
            self.captured.rowid_name(),
        ) {
            (RowIdentity::Rowid, Some(b), Some(a)) => format!("b.{b} = a.{a}"),
            _ => self
                .captured
                .declared_key()
                .unwrap_or_default()
                .iter()
                .map(|k| format!("b.{q} IS a.{q}", q = quote(k)))
                .collect::<Vec<_>>()
                .join(" AND "),
        }
    }

    /// `a` differs from `b` in a column both have: another value, or another storage class.
    fn differs(&self, image: &Table) -> String {
        let cmp: Vec<String> = self
            .src_cols
            .iter()
            .filter(|c| image.has_column(c))
            .map(|c| {
                let q = quote(c);
                format!("(a.{q} IS b.{q} COLLATE BINARY AND typeof(a.{q}) = typeof(b.{q}))")
            })
            .collect();
        if cmp.is_empty() {
            "0".to_owned()
        } else {
            format!("NOT ({})", cmp.join(" AND "))
        }
    }

    /// The row's rowid in the capture: its alias column, or the rowid read.
    fn rowid_of(&self, values: &[Val], read: Option<i64>) -> Option<i64> {
        match self.alias_at.map(|at| &values[at]) {
            Some(Val::Int(i)) => Some(*i),
            Some(_) => None,
            None => read,
        }
    }

    fn key_text(&self, values: &[Val], rowid: Option<i64>) -> String {
        match self.identity {
            RowIdentity::PrimaryKey => self
                .key_at
                .iter()
                .map(|i| values.get(*i).map_or("?".to_owned(), Val::to_string))
                .collect::<Vec<_>>()
                .join(", "),
            RowIdentity::Rowid => format!("rowid {}", rowid.map_or("?".into(), |r| r.to_string())),
        }
    }

    fn conflict(&mut self, values: &[Val], rowid: Option<i64>) {
        self.report.conflicts += 1;
        if self.report.conflict_keys.len() < 5 {
            let key = self.key_text(values, rowid);
            self.report.conflict_keys.push(key);
        }
    }

    fn take_capture(&self, m: &Merge<'_>) -> bool {
        // Under the add-only rule nothing live is overwritten, whatever was asked.
        !self.policy.add_only && m.apply && m.options.conflicts == ConflictPolicy::TakeCapture
    }

    /// Follows the parents' moved rows; `true` when a parent row was refused.
    fn translate(
        &self,
        m: &Merge<'_>,
        remaps: &Remaps,
        values: &mut [Val],
    ) -> Result<bool, RecoverError> {
        let mut orphan = false;
        for (at, parent) in &self.follows {
            let Val::Int(old) = values[*at] else { continue };
            match remaps
                .lookup(m.target, parent, old)
                .map_err(m.sq("look up a moved parent row"))?
            {
                Some(Some(new)) => values[*at] = Val::Int(new),
                Some(None) => orphan = true,
                None => {}
            }
        }
        Ok(orphan)
    }
}

/// The `INSERT` and the live-row `SELECT` of a table's merge.
fn statements(
    live: &Table,
    cols: &[String],
    rowid_col: Option<&str>,
    identity: RowIdentity,
    key_at: &[usize],
) -> (String, String) {
    let table = quote(&live.name);
    let quoted: Vec<String> = cols.iter().map(|c| quote(c)).collect();
    let mut insert_cols = quoted.clone();
    insert_cols.extend(rowid_col.map(str::to_owned));
    let marks = (1..=insert_cols.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let insert = format!(
        "INSERT INTO main.{table} ({}) VALUES ({marks})",
        insert_cols.join(", ")
    );
    let cond = match identity {
        RowIdentity::Rowid => format!("{} = ?1", live.rowid_name().unwrap_or("rowid")),
        RowIdentity::PrimaryKey => key_at
            .iter()
            .enumerate()
            .map(|(n, i)| format!("{} IS ?{}", quoted[*i], n + 1))
            .collect::<Vec<_>>()
            .join(" AND "),
    };
    let select = format!(
        "SELECT {} FROM main.{table} WHERE {cond}",
        quoted.join(", ")
    );
    (insert, select)
}

/// `pre."t" AS b`.
fn image_from(schema: &str, image: &Table) -> String {
    format!("{schema}.{} AS b", quote(&image.name))
}

/// `(column, parent)` of each single-column foreign key of `live` that refers to the rowid of a
/// parent without a declared key: its values follow the parent's rows.
fn rowid_references(live: &Table, target: &Schema) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for fk in &live.foreign_keys {
        let parent = fk.parent.to_lowercase();
        let Some(p) = target.tables.get(&parent) else {
            continue;
        };
        let Some(p_alias) = p.rowid_alias() else {
            continue;
        };
        if fk
            .to
            .as_deref()
            .is_none_or(|to| to.eq_ignore_ascii_case(p_alias))
        {
            out.push((fk.from.clone(), parent));
        }
    }
    out
}

#[cfg(test)]
mod tests;
