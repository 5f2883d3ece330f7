//! Recovery: from a capture back into the live database.
//!
//! ```no_run
//! use hermes_guard::recover::{self, Capture, MergeOptions};
//! let capture = Capture::open("state.db.retired-wal-20261129-031502-4242")?;
//! let plan = recover::plan(&capture, "state.db".as_ref(), &MergeOptions::default())?;
//! println!("{} rows missing from the live database", plan.missing());
//! let done = recover::apply(&capture, "state.db".as_ref(), &MergeOptions::default(), &mut |_| {})?;
//! println!("{} rows inserted, updated or deleted", done.changed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Capture::open`] checks a capture against its manifest (sizes, sha256) and works on a
//!   private copy; the capture directory is never changed.
//! - [`plan`] says, per table, what the captured generation changed (its WAL against the main
//!   image it was written on) that the live database lacks, and which rule applies
//!   ([`MergeRule`]); [`apply`] writes it in one `BEGIN IMMEDIATE` transaction through the
//!   guard, with `PRAGMA foreign_key_check` clean before commit, and records the capture in the
//!   live database (`hermes_guard_merges`). Running it again adds nothing.
//! - [`rebuild_torn`] rebuilds a live database the loss left torn (`main_torn`), and refuses one
//!   that is not.
//! - [`verify_capture`] verifies a capture from its bytes: the WAL read frame by frame
//!   ([`WalCheck`]) and compared with the manifest.
//!
//! The merge rules are in `docs/merge-rules.md`.

mod btree;
mod changes;
mod context;
mod error;
mod ledger;
mod merge;
mod objects;
mod open;
mod policy;
mod rebuild;
mod report;
mod rows;
mod schema;
mod siblings;
mod sql;
mod table;
mod value;
mod verify;
mod walcheck;

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

pub use changes::{
    generation_changes, ChangeCounts, ChangedRow, GenerationChangesReport, ShownValue,
    TableChangesReport, UndecidedRow as UndecidedChange, UpdatedRow,
};
pub use error::RecoverError;
pub use ledger::generation_id;
pub use open::{list_captures, read_manifest, Capture, CaptureListing};
pub use rebuild::{check_torn, rebuild_torn, RebuildReport};
pub use report::{
    ConflictPolicy, MergeOptions, MergeReport, MergeRule, NotMerged, Progress, RowIdentity,
    TableReport, Unreadable,
};
pub use verify::{
    read_heal_of, unreadable_commits, verify_capture, wal_problems, CaptureCheck, FileFound,
};
pub use walcheck::{PrefixEnd, WalCheck};

pub(crate) use context::Merge;
use context::{ChangeContext, BULK_CAPTURE, BULK_IMAGE};
pub(crate) use merge::foreign_key_violations;
use policy::RowSource;

/// What the captured generation committed that the live database `database` lacks, per table.
/// Reads only (in one read transaction through the guard); writes nothing.
pub fn plan(
    capture: &Capture,
    database: &Path,
    options: &MergeOptions,
) -> Result<MergeReport, RecoverError> {
    let conn = open_target(capture.dir(), database, options)?;
    conn.execute_batch("BEGIN")
        .map_err(|e| RecoverError::sqlite(database, "begin a read transaction", e))?;
    let result = run_merge(capture, &conn, database, options, false, false, &mut |_| {});
    let _ = conn.execute_batch("ROLLBACK");
    result
}

/// Writes what [`plan`] finds missing, in one `BEGIN IMMEDIATE` transaction on the live
/// database opened through the guard. The plan is made again inside the transaction, so what is
/// inserted is exactly what is missing at that moment (another process may have merged
/// meanwhile): running it twice, or in two processes at once, inserts each row once.
/// Refuses to commit new foreign-key violations. On any error nothing is written.
pub fn apply(
    capture: &Capture,
    database: &Path,
    options: &MergeOptions,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    let conn = open_target(capture.dir(), database, options)?;
    // The capture attached read-only through the unix VFS: tables whose added rows land on
    // rowids the live table never used take them with one INSERT … SELECT.
    let attached = attach_capture(&conn, capture);
    let result = apply_inner(capture, &conn, database, options, attached, progress);
    if attached {
        let _ = conn.execute_batch(&format!(
            "DETACH DATABASE {BULK_CAPTURE}; DETACH DATABASE {BULK_IMAGE}"
        ));
    }
    result
}

