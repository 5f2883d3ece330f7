//! Recovery: from a capture back into the live database.
//!
//! ```no_run
//! use hermes_guard::recover::{self, Capture, MergeOptions};
//! let capture = Capture::open("state.db.retired-wal-20261129-031502-4242")?;
//! let plan = recover::plan(&capture, "state.db".as_ref(), &MergeOptions::default())?;
//! println!("{} rows missing from the live database", plan.missing());
//! let done = recover::apply(&capture, "state.db".as_ref(), &MergeOptions::default(), &mut |_| {})?;
//! assert_eq!(done.inserted(), plan.missing());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Capture::open`] checks a capture against its manifest (sizes, sha256) and works on a
//!   private copy; the capture directory is never changed.
//! - [`plan`] says, per table, what the captured generation committed that the live database
//!   lacks; [`apply`] inserts it in one `BEGIN IMMEDIATE` transaction through the guard, with
//!   `PRAGMA foreign_key_check` clean before commit. Running it again adds nothing.
//! - [`rebuild_torn`] rebuilds a live database the loss left torn (`main_torn`), and refuses one
//!   that is not.
//! - [`verify_capture`] verifies a capture from its bytes: the WAL read frame by frame
//!   ([`WalCheck`]) and compared with the manifest.
//!
//! The merge rules are in `docs/merge-rules.md`.

mod error;
mod heal;
mod merge;
mod open;
mod rebuild;
mod schema;
mod verify;
mod walcheck;

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

pub use error::RecoverError;
pub use heal::{Healed, HEALED_MARK_PREFIX};
pub use merge::{
    ConflictPolicy, MergeOptions, MergeReport, NotMerged, Progress, RowIdentity, TableReport,
    Unreadable,
};
pub use open::{list_captures, read_manifest, Capture, CaptureListing};
pub use rebuild::{check_torn, rebuild_torn, RebuildReport};
pub use verify::{unreadable_commits, verify_capture, wal_problems, CaptureCheck, FileFound};
pub use walcheck::{PrefixEnd, WalCheck};

#[cfg(feature = "store")]
pub(crate) use heal::heal_store;
pub(crate) use merge::{foreign_key_violations, Merge};

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
    let result = run_merge(capture, &conn, database, options, false, &mut |_| {});
    let _ = conn.execute_batch("ROLLBACK");
    result
}

/// Inserts what [`plan`] finds missing, in one `BEGIN IMMEDIATE` transaction on the live
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
    apply_on(capture, &conn, database, options, progress)
}

/// [`apply`] on a connection the caller opened (through the guard) on `database`.
pub fn apply_on(
    capture: &Capture,
    conn: &Connection,
    database: &Path,
    options: &MergeOptions,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| RecoverError::sqlite(database, "take the write lock (BEGIN IMMEDIATE)", e))?;
    let result = (|| {
        let before = foreign_key_violations(conn)
            .map_err(|e| RecoverError::sqlite(database, "foreign_key_check", e))?;
        let report = run_merge(capture, conn, database, options, true, progress)?;
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
        conn.execute_batch("COMMIT")
            .map_err(|e| RecoverError::sqlite(database, "commit the merge", e))?;
        Ok(report)
    })();
    if result.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let report = result?;
    if report.inserted() > 0 || report.tables.iter().any(|t| t.replaced > 0) {
        log::warn!(
            "hermes-guard: merged {} row(s) from the capture {} into {} ({})",
            report.inserted(),
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
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<MergeReport, RecoverError> {
    let source = capture.connection();
    let _ = source.execute_batch("BEGIN");
    let merge = Merge {
        source,
        source_path: capture.dir(),
        target: conn,
        target_path: database,
        options,
        apply,
    };
    let result = merge.run(progress);
    let _ = source.execute_batch("ROLLBACK");
    let mut report = result?;
    report.capture_integrity = capture.integrity().to_vec();
    Ok(report)
}

/// `table +n` for each table that got rows.
pub fn summary(report: &MergeReport) -> String {
    let parts: Vec<String> = report
        .tables
        .iter()
        .filter(|t| t.inserted > 0 || t.to_insert > 0)
        .map(|t| format!("{} +{}", t.table, t.inserted.max(t.to_insert)))
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
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
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
