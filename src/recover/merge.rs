//! The merge: which tables, in which order, and what is created first. The rules are in
//! docs/merge-rules.md; what a merge works with is [`Merge`] (`context.rs`); one table's rows
//! are merged by [`super::table`].

use std::collections::HashSet;

use rusqlite::Connection;

pub(crate) use super::context::Merge;
use super::ledger;
use super::objects;
use super::policy::RowSource;
use super::report::{MergeReport, NotMerged, Progress};
use super::schema::{Schema, Table};
use super::sql::quote;
use super::table::{Remaps, TableMerge};
use super::RecoverError;

impl Merge<'_> {
    /// Plans, and when `apply`, writes. The caller holds the transactions (`BEGIN IMMEDIATE` on
    /// the target to apply) and commits.
    pub fn run(self, progress: &mut dyn FnMut(&Progress<'_>)) -> Result<MergeReport, RecoverError> {
        let mut schemas = self.read_schemas()?;
        self.check_application_id()?;
        let live_empty = schemas.target.is_empty();
        let create = objects::to_create(
            self.source,
            self.target,
            live_empty,
            schemas.image.is_some(),
        )
        .map_err(self.sq("compare the schemas"))?;
        let mut report = self.start(&mut schemas, &create, live_empty)?;
        let tables = self.plan_tables(&schemas, &create, live_empty, &mut report)?;
        let mut tables = in_merge_order(tables);
        self.merge_tables(&mut tables, &mut report, progress)?;
        report.tables = tables.into_iter().map(|t| t.report).collect();
        if self.apply {
            self.finish(&schemas.target, &create, &mut report)?;
        }
        report.applied = self.apply;
        Ok(report)
    }

    /// The captured schema, the image's as the rule needs it, and the live one.
    fn read_schemas(&self) -> Result<Schemas, RecoverError> {
        let source =
            Schema::read(self.source).map_err(self.source_sq("read the captured schema"))?;
        let read_pre = || {
            Schema::read_in(self.source, "pre")
                .map_err(self.source_sq("read the captured image's schema"))
        };
        let (image, whole_base) = match self.policy().rows {
            RowSource::Whole if self.base_frames > 0 => (None, Some(read_pre()?)),
            RowSource::Whole => (None, None),
            RowSource::Delta | RowSource::Changes => (Some(read_pre()?), None),
        };
        let target = Schema::read(self.target).map_err(self.sq("read the live schema"))?;
        Ok(Schemas {
            source,
            image,
            whole_base,
            target,
        })
    }

    /// Refuses a live database that has none of the captured tables; creates the objects that
    /// exist only in the capture (when applying, then reads the live schema again); the report
    /// as far as that.
    fn start(
        &self,
        schemas: &mut Schemas,
        create: &[objects::Object],
        live_empty: bool,
    ) -> Result<MergeReport, RecoverError> {
        let (source, target) = (&schemas.source, &schemas.target);
        if !live_empty
            && !source.tables.is_empty()
            && !source
                .tables
                .keys()
                .any(|k| target.tables.contains_key(k) || creates_table(create, k))
        {
            return Err(self.different("it has none of the captured tables".into()));
        }
        let mut report = MergeReport::new(
            self.source_path,
            self.target_path,
            self.rule,
            self.rule_reason.clone(),
        );
        report.created = create
            .iter()
            .map(|o| format!("{} {}", o.kind, o.name))
            .collect();
        if self.apply && !create.is_empty() {
            objects::create(
                self.source,
                self.target,
                self.target_path,
                create,
                live_empty,
            )?;
            schemas.target = Schema::read(self.target).map_err(self.sq("read the live schema"))?;
        }
        if let Some((at, from)) = &self.merged_before {
            report.merged_before = Some(at.clone());
            report.merged_from = Some(from.clone());
        }
        report.delta_from_frame = self.base_frames;
        Ok(report)
    }

    /// The merge of each captured table the live schema can take; the others, the tables the
    /// generation dropped and the virtual tables are reported as not merged.
    fn plan_tables<'s>(
        &self,
        schemas: &'s Schemas,
        create: &[objects::Object],
        live_empty: bool,
        report: &mut MergeReport,
    ) -> Result<Vec<TableMerge<'s>>, RecoverError> {
        let (source, target) = (&schemas.source, &schemas.target);
        let mut tables: Vec<TableMerge<'_>> = Vec::new();
        let mut conflicting: Vec<String> = Vec::new();
        let mut names: Vec<&String> = source.tables.keys().collect();
        names.sort();
        for key in names {
            let captured = &source.tables[key];
            let in_image = schemas.image.as_ref().and_then(|i| i.tables.get(key));
            let (live, absent) = match target.tables.get(key) {
                Some(live) => (live, false),
                None if !self.apply && creates_table(create, key) => (captured, true),
                None => {
                    report.not_merged.push(NotMerged {
                        table: captured.name.clone(),
                        reason: "the live database has no such table (the newer generation \
                                 dropped it, or never had it)"
                            .into(),
                        leaves_rows: table_has_rows(self.source, captured),
                    });
                    continue;
                }
            };
            if let Some(why) = incompatible(captured, live) {
                conflicting.push(format!("{}: {why}", captured.name));
                report.not_merged.push(NotMerged {
                    table: captured.name.clone(),
                    reason: why,
                    leaves_rows: table_has_rows(self.source, captured),
                });
                continue;
            }
            // Only a delta reads rows through the image.
            let in_image = in_image.filter(|_| self.policy().rows == RowSource::Delta);
            let mut t = TableMerge::new(live, captured, in_image, target, self.rule, absent);
            t.set_whole_base(schemas.whole_base.as_ref().and_then(|b| b.tables.get(key)));
            tables.push(t);
        }
        if tables.is_empty() && !conflicting.is_empty() && !live_empty {
            return Err(self.different(format!("conflicting schemas: {}", conflicting.join("; "))));
        }
        if let Some(image) = &schemas.image {
            not_merged_dropped(source, image, report);
        }
        self.not_merged_virtuals(source, report);
        Ok(tables)
    }

    /// Each table's added and changed rows (parents first), then its deleted rows (children
    /// first), following and recording the rows that moved to another rowid.
    fn merge_tables(
        &self,
        tables: &mut [TableMerge<'_>],
        report: &mut MergeReport,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<(), RecoverError> {
        // Moves are recorded for a later merge of this generation that reaches further, and
        // those of earlier merges are followed.
        let generation_id = self.ledger.as_ref().map(|g| g.id.clone());
        let mut remaps = Remaps::recording(generation_id.filter(|_| self.apply));
        for key in self.ledger.iter().flat_map(|g| g.keys()) {
            remaps
                .load(self.target, key)
                .map_err(self.sq("read hermes_guard_moved"))?;
        }
        let changed = |t: &TableMerge<'_>| {
            self.changes.map(|(loaded, context)| {
                let table = loaded
                    .changes
                    .tables
                    .iter()
                    .find(|c| c.name.eq_ignore_ascii_case(&t.report.table));
                (table, context)
            })
        };
        for t in tables.iter_mut() {
            match changed(t) {
                Some((Some(c), context)) => t.merge_changed_rows(self, &mut remaps, c, context)?,
                Some((None, _)) => {}
                None => t.merge_rows(self, &mut remaps, progress)?,
            }
        }
        for t in tables.iter_mut().rev() {
            match changed(t) {
                Some((Some(c), _)) => t.merge_changed_deletions(self, &remaps, c)?,
                Some((None, _)) => {}
                None => t.merge_deletions(self, &remaps)?,
            }
        }
        if let Some((loaded, _)) = self.changes {
            report.unattributed_pages = loaded.changes.unattributed_pages.clone();
            report.change_notes = loaded.changes.notes.clone();
        }
        remaps.finish(self.target);
        Ok(())
    }

    /// After the rows are written: the full-text indexes to rebuild, and the ledger's record.
    fn finish(
        &self,
        target: &Schema,
        create: &[objects::Object],
        report: &mut MergeReport,
    ) -> Result<(), RecoverError> {
        self.rebuild_fts(target, create, report)?;
        // A first merge that inserted rows, or one that took this generation further.
        if let (Some(generation), None, true) = (
            &self.ledger,
            &self.merged_before,
            report.inserted() > 0 || self.base_frames > 0 || self.widens_to_whole,
        ) {
            ledger::record(self.target, generation, report)
                .map_err(self.sq("record the merge in hermes_guard_merges"))?;
        }
        Ok(())
    }

    fn check_application_id(&self) -> Result<(), RecoverError> {
        let app_id =
            |c: &Connection| c.query_row("PRAGMA main.application_id", [], |r| r.get::<_, i64>(0));
        let (a, b) = (
            app_id(self.source).unwrap_or(0),
            app_id(self.target).map_err(self.sq("read application_id"))?,
        );
        if a != 0 && b != 0 && a != b {
            return Err(self.different(format!(
                "application_id {b:#x} where the capture has {a:#x}"
            )));
        }
        Ok(())
    }

    fn not_merged_virtuals(&self, source: &Schema, report: &mut MergeReport) {
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
                    .unwrap_or(true)
                && !report
                    .created
                    .iter()
                    .any(|c| c.ends_with(&format!(" {}", v.name)));
            report.not_merged.push(NotMerged {
                table: v.name.clone(),
                reason,
                leaves_rows,
            });
        }
    }

    /// External-content full-text indexes whose content table changed and that no trigger of
    /// the live schema kept in step (or that were created by this merge) are rebuilt.
    fn rebuild_fts(
        &self,
        target: &Schema,
        created: &[objects::Object],
        report: &mut MergeReport,
    ) -> Result<(), RecoverError> {
        for v in &target.virtuals {
            let Some(content) = &v.content else { continue };
            let touched = report.tables.iter().any(|t| {
                t.table.eq_ignore_ascii_case(content)
                    && (t.inserted + t.updated + t.removed + t.replaced) > 0
            });
            let new = created.iter().any(|o| o.name.eq_ignore_ascii_case(&v.name));
            if touched && (new || !target.trigger_feeds(content, &v.name)) {
                let q = quote(&v.name);
                self.target
                    .execute(&format!("INSERT INTO main.{q}({q}) VALUES ('rebuild')"), [])
                    .map_err(self.sq(format!("rebuild the full-text index {}", v.name)))?;
                report.fts_rebuilt.push(v.name.clone());
            }
        }
        Ok(())
    }
}