/// Attaches the capture's private copy and its image to `conn` (opened with URI filenames),
/// read-only, through the unix VFS. `false` (logged) when they cannot be.
fn attach_capture(conn: &Connection, capture: &Capture) -> bool {
    let uri = |p: &Path| {
        let mut s = String::from("file:");
        for b in p.as_os_str().as_encoded_bytes() {
            match b {
                b'%' | b'?' | b'#' => s.push_str(&format!("%{b:02X}")),
                _ => s.push(char::from(*b)),
            }
        }
        s + "?mode=ro&vfs=unix"
    };
    let ascii = |p: &Path| p.as_os_str().as_encoded_bytes().is_ascii();
    let (copy, image) = (capture.private_copy(), capture.image_copy());
    if !ascii(copy) || !ascii(&image) {
        return false;
    }
    let attach = |path: &Path, name: &str| {
        conn.execute(&format!("ATTACH DATABASE ?1 AS {name}"), [uri(path)])
    };
    match attach(copy, BULK_CAPTURE).and_then(|_| attach(&image, BULK_IMAGE)) {
        Ok(_) => true,
        Err(e) => {
            log::debug!("hermes-guard: merging row by row: the capture cannot be attached: {e}");
            let _ = conn.execute_batch(&format!("DETACH DATABASE {BULK_CAPTURE}"));
            false
        }
    }
}

/// [`apply`] on a connection the caller opened (through the guard) on `database`.
pub fn apply_on(
    capture: &Capture,
    conn: &Connection,
    database: &Path,
    options: &MergeOptions,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    apply_inner(capture, conn, database, options, false, progress)
}

/// [`apply`]'s merge inside a write transaction the caller holds: `conn` is a connection the
/// caller opened through the guard on `database` and began with `BEGIN IMMEDIATE`. Writes what
/// is missing, records the capture in `hermes_guard_merges` and refuses new foreign-key
/// violations, but neither commits nor rolls back: the caller adds its own writes to the same
/// transaction (the session store marks the capture healed in it) and commits, or rolls back on
/// an error.
pub fn merge_in_transaction(
    capture: &Capture,
    conn: &Connection,
    database: &Path,
    options: &MergeOptions,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    merge_checked(capture, conn, database, options, false, progress)
}

/// The merge, with `PRAGMA foreign_key_check` before and after: new violations are refused.
fn merge_checked(
    capture: &Capture,
    conn: &Connection,
    database: &Path,
    options: &MergeOptions,
    bulk: bool,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    let before = foreign_key_violations(conn)
        .map_err(|e| RecoverError::sqlite(database, "foreign_key_check", e))?;
    let report = run_merge(capture, conn, database, options, true, bulk, progress)?;
    let after = foreign_key_violations(conn)
        .map_err(|e| RecoverError::sqlite(database, "foreign_key_check", e))?;
    let mut new: Vec<String> = after.difference(&before).cloned().collect();
    if !new.is_empty() {
        new.sort();
        return Err(RecoverError::ForeignKeys {
            database: database.to_path_buf(),
            violations: new,
        });
    }
    Ok(report)
}

fn apply_inner(
    capture: &Capture,
    conn: &Connection,
    database: &Path,
    options: &MergeOptions,
    bulk: bool,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| {
        let operation = format!(
            "take the write lock (BEGIN IMMEDIATE, waited up to {:?})",
            options.busy_timeout
        );
        RecoverError::sqlite(database, operation, e)
    })?;
    let result: Result<MergeReport, RecoverError> = (|| {
        let report = merge_checked(capture, conn, database, options, bulk, progress)?;
        conn.execute_batch("COMMIT")
            .map_err(|e| RecoverError::sqlite(database, "commit the merge", e))?;
        Ok(report)
    })();
    if result.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let report = result?;
    if report.changed() > 0 {
        log::warn!(
            "hermes-guard: merged {} row(s) from the capture {} into {} ({})",
            report.changed(),
            capture.dir().display(),
            database.display(),
            summary(&report)
        );
    }
    Ok(report)
}

