//! What is done with each row: judged against the live row of the same identity, then
//! inserted, updated or deleted (when applied), or counted as a conflict.

use rusqlite::{params_from_iter, OptionalExtension};

use super::{Remaps, TableMerge};
use crate::recover::context::Merge;
use crate::recover::report::RowIdentity;
use crate::recover::rows::SourceRow;
use crate::recover::sql::quote;
use crate::recover::value::{same_row, same_value, Val};
use crate::recover::RecoverError;

/// `SQLITE_CONSTRAINT_PRIMARYKEY` / `SQLITE_CONSTRAINT_ROWID`: the rowid is taken.
fn rowid_taken(e: &rusqlite::Error) -> bool {
    e.sqlite_error().is_some_and(|s| {
        s.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            || s.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_ROWID
    })
}

/// A constraint of the live schema refused the row (UNIQUE, NOT NULL, CHECK, a trigger's
/// RAISE).
fn refused(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation)
}

impl TableMerge<'_> {
    /// A row the captured generation added (under the whole rule: any row of the capture).
    pub(super) fn added(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        row: SourceRow,
    ) -> Result<(), RecoverError> {
        self.report.added += 1;
        let mut values = row.values;
        let rowid = self.rowid_of(&values, row.rowid);
        let orphan = self.translate(m, remaps, &mut values)?;
        if self.identity == RowIdentity::Rowid {
            if m.merged_before.is_some() {
                self.report.already_live += 1;
                return Ok(());
            }
            if self.policy.compare_added && self.moved_here_before(m, remaps, &values, rowid)? {
                self.report.already_live += 1;
                return Ok(());
            }
            let mut taken = false;
            if self.policy.compare_added {
                match self.live_row(m, &values, rowid)? {
                    Some(live) if same_row(&live, &values) => {
                        self.report.already_live += 1;
                        return Ok(());
                    }
                    Some(_) => taken = true,
                    None => {}
                }
            }
            return self.insert(m, remaps, values, rowid, orphan, taken);
        }
        match self.live_row(m, &values, rowid)? {
            None => self.insert(m, remaps, values, rowid, orphan, false),
            Some(live) if same_row(&live, &values) => {
                self.report.already_live += 1;
                Ok(())
            }
            Some(_) => {
                self.conflict(&values, rowid);
                if self.take_capture(m) && !orphan {
                    self.update(m, &values, rowid)?;
                    self.report.replaced += 1;
                }
                Ok(())
            }
        }
    }

    /// A row the captured generation changed: `row.before` is the image's.
    pub(super) fn changed(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        row: SourceRow,
    ) -> Result<(), RecoverError> {
        self.report.changed += 1;
        let mut before = row.before.unwrap_or_default();
        let mut values = row.values;
        let mut rowid = self.rowid_of(&values, row.rowid);
        let captured_rowid = rowid;
        if !self.follow_own_move(m, remaps, &mut rowid, &mut [&mut values, &mut before])? {
            return Ok(());
        }
        let orphan = self.translate(m, remaps, &mut values)?;
        if self.policy.add_only {
            let moved = rowid != captured_rowid;
            return self.changed_add_only(m, remaps, values, before, rowid, orphan, moved);
        }
        match self.live_row(m, &values, rowid)? {
            Some(live) if same_row(&live, &values) => self.report.already_live += 1,
            Some(live) if self.as_in_image(&live, &before) => {
                if orphan {
                    self.report.rejected += 1;
                    return Ok(());
                }
                self.report.to_update += 1;
                if m.apply {
                    self.update(m, &values, rowid)?;
                    self.report.updated += 1;
                }
            }
            live => {
                // The newer generation changed or deleted it too.
                self.conflict(&values, rowid);
                if self.take_capture(m) && !orphan {
                    if live.is_some() {
                        self.update(m, &values, rowid)?;
                    } else {
                        self.exec_insert(m, &values, rowid)
                            .map_err(|e| m.write_error(e, &self.live.name))?;
                    }
                    self.report.replaced += 1;
                }
            }
        }
        Ok(())
    }

    /// A row of the image the captured generation deleted: `row.values` are the image's.
    pub(super) fn deleted(
        &mut self,
        m: &Merge<'_>,
        remaps: &Remaps,
        mut row: SourceRow,
    ) -> Result<(), RecoverError> {
        self.report.deleted += 1;
        let mut rowid = self.rowid_of(&row.values, row.rowid);
        if !self.follow_own_move(m, remaps, &mut rowid, &mut [&mut row.values])? {
            return Ok(());
        }
        let Some(live) = self.live_row(m, &row.values, rowid)? else {
            return Ok(()); // gone from the live database too
        };
        if self.policy.add_only {
            self.undecided(m, &row.values, None, Some(&live), rowid, None);
            return Ok(());
        }
        let referenced = self.still_referenced(m, &row.values, rowid)?;
        if self.as_in_image(&live, &row.values) && !referenced {
            self.report.to_delete += 1;
            if m.apply {
                self.delete(m, &row.values, rowid)?;
                self.report.removed += 1;
            }
            return Ok(());
        }
        // Changed by the newer generation, or still referred to by its rows.
        self.conflict(&row.values, rowid);
        if self.take_capture(m) && !referenced {
            self.delete(m, &row.values, rowid)?;
            self.report.replaced += 1;
        }
        Ok(())
    }

    /// A row an earlier merge of this generation added under another rowid (the captured one
    /// was taken), changed or deleted by the commits after that merge: `rowid` and the alias
    /// column of `rows` become the rowid it was given. `false`: the live schema refused it then,
    /// so it is not live (counted as rejected).
    pub(super) fn follow_own_move(
        &mut self,
        m: &Merge<'_>,
        remaps: &Remaps,
        rowid: &mut Option<i64>,
        rows: &mut [&mut Vec<Val>],
    ) -> Result<bool, RecoverError> {
        let (RowIdentity::Rowid, Some(old)) = (self.identity, *rowid) else {
            return Ok(true);
        };
        match remaps
            .lookup(m.target, &self.lname(), old)
            .map_err(m.sq("look up a moved row"))?
        {
            None => Ok(true),
            Some(None) => {
                self.report.rejected += 1;
                Ok(false)
            }
            Some(Some(new)) => {
                *rowid = Some(new);
                if let Some(at) = self.alias_at {
                    for values in rows.iter_mut() {
                        if let Some(v) = values.get_mut(at) {
                            *v = Val::Int(new);
                        }
                    }
                }
                Ok(true)
            }
        }
    }

    /// Under a rule that compares added rows with the live ones: an earlier merge of this
    /// generation (another capture of it) put this row under another rowid, and it is there
    /// with the same content. Without this, a `whole` merge after a delta merge of the same
    /// generation would insert those rows a second time.
    fn moved_here_before(
        &self,
        m: &Merge<'_>,
        remaps: &Remaps,
        values: &[Val],
        rowid: Option<i64>,
    ) -> Result<bool, RecoverError> {
        let Some(old) = rowid else {
            return Ok(false);
        };
        let Some(Some(new)) = remaps
            .lookup(m.target, &self.lname(), old)
            .map_err(m.sq("look up a moved row"))?
        else {
            return Ok(false);
        };
        let mut moved = values.to_vec();
        if let Some(v) = self.alias_at.and_then(|at| moved.get_mut(at)) {
            *v = Val::Int(new);
        }
        Ok(self
            .live_row(m, &moved, Some(new))?
            .is_some_and(|live| same_row(&live, &moved)))
    }

    /// The live row of the same identity, as the merged columns.
    pub(super) fn live_row(
        &self,
        m: &Merge<'_>,
        values: &[Val],
        rowid: Option<i64>,
    ) -> Result<Option<Vec<Val>>, RecoverError> {
        if self.live_absent {
            return Ok(None);
        }
        let (_, params) = self.identify(values, rowid, 1);
        if params.is_empty() {
            return Ok(None);
        }
        let sql = &self.live_sql;
        let n = self.cols.len();
        m.target
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_row(params_from_iter(params), |r| {
                    (0..n).map(|i| r.get_ref(i).map(Val::from)).collect()
                })
                .optional()
            })
            .map_err(m.sq(format!("look up {}", self.live.name)))
    }

    /// `WHERE` condition and parameters (numbered from `first`) naming the row: its rowid, or
    /// its declared key. No parameters: the row has no usable identity.
    fn identify(&self, values: &[Val], rowid: Option<i64>, first: usize) -> (String, Vec<Val>) {
        match self.identity {
            RowIdentity::Rowid => match (rowid, self.live.rowid_name()) {
                (Some(r), Some(name)) => (format!("{name} = ?{first}"), vec![Val::Int(r)]),
                _ => (String::new(), Vec::new()),
            },
            RowIdentity::PrimaryKey => (
                self.key_at
                    .iter()
                    .enumerate()
                    .map(|(n, i)| format!("{} IS ?{}", quote(&self.cols[*i]), first + n))
                    .collect::<Vec<_>>()
                    .join(" AND "),
                self.key_at.iter().map(|i| values[*i].clone()).collect(),
            ),
        }
    }

    /// The live row is as the image had it, in every column the image has.
    fn as_in_image(&self, live: &[Val], before: &[Val]) -> bool {
        live.len() == before.len()
            && self.src_cols.iter().enumerate().all(|(i, c)| {
                self.image.is_some_and(|img| !img.has_column(c)) || same_value(&live[i], &before[i])
            })
    }

    /// Inserts `values` under the captured rowid, or a fresh one when it is taken.
    pub(super) fn insert(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        mut values: Vec<Val>,
        rowid: Option<i64>,
        orphan: bool,
        taken: bool,
    ) -> Result<(), RecoverError> {
        self.report.to_insert += 1;
        let follow = self.referenced && self.identity == RowIdentity::Rowid;
        let record = follow || (remaps.records() && self.identity == RowIdentity::Rowid);
        if orphan {
            self.report.rejected += 1;
            if let (true, Some(old)) = (record, rowid) {
                remaps
                    .record(m.target, &self.lname(), old, None, follow)
                    .map_err(m.sq("record a refused row"))?;
            }
            return Ok(());
        }
        if !m.apply {
            return Ok(());
        }
        let rowid_identity = self.identity == RowIdentity::Rowid;
        let mut keep = rowid_identity && !taken;
        let mut result = if rowid_identity && taken {
            let fresh = self.fresh_rowid(m, &mut values)?;
            self.exec_insert(m, &values, fresh)
        } else {
            self.exec_insert(m, &values, rowid.filter(|_| keep))
        };
        if keep && matches!(&result, Err(e) if rowid_taken(e)) {
            keep = false;
            let fresh = self.fresh_rowid(m, &mut values)?;
            result = self.exec_insert(m, &values, fresh);
        }
        match result {
            Ok(()) => {
                self.report.inserted += 1;
                if self.identity == RowIdentity::Rowid && !keep && rowid.is_some() {
                    self.report.new_rowids += 1;
                    if let (true, Some(old)) = (record, rowid) {
                        let new = m.target.last_insert_rowid();
                        remaps
                            .record(m.target, &self.lname(), old, Some(new), follow)
                            .map_err(m.sq("record a moved row"))?;
                    }
                }
                Ok(())
            }
            Err(e) if refused(&e) => {
                self.report.rejected += 1;
                if let (true, Some(old)) = (record, rowid) {
                    remaps
                        .record(m.target, &self.lname(), old, None, follow)
                        .map_err(m.sq("record a refused row"))?;
                }
                Ok(())
            }
            Err(e) => Err(m.write_error(e, &self.live.name)),
        }
    }

    /// A rowid above every rowid of the live table and of the captured one, so that no later
    /// captured row finds its own rowid taken by a moved one: set in the alias column, or
    /// returned for the `rowid` column.
    fn fresh_rowid(
        &mut self,
        m: &Merge<'_>,
        values: &mut [Val],
    ) -> Result<Option<i64>, RecoverError> {
        let next = match self.next_fresh {
            Some(n) => n,
            None => {
                let max = |conn: &rusqlite::Connection, table: &str, rowid: &str| {
                    conn.query_row(
                        &format!("SELECT MAX({rowid}) FROM main.{}", quote(table)),
                        [],
                        |r| r.get::<_, Option<i64>>(0),
                    )
                };
                let live = self.largest_live_rowid(m)?;
                let captured = max(
                    m.source,
                    &self.captured.name,
                    self.captured.rowid_name().unwrap_or("rowid"),
                )
                .map_err(|e| RecoverError::sqlite(m.source_path, "read the largest rowid", e))?;
                live.max(captured).unwrap_or(0).saturating_add(1)
            }
        };
        self.next_fresh = Some(next.saturating_add(1));
        match self.alias_at {
            Some(at) => {
                values[at] = Val::Int(next);
                Ok(None)
            }
            None => Ok(Some(next)),
        }
    }

    /// The largest rowid of the live table (`None`: it is empty).
    pub(super) fn largest_live_rowid(&self, m: &Merge<'_>) -> Result<Option<i64>, RecoverError> {
        let rowid = self.live.rowid_name().unwrap_or("rowid");
        m.target
            .query_row(
                &format!("SELECT MAX({rowid}) FROM main.{}", quote(&self.live.name)),
                [],
                |r| r.get::<_, Option<i64>>(0),
            )
            .map_err(m.sq("read the largest rowid"))
    }

    fn lname(&self) -> String {
        self.live.name.to_lowercase()
    }

    /// `INSERT` of the merged columns; a rowid table whose rowid is not a column gets `rowid`
    /// too (`None`: a fresh one).
    fn exec_insert(
        &self,
        m: &Merge<'_>,
        values: &[Val],
        rowid: Option<i64>,
    ) -> rusqlite::Result<()> {
        let mut stmt = m.target.prepare_cached(&self.insert_sql)?;
        let extra = self.rowid_col.map(|_| rowid.map_or(Val::Null, Val::Int));
        stmt.execute(params_from_iter(values.iter().chain(extra.as_ref())))?;
        Ok(())
    }

    /// Sets every merged column but the identity's to `values`.
    pub(super) fn update(
        &self,
        m: &Merge<'_>,
        values: &[Val],
        rowid: Option<i64>,
    ) -> Result<(), RecoverError> {
        let others: Vec<usize> = (0..self.cols.len())
            .filter(|i| !self.key_at.contains(i) && Some(*i) != self.alias_at)
            .collect();
        if others.is_empty() {
            return Ok(());
        }
        let set = others
            .iter()
            .enumerate()
            .map(|(n, i)| format!("{} = ?{}", quote(&self.cols[*i]), n + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let (cond, key) = self.identify(values, rowid, others.len() + 1);
        let params: Vec<&Val> = others
            .iter()
            .map(|i| &values[*i])
            .chain(key.iter())
            .collect();
        m.target
            .prepare_cached(&format!(
                "UPDATE main.{} SET {set} WHERE {cond}",
                quote(&self.live.name)
            ))
            .and_then(|mut s| s.execute(params_from_iter(params)))
            .map_err(|e| m.write_error(e, &self.live.name))?;
        Ok(())
    }

    pub(super) fn delete(
        &self,
        m: &Merge<'_>,
        values: &[Val],
        rowid: Option<i64>,
    ) -> Result<(), RecoverError> {
        let (cond, key) = self.identify(values, rowid, 1);
        m.target
            .prepare_cached(&format!(
                "DELETE FROM main.{} WHERE {cond}",
                quote(&self.live.name)
            ))
            .and_then(|mut s| s.execute(params_from_iter(key)))
            .map_err(|e| m.write_error(e, &self.live.name))?;
        Ok(())
    }

    /// A live row still refers to this one (a foreign key of the live schema).
    pub(super) fn still_referenced(
        &self,
        m: &Merge<'_>,
        values: &[Val],
        rowid: Option<i64>,
    ) -> Result<bool, RecoverError> {
        for r in &self.referrers {
            let value = match r.to_at {
                Some(at) => values[at].clone(),
                None => rowid.map_or(Val::Null, Val::Int),
            };
            if value == Val::Null {
                continue;
            }
            let sql = format!(
                "SELECT EXISTS (SELECT 1 FROM main.{} WHERE {} = ?1)",
                quote(&r.child),
                quote(&r.from)
            );
            let found: bool = m
                .target
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_row([&value], |row| row.get(0)))
                .map_err(m.sq(format!(
                    "look up rows of {} referring to {}",
                    r.child, self.live.name
                )))?;
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