/// The schemas a merge plans from.
struct Schemas {
    /// The captured generation's (`main` of the source).
    source: Schema,
    /// The captured image's (`pre`), under a rule that reads it.
    image: Option<Schema>,
    /// Under the `whole` rule after an earlier merge of a WAL prefix: `pre`, the image plus
    /// that prefix.
    whole_base: Option<Schema>,
    /// The live database's (read again once objects are created).
    target: Schema,
}

/// Whether the table of lower-case name `key` is among the objects to create.
fn creates_table(create: &[objects::Object], key: &str) -> bool {
    create
        .iter()
        .any(|o| o.kind == "table" && o.name.to_lowercase() == key)
}

/// The tables of the image the captured generation dropped, reported as not merged.
fn not_merged_dropped(source: &Schema, image: &Schema, report: &mut MergeReport) {
    let mut dropped: Vec<&Table> = image
        .tables
        .iter()
        .filter(|(k, _)| !source.tables.contains_key(*k))
        .map(|(_, t)| t)
        .collect();
    dropped.sort_by(|a, b| a.name.cmp(&b.name));
    for t in dropped {
        report.not_merged.push(NotMerged {
            table: t.name.clone(),
            reason: "dropped by the captured generation: a merge never drops a live table".into(),
            leaves_rows: false,
        });
    }
}

