//! Rebuilding a live database the loss left torn (`main_torn`): the capture's consistent
//! generation, plus every row the live generation added, swapped in while nobody holds the file.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, MAIN_DB};
use serde::Serialize;

use super::merge::{foreign_key_violations, Merge};
use super::open::integrity_check;
use super::report::{MergeOptions, MergeReport, MergeRule};
use super::{check_target, Capture, RecoverError};
use crate::capture::{fitted_name, DIR_STEM_MAX, FILE_STEM_MAX};
use crate::permissions::{create_dir_at_path, create_file_at_path, Permissions};

/// What [`rebuild_torn`] did.
#[derive(Debug, Clone, Serialize)]
pub struct RebuildReport {
    /// The database rebuilt.
    #[serde(serialize_with = "ser_path")]
    pub database: PathBuf,
    /// Where the torn file and its `-wal` were kept (nothing is deleted).
    #[serde(serialize_with = "ser_path")]
    pub kept: PathBuf,
    /// `PRAGMA integrity_check` of the torn live file before the rebuild.
    pub live_integrity: Vec<String>,
    /// The rows the live generation added on top of the capture, merged into the new file.
    pub from_live: MergeReport,
}

/// `fsync` of the directory `dir`: its entries made durable.
fn sync_dir(dir: &Path) -> Result<(), RecoverError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| RecoverError::io(dir.to_path_buf(), "fsync the directory", e))
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::paths::path_display(p))
}

/// Rebuilds `database` from the capture's consistent generation plus every row the live
/// generation added since (read table by table, as far as the torn file can be read), checks the
/// result (`integrity_check`, `foreign_key_check`), and swaps it in — only for a database that
/// is torn ([`check_torn`]'s rule, checked under the lock: otherwise [`RecoverError::NotTorn`]
/// and nothing changes), and only while no other
/// connection holds the database: the live file is locked exclusively first
/// (`locking_mode=EXCLUSIVE` + `BEGIN EXCLUSIVE`, which any other open connection, reading or
/// writing, blocks), and held until the new file is in place. Otherwise
/// [`RecoverError::InUse`] and nothing changes.
///
/// The torn file and its `-wal`/`-shm` are moved, not deleted, into `<name>.torn-<UTC>-<pid>/`
/// beside it.
pub fn rebuild_torn(
    capture: &Capture,
    database: &Path,
    options: &MergeOptions,
) -> Result<RebuildReport, RecoverError> {
    check_target(capture.dir(), database)?;
    let holder = lock_live(database)?;
    let live_integrity = integrity_check(&holder)
        .unwrap_or_else(|e| vec![format!("the live database cannot be checked: {e}")]);
    refuse_unless_torn(capture, database, &live_integrity)?;

    let parent = database
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = database.file_name().unwrap_or(OsStr::new("database"));
    let pid = std::process::id();
    let new = parent.join(format!(
        ".{}.rebuild-{pid}",
        fitted_name(name, DIR_STEM_MAX)
    ));
    let (permissions, from_live) = build_beside(capture, &holder, database, &new, options)?;

    // Keep the torn generation, then swap.
    let kept = keep_torn(database, parent, name, pid, &permissions)?;
    std::fs::rename(&new, database)
        .map_err(|e| RecoverError::io(new.clone(), "swap in the rebuilt file", e))?;
    sync_dir(parent)?;
    drop(holder);
    log::warn!(
        "hermes-guard: rebuilt {} from the capture {} plus {} row(s) of the live generation; the \
         torn file is kept in {}",
        database.display(),
        capture.dir().display(),
        from_live.inserted(),
        kept.display()
    );
    Ok(RebuildReport {
        database: database.to_path_buf(),
        kept,
        live_integrity,
        from_live,
    })
}

