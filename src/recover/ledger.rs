//! The record, in the live database, of the captured generations whose rows were inserted, and
//! how far.
//!
//! A row the captured generation added cannot be told, once merged, from a row of the newer
//! generation with the same content: so the merge records, in its own transaction, that a
//! generation's added rows are in (`hermes_guard_merges`, one row per captured generation), and a
//! later run does not insert them again. Updates and deletions need no record: they are judged
//! against the live row each time.
//!
//! A generation is keyed by what every copy of its capture shares, damaged or not: its WAL's
//! header (salt-1, salt-2 and the checkpoint sequence: SQLite draws new salts whenever it starts
//! the WAL over, and never rewrites a committed frame until then) and the sha256 of the main image
//! that WAL was written on. The row says how far it was merged (`frames`: the WAL frames up to
//! the last commit SQLite could read), so a later copy that reaches further (the intact capture
//! after a damaged one) merges only what its later commits did. Rows written before this key
//! (`wal:<sha256 of the WAL> main:<sha256 of the image>`, no `frames`) still count: the same WAL
//! bytes are taken as merged in full.

use rusqlite::{params, Connection, OptionalExtension};

use super::report::MergeReport;
use super::schema::quote;

/// The table's name (lower case; never merged, never created from a capture).
pub(crate) const LEDGER_TABLE: &str = "hermes_guard_merges";
/// Where the rows a merge added under another rowid than their captured one went, per
/// generation (see `table::Remaps`; never merged either).
pub(crate) const MOVED_TABLE: &str = "hermes_guard_moved";

/// A captured generation, and how far this capture of it reaches.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    /// `wal-salts:<salt-1>-<salt-2> ckpt:<sequence> main:<sha256 of the image>`.
    pub id: String,
    /// The key before `frames` was recorded: `wal:<sha256 of the WAL> main:<…>`.
    pub legacy_id: String,
    /// The capture directory.
    pub capture: String,
    /// WAL frames this capture's readable commits span (to its last readable commit frame).
    pub frames: u64,
    /// Its readable commits.
    pub commits: u64,
    /// The sha256 of this capture's WAL file (which copy it was, for the record).
    pub wal_sha256: String,
}

impl Generation {
    pub fn of(capture: &super::Capture) -> Generation {
        let m = capture.manifest();
        let wal = capture.wal_check();
        let h = &wal.header;
        Generation {
            id: format!(
                "wal-salts:{:08x}-{:08x} ckpt:{} main:{}",
                h.salts[0],
                h.salts[1],
                h.checkpoint_seq,
                m.main.sha256.to_lowercase()
            ),
            legacy_id: format!("wal:{} main:{}", m.wal.sha256, m.main.sha256),
            capture: crate::paths::path_display(capture.dir()),
            frames: capture.readable_frames(),
            commits: wal.commits,
            wal_sha256: m.wal.sha256.to_lowercase(),
        }
    }
}

/// What the ledger holds of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merged {
    /// When it was last merged.
    pub at: String,
    /// How far (WAL frames); `None`: a row of the old format, whose WAL was merged in full.
    pub frames: Option<u64>,
}

/// What a merge of `generation` starts from, given what the ledger holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    /// The generation's added rows are all in already (`merged_before` in the report).
    pub merged_before: Option<String>,
    /// WAL frames already merged to take the delta against (0: the bare image).
    pub base_frames: u64,
}

impl Start {
    /// From the ledger's row: merged as far as this capture reaches → nothing to add (against
    /// the bare image, so changes and conflicts are judged again as before); merged less far →
    /// the delta from the merged prefix on; a longer prefix merged → this capture holds nothing
    /// more (the delta is empty).
    pub fn from(generation: &Generation, merged: Option<Merged>) -> Start {
        match merged {
            None => Start {
                merged_before: None,
                base_frames: 0,
            },
            Some(Merged { at, frames: None }) => Start {
                merged_before: Some(at),
                base_frames: 0,
            },
            Some(Merged {
                at,
                frames: Some(f),
            }) if f >= generation.frames => Start {
                merged_before: Some(at),
                base_frames: if f > generation.frames {
                    generation.frames
                } else {
                    0
                },
            },
            Some(Merged {
                frames: Some(f), ..
            }) => Start {
                merged_before: None,
                base_frames: f,
            },
        }
    }
}