fn run_merge(
    capture: &Capture,
    conn: &Connection,
    database: &Path,
    options: &MergeOptions,
    apply: bool,
    bulk: bool,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    if capture.heal().is_healed() {
        // Its rows are in the live file already (the close healed them back into it, as the
        // capture records): merging them again would add every added row a second time.
        let (rule, why) = rule_for(capture, database);
        let mut report = MergeReport::new(capture.dir(), database, rule, why);
        report.applied = apply;
        report.healed_at_close = Some(capture.heal().describe());
        report.capture_integrity = capture.integrity().to_vec();
        return Ok(report);
    }
    let (rule, rule_reason) = rule_for(capture, database);
    let (generation, start, healed) = ledger_start(capture, conn, database, rule)?;
    if let Some(healed) = healed.as_ref().filter(|h| h.frames >= generation.frames) {
        // Another capture of this generation was healed into the live file as far as this one
        // reaches: its rows are live, as for a capture healed itself.
        let mut report = MergeReport::new(capture.dir(), database, rule, rule_reason);
        report.applied = apply;
        report.healed_by = Some(healed.capture.clone());
        report.healed_at_close = Some(format!(
            "this WAL generation was healed into the live file at close from another capture \
             of it, {} ({}, {} frame(s), as far as this capture's {})",
            healed.capture, healed.at, healed.frames, generation.frames
        ));
        report.capture_integrity = capture.integrity().to_vec();
        return Ok(report);
    }
    let loaded = match rule.policy().rows {
        RowSource::Changes => Some(changes::load(capture.dir(), start.base_frames)?),
        RowSource::Delta | RowSource::Whole => None,
    };
    let context = loaded.as_ref().map(|l| ChangeContext {
        shared_wal: wal_read_by_newer(capture.manifest()),
        backfill_known: l.backfill_known,
    });
    let source = capture.connection();
    let _ = source.execute_batch("BEGIN");
    let merge = Merge {
        source,
        source_path: capture.dir(),
        target: conn,
        target_path: database,
        options,
        apply,
        rule,
        rule_reason,
        ledger: Some(generation),
        merged_before: start.merged_before,
        base_frames: start.base_frames,
        // The attached image is the bare one: a delta from a merged prefix goes row by row.
        bulk: bulk && start.base_frames == 0 && rule.policy().bulk_insert,
        widens_to_whole: start.widens_to_whole,
        changes: loaded.as_ref().zip(context),
    };
    let result = merge.run(progress);
    let _ = source.execute_batch("ROLLBACK");
    let mut report = result?;
    report.capture_integrity = capture.integrity().to_vec();
    report.healed_by = healed.map(|h| h.capture);
    Ok(report)
}

/// What the ledger of `conn` (inside the merge's transaction) holds of the capture's
/// generation, and `pre` made what the delta is taken against: the bare image, or the image
/// plus the WAL prefix an earlier merge of this generation took (docs/merge-rules.md). A heal
/// of the generation into the live file by another capture of it counts as a merge up to the
/// frames it healed (`siblings.rs`), returned when it reaches further than the ledger's row.
pub(crate) fn ledger_start(
    capture: &Capture,
    conn: &Connection,
    database: &Path,
    rule: MergeRule,
) -> Result<
    (
        ledger::Generation,
        ledger::Start,
        Option<siblings::SiblingHeal>,
    ),
    RecoverError,
> {
    let generation = ledger::Generation::of(capture);
    let mut merged = ledger::merged(conn, &generation)
        .map_err(|e| RecoverError::sqlite(database, "read hermes_guard_merges", e))?;
    let healed = generation_id(capture.wal_check())
        .and_then(|id| siblings::healed_elsewhere(capture, &id, database))
        .filter(|h| match &merged {
            None => true,
            // A row of the oldest format was merged in full; else the further reach counts.
            Some(m) => m.frames.is_some_and(|f| f < h.frames),
        });
    if let Some(h) = &healed {
        merged = Some(ledger::Merged {
            at: h.at.clone(),
            capture: h.capture.clone(),
            frames: Some(h.frames),
            whole: false,
        });
    }
    let start = ledger::Start::from(&generation, merged, rule.policy().rows == RowSource::Whole);
    capture.set_base(start.base_frames)?;
    Ok((generation, start, healed))
}

