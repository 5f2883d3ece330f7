//! Where rows went when they could not keep their captured rowid: for the children that follow
//! them in this merge (a temporary table), and, when the merge is recorded in the ledger, for a
//! later merge of the same generation that reaches further (`hermes_guard_moved`, in the live
//! database): its changes and deletions of those rows, and its rows that refer to them, find
//! them under the rowids they were given.

use std::collections::HashSet;

use rusqlite::{Connection, OptionalExtension};

use crate::recover::ledger::MOVED_TABLE;
use crate::recover::sql::quote;

/// The moves of one merge, kept in a temporary table of the live connection, so memory does
/// not grow with the number of rows moved.
#[derive(Default)]
pub(crate) struct Remaps {
    tables: HashSet<String>,
    /// The generation the moves are recorded under in [`MOVED_TABLE`], when they are.
    ledger: Option<String>,
    ledger_ready: bool,
}

const REMAP_TABLE: &str = "temp.hermes_guard_remap";

impl Remaps {
    /// Moves are recorded in the live database under `generation` too.
    pub fn recording(generation: Option<String>) -> Remaps {
        Remaps {
            ledger: generation,
            ..Remaps::default()
        }
    }

    fn create(&self, conn: &Connection) -> rusqlite::Result<()> {
        if self.tables.is_empty() {
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS {REMAP_TABLE} \
                 (tbl TEXT, old INTEGER, new INTEGER, PRIMARY KEY (tbl, old)) WITHOUT ROWID"
            ))?;
        }
        Ok(())
    }

    /// The moves an earlier merge of `generation` recorded, as if made by this one.
    pub fn load(&mut self, conn: &Connection, generation: &str) -> rusqlite::Result<()> {
        let exists: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?1)",
            [MOVED_TABLE],
            |r| r.get(0),
        )?;
        if !exists {
            return Ok(());
        }
        let moved = quote(MOVED_TABLE);
        let mut stmt = conn.prepare(&format!(
            "SELECT DISTINCT tbl FROM main.{moved} WHERE generation = ?1"
        ))?;
        let tables: Vec<String> = stmt
            .query_map([generation], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if tables.is_empty() {
            return Ok(());
        }
        self.create(conn)?;
        conn.execute(
            &format!(
                "INSERT OR REPLACE INTO {REMAP_TABLE} (tbl, old, new) \
                 SELECT tbl, captured, live FROM main.{moved} WHERE generation = ?1"
            ),
            [generation],
        )?;
        self.tables.extend(tables);
        Ok(())
    }

    /// A row of `table` (lower case) under the captured rowid `old` went to `new` (`None`:
    /// refused by the live schema). `follow`: for this merge's children too.
    pub(super) fn record(
        &mut self,
        conn: &Connection,
        table: &str,
        old: i64,
        new: Option<i64>,
        follow: bool,
    ) -> rusqlite::Result<()> {
        if let Some(generation) = &self.ledger {
            let moved = quote(MOVED_TABLE);
            if !self.ledger_ready {
                conn.execute_batch(&format!(
                    "CREATE TABLE IF NOT EXISTS main.{moved} (generation TEXT NOT NULL, \
                     tbl TEXT NOT NULL, captured INTEGER NOT NULL, live INTEGER, \
                     PRIMARY KEY (generation, tbl, captured)) WITHOUT ROWID"
                ))?;
                self.ledger_ready = true;
            }
            conn.prepare_cached(&format!(
                "INSERT OR REPLACE INTO main.{moved} (generation, tbl, captured, live) \
                 VALUES (?1, ?2, ?3, ?4)"
            ))?
            .execute(rusqlite::params![generation, table, old, new])?;
        }
        if !follow {
            return Ok(());
        }
        self.create(conn)?;
        self.tables.insert(table.to_owned());
        conn.prepare_cached(&format!(
            "INSERT OR REPLACE INTO {REMAP_TABLE} (tbl, old, new) VALUES (?1, ?2, ?3)"
        ))?
        .execute(rusqlite::params![table, old, new])?;
        Ok(())
    }

    /// Whether moves are recorded in the live database (a merge with a ledger).
    pub(super) fn records(&self) -> bool {
        self.ledger.is_some()
    }

    /// `Some(Some(new))`: moved; `Some(None)`: refused by the live schema; `None`: kept.
    pub(super) fn lookup(
        &self,
        conn: &Connection,
        table: &str,
        old: i64,
    ) -> rusqlite::Result<Option<Option<i64>>> {
        if !self.tables.contains(table) {
            return Ok(None);
        }
        conn.prepare_cached(&format!(
            "SELECT new FROM {REMAP_TABLE} WHERE tbl = ?1 AND old = ?2"
        ))?
        .query_row(rusqlite::params![table, old], |r| r.get(0))
        .optional()
    }

    /// Whether rows of `table` were moved or refused.
    pub(super) fn has(&self, table: &str) -> bool {
        self.tables.contains(table)
    }

    /// Drops the temporary table.
    pub fn finish(&self, conn: &Connection) {
        if !self.tables.is_empty() {
            let _ = conn.execute_batch(&format!("DROP TABLE IF EXISTS {REMAP_TABLE}"));
        }
    }
}
