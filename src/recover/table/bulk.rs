//! The fast path of a table's added rows: when none of them lands on a rowid the live table
//! has used, they go in with one `INSERT … SELECT` inside SQLite, from the capture attached to
//! the live connection (read-only, through the unix VFS), streamed page by page.

use rusqlite::OptionalExtension;

use super::{image_from, Remaps, TableMerge};
use crate::recover::merge::{Merge, BULK_CAPTURE, BULK_IMAGE};
use crate::recover::report::RowIdentity;
use crate::recover::schema::quote;
use crate::recover::RecoverError;

impl TableMerge<'_> {
    /// Whether the added rows may go in at once: a delta applied for the first time, rows
    /// identified by rowid, no other table following them, and no parent row moved.
    pub(super) fn bulk_ready(&self, m: &Merge<'_>, remaps: &Remaps) -> bool {
        m.apply
            && !self.compare_added
            && m.merged_before.is_none()
            && !self.live_absent
            && self.identity == RowIdentity::Rowid
            && !self.referenced
            && self.follows.iter().all(|(_, p)| !remaps.has(p))
            && self.captured.rowid_name().is_some()
            && self.live.rowid_name().is_some()
    }

    /// `Ok(true)`: every added row is in. `Ok(false)`: nothing was written and the rows go
    /// one by one: a captured rowid the live table has used (up to its largest), a row the live
    /// schema refuses, or a part of the capture that cannot be read (the statement is rolled
    /// back by itself).
    pub(super) fn bulk_added(&mut self, m: &Merge<'_>) -> Result<bool, RecoverError> {
        let (Some(rid), Some(live_rid)) = (self.captured.rowid_name(), self.live.rowid_name())
        else {
            return Ok(false);
        };
        let from = format!("{BULK_CAPTURE}.{} AS a", quote(&self.captured.name));
        let filter = match self.image {
            Some(image) => format!(
                "NOT EXISTS (SELECT 1 FROM {} WHERE {})",
                image_from(BULK_IMAGE, image),
                self.matches(image)
            ),
            None => "1".to_owned(),
        };
        let live = quote(&self.live.name);
        let sq = |what: &'static str| m.sq(format!("{what} ({})", self.live.name));
        let live_max: Option<i64> = m
            .target
            .query_row(
                &format!("SELECT MAX({live_rid}) FROM main.{live}"),
                [],
                |r| r.get(0),
            )
            .map_err(sq("read the largest rowid"))?;
        let first: Option<i64> = match m
            .target
            .query_row(
                &format!("SELECT a.{rid} FROM {from} WHERE {filter} ORDER BY a.{rid} LIMIT 1"),
                [],
                |r| r.get(0),
            )
            .optional()
        {
            Ok(first) => first,
            Err(_) => return Ok(false), // read again row by row, damage and all
        };
        match (live_max, first) {
            (_, None) => return Ok(true), // nothing added
            (Some(max), Some(first)) if first <= max => return Ok(false),
            _ => {}
        }
        let mut cols: Vec<String> = self.cols.iter().map(|c| quote(c)).collect();
        let mut select = self.select_cols("a", None);
        if let Some(r) = self.rowid_col {
            cols.push(r.to_owned());
            select.push_str(&format!(", a.{rid}"));
        }
        let sql = format!(
            "INSERT INTO main.{live} ({}) SELECT {select} FROM {from} WHERE {filter} \
             ORDER BY a.{rid}",
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
