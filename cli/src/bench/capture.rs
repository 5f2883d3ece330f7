//! The capture: how long the first refused write takes to capture a large retired generation,
//! against the floor of copying the same bytes durably and hashing them, and how much memory it
//! needs beyond what the process already had.
//!
//! The database (a main image plus a large WAL) is built once. Each round, a child process opens
//! it through hermes-guard, reads it, has its sidecars renamed away, and writes once: the write is
//! refused and the refusal captures. Only the refused write is timed. The child does nothing else,
//! so its resident-set high-water mark during the write is the capture's. The parent then puts the
//! sidecars back for the next round.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

use rusqlite::config::DbConfig;
use serde::{Deserialize, Serialize};

use hermes_guard::digest::sha256_stream;
use hermes_guard::paths::sidecar;
use hermes_guard_cli::workloads::{self, fill_wal, BenchError, Context, Stopwatch, Timed, Vfs};

const LOST: &str = ".bench-lost";

/// A database with a main image of about `main_bytes` and a WAL of at least `wal_bytes`, left on
/// disk with its WAL (its builder closes without checkpointing).
pub fn build(dir: &Path, main_bytes: u64, wal_bytes: u64) -> Result<PathBuf, BenchError> {
    let db = dir.join("capture").join("state.db");
    let parent = db.parent().expect("joined above");
    fs::create_dir_all(parent).ctx("creating", parent)?;
    let conn = workloads::open(Vfs::Stock, &db)?;
    conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0;")
        .ctx("configuring", &db)?;
    fill_wal(&conn, &db, main_bytes)?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .ctx("checkpointing the main image", &db)?;
    fill_wal(&conn, &db, wal_bytes)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .ctx("keeping the WAL at close", &db)?;
    conn.close().map_err(|(_, e)| e).ctx("closing", &db)?;
    let wal = sidecar(&db, "-wal");
    let size = fs::metadata(&wal).map(|m| m.len()).ctx("measuring", &wal)?;
    if size < wal_bytes {
        return Err(BenchError::Invalid(format!(
            "{} is {size} bytes after the build, expected at least {wal_bytes}",
            wal.display()
        )));
    }
    Ok(db)
}

/// What the capture child reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// Time of the refused write, which captured.
    pub elapsed_ns: u64,
    /// CPU time of the refused write, when known.
    pub cpu_ns: Option<u64>,
    /// WAL and main-image bytes the capture copied (from its manifest).
    pub bytes: u64,
    /// Resident set just before the write, KiB.
    pub baseline_kib: u64,
    /// Resident-set high-water mark after the write, KiB.
    pub peak_kib: u64,
    /// Whether the high-water mark could be reset to the baseline first (`/proc/self/clear_refs`);
    /// when not, the peak includes whatever came before, and the extra memory is a lower bound.
    pub hwm_reset: bool,
    /// The artifact directory.
    pub artifact: PathBuf,
}