/// Which rows of `capture` are merged into `database`, and why (docs/merge-rules.md).
///
/// The delta of the captured generation (its WAL against its own main image) is what it
/// changed; it applies when the live file descends from that image: the capture is of a lost
/// `-wal`/`-shm`, and the live file is the very file the capture was taken of (same device and
/// inode). Otherwise the whole captured generation is compared with the live rows.
pub(crate) fn rule_for(capture: &Capture, database: &Path) -> (MergeRule, String) {
    let m = capture.manifest();
    if m.is_main_replaced() {
        return (
            MergeRule::Whole,
            "the main file was replaced under the captured generation (a restore): the live file \
             does not descend from the captured image, so what that generation changed since \
             the live file's past is not known"
                .into(),
        );
    }
    if m.reason == Some(crate::status::RetireReason::StaleWal) {
        return (
            MergeRule::Delta,
            "a stale WAL set aside at the open, with the file it was written on (--main): what its \
             generation changed on that file is merged into the live file (rows the live file \
             lacks from before that generation are not: that is the restore)"
                .into(),
        );
    }
    let live = crate::identity::identity_of_path(database).ok().flatten();
    if live.is_none() || live != m.main.identity {
        return (
            MergeRule::Whole,
            "the live file is not the file the capture was taken of (another inode): it may not \
             descend from the captured image"
                .into(),
        );
    }
    let base_ignored = crate::testing::seam::capture_base_ignored();
    let changes_ignored = crate::testing::seam::changes_ignored();
    if m.base_verdict() != crate::capture::BaseVerdict::Own && !base_ignored {
        if m.base_pages.is_some() && !changes_ignored {
            return (
                MergeRule::Changes,
                "the capture cannot show that its main image is the file its WAL generation was \
                 written on (see its base), but it holds the base of every page its WAL carries \
                 (<file>-base): what that generation itself inserted, updated and deleted is \
                 read from those pages, and applied only where the live row is still as that \
                 generation found it"
                    .into(),
            );
        }
        return (
            MergeRule::AddOnly,
            "the capture cannot show that its main image is the file its WAL generation was \
             written on (see its base): a newer generation may have checkpointed into that file \
             before the capture read it, so a row of the image that the WAL changed or removed \
             may be the newer generation's; only rows the live database lacks are added"
                .into(),
        );
    }
    if matches!(
        capture.heal(),
        crate::capture::HealState::Undetermined { .. }
    ) {
        return (
            MergeRule::DeltaSharedWal,
            "a heal at close was interrupted and nothing shows whether it reached the live file \
             (its staging file is gone): read as rolled back, each added row compared with the \
             live row of its rowid, so a row the heal did put back is not inserted twice"
                .into(),
        );
    }
    if m.main_torn {
        return (
            MergeRule::DeltaSharedWal,
            "the loss left the live file torn: a checkpoint had copied part of the captured WAL \
             into it (see recover --rebuild)"
                .into(),
        );
    }
    match m.path_generation_at_capture.wal {
        None => (
            MergeRule::Delta,
            "the -wal was gone from the path when the capture was taken: the live database \
             descends from the captured image and never read the captured WAL"
                .into(),
        ),
        Some(at_path) if at_path == m.wal.identity => (
            MergeRule::DeltaSharedWal,
            "the captured WAL was still at the path when the capture was taken (its -shm was \
             lost): the newer generation read its commits"
                .into(),
        ),
        Some(_) => (
            MergeRule::DeltaSharedWal,
            "another -wal was at the path when the capture was taken: the newer generation may \
             have read a copy of some captured commits"
                .into(),
        ),
    }
}

