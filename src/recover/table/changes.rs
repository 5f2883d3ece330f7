//! The changes rule (`MergeRule::Changes`): the captured generation's own inserts, updates and
//! deletes, computed from its pages (`recover::changes`), applied one by one. An insert goes in
//! under its own rowid when the live table has no row there, else under a fresh one (never
//! taken as an equal live row: the newer generation may have written the same content under
//! the same rowid); an update or delete applies only where the live row is still the row the
//! generation changed; anything else is undecided and the live row stays. A row the generation
//! did not change is never read or written.

use super::{Remaps, TableMerge};
use crate::recover::changes::{RowChange, TableChanges};
use crate::recover::context::{ChangeContext, Merge};
use crate::recover::report::RowIdentity;
use crate::recover::schema::Column;
use crate::recover::value::{same_row, Val};
use crate::recover::RecoverError;

/// Why a computed row could not be mapped onto the table's columns.
const UNREADABLE: &str = "its record could not be read from the captured pages";

impl TableMerge<'_> {
    /// The generation's inserts and updates of this table (parents first).
    pub(crate) fn merge_changed_rows(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        changes: &TableChanges,
        context: ChangeContext,
    ) -> Result<(), RecoverError> {
        let defaults = self.record_defaults(m);
        let map = |row: &RowChange| self.to_columns(row, &defaults);
        let inserts: Vec<(Option<Vec<Val>>, Option<i64>)> =
            changes.inserts.iter().map(|r| (map(r), r.rowid)).collect();
        let updates: Vec<_> = changes
            .updates
            .iter()
            .map(|(old, new)| (map(old), map(new), new.rowid))
            .collect();
        let undecided: Vec<_> = changes
            .undecided
            .iter()
            .map(|(row, why)| (map(row), row.rowid, why.clone()))
            .collect();
        self.report.unknown_base_pages = changes.unknown_base_pages.clone();
        if self.all_live_already(m, &inserts, &updates, changes, &defaults)? {
            // The live database holds every row exactly as the generation left it: it read the
            // generation (a WAL a power cut brought back to the path, replayed at the next
            // open; a merge or heal of another copy), so nothing is inserted again.
            self.report.added += inserts.len() as u64;
            self.report.changed += updates.len() as u64;
            self.report.already_live += (inserts.len() + updates.len()) as u64;
            return Ok(());
        }
        let fresh_needed = self.identity == RowIdentity::Rowid && !self.live_absent;
        if fresh_needed && self.next_fresh.is_none() && !inserts.is_empty() {
            // Fresh rowids above every live one and every inserted one, so no later insert
            // finds its own rowid taken by a moved row; never read through the capture's
            // image + WAL, which need not read as one database.
            let live = self.largest_live_rowid(m)?;
            let inserted = inserts.iter().filter_map(|(_, r)| *r).max();
            self.next_fresh = Some(live.max(inserted).unwrap_or(0).saturating_add(1));
        }
        for (values, rowid) in inserts {
            match values {
                Some(values) => self.change_insert(m, remaps, values, rowid, context)?,
                None => self.undecided(m, &[], None, None, rowid, Some(UNREADABLE)),
            }
        }
        for (old, new, rowid) in updates {
            match (old, new) {
                (Some(old), Some(new)) => self.change_update(m, remaps, old, new, rowid)?,
                _ => self.undecided(m, &[], None, None, rowid, Some(UNREADABLE)),
            }
        }
        for (values, rowid, why) in undecided {
            let values = values.unwrap_or_default();
            let live = match values.is_empty() {
                true => None,
                false => self.live_row(m, &values, self.rowid_of(&values, rowid))?,
            };
            self.undecided(m, &values, None, live.as_deref(), rowid, Some(&why));
        }
        Ok(())
    }

    /// Whether every insert and update of the table is live under its own rowid (or key) with
    /// exactly the generation's values and every delete is gone: then the live database has the
    /// generation's changes of the table. A newer generation's rows that merely repeat some of
    /// them (equal credits under the same rowids) leave the others out, and are not taken.
    #[allow(clippy::type_complexity)]
    fn all_live_already(
        &self,
        m: &Merge<'_>,
        inserts: &[(Option<Vec<Val>>, Option<i64>)],
        updates: &[(Option<Vec<Val>>, Option<Vec<Val>>, Option<i64>)],
        changes: &TableChanges,
        defaults: &[Option<Val>],
    ) -> Result<bool, RecoverError> {
        if inserts.is_empty() && updates.is_empty() {
            return Ok(false);
        }
        let final_rows = inserts
            .iter()
            .map(|(v, r)| (v, r))
            .chain(updates.iter().map(|(_, new, r)| (new, r)));
        for (values, rowid) in final_rows {
            let Some(values) = values else {
                return Ok(false);
            };
            let rowid = self.rowid_of(values, *rowid);
            match self.live_row(m, values, rowid)? {
                Some(live) if same_row(&live, values) => {}
                _ => return Ok(false),
            }
        }
        for row in &changes.deletes {
            let Some(values) = self.to_columns(row, defaults) else {
                return Ok(false);
            };
            if self
                .live_row(m, &values, self.rowid_of(&values, row.rowid))?
                .is_some()
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The generation's deletes of this table (children first).
    pub(crate) fn merge_changed_deletions(
        &mut self,
        m: &Merge<'_>,
        remaps: &Remaps,
        changes: &TableChanges,
    ) -> Result<(), RecoverError> {
        let defaults = self.record_defaults(m);
        for row in &changes.deletes {
            match self.to_columns(row, &defaults) {
                Some(values) => self.change_delete(m, remaps, values, row.rowid)?,
                None => self.undecided(m, &[], None, None, row.rowid, Some(UNREADABLE)),
            }
        }
        Ok(())
    }

    fn change_insert(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        mut values: Vec<Val>,
        read_rowid: Option<i64>,
        context: ChangeContext,
    ) -> Result<(), RecoverError> {
        self.report.added += 1;
        let rowid = self.rowid_of(&values, read_rowid);
        let orphan = self.translate(m, remaps, &mut values)?;
        if m.merged_before.is_some() {
            // An earlier merge of this generation inserted its rows (under fresh rowids where
            // theirs were taken): never a second time.
            self.report.already_live += 1;
            return Ok(());
        }
        let live = self.live_row(m, &values, rowid)?;
        if self.identity == RowIdentity::PrimaryKey {
            return match live {
                None => self.insert(m, remaps, values, rowid, orphan, false),
                // A declared key holds one row: the same row is there.
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
            };
        }
        match live {
            None => self.insert(m, remaps, values, rowid, orphan, false),
            Some(live) if same_row(&live, &values) && context.shared_wal => {
                self.report.already_live += 1;
                Ok(())
            }
            Some(live) if same_row(&live, &values) && !context.backfill_known => {
                let why = "the live row of its rowid has the same content, and the capture does \
                           not record how far a checkpoint had copied the generation before the \
                           loss: it may be the newer generation's copy of this row";
                self.undecided(m, &[], Some(&values), Some(&live), rowid, Some(why));
                Ok(())
            }
            // The rowid holds the newer generation's row, whatever its content: beside it.
            Some(_) => self.insert(m, remaps, values, rowid, orphan, true),
        }
    }

    fn change_update(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        mut old: Vec<Val>,
        mut new: Vec<Val>,
        read_rowid: Option<i64>,
    ) -> Result<(), RecoverError> {
        self.report.changed += 1;
        let mut rowid = self.rowid_of(&new, read_rowid);
        if !self.follow_own_move(m, remaps, &mut rowid, &mut [&mut new, &mut old])? {
            return Ok(());
        }
        let orphan = self.translate(m, remaps, &mut new)?;
        match self.live_row(m, &new, rowid)? {
            Some(live) if same_row(&live, &new) => self.report.already_live += 1,
            Some(live) if same_row(&live, &old) => {
                if orphan {
                    self.report.rejected += 1;
                    return Ok(());
                }
                self.report.to_update += 1;
                if m.apply {
                    self.update(m, &new, rowid)?;
                    self.report.updated += 1;
                }
            }
            live => {
                let why = match live {
                    Some(_) => "the newer generation changed this row too",
                    None => "the newer generation deleted this row",
                };
                self.undecided(m, &old, Some(&new), live.as_deref(), rowid, Some(why));
            }
        }
        Ok(())
    }

    fn change_delete(
        &mut self,
        m: &Merge<'_>,
        remaps: &Remaps,
        mut old: Vec<Val>,
        read_rowid: Option<i64>,
    ) -> Result<(), RecoverError> {
        self.report.deleted += 1;
        let mut rowid = self.rowid_of(&old, read_rowid);
        if !self.follow_own_move(m, remaps, &mut rowid, &mut [&mut old])? {
            return Ok(());
        }
        let Some(live) = self.live_row(m, &old, rowid)? else {
            return Ok(()); // gone from the live database too
        };
        if !same_row(&live, &old) {
            let why = "the newer generation changed this row";
            self.undecided(m, &old, None, Some(&live), rowid, Some(why));
            return Ok(());
        }
        if self.still_referenced(m, &old, rowid)? {
            let why = "live rows of another table still refer to it";
            self.undecided(m, &old, None, Some(&live), rowid, Some(why));
            return Ok(());
        }
        self.report.to_delete += 1;
        if m.apply {
            self.delete(m, &old, rowid)?;
            self.report.removed += 1;
        }
        Ok(())
    }

    /// The value each stored column of the captured table reads as in a record written before
    /// it was added (`ALTER TABLE … ADD COLUMN`): its default, evaluated once; `None` where the
    /// default cannot be evaluated.
    fn record_defaults(&self, m: &Merge<'_>) -> Vec<Option<Val>> {
        self.captured
            .columns
            .iter()
            .map(|c| match &c.default {
                None => Some(Val::Null),
                Some(expr) => m
                    .source
                    .query_row(&format!("SELECT {expr}"), [], |r| {
                        r.get_ref(0).map(Val::from)
                    })
                    .ok(),
            })
            .collect()
    }

    /// A computed row as the merged columns (`self.src_cols`, in order), valued as `SELECT`
    /// reads them: a REAL column's integral value stored as an integer is a real again, and a
    /// column missing from an older record takes its default (text is UTF-8 already). `None`: the
    /// record could not be read, or is longer than the table's stored columns.
    fn to_columns(&self, row: &RowChange, defaults: &[Option<Val>]) -> Option<Vec<Val>> {
        if row.values.is_empty() {
            return None;
        }
        let columns = &self.captured.columns;
        let mut order: Vec<usize> = (0..columns.len()).filter(|&i| columns[i].stored).collect();
        if self.captured.without_rowid {
            // The key's columns first, in key order, then the others in declaration order.
            order.sort_by_key(|&i| match columns[i].pk {
                0 => (1, i as i64),
                pk => (0, pk),
            });
        }
        if row.values.len() > order.len() {
            return None;
        }
        let mut by_column: Vec<Option<Val>> = vec![None; columns.len()];
        for (at, &i) in order.iter().enumerate() {
            let value = match row.values.get(at) {
                Some(v) => v.clone(),
                None => defaults.get(i).cloned().flatten()?,
            };
            by_column[i] = Some(as_selected(&columns[i], value));
        }
        self.src_cols
            .iter()
            .map(|name| {
                let i = columns.iter().position(|c| &c.name == name)?;
                by_column[i].clone()
            })
            .collect()
    }
}

/// A stored value as `SELECT` reads it from `column`: an integer in a column of REAL affinity
/// is a real (SQLite stores integral reals so).
fn as_selected(column: &Column, value: Val) -> Val {
    match value {
        Val::Int(i) if real_affinity(&column.decl_type) => Val::Real(i as f64),
        other => other,
    }
}

/// SQLite's affinity rules (section 3.1 of its datatype page), REAL only: no `INT`, no
/// `CHAR`/`CLOB`/`TEXT`, no `BLOB` and not empty, and one of `REAL`, `FLOA`, `DOUB`.
fn real_affinity(decl_type: &str) -> bool {
    let t = decl_type.to_ascii_uppercase();
    let has = |words: &[&str]| words.iter().any(|w| t.contains(w));
    !t.is_empty()
        && !has(&["INT", "CHAR", "CLOB", "TEXT", "BLOB"])
        && has(&["REAL", "FLOA", "DOUB"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_affinity_follows_sqlites_rules_in_order() {
        assert!(real_affinity("REAL"));
        assert!(real_affinity("double precision"));
        assert!(real_affinity("FLOAT"));
        assert!(!real_affinity("FLOATING POINT INTEGER")); // INT wins
        assert!(!real_affinity("CHARREAL")); // text wins
        assert!(!real_affinity(""));
        assert!(!real_affinity("NUMERIC"));
    }
}
