//! Recovery: how long `recover::apply` takes to merge a large capture into the live database,
//! against the floor of `INSERT … SELECT` of the same rows from the capture opened as a
//! database, and how much memory the whole recovery (opening the capture, then the merge) needs
//! beyond what the process already had.
//!
//! The capture is made once: a table created and checkpointed, then `rows` rows committed only
//! in the WAL, the sidecars unlinked and the next write refused. The live database is then the
//! captured image (the table, empty). Each round, a child process opens the capture and merges
//! it (only `apply` is timed for the ratio; the child does nothing else, so its resident-set
//! high-water mark is the recovery's), and the floor copies the capture's two files, opens them
//! and runs `INSERT INTO live.events SELECT * FROM main.events` (only that statement and its
//! commit are timed). The live file is put back to the image between the two, in place (same
//! inode), so both start from the same state.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use hermes_guard::recover::{self, Capture, MergeOptions};
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};

use super::{Bench, Id, Round, Sizes, MIB};
use hermes_guard::paths::sidecar;
use hermes_guard_cli::workloads::{self, BenchError, Context, Stopwatch, Timed, Vfs};

/// A capture of `rows` rows (about 700 bytes each) and the live database it was taken of.
pub struct Built {
    pub db: PathBuf,
    pub capture: PathBuf,
    /// The live file's bytes after the loss (the captured image): put back before each side.
    image: Vec<u8>,
    /// Rows the newer generation writes after the image is put back, on the captured rows'
    /// rowids: the captured rows then move to fresh ones.
    newer: u64,
}

pub fn build(dir: &Path, rows: u64, newer: u64) -> Result<Built, BenchError> {
    let db = dir.join("recovery").join("state.db");
    let parent = db.parent().expect("joined above");
    fs::create_dir_all(parent).ctx("creating", parent)?;
    let conn = workloads::open(Vfs::Guard, &db)?;
    conn.execute_batch(
        "PRAGMA wal_autocheckpoint=0;
         CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, at REAL, body TEXT);",
    )
    .ctx("creating the events table", &db)?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .ctx("checkpointing the image", &db)?;
    let per_txn = 10_000;
    let mut written = 0;
    while written < rows {
        let n = per_txn.min(rows - written);
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2) \
             INSERT INTO events (kind, at, body) \
             SELECT 'kind ' || (i % 7), i * 0.5, printf('%08d ', i) || hex(randomblob(346)) FROM n",
            [written as i64, (written + n - 1) as i64],
        )
        .ctx("filling the WAL", &db)?;
        written += n;
    }
    for suffix in ["-wal", "-shm"] {
        let side = sidecar(&db, suffix);
        fs::remove_file(&side).ctx("unlinking", &side)?;
    }
    let refused = conn.execute("INSERT INTO events (kind) VALUES ('refused')", []);
    if refused.is_ok() {
        return Err(BenchError::Invalid(format!(
            "the write after the loss of {}'s sidecars was not refused",
            db.display()
        )));
    }
    let status = hermes_guard::GuardExt::guard_status(&conn)
        .map_err(|e| BenchError::Invalid(format!("status of {}: {e}", db.display())))?;
    let capture = status.capture.ok_or_else(|| {
        BenchError::Invalid(format!("the refusal on {} did not capture", db.display()))
    })?;
    hermes_guard::close(conn)
        .map_err(|(_, e)| BenchError::Invalid(format!("closing {}: {e}", db.display())))?;
    // The image the generation was written on, as captured: the close may have healed the
    // live file since (nothing newer was there), and each round starts from the loss.
    let captured_image = capture.join("state.db");
    let image = fs::read(&captured_image).ctx("reading", &captured_image)?;
    // Each round undoes that heal (the live file back to the image): the capture's record of it
    // no longer holds, and with it the merge would rightly merge nothing.
    let healed = capture.join(hermes_guard::manifest::HEALED_NAME);
    if healed.exists() {
        fs::remove_file(&healed).ctx("removing", &healed)?;
    }
    Ok(Built {
        db,
        capture,
        image,
        newer,
    })
}

impl Built {
    /// The live file back to the captured image, in place: the same inode, so the merge still
    /// takes the capture's delta.
    fn reset(&self) -> Result<(), BenchError> {
        for suffix in ["-wal", "-shm"] {
            let side = sidecar(&self.db, suffix);
            if side.exists() {
                fs::remove_file(&side).ctx("removing", &side)?;
            }
        }
        fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&self.db)
            .and_then(|mut f| f.write_all(&self.image).and_then(|()| f.sync_all()))
            .ctx("putting back the image of", &self.db)?;
        if self.newer > 0 {
            let conn = workloads::open(Vfs::Stock, &self.db)?;
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                 INSERT INTO events (kind, at, body) SELECT 'newer', i, 'newer ' || i FROM n",
                [self.newer as i64],
            )
            .ctx("writing the newer generation", &self.db)?;
        }
        Ok(())
    }
}

/// What the recovery child reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// `Capture::open`: checking and copying the capture.
    pub open_ns: u64,
    /// `recover::apply`.
    pub apply_ns: u64,
    pub apply_cpu_ns: Option<u64>,
    pub inserted: u64,
    pub baseline_kib: u64,
    pub peak_kib: u64,
    pub hwm_reset: bool,
}

/// One recovery, in a child process.
pub fn measure(exe: &Path, dir: &Path, built: &Built) -> Result<Report, BenchError> {
    built.reset()?;
    workloads::settle(dir)?;
    let output = Command::new(exe)
        .args(["bench-child", "--role", "recovery", "--db"])
        .arg(&built.capture)
        .output()
        .ctx("running the recovery child", exe)?;
    if !output.status.success() {
        return Err(BenchError::Invalid(format!(
            "the recovery child exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        BenchError::Invalid(format!(
            "the recovery child's report {:?} is not JSON: {e}",
            String::from_utf8_lossy(&output.stdout)
        ))
    })
}