/// Whether the newer generation may have read the captured commits: the captured WAL itself was
/// at the path when the capture was taken (a lost `-shm`), or a WAL with its salts (a copy of
/// it put in place). Another WAL there is the newer generation's own, which it started after
/// the loss.
fn wal_read_by_newer(m: &crate::capture::Manifest) -> bool {
    let at_path = &m.path_generation_at_capture;
    at_path.wal == Some(m.wal.identity)
        || (at_path.wal.is_some() && at_path.wal_salts == Some(m.wal.header.salts))
}

/// `table +n ~n -n` for each table that changed.
pub fn summary(report: &MergeReport) -> String {
    let parts: Vec<String> = report
        .tables
        .iter()
        .filter(|t| {
            t.inserted + t.to_insert + t.updated + t.to_update + t.removed + t.to_delete > 0
        })
        .map(|t| {
            let mut s = format!("{} +{}", t.table, t.inserted.max(t.to_insert));
            if t.updated.max(t.to_update) > 0 {
                s += &format!(" ~{}", t.updated.max(t.to_update));
            }
            if t.removed.max(t.to_delete) > 0 {
                s += &format!(" -{}", t.removed.max(t.to_delete));
            }
            s
        })
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

/// Checks that `database` can receive a merge from the capture in `capture_dir`: it exists, is
/// an SQLite database, and is not inside the capture.
pub(crate) fn check_target(capture_dir: &Path, database: &Path) -> Result<(), RecoverError> {
    let bad = |why: &str| RecoverError::BadTarget {
        database: database.to_path_buf(),
        why: why.to_owned(),
    };
    let meta = match std::fs::metadata(database) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(
                "no such file: recovery merges into an existing database and never creates one",
            ))
        }
        Err(e) => return Err(RecoverError::io(database, "stat", e)),
    };
    if meta.is_dir() {
        return Err(bad("is a directory, not a database file"));
    }
    let canon = |p: &Path| std::fs::canonicalize(p).map_err(|e| RecoverError::io(p, "resolve", e));
    let (target, capture) = (canon(database)?, canon(capture_dir)?);
    if target.starts_with(&capture) {
        return Err(RecoverError::TargetIsCapture {
            database: database.to_path_buf(),
            capture: capture_dir.to_path_buf(),
        });
    }
    if meta.len() == 0 {
        return Ok(()); // an empty file is an empty database to SQLite
    }
    let mut header = [0u8; 16];
    let read = std::fs::File::open(database)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut header))
        .map_err(|e| RecoverError::io(database, "read the header", e))?;
    if read < 16 || &header != b"SQLite format 3\0" {
        return Err(bad(
            "is not an SQLite database (its header is not \"SQLite format 3\")",
        ));
    }
    Ok(())
}

/// Opens the live database through the guard, for reading and writing, never creating it.
pub(crate) fn open_target(
    capture_dir: &Path,
    database: &Path,
    options: &MergeOptions,
) -> Result<Connection, RecoverError> {
    check_target(capture_dir, database)?;
    crate::register().map_err(|e| RecoverError::BadTarget {
        database: database.to_path_buf(),
        why: format!("the hermes-guard VFS could not be registered: {e}"),
    })?;
    let conn = Connection::open_with_flags_and_vfs(
        database,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
        crate::VFS_NAME,
    )
    .map_err(|e| RecoverError::sqlite(database, "open through hermes-guard", e))?;
    crate::set_busy_timeout(&conn, options.busy_timeout)
        .map_err(|e| RecoverError::sqlite(database, "set busy_timeout", e))?;
    let status = crate::GuardExt::guard_status(&conn).map_err(|e| RecoverError::BadTarget {
        database: database.to_path_buf(),
        why: format!("the guard's status could not be read: {e}"),
    })?;
    if let Some(reason) = status.reason {
        return Err(RecoverError::Retired {
            database: database.to_path_buf(),
            why: reason.describe().to_owned(),
        });
    }
    Ok(conn)
}

/// The path a capture's manifest names as its database.
pub fn captured_database(capture: &Capture) -> PathBuf {
    capture.manifest().database_path()
}
