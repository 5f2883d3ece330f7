//! The record, in the live database, of the captured generations whose rows were inserted, and
//! how far.
//!
//! A row the captured generation added cannot be told, once merged, from a row of the newer
//! generation with the same content: so the merge records, in its own transaction, that a
//! generation's added rows are in (`hermes_guard_merges`, one row per captured generation), and a
//! later run does not insert them again. Updates and deletions need no record: they are judged
//! against the live row each time.
//!
//! A generation is keyed by what every capture of it shares, damaged or not, whichever main
//! image it holds ([`generation_id`]: its WAL header's salts, checkpoint sequence and checksum,
//! and its first frame's checksum; SQLite draws new salts whenever it starts the WAL over, and
//! never rewrites a committed frame until then). So a restore that leaves two captures of one
//! generation (the replaced main file's, and the stale WAL set aside when the application
//! reconnected) is merged once, whichever goes first. The row says how far it was
//! merged (`frames`: the WAL frames up to the last commit SQLite could read), so a later copy
//! that reaches further (the intact capture after a damaged one) merges only what its later
//! commits did, and whether a `whole` merge judged the image's rows too (`whole`). Rows written
//! under the older keys (`wal-salts:… ckpt:… main:<sha256 of the image>`; `wal:<sha256 of the
//! WAL> main:<…>`, no `frames`, taken as merged in full) still count.

use rusqlite::{params, Connection, OptionalExtension};

use super::report::MergeReport;
use super::sql::quote;

/// The table's name (lower case; never merged, never created from a capture).
pub(crate) const LEDGER_TABLE: &str = "hermes_guard_merges";
/// Where the rows a merge added under another rowid than their captured one went, per
/// generation (see `table::Remaps`; never merged either).
pub(crate) const MOVED_TABLE: &str = "hermes_guard_moved";

/// A captured generation, and how far this capture of it reaches.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    /// [`generation_id`]: what every capture of this WAL generation shares, whichever main file
    /// image it holds (or none: a stale WAL given its file with `--main`).
    pub id: String,
    /// The keys rows were written under before (`wal-salts:… ckpt:… main:<sha256 of the
    /// image>`, then `wal:<sha256 of the WAL> main:<…>`), newest first.
    pub older_ids: Vec<String>,
    /// The capture directory.
    pub capture: String,
    /// WAL frames this capture's readable commits span (to its last readable commit frame).
    pub frames: u64,
    /// Its readable commits.
    pub commits: u64,
    /// The sha256 of this capture's WAL file (which copy it was, for the record).
    pub wal_sha256: String,
}

/// The identity of the WAL generation `wal` holds (computed by the WAL reader, `walfile::generation_id`): what
/// every capture of it shares, damaged or not, whichever main image it holds. `None` for a WAL
/// SQLite reads no frame of.
pub fn generation_id(wal: &super::WalCheck) -> Option<String> {
    crate::walfile::generation_id(&wal.header, wal.first_frame_checksum)
}

impl Generation {
    pub fn of(capture: &super::Capture) -> Generation {
        let m = capture.manifest();
        let wal = capture.wal_check();
        let h = &wal.header;
        let image_sha = m.main.sha256.to_lowercase();
        let by_image = format!(
            "wal-salts:{:08x}-{:08x} ckpt:{} main:{}",
            h.salts[0], h.salts[1], h.checkpoint_seq, image_sha
        );
        let legacy = format!("wal:{} main:{}", m.wal.sha256, m.main.sha256);
        // A WAL with no readable frame has nothing to merge; its key is its bytes.
        let id = generation_id(wal).unwrap_or_else(|| legacy.clone());
        let mut older_ids = Vec::new();
        if !image_sha.is_empty() {
            older_ids.push(by_image);
        }
        if legacy != id {
            older_ids.push(legacy);
        }
        Generation {
            id,
            older_ids,
            capture: crate::paths::path_display(capture.dir()),
            frames: capture.readable_frames(),
            commits: wal.commits,
            wal_sha256: m.wal.sha256.to_lowercase(),
        }
    }

    /// Every key this generation's rows (and moved rows) may be recorded under.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.id).chain(self.older_ids.iter())
    }
}

