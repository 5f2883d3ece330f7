//! MP: two processes writing the same database, each through the VFS under test.
//!
//! A session is two writer children on a fresh database. Each opens it, prepares its statement
//! and says `ready`; then, for every chunk, the parent tells both `go N` and times until both
//! report `done`, so process start-up and opening stay out of the measurement, and a round can
//! alternate chunks between a stock pair and a guard pair like the in-process workloads do.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::params;

use hermes_guard_cli::workloads::{self, payload, BenchError, Context, Session, Timed, Vfs, TABLE};

/// How long a writer backs off when the other holds the WAL write lock. SQLite's default busy
/// handler sleeps 1, 2, 5, 10... ms, which would make the measurement about sleep granularity
/// rather than about the VFS; a short fixed back-off keeps both writers busy.
const BACKOFF: Duration = Duration::from_micros(50);
/// About 30 s of back-off before a writer gives up with SQLITE_BUSY.
const MAX_BUSY_RETRIES: i32 = 600_000;

/// Two writer children on a fresh database; an operation is one transaction of either.
pub struct Writers {
    children: Vec<Writer>,
    db: PathBuf,
    committed: u64,
    _dir: tempfile::TempDir,
}

impl Writers {
    /// Starts both writers on a fresh database under `dir`, through `vfs`.
    pub fn open(exe: &Path, dir: &Path, vfs: Vfs) -> Result<Box<dyn Session>, BenchError> {
        let scratch = workloads::scratch(dir)?;
        let db = scratch.path().join("mp.db");
        {
            // The schema exists before either child starts, so neither races to create it.
            let conn = workloads::open(Vfs::Stock, &db)?;
            conn.execute_batch(TABLE).ctx("creating the table", &db)?;
            conn.close().map_err(|(_, e)| e).ctx("closing", &db)?;
        }
        let mut children = vec![Writer::spawn(exe, &db, vfs)?, Writer::spawn(exe, &db, vfs)?];
        for child in &mut children {
            child.read_line("ready")?;
        }
        Ok(Box::new(Writers {
            children,
            db,
            committed: 0,
            _dir: scratch,
        }))
    }
}

impl Session for Writers {
    /// `ops` transactions in all, half from each writer, at once.
    fn run(&mut self, ops: u64) -> Result<Timed, BenchError> {
        let each = ops.div_ceil(2);
        let start = Instant::now();
        for child in &mut self.children {
            child.send(&format!("go {each}"))?;
        }
        let mut cpu = Some(Duration::ZERO);
        for child in &mut self.children {
            let spent = child.expect_done()?;
            cpu = cpu.zip(spent).map(|(a, b)| a + b);
        }
        let elapsed = start.elapsed();
        self.committed += 2 * each;
        Ok(Timed {
            ops: (2 * each) as f64,
            elapsed,
            cpu,
        })
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        for child in self.children {
            child.wait()?;
        }
        let conn = workloads::open(Vfs::Stock, &self.db)?;
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .ctx("counting the rows", &self.db)?;
        conn.close().map_err(|(_, e)| e).ctx("closing", &self.db)?;
        if rows != self.committed as i64 {
            return Err(BenchError::Invalid(format!(
                "{} holds {rows} rows after the two writers committed {}",
                self.db.display(),
                self.committed
            )));
        }
        Ok(())
    }
}

struct Writer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Writer {
    fn spawn(exe: &Path, db: &Path, vfs: Vfs) -> Result<Writer, BenchError> {
        let mut child = Command::new(exe)
            .args(["bench-child", "--role", "mp-writer", "--vfs", vfs.arg()])
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

    fn read_line(&mut self, want: &str) -> Result<String, BenchError> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| BenchError::Invalid(format!("reading a writer child: {e}")))?;
        if line.split_whitespace().next() != Some(want) {
            return Err(BenchError::Invalid(format!(
                "a writer child said {:?} where {want:?} was expected (its stderr is above)",
                line.trim()
            )));
        }
        Ok(line)
    }

    /// `done <cpu ns>`: the child's CPU time over its transactions, when it could tell.
    fn expect_done(&mut self) -> Result<Option<Duration>, BenchError> {
        let line = self.read_line("done")?;
        Ok(line
            .split_whitespace()
            .nth(1)
            .and_then(|ns| ns.parse().ok())
            .map(Duration::from_nanos))
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

/// The child's side: on each `go N` from the parent, `N` one-row transactions on `db` through
/// `vfs`, then `done <cpu ns>`; at the end of its input, close and exit.
pub fn writer_child(db: &Path, vfs: Vfs) -> Result<(), BenchError> {
    let conn = workloads::open(vfs, db)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .ctx("setting synchronous", db)?;
    // The back-off is this loop's, not a busy handler's: rusqlite's busy_handler needs SQLite 3.44
    // (sqlite3_set_clientdata) and the CLI built without `bundled` runs on an older system
    // SQLite. A one-row autocommit insert that gets SQLITE_BUSY wrote nothing and is retried.
    conn.pragma_update(None, "busy_timeout", 0)
        .ctx("turning the busy timeout off", db)?;
    let pid = u64::from(std::process::id());
    let mut next = 0u64;
    let mut out = std::io::stdout().lock();
    let say = |out: &mut std::io::StdoutLock<'_>, line: &str| {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| BenchError::Invalid(format!("writing to the parent: {e}")))
    };
    say(&mut out, "ready")?;
    for cue in std::io::stdin().lock().lines() {
        let cue = cue.map_err(|e| BenchError::Invalid(format!("reading the parent's cue: {e}")))?;
        let ops: u64 = cue
            .strip_prefix("go ")
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| {
                BenchError::Invalid(format!("expected \"go N\" from the parent, got {cue:?}"))
            })?;
        let mut insert = conn
            .prepare_cached("INSERT INTO t (k, payload) VALUES (?1, ?2)")
            .ctx("preparing the insert", db)?;
        let clock = workloads::Stopwatch::start();
        for _ in 0..ops {
            let mut attempt = 0;
            loop {
                match insert.execute(params![(pid << 32 | next) as i64, payload(next)]) {
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::DatabaseBusy
                            && attempt < MAX_BUSY_RETRIES =>
                    {
                        attempt += 1;
                        std::thread::sleep(BACKOFF);
                    }
                    done => {
                        done.ctx("inserting", db)?;
                        break;
                    }
                }
            }
            next += 1;
        }
        let timed = clock.stop(ops as f64);
        match timed.cpu {
            Some(cpu) => say(&mut out, &format!("done {}", cpu.as_nanos()))?,
            None => say(&mut out, "done")?,
        }
    }
    conn.close().map_err(|(_, e)| e).ctx("closing", db)
}