/// One capture, in a child process; the sidecars are back in place when this returns, and the
/// artifact is left for the caller to remove once the round is over.
pub fn measure(exe: &Path, dir: &Path, db: &Path) -> Result<Report, BenchError> {
    workloads::settle(dir)?;
    let output = Command::new(exe)
        .args(["bench-child", "--role", "capture", "--vfs", "guard", "--db"])
        .arg(db)
        .output()
        .ctx("running the capture child", exe);
    let restored = restore_sidecars(db);
    let output = output?;
    restored?;
    if !output.status.success() {
        return Err(BenchError::Invalid(format!(
            "the capture child exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let report: Report = serde_json::from_slice(&output.stdout).map_err(|e| {
        BenchError::Invalid(format!(
            "the capture child's report {:?} is not JSON: {e}",
            String::from_utf8_lossy(&output.stdout)
        ))
    })?;
    Ok(report)
}

fn restore_sidecars(db: &Path) -> Result<(), BenchError> {
    for suffix in ["-wal", "-shm"] {
        let lost = sidecar(db, &format!("{suffix}{LOST}"));
        if lost.exists() {
            let back = sidecar(db, suffix);
            fs::rename(&lost, &back).ctx("putting back", &back)?;
        }
    }
    Ok(())
}

/// The floor: a plain copy of the WAL and the main file, synced as the capture syncs its own,
/// then the sha256 of the copied bytes. Counted in bytes. The copies stay until the returned
/// directory is dropped.
pub fn floor(dir: &Path, db: &Path) -> Result<(Timed, tempfile::TempDir), BenchError> {
    let scratch = workloads::scratch(dir)?;
    let clock = Stopwatch::start();
    let mut bytes = 0;
    let mut copies = Vec::new();
    for source in [sidecar(db, "-wal"), db.to_path_buf()] {
        let name = source.file_name().expect("a file");
        let copy = scratch.path().join(name);
        bytes += fs::copy(&source, &copy).ctx("copying", &source)?;
        File::open(&copy)
            .and_then(|f| f.sync_all())
            .ctx("syncing", &copy)?;
        copies.push(copy);
    }
    File::open(scratch.path())
        .and_then(|d| d.sync_all())
        .ctx("syncing", scratch.path())?;
    for copy in &copies {
        let f = File::open(copy).ctx("opening", copy)?;
        let digest = sha256_stream(f, |_| Ok(())).ctx("reading", copy)?;
        std::hint::black_box(digest);
    }
    Ok((clock.stop(bytes as f64), scratch))
}

/// The child's side: open, lose the sidecars, write once, report.
pub fn child(db: &Path) -> Result<(), BenchError> {
    let conn = workloads::open(Vfs::Guard, db)?;
    // A read maps the -shm and pins it, as a long-lived connection would have.
    let pages: i64 = conn
        .query_row("SELECT count(*) FROM pages", [], |r| r.get(0))
        .ctx("reading", db)?;
    if pages == 0 {
        return Err(BenchError::Invalid(format!(
            "{} has no pages to capture",
            db.display()
        )));
    }
    for suffix in ["-wal", "-shm"] {
        let side = sidecar(db, suffix);
        if side.exists() {
            fs::rename(&side, sidecar(db, &format!("{suffix}{LOST}"))).ctx("renaming", &side)?;
        }
    }

    let hwm_reset = fs::write("/proc/self/clear_refs", "5").is_ok();
    let baseline_kib = proc_status_kib(if hwm_reset { "VmRSS" } else { "VmHWM" })?;
    let clock = Stopwatch::start();
    let write = conn.execute("INSERT INTO pages (body) VALUES (zeroblob(10))", []);
    let timed = clock.stop(1.0);
    let peak_kib = proc_status_kib("VmHWM")?;

    match &write {
        Err(e)
            if e.sqlite_error().map(|e| e.extended_code)
                == Some(rusqlite::ffi::SQLITE_READONLY_DBMOVED) => {}
        other => {
            return Err(BenchError::Invalid(format!(
                "the write after the loss of {}'s sidecars should be refused with \
                 SQLITE_READONLY_DBMOVED; it returned {other:?}",
                db.display()
            )))
        }
    }
    let status = hermes_guard::GuardExt::guard_status(&conn)
        .map_err(|e| BenchError::Invalid(format!("status of {}: {e}", db.display())))?;
    let artifact = status.capture.ok_or_else(|| {
        BenchError::Invalid(format!(
            "the refusal on {} did not capture: {:?}",
            db.display(),
            status.capture_error
        ))
    })?;
    let manifest_path = artifact.join(hermes_guard::Manifest::FILE_NAME);
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(&manifest_path).ctx("reading", &manifest_path)?)
            .map_err(|e| BenchError::Invalid(format!("{}: {e}", manifest_path.display())))?;
    let bytes = manifest["wal"]["bytes"].as_u64().unwrap_or(0)
        + manifest["main"]["bytes"].as_u64().unwrap_or(0);
    hermes_guard::close(conn)
        .map_err(|(_, e)| BenchError::Invalid(format!("closing {}: {e}", db.display())))?;

    let report = Report {
        elapsed_ns: timed.elapsed.as_nanos() as u64,
        cpu_ns: timed.cpu.map(|cpu| cpu.as_nanos() as u64),
        bytes,
        baseline_kib,
        peak_kib,
        hwm_reset,
        artifact,
    };
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| BenchError::Invalid(e.to_string()))?
    );
    Ok(())
}

/// A `kB` field of `/proc/self/status`.
pub fn proc_status_kib(field: &str) -> Result<u64, BenchError> {
    let path = Path::new("/proc/self/status");
    let status = fs::read_to_string(path).ctx("reading", path)?;
    status
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .ok_or_else(|| BenchError::Invalid(format!("no {field} in {}", path.display())))
}
