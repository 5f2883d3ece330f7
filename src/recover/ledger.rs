//! The record, in the live database, of the captures whose rows were inserted.
//!
//! A row the captured generation added cannot be told, once merged, from a row of the newer
//! generation with the same content: so the merge records, in its own transaction, that a
//! capture's added rows are in (`hermes_guard_merges`, one row per captured generation), and a
//! later run does not insert them again. Updates and deletions need no record: they are judged
//! against the live row each time.

use rusqlite::{params, Connection, OptionalExtension};

use super::report::MergeReport;
use super::schema::quote;

/// The table's name (lower case; never merged, never created from a capture).
pub(crate) const LEDGER_TABLE: &str = "hermes_guard_merges";

/// A captured generation: the sha256 of its WAL and of its main image.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub id: String,
    pub capture: String,
}

impl Generation {
    pub fn of(capture: &super::Capture) -> Generation {
        let m = capture.manifest();
        Generation {
            id: format!("wal:{} main:{}", m.wal.sha256, m.main.sha256),
            capture: crate::paths::path_display(capture.dir()),
        }
    }
}

/// When `generation`'s rows were merged into `conn`'s main database, if they were.
pub(crate) fn merged_at(
    conn: &Connection,
    generation: &Generation,
) -> rusqlite::Result<Option<String>> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?1)",
        [LEDGER_TABLE],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    conn.query_row(
        &format!(
            "SELECT merged_at FROM main.{} WHERE generation = ?1",
            quote(LEDGER_TABLE)
        ),
        [&generation.id],
        |r| r.get(0),
    )
    .optional()
}

/// Records that `generation`'s added rows are merged (inside the merge's transaction).
pub(crate) fn record(
    conn: &Connection,
    generation: &Generation,
    report: &MergeReport,
) -> rusqlite::Result<()> {
    let table = quote(LEDGER_TABLE);
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS main.{table} (
             generation TEXT PRIMARY KEY,
             capture TEXT NOT NULL,
             merged_at TEXT NOT NULL,
             inserted INTEGER NOT NULL,
             tables TEXT NOT NULL
         )"
    ))?;
    let tables: Vec<serde_json::Value> = report
        .tables
        .iter()
        .filter(|t| t.inserted > 0)
        .map(|t| serde_json::json!({"table": t.table, "inserted": t.inserted, "new_rowids": t.new_rowids}))
        .collect();
    conn.execute(
        &format!(
            "INSERT OR IGNORE INTO main.{table} (generation, capture, merged_at, inserted, tables) \
             VALUES (?1, ?2, ?3, ?4, ?5)"
        ),
        params![
            generation.id,
            generation.capture,
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            report.inserted() as i64,
            serde_json::Value::from(tables).to_string()
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recover::report::{MergeRule, TableReport};

    #[test]
    fn a_recorded_generation_is_found_and_another_is_not() {
        let conn = Connection::open_in_memory().unwrap();
        let one = Generation {
            id: "wal:aa main:bb".into(),
            capture: "/srv/state.db.retired-wal-1".into(),
        };
        let two = Generation {
            id: "wal:cc main:bb".into(),
            capture: "/srv/state.db.retired-wal-2".into(),
        };
        assert_eq!(merged_at(&conn, &one).unwrap(), None, "no table yet");
        let mut report = MergeReport::new(
            std::path::Path::new("c"),
            std::path::Path::new("d"),
            MergeRule::Delta,
            String::new(),
        );
        let mut t = TableReport::new("messages", crate::recover::RowIdentity::Rowid);
        t.inserted = 4;
        report.tables.push(t);
        record(&conn, &one, &report).unwrap();
        record(&conn, &one, &report).unwrap(); // once
        assert!(merged_at(&conn, &one).unwrap().is_some());
        assert_eq!(merged_at(&conn, &two).unwrap(), None);
        let (n, tables): (i64, String) = conn
            .query_row(
                "SELECT inserted, tables FROM hermes_guard_merges",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(n, 4);
        assert!(tables.contains("\"messages\""), "{tables}");
    }
}