/// A stock connection to `database` holding its lock exclusively: [`RecoverError::InUse`] when
/// any other connection holds it. The guard would see its own file replaced by the swap and
/// capture the torn generation at close; the unix VFS, seeing the file moved
/// (SQLITE_FCNTL_HAS_MOVED), neither checkpoints nor deletes anything at its close.
fn lock_live(database: &Path) -> Result<Connection, RecoverError> {
    let sq = |what: &'static str| move |e| RecoverError::sqlite(database, what, e);
    let holder = Connection::open_with_flags_and_vfs(
        database,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        "unix",
    )
    .map_err(sq("open the live database"))?;
    // A refused rebuild changes nothing, not even by the checkpoint a last close would run.
    holder
        .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(sq("turn off the checkpoint at close"))?;
    crate::set_busy_timeout(&holder, std::time::Duration::ZERO).map_err(sq("busy_timeout"))?;
    let _: String = holder
        .query_row("PRAGMA locking_mode=EXCLUSIVE", [], |r| r.get(0))
        .map_err(sq("locking_mode=EXCLUSIVE"))?;
    if let Err(e) = holder.execute_batch("BEGIN EXCLUSIVE") {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) {
            return Err(RecoverError::InUse {
                database: database.to_path_buf(),
            });
        }
        return Err(RecoverError::sqlite(database, "BEGIN EXCLUSIVE", e));
    }
    Ok(holder)
}

/// Builds the rebuilt file at `new` (any leftover of an earlier attempt removed first, and the
/// file with its sidecars again when the build fails); the database's permissions it was made
/// with, and the rows merged from the live generation.
fn build_beside(
    capture: &Capture,
    holder: &Connection,
    database: &Path,
    new: &Path,
    options: &MergeOptions,
) -> Result<(Permissions, MergeReport), RecoverError> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(crate::capture::sidecar(new, suffix));
    }
    // The new file becomes the database: made empty with the database's permissions (bits, and
    // owner for a root process) before SQLite fills it, so it is never more open than the file
    // it replaces (SQLite gives its own -wal and -journal of it the same).
    let permissions = Permissions::of_database(database);
    create_file_at_path(&permissions, new)
        .map_err(|e| RecoverError::io(new, "create", std::io::Error::from(e)))?;
    match build(capture, holder, database, new, options) {
        Ok(report) => Ok((permissions, report)),
        Err(e) => {
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let _ = std::fs::remove_file(crate::capture::sidecar(new, suffix));
            }
            Err(e)
        }
    }
}

/// Keeps the torn generation in `<name>.torn-<UTC>-<pid>/` in `parent`: the file hard-linked,
/// its `-wal` and `-shm` moved in; that directory and `parent` fsynced, so the torn generation
/// is durable where it is kept before the swap can be. Returns the directory.
fn keep_torn(
    database: &Path,
    parent: &Path,
    name: &OsStr,
    pid: u32,
    permissions: &Permissions,
) -> Result<PathBuf, RecoverError> {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>();
    let kept = parent.join(format!(
        "{}.torn-{}-{}-{pid}",
        fitted_name(name, DIR_STEM_MAX),
        &stamp[..8],
        &stamp[8..14]
    ));
    let io = |p: &Path, what: &'static str| {
        let p = p.to_path_buf();
        move |e| RecoverError::io(p, what, e)
    };
    create_dir_at_path(permissions, &kept)
        .map_err(std::io::Error::from)
        .map_err(io(&kept, "create"))?;
    let file = fitted_name(name, FILE_STEM_MAX);
    std::fs::hard_link(database, kept.join(&file)).map_err(io(database, "keep the torn file"))?;
    for suffix in ["-wal", "-shm"] {
        let side = crate::capture::sidecar(database, suffix);
        if side.exists() {
            std::fs::rename(&side, kept.join(format!("{file}{suffix}")))
                .map_err(io(&side, "move aside"))?;
        }
    }
    // Its entries, then the directory's own entry and the sidecars' departure.
    sync_dir(&kept)?;
    sync_dir(parent)?;
    Ok(kept)
}