/// The floor: the capture's files copied and opened as a database (not timed), then
/// `INSERT … SELECT` of its rows into the live database and the commit (timed). Counted in
/// rows.
pub fn floor(dir: &Path, built: &Built) -> Result<Timed, BenchError> {
    built.reset()?;
    let scratch = workloads::scratch(dir)?;
    let manifest = hermes_guard::Manifest::read(&built.capture)
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let copy = scratch.path().join("capture.db");
    for (name, to) in [
        (&manifest.main.file, copy.clone()),
        (&manifest.wal.file, sidecar(&copy, "-wal")),
    ] {
        let from = built.capture.join(name);
        fs::copy(&from, &to).ctx("copying", &from)?;
    }
    let conn = Connection::open_with_flags_and_vfs(&copy, OpenFlags::default(), "unix")
        .ctx("opening", &copy)?;
    let _: i64 = conn
        .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
        .ctx("reading", &copy)?;
    conn.execute(
        "ATTACH DATABASE ?1 AS live",
        [built.db.to_str().unwrap_or_default()],
    )
    .ctx("attaching", &built.db)?;
    // With a newer generation on the same rowids, the floor gives every row a fresh one.
    let sql = if built.newer > 0 {
        "BEGIN IMMEDIATE; INSERT INTO live.events (kind, at, body) \
         SELECT kind, at, body FROM main.events; COMMIT;"
    } else {
        "BEGIN IMMEDIATE; INSERT INTO live.events SELECT * FROM main.events; COMMIT;"
    };
    let clock = Stopwatch::start();
    conn.execute_batch(sql).ctx("INSERT … SELECT", &built.db)?;
    let rows = conn.changes() as f64;
    let timed = clock.stop(rows);
    conn.execute_batch("DETACH DATABASE live")
        .ctx("detaching", &built.db)?;
    Ok(timed)
}

/// The child's side: open the capture, merge it into the database it names, report.
pub fn child(capture: &Path) -> Result<(), BenchError> {
    let hwm_reset = fs::write("/proc/self/clear_refs", "5").is_ok();
    let baseline_kib = super::capture::proc_status_kib(if hwm_reset { "VmRSS" } else { "VmHWM" })?;
    let clock = Stopwatch::start();
    let opened = Capture::open(capture).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let open = clock.stop(1.0);
    let db = recover::captured_database(&opened);
    let clock = Stopwatch::start();
    let report = recover::apply(&opened, &db, &MergeOptions::default(), &mut |_| {})
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let apply = clock.stop(report.inserted() as f64);
    let peak_kib = super::capture::proc_status_kib("VmHWM")?;
    let report = Report {
        open_ns: open.elapsed.as_nanos() as u64,
        apply_ns: apply.elapsed.as_nanos() as u64,
        apply_cpu_ns: apply.cpu.map(|c| c.as_nanos() as u64),
        inserted: report.inserted(),
        baseline_kib,
        peak_kib,
        hwm_reset,
    };
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| BenchError::Invalid(e.to_string()))?
    );
    Ok(())
}

impl Bench {
    /// The recovery rows: the floor in this process, the recovery in a child, alternating.
    pub(super) fn recovery(
        &mut self,
        exe: &Path,
        dir: &Path,
        sizes: &Sizes,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let built = build(dir, sizes.rec_rows, sizes.rec_newer_rows)?;
        let manifest = hermes_guard::Manifest::read(&built.capture)?;
        eprintln!(
            "  (recovery: a capture of {} rows, WAL {:.0} MiB, image {} KiB)",
            sizes.rec_rows,
            manifest.wal.bytes as f64 / MIB as f64,
            manifest.main.bytes / 1024
        );
        let (mut time, mut memory) = (Vec::new(), Vec::new());
        for n in 0..self.warmup + self.rounds {
            let (mut floor, mut report) = (None, None);
            for floor_now in [n.is_multiple_of(2), !n.is_multiple_of(2)] {
                if floor_now {
                    floor = Some(self::floor(dir, &built)?);
                } else {
                    report = Some(measure(exe, dir, &built)?);
                }
            }
            let (floor, report) = (floor.expect("ran"), report.expect("ran"));
            if report.inserted as f64 != floor.ops {
                return Err(format!(
                    "the recovery inserted {} rows, INSERT … SELECT {}",
                    report.inserted, floor.ops
                )
                .into());
            }
            let secs = report.apply_ns as f64 / 1e9;
            let t = Round {
                baseline: floor.rate(),
                guard: report.inserted as f64 / secs,
                ratio: secs / floor.elapsed.as_secs_f64(),
                cpu_ratio: report.apply_cpu_ns.map_or(f64::NAN, |ns| ns as f64 / 1e9)
                    / floor.cpu.map_or(f64::NAN, |c| c.as_secs_f64()),
            };
            let extra = report.peak_kib.saturating_sub(report.baseline_kib) as f64 / 1024.0;
            let m = Round {
                baseline: f64::NAN,
                guard: extra,
                ratio: extra,
                cpu_ratio: f64::NAN,
            };
            eprintln!(
                "  (recovery round {n}: opening the capture {:.2} s, merge {:.2} s, INSERT … SELECT {:.2} s)",
                report.open_ns as f64 / 1e9,
                secs,
                floor.elapsed.as_secs_f64()
            );
            self.progress(Id::RecTime, n, &t);
            self.progress(Id::RecMem, n, &m);
            if n >= self.warmup {
                time.push(t);
                memory.push(m);
            }
        }
        self.push_time_and_memory((Id::RecTime, time), (Id::RecMem, memory));
        Ok(())
    }
}