/// What the ledger holds of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merged {
    /// When it was last merged.
    pub at: String,
    /// The capture it was merged from (the one that took it furthest).
    pub capture: String,
    /// How far (WAL frames); `None`: a row of the old format, whose WAL was merged in full.
    pub frames: Option<u64>,
    /// Whether a merge under the `whole` rule judged the generation's image rows too; a row
    /// written before this was recorded counts as whole (as it did then).
    pub whole: bool,
}

/// What a merge of `generation` starts from, given what the ledger holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    /// The generation's added rows are all in already (`merged_before` in the report): when,
    /// and from which capture.
    pub merged_before: Option<(String, String)>,
    /// WAL frames already merged to take the delta against (0: the bare image).
    pub base_frames: u64,
    /// A `whole` merge of a generation whose frames an earlier delta merged (a stale WAL's
    /// capture with `--main`): the image's rows are judged now; what the delta inserted is live
    /// under its rowid or found where it was moved. Recorded even when nothing is inserted.
    pub widens_to_whole: bool,
}

impl Start {
    /// From the ledger's row: merged as far as this capture reaches → nothing to add (against
    /// the bare image, so changes and conflicts are judged again as before); merged less far →
    /// the delta from the merged prefix on; a longer prefix merged → this capture holds nothing
    /// more (the delta is empty). A `whole` merge (`whole` true) after delta merges only of the
    /// generation is a whole merge from the image, which finds the delta's rows live.
    pub fn from(generation: &Generation, merged: Option<Merged>, whole: bool) -> Start {
        let fresh = Start {
            merged_before: None,
            base_frames: 0,
            widens_to_whole: false,
        };
        let Some(merged) = merged else {
            return fresh;
        };
        let before = Some((merged.at, merged.capture));
        match merged.frames {
            None => Start {
                merged_before: before,
                ..fresh
            },
            Some(_) if whole && !merged.whole => Start {
                widens_to_whole: true,
                ..fresh
            },
            Some(f) if f >= generation.frames => Start {
                merged_before: before,
                base_frames: if f > generation.frames {
                    generation.frames
                } else {
                    0
                },
                widens_to_whole: false,
            },
            Some(f) => Start {
                base_frames: f,
                ..fresh
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

/// Whether the ledger table has `column` (`frames` and `whole` came with later formats).
fn has_column(conn: &Connection, column: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1, 'main') WHERE name = ?2)",
        [LEDGER_TABLE, column],
        |r| r.get(0),
    )
}

/// What the ledger of `conn`'s main database holds of `generation`, if anything: under its
/// key, else under a key of an older format.
pub(crate) fn merged(
    conn: &Connection,
    generation: &Generation,
) -> rusqlite::Result<Option<Merged>> {
    if !table_exists(conn)? {
        return Ok(None);
    }
    let table = quote(LEDGER_TABLE);
    let frames = if has_column(conn, "frames")? {
        "frames"
    } else {
        "NULL"
    };
    let whole = if has_column(conn, "whole")? {
        "coalesce(whole, 1)"
    } else {
        "1"
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT merged_at, capture, {frames}, {whole} FROM main.{table} WHERE generation = ?1"
    ))?;
    for key in generation.keys() {
        let found = stmt
            .query_row([key], |r| {
                Ok(Merged {
                    at: r.get(0)?,
                    capture: r.get(1)?,
                    frames: r.get::<_, Option<i64>>(2)?.map(|f| f.max(0) as u64),
                    whole: r.get::<_, i64>(3)? != 0,
                })
            })
            .optional()?;
        if let Some(mut found) = found {
            if key.starts_with("wal:") {
                found.frames = None; // the oldest format: the same WAL bytes, merged in full
            }
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// Records (inside the merge's transaction) that `generation`'s added rows are merged up to its
/// `frames`: a new row, or the generation's row moved on to this capture's reach (`inserted`
/// summed, `tables` appended). Adds the format's columns to a table of the old format.
pub(crate) fn record(
    conn: &Connection,
    generation: &Generation,
    report: &MergeReport,
) -> rusqlite::Result<()> {
    let whole = i64::from(report.rule.policy().rows == super::policy::RowSource::Whole);
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
             wal_sha256 TEXT,
             whole INTEGER
         )"
    ))?;
    if !has_column(conn, "frames")? {
        conn.execute_batch(&format!(
            "ALTER TABLE main.{table} ADD COLUMN frames INTEGER;
             ALTER TABLE main.{table} ADD COLUMN commits INTEGER;
             ALTER TABLE main.{table} ADD COLUMN wal_sha256 TEXT;"
        ))?;
    }
    if !has_column(conn, "whole")? {
        conn.execute_batch(&format!(
            "ALTER TABLE main.{table} ADD COLUMN whole INTEGER;"
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
             (generation, capture, merged_at, inserted, tables, frames, commits, wal_sha256, \
              whole) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (generation) DO UPDATE SET capture = excluded.capture, \
             merged_at = excluded.merged_at, inserted = inserted + excluded.inserted, \
             tables = excluded.tables, frames = max(coalesce(frames, 0), excluded.frames), \
             commits = max(coalesce(commits, 0), excluded.commits), \
             wal_sha256 = excluded.wal_sha256, whole = max(coalesce(whole, 1), excluded.whole) \
             WHERE excluded.frames > coalesce(frames, -1) OR excluded.whole > coalesce(whole, 1)"
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
            whole,
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
            id: format!("wal-gen:{salt:08x}-00000001 ckpt:0 cksum:0-0 frame-1:0-0"),
            older_ids: vec![
                format!("wal-salts:{salt:08x}-00000001 ckpt:0 main:bb"),
                format!("wal:{wal_sha} main:bb"),
            ],
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
        let start = Start::from(&intact, merged(&conn, &intact).unwrap(), false);
        assert_eq!((start.merged_before, start.base_frames), (None, 6));
        record(&conn, &intact, &report(3)).unwrap();
        let m = merged(&conn, &intact).unwrap().unwrap();
        assert_eq!(m.frames, Some(12));
        let start = Start::from(&intact, Some(m.clone()), false);
        assert!(start.merged_before.is_some());
        assert_eq!(
            start.base_frames, 0,
            "the same reach: against the bare image"
        );
        let start = Start::from(&damaged, Some(m), false);
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
        let start = Start::from(&same_wal, Some(m), false);
        assert_eq!(
            start.merged_before.map(|b| b.0).as_deref(),
            Some("2026-11-30T00:00:00Z")
        );
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

    fn whole_report(inserted: u64) -> MergeReport {
        let mut r = report(inserted);
        r.rule = MergeRule::Whole;
        r
    }

    #[test]
    fn a_row_under_the_image_key_is_found_for_a_capture_of_the_same_generation() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE hermes_guard_merges (generation TEXT PRIMARY KEY, capture TEXT NOT NULL,
                 merged_at TEXT NOT NULL, inserted INTEGER NOT NULL, tables TEXT NOT NULL,
                 frames INTEGER, commits INTEGER, wal_sha256 TEXT);
             INSERT INTO hermes_guard_merges VALUES ('wal-salts:00000007-00000001 ckpt:0 main:bb',
                 '/old', '2026-11-30T00:00:00Z', 4, '[]', 10, 5, 'aa');",
        )
        .unwrap();
        let m = merged(&conn, &generation(7, 10, "zz")).unwrap().unwrap();
        assert_eq!(
            (m.frames, m.whole, m.capture.as_str()),
            (Some(10), true, "/old")
        );
    }

    #[test]
    fn a_whole_merge_after_a_delta_merge_of_the_generation_judges_the_image_once() {
        let conn = Connection::open_in_memory().unwrap();
        let g = generation(7, 10, "aa");
        record(&conn, &g, &report(3)).unwrap();
        let delta_only = merged(&conn, &g).unwrap().unwrap();
        assert!(!delta_only.whole);
        let again = Start::from(&g, Some(delta_only.clone()), false);
        assert!(
            again.merged_before.is_some(),
            "another delta: nothing to add"
        );
        let widen = Start::from(&g, Some(delta_only), true);
        assert_eq!(
            (
                widen.merged_before,
                widen.base_frames,
                widen.widens_to_whole
            ),
            (None, 0, true)
        );
        record(&conn, &g, &whole_report(0)).unwrap();
        let both = merged(&conn, &g).unwrap().unwrap();
        assert_eq!((both.whole, both.frames), (true, Some(10)));
        assert!(Start::from(&g, Some(both.clone()), true)
            .merged_before
            .is_some());
        assert!(Start::from(&g, Some(both), false).merged_before.is_some());
    }
}