fn table_exists(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?1)",
        [LEDGER_TABLE],
        |r| r.get(0),
    )
}

/// Whether the ledger table has the `frames` column (written by this format).
fn has_frames(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1, 'main') WHERE name = 'frames')",
        [LEDGER_TABLE],
        |r| r.get(0),
    )
}

/// What the ledger of `conn`'s main database holds of `generation`, if anything.
pub(crate) fn merged(
    conn: &Connection,
    generation: &Generation,
) -> rusqlite::Result<Option<Merged>> {
    if !table_exists(conn)? {
        return Ok(None);
    }
    let table = quote(LEDGER_TABLE);
    if has_frames(conn)? {
        let found = conn
            .query_row(
                &format!("SELECT merged_at, frames FROM main.{table} WHERE generation = ?1"),
                [&generation.id],
                |r| {
                    Ok(Merged {
                        at: r.get(0)?,
                        frames: r.get::<_, Option<i64>>(1)?.map(|f| f.max(0) as u64),
                    })
                },
            )
            .optional()?;
        if found.is_some() {
            return Ok(found);
        }
    }
    conn.query_row(
        &format!("SELECT merged_at FROM main.{table} WHERE generation = ?1"),
        [&generation.legacy_id],
        |r| {
            Ok(Merged {
                at: r.get(0)?,
                frames: None,
            })
        },
    )
    .optional()
}

