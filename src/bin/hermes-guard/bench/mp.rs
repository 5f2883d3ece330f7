//! MP: two processes writing the same database, each through the VFS under test.
//!
//! Both children open the database, prepare their statement and say `ready`; the parent starts
//! the clock when it tells both `go` and stops it when the second reports `done`, so process
//! start-up and opening stay out of the measurement.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::params;

use super::workloads::{self, payload, BenchError, Context, Timed, Vfs, TABLE};

/// How long a writer backs off when the other holds the WAL write lock. SQLite's default busy
/// handler sleeps 1, 2, 5, 10... ms, which would make the measurement about sleep granularity
/// rather than about the VFS; a short fixed back-off keeps both writers busy.
const BACKOFF: Duration = Duration::from_micros(50);
/// About 30 s of back-off before a writer gives up with SQLITE_BUSY.
const MAX_BUSY_RETRIES: i32 = 600_000;

/// The parent's side: one measurement of `vfs`, `ops` one-row transactions per child.
pub fn measure(exe: &Path, dir: &Path, vfs: Vfs, ops: u64) -> Result<Timed, BenchError> {
    let scratch = workloads::scratch(dir)?;
    let db = scratch.path().join("mp.db");
    {
        // The schema exists before either child starts, so neither races to create it.
        let conn = workloads::open(Vfs::Stock, &db)?;
        conn.execute_batch(TABLE).ctx("creating the table", &db)?;
        conn.close().map_err(|(_, e)| e).ctx("closing", &db)?;
    }
    let mut children = [
        Writer::spawn(exe, &db, vfs, ops)?,
        Writer::spawn(exe, &db, vfs, ops)?,
    ];
    for child in &mut children {
        child.expect_line("ready")?;
    }
    let start = Instant::now();
    for child in &mut children {
        child.send("go")?;
    }
    for child in &mut children {
        child.expect_line("done")?;
    }
    let elapsed = start.elapsed();
    for child in children {
        child.wait()?;
    }

    let conn = workloads::open(Vfs::Stock, &db)?;
    let rows: u64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .ctx("counting the rows", &db)?;
    conn.close().map_err(|(_, e)| e).ctx("closing", &db)?;
    if rows != 2 * ops {
        return Err(BenchError::Invalid(format!(
            "{} holds {rows} rows after two writers committed {ops} each",
            db.display()
        )));
    }
    Ok(Timed {
        ops: (2 * ops) as f64,
        elapsed,
    })
}

struct Writer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Writer {
    fn spawn(exe: &Path, db: &Path, vfs: Vfs, ops: u64) -> Result<Writer, BenchError> {
        let mut child = Command::new(exe)
            .args(["bench-child", "--role", "mp-writer", "--vfs", vfs.arg()])
            .arg("--ops")
            .arg(ops.to_string())
            .arg("--db")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ctx("starting a writer child", exe)?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        Ok(Writer {
            child,
            stdin,
            stdout,
        })
    }

    fn send(&mut self, line: &str) -> Result<(), BenchError> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| BenchError::Invalid(format!("telling a writer child {line:?}: {e}")))
    }

    fn expect_line(&mut self, want: &str) -> Result<(), BenchError> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| BenchError::Invalid(format!("reading a writer child: {e}")))?;
        if line.trim() != want {
            return Err(BenchError::Invalid(format!(
                "a writer child said {:?} where {want:?} was expected (its stderr is above)",
                line.trim()
            )));
        }
        Ok(())
    }

    fn wait(mut self) -> Result<(), BenchError> {
        drop(self.stdin);
        let status = self
            .child
            .wait()
            .map_err(|e| BenchError::Invalid(format!("waiting for a writer child: {e}")))?;
        if !status.success() {
            return Err(BenchError::Invalid(format!(
                "a writer child exited with {status}"
            )));
        }
        Ok(())
    }
}

/// The child's side: `ops` one-row transactions on `db` through `vfs`, on cue.
pub fn writer_child(db: &Path, vfs: Vfs, ops: u64) -> Result<(), BenchError> {
    let mut conn = workloads::open(vfs, db)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .ctx("setting synchronous", db)?;
    conn.busy_handler(Some(|attempt: i32| {
        std::thread::sleep(BACKOFF);
        attempt < MAX_BUSY_RETRIES
    }))
    .ctx("setting the busy handler", db)?;
    let mut insert = conn
        .prepare("INSERT INTO t (k, payload) VALUES (?1, ?2)")
        .ctx("preparing the insert", db)?;
    let pid = u64::from(std::process::id());
    let mut out = std::io::stdout().lock();
    let say = |out: &mut std::io::StdoutLock<'_>, line: &str| {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| BenchError::Invalid(format!("writing to the parent: {e}")))
    };
    say(&mut out, "ready")?;
    let mut cue = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut cue)
        .map_err(|e| BenchError::Invalid(format!("waiting for the parent's cue: {e}")))?;
    if cue.trim() != "go" {
        return Err(BenchError::Invalid(format!(
            "expected \"go\" from the parent, got {:?}",
            cue.trim()
        )));
    }
    for i in 0..ops {
        insert
            .execute(params![(pid << 32 | i) as i64, payload(i)])
            .ctx("inserting", db)?;
    }
    drop(insert);
    say(&mut out, "done")?;
    conn.close().map_err(|(_, e)| e).ctx("closing", db)
}
