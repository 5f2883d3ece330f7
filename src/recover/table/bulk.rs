//! The fast path of a table's added rows, from the capture attached to the live connection
//! (read-only, through the unix VFS): the rows whose rowid the live table has used go one by one
//! under fresh rowids (above every rowid of both tables, so none takes another captured row's
//! own), then all the others with one `INSERT … SELECT` inside SQLite, streamed page by page.

use rusqlite::OptionalExtension;

use super::{image_from, Remaps, TableMerge};
use crate::recover::context::{Merge, BULK_CAPTURE, BULK_IMAGE};
use crate::recover::report::{RowIdentity, Unreadable};
use crate::recover::rows::Scan;
use crate::recover::sql::quote;
use crate::recover::RecoverError;

/// The captured rowids a table of the live database already used, while its rows go in.
const TAKEN: &str = "temp.hermes_guard_taken";

impl TableMerge<'_> {
    /// Whether the added rows may go in this way: a delta applied for the first time, rows
    /// identified by rowid, no other table following them, and no parent row moved.
    pub(super) fn bulk_ready(&self, m: &Merge<'_>, remaps: &Remaps) -> bool {
        m.apply
            && self.policy.bulk_insert
            && m.merged_before.is_none()
            && !self.live_absent
            && self.identity == RowIdentity::Rowid
            && !self.referenced
            && self.follows.iter().all(|(_, p)| !remaps.has(p))
            && self.captured.rowid_name().is_some()
            && self.live.rowid_name().is_some()
    }

    /// Merges the added rows: `Some` with what could not be read, or `None` when nothing was
    /// written and they go one by one from the capture's own connection (the capture cannot be
    /// read through the attachment).
    pub(super) fn bulk_added(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
    ) -> Result<Option<Vec<Unreadable>>, RecoverError> {
        let (Some(rid), Some(live_rid)) = (self.captured.rowid_name(), self.live.rowid_name())
        else {
            return Ok(None);
        };
        let from = format!("{BULK_CAPTURE}.{} AS a", quote(&self.captured.name));
        let added = match self.image {
            Some(image) => format!(
                "NOT EXISTS (SELECT 1 FROM {} WHERE {})",
                image_from(BULK_IMAGE, image),
                self.matches(image)
            ),
            None => "1".to_owned(),
        };
        let live = quote(&self.live.name);
        let live_max: Option<i64> = m
            .target
            .query_row(
                &format!("SELECT MAX({live_rid}) FROM main.{live}"),
                [],
                |r| r.get(0),
            )
            .map_err(m.sq(format!("read the largest rowid of {}", self.live.name)))?;
        let first: Option<i64> = match m
            .target
            .query_row(
                &format!("SELECT a.{rid} FROM {from} WHERE {added} ORDER BY a.{rid} LIMIT 1"),
                [],
                |r| r.get(0),
            )
            .optional()
        {
            Ok(first) => first,
            Err(_) => return Ok(None), // read row by row, damage and all
        };
        let Some(first) = first else {
            return Ok(Some(Vec::new())); // nothing added
        };
        let (select, ncols) = (self.select_cols("a", None), self.cols.len());
        let scan = |filter: String| Scan {
            conn: m.target,
            select: select.clone(),
            from: from.clone(),
            filter,
            rowid: Some(format!("a.{rid}")),
            ncols,
            nbefore: 0,
        };
        let Some(max) = live_max.filter(|max| first <= *max) else {
            // No captured rowid is taken: all at once (appended above the live rows).
            if self.insert_select(m, &from, &added, rid)? {
                return Ok(Some(Vec::new()));
            }
            return Ok(Some(
                scan(added).for_each(&mut |row| self.added(m, remaps, row))?,
            ));
        };
        // The captured rowids the live table has used (up to its largest), set aside first in
        // a temporary table: once the free rows are in, theirs are taken too.
        let listed = m.target.execute_batch(&format!(
            "DROP TABLE IF EXISTS {TAKEN}; CREATE TABLE {TAKEN} (id INTEGER PRIMARY KEY); \
             INSERT INTO {TAKEN} SELECT a.{rid} FROM {from} WHERE {added} \
             AND a.{rid} <= {max} \
             AND EXISTS (SELECT 1 FROM main.{live} AS l WHERE l.{live_rid} = a.{rid})"
        ));
        if listed.is_err() {
            // A damaged page: row by row from the capture's connection, damage and all.
            let _ = m
                .target
                .execute_batch(&format!("DROP TABLE IF EXISTS {TAKEN}"));
            return Ok(None);
        }
        let free = format!("{added} AND a.{rid} NOT IN (SELECT id FROM {TAKEN})");
        // The free rows first, appended above the live rows; then the others, one by one,
        // under fresh rowids above every rowid of both tables (appended too).
        let mut unreadable = Vec::new();
        if !self.insert_select(m, &from, &free, rid)? {
            // A row the live schema refuses, or a damaged page: the free rows one by one.
            unreadable = scan(free).for_each(&mut |row| self.added(m, remaps, row))?;
        }
        let moved = format!("{added} AND a.{rid} IN (SELECT id FROM {TAKEN})");
        unreadable.extend(scan(moved).for_each(&mut |row| self.added(m, remaps, row))?);
        m.target
            .execute_batch(&format!("DROP TABLE {TAKEN}"))
            .map_err(m.sq(format!(
                "drop the list of {}'s taken rowids",
                self.live.name
            )))?;
        Ok(Some(unreadable))
    }

    /// `INSERT … SELECT` of the captured rows `filter` selects, under their own rowids.
    /// `false`: the statement failed and was rolled back by itself (nothing written).
    fn insert_select(
        &mut self,
        m: &Merge<'_>,
        from: &str,
        filter: &str,
        rid: &str,
    ) -> Result<bool, RecoverError> {
        let mut cols: Vec<String> = self.cols.iter().map(|c| quote(c)).collect();
        let mut select = self.select_cols("a", None);
        if let Some(r) = self.rowid_col {
            cols.push(r.to_owned());
            select.push_str(&format!(", a.{rid}"));
        }
        let sql = format!(
            "INSERT INTO main.{} ({}) SELECT {select} FROM {from} WHERE {filter} ORDER BY a.{rid}",
            quote(&self.live.name),
            cols.join(", ")
        );
        match m.target.execute(&sql, []) {
            Ok(n) => {
                let n = n as u64;
                self.report.added += n;
                self.report.to_insert += n;
                self.report.inserted += n;
                Ok(true)
            }
            Err(e) => {
                let moved = e
                    .sqlite_error()
                    .is_some_and(|s| s.extended_code == rusqlite::ffi::SQLITE_READONLY_DBMOVED);
                if moved || m.target.is_autocommit() {
                    return Err(m.write_error(e, &self.live.name));
                }
                log::debug!(
                    "hermes-guard: {}: merging {} row by row: {e}",
                    m.target_path.display(),
                    self.live.name
                );
                Ok(false)
            }
        }
    }
}