/// Records (inside the merge's transaction) that `generation`'s added rows are merged up to its
/// `frames`: a new row, or the generation's row moved on to this capture's reach (`inserted`
/// summed, `tables` appended). Adds the format's columns to a table of the old format.
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
             tables TEXT NOT NULL,
             frames INTEGER,
             commits INTEGER,
             wal_sha256 TEXT
         )"
    ))?;
    if !has_frames(conn)? {
        conn.execute_batch(&format!(
            "ALTER TABLE main.{table} ADD COLUMN frames INTEGER;
             ALTER TABLE main.{table} ADD COLUMN commits INTEGER;
             ALTER TABLE main.{table} ADD COLUMN wal_sha256 TEXT;"
        ))?;
    }
    let mut tables: Vec<serde_json::Value> = conn
        .query_row(
            &format!("SELECT tables FROM main.{table} WHERE generation = ?1"),
            [&generation.id],
            |r| r.get::<_, String>(0),
        )
        .optional()?
        .and_then(|t| serde_json::from_str::<Vec<serde_json::Value>>(&t).ok())
        .unwrap_or_default();
    tables.extend(report.tables.iter().filter(|t| t.inserted > 0).map(|t| {
        serde_json::json!({"table": t.table, "inserted": t.inserted, "new_rowids": t.new_rowids})
    }));
    conn.execute(
        &format!(
            "INSERT INTO main.{table} \
             (generation, capture, merged_at, inserted, tables, frames, commits, wal_sha256) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
             ON CONFLICT (generation) DO UPDATE SET capture = excluded.capture, \
             merged_at = excluded.merged_at, inserted = inserted + excluded.inserted, \
             tables = excluded.tables, frames = excluded.frames, commits = excluded.commits, \
             wal_sha256 = excluded.wal_sha256 \
             WHERE excluded.frames > coalesce(frames, -1)"
        ),
        params![
            generation.id,
            generation.capture,
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            report.inserted() as i64,
            serde_json::Value::from(tables).to_string(),
            generation.frames as i64,
            generation.commits as i64,
            generation.wal_sha256,
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recover::report::{MergeRule, TableReport};

    fn generation(salt: u32, frames: u64, wal_sha: &str) -> Generation {
        Generation {
            id: format!("wal-salts:{salt:08x}-00000001 ckpt:0 main:bb"),
            legacy_id: format!("wal:{wal_sha} main:bb"),
            capture: "/srv/state.db.retired-wal-1".into(),
            frames,
            commits: frames / 2,
            wal_sha256: wal_sha.into(),
        }
    }

    fn report(inserted: u64) -> MergeReport {
        let mut report = MergeReport::new(
            std::path::Path::new("c"),
            std::path::Path::new("d"),
            MergeRule::Delta,
            String::new(),
        );
        let mut t = TableReport::new("messages", crate::recover::RowIdentity::Rowid);
        t.inserted = inserted;
        report.tables.push(t);
        report
    }

    #[test]
    fn a_recorded_generation_is_found_with_its_reach_and_another_is_not() {
        let conn = Connection::open_in_memory().unwrap();
        let one = generation(7, 10, "aa");
        let two = generation(8, 10, "cc");
        assert_eq!(merged(&conn, &one).unwrap(), None, "no table yet");
        record(&conn, &one, &report(4)).unwrap();
        record(&conn, &one, &report(4)).unwrap(); // the same reach: once
        assert_eq!(merged(&conn, &one).unwrap().unwrap().frames, Some(10));
        assert_eq!(merged(&conn, &two).unwrap(), None);
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

    #[test]
    fn a_copy_that_reaches_further_moves_the_row_on() {
        let conn = Connection::open_in_memory().unwrap();
        let damaged = generation(7, 6, "d1");
        let intact = generation(7, 12, "i1");
        record(&conn, &damaged, &report(3)).unwrap();
        let start = Start::from(&intact, merged(&conn, &intact).unwrap());
        assert_eq!((start.merged_before, start.base_frames), (None, 6));
        record(&conn, &intact, &report(3)).unwrap();
        let m = merged(&conn, &intact).unwrap().unwrap();
        assert_eq!(m.frames, Some(12));
        let start = Start::from(&intact, Some(m.clone()));
        assert!(start.merged_before.is_some());
        assert_eq!(
            start.base_frames, 0,
            "the same reach: against the bare image"
        );
        let start = Start::from(&damaged, Some(m));
        assert!(start.merged_before.is_some());
        assert_eq!(start.base_frames, 6, "a shorter copy: an empty delta");
        record(&conn, &damaged, &report(0)).unwrap(); // never moves the row back
        let (n, frames, sha): (i64, i64, String) = conn
            .query_row(
                "SELECT inserted, frames, wal_sha256 FROM hermes_guard_merges",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((n, frames, sha.as_str()), (6, 12, "i1"));
    }

    #[test]
    fn a_row_of_the_old_format_counts_as_merged_in_full_and_the_table_gains_the_columns() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE hermes_guard_merges (generation TEXT PRIMARY KEY, capture TEXT NOT NULL,
                 merged_at TEXT NOT NULL, inserted INTEGER NOT NULL, tables TEXT NOT NULL);
             INSERT INTO hermes_guard_merges VALUES
                 ('wal:aa main:bb', '/old', '2026-11-30T00:00:00Z', 4, '[]');",
        )
        .unwrap();
        let same_wal = generation(7, 10, "aa");
        let m = merged(&conn, &same_wal).unwrap().unwrap();
        assert_eq!(m.frames, None);
        let start = Start::from(&same_wal, Some(m));
        assert_eq!(start.merged_before.as_deref(), Some("2026-11-30T00:00:00Z"));
        assert_eq!(start.base_frames, 0);
        let other = generation(7, 10, "ee");
        assert_eq!(merged(&conn, &other).unwrap(), None);
        record(&conn, &other, &report(2)).unwrap();
        assert_eq!(merged(&conn, &other).unwrap().unwrap().frames, Some(10));
        assert!(
            merged(&conn, &same_wal).unwrap().is_some(),
            "found by its new key"
        );
    }
}