/// The tables parents first, each marked when another table follows its rowids.
fn in_merge_order(tables: Vec<TableMerge<'_>>) -> Vec<TableMerge<'_>> {
    let mut tables = parents_first(tables);
    let followed: HashSet<String> = tables
        .iter()
        .flat_map(|t| t.parents().map(str::to_owned))
        .collect();
    for t in &mut tables {
        if followed.contains(&t.report.table.to_lowercase()) {
            t.set_referenced();
        }
    }
    tables
}

/// Why the captured table cannot be merged into the live one, if it cannot.
fn incompatible(captured: &Table, live: &Table) -> Option<String> {
    let missing: Vec<&str> = captured
        .columns
        .iter()
        .filter(|c| !c.generated && !live.has_column(&c.name))
        .map(|c| c.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "the live table has no column {}",
            missing.join(", ")
        ));
    }
    if live.declared_key() != captured.declared_key()
        || live.rowid_alias().map(str::to_lowercase)
            != captured.rowid_alias().map(str::to_lowercase)
    {
        return Some("its primary key differs in the live schema".into());
    }
    None
}

/// Tables in an order where a parent comes before the tables that refer to it.
fn parents_first(mut left: Vec<TableMerge<'_>>) -> Vec<TableMerge<'_>> {
    let names: HashSet<String> = left.iter().map(|t| t.report.table.to_lowercase()).collect();
    let mut done: Vec<TableMerge<'_>> = Vec::new();
    left.sort_by(|a, b| a.report.table.cmp(&b.report.table));
    while !left.is_empty() {
        let ready = left.iter().position(|t| {
            let me = t.report.table.to_lowercase();
            t.parents_declared().all(|p| {
                p == me
                    || !names.contains(&p)
                    || done.iter().any(|d| d.report.table.to_lowercase() == p)
            })
        });
        // A cycle: take the first; its references are translated where already known.
        done.push(left.remove(ready.unwrap_or(0)));
    }
    done
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