/// Whether `database` is torn as far as can be told without locking it: the capture's manifest
/// says the loss tore it (`main_torn`), or its `integrity_check` fails. Returns what
/// `integrity_check` said; [`RecoverError::NotTorn`] for a healthy file. Reads only (a read-only
/// connection on the unix VFS, no checkpoint at close).
pub fn check_torn(capture: &Capture, database: &Path) -> Result<Vec<String>, RecoverError> {
    check_target(capture.dir(), database)?;
    let sq = |what: &'static str| move |e| RecoverError::sqlite(database, what, e);
    let conn = Connection::open_with_flags_and_vfs(
        database,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        "unix",
    )
    .map_err(sq("open the live database to read"))?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(sq("turn off the checkpoint at close"))?;
    let integrity = integrity_check(&conn)
        .unwrap_or_else(|e| vec![format!("the live database cannot be checked: {e}")]);
    refuse_unless_torn(capture, database, &integrity)?;
    Ok(integrity)
}

/// [`RecoverError::NotTorn`] unless the manifest says `main_torn` or `integrity` is not `ok`.
fn refuse_unless_torn(
    capture: &Capture,
    database: &Path,
    integrity: &[String],
) -> Result<(), RecoverError> {
    if capture.manifest().main_torn || integrity != ["ok"] {
        return Ok(());
    }
    Err(RecoverError::NotTorn {
        database: database.to_path_buf(),
        capture: capture.dir().to_path_buf(),
    })
}

fn build(
    capture: &Capture,
    live: &Connection,
    database: &Path,
    new: &Path,
    options: &MergeOptions,
) -> Result<MergeReport, RecoverError> {
    let sq = |what: &'static str| move |e| RecoverError::sqlite(new, what, e);
    capture
        .connection()
        .backup(MAIN_DB, new, None::<fn(rusqlite::backup::Progress)>)
        .map_err(sq("copy the captured generation"))?;
    let conn = Connection::open_with_flags_and_vfs(
        new,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        "unix",
    )
    .map_err(sq("open the rebuilt file"))?;
    conn.execute_batch("BEGIN IMMEDIATE").map_err(sq("begin"))?;
    let before = foreign_key_violations(&conn).map_err(sq("foreign_key_check"))?;
    let merge = Merge {
        source: live,
        source_path: database,
        target: &conn,
        target_path: new,
        options,
        apply: true,
        // The live file's rows against the rebuilt one: nothing to take a delta against.
        rule: MergeRule::Whole,
        rule_reason: "a rebuild: every row of the torn live file, compared with the captured \
                      generation's row of the same rowid or key"
            .into(),
        ledger: None,
        merged_before: None,
        base_frames: 0,
        bulk: false,
        widens_to_whole: false,
        changes: None,
    };
    let mut report = merge.run(&mut |_| {})?;
    let after = foreign_key_violations(&conn).map_err(sq("foreign_key_check"))?;
    let mut violations: Vec<String> = after.difference(&before).cloned().collect();
    if !violations.is_empty() {
        violations.sort();
        return Err(RecoverError::RebuildCheck {
            database: database.to_path_buf(),
            why: format!("new foreign-key violations: {}", violations.join("; ")),
        });
    }
    conn.execute_batch("COMMIT").map_err(sq("commit"))?;
    let check = integrity_check(&conn).map_err(sq("integrity_check"))?;
    if check != ["ok"] {
        return Err(RecoverError::RebuildCheck {
            database: database.to_path_buf(),
            why: check.join("; "),
        });
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(sq("checkpoint"))?;
    conn.close()
        .map_err(|(_, e)| RecoverError::sqlite(new, "close", e))?;
    std::fs::File::open(new)
        .and_then(|f| f.sync_all())
        .map_err(|e| RecoverError::io(new, "fsync", e))?;
    report.capture = database.to_path_buf();
    report.database = database.to_path_buf();
    Ok(report)
}
