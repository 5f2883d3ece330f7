//! A connection in another process (scenarios `newer-checkpointed`, `newer-changes`, …): the explorer's own binary
//! run again as `explore --child <db> guarded|stock`, driven one statement at a time over its
//! stdin, each statement a step of the schedule (its VFS calls are not: nothing schedules them
//! in the child, which runs while every participant of the schedule is parked).
//!
//! Why another process: in one process the unix VFS keys the `-shm` by the main file's inode, so
//! a connection opened after the `-wal` and `-shm` were unlinked joins the old connection's
//! mapping of the unlinked `-shm` (and the guard's retired state) instead of starting a newer
//! generation, which is what another process does: a `-shm` and a `-wal` of its own, its own
//! POSIX locks (the old connection's SHARED on the main file is a real lock to it).
//!
//! The child's busy timeout is 0: a lock a parked participant holds is not given back while the
//! child waits, so it fails at once (`SQLITE_BUSY`, recorded as an error), and the schedule stays
//! a function of the seed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};

use rusqlite::{Connection, OpenFlags};

use crate::sched::{step_number, yield_now, Kind};
use crate::world::Who;

/// The argument that makes `explore` the child.
pub const CHILD_ARG: &str = "--child";

/// The explorer's binary: this one, or beside the test binaries' `deps/` (cargo builds the
/// package's binary for its integration tests).
fn explorer_exe() -> PathBuf {
    let me = std::env::current_exe().expect("the current executable");
    match me.parent() {
        Some(deps) if deps.file_name().is_some_and(|n| n == "deps") => {
            deps.parent().expect("a target directory").join("explore")
        }
        _ => me,
    }
}

/// The parent's side: a participant's handle on the child.
pub struct Other {
    who: Who,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Other {
    /// A step: starts the child, which opens `db` (guarded or stock). `None` when the open failed
    /// (recorded).
    pub fn open(who: &Who, db: &Path, guarded: bool) -> Option<Other> {
        let how = if guarded { "guarded" } else { "stock" };
        yield_now(Kind::Go, || format!("open {how} (another process)"));
        let exe = explorer_exe();
        let mut child = Command::new(&exe)
            .env(crate::faults::CHILD_ENV, crate::faults::names_on())
            .arg(CHILD_ARG)
            .arg(db)
            .arg(how)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("the child's stdout"));
        let mut other = Other {
            who: who.clone(),
            child,
            stdin,
            stdout,
        };
        match other.answer() {
            Ok(()) => Some(other),
            Err(e) => {
                other.saw("open", &e);
                other.end();
                None
            }
        }
    }

    /// A step: inserts `v` in its own transaction; acknowledged rows go to the ledger.
    pub fn insert(&mut self, v: &str) -> bool {
        yield_now(Kind::Go, || format!("insert {v} (another process)"));
        match self.ask(&format!("insert {v}")) {
            Ok(()) => {
                let step = step_number();
                self.who.ledger.lock().acked.push((v.to_string(), step));
                true
            }
            Err(e) => {
                self.saw(&format!("insert {v}"), &e);
                false
            }
        }
    }

    /// A step: counts the rows (a read transaction).
    pub fn count(&mut self) {
        yield_now(Kind::Go, || "count (another process)".into());
        if let Err(e) = self.ask("count") {
            self.saw("count", &e);
        }
    }

    /// A step: runs `sql` (one statement on one line, its own transaction; `what` names it in
    /// the steps). `true` when it was acknowledged (the scenario records what it did).
    pub fn exec(&mut self, what: &str, sql: &str) -> bool {
        debug_assert!(!sql.contains('\n'), "one line");
        yield_now(Kind::Go, || format!("{what} (another process)"));
        match self.ask(&format!("exec {sql}")) {
            Ok(()) => true,
            Err(e) => {
                self.saw(what, &e);
                false
            }
        }
    }

    /// A step: `PRAGMA wal_checkpoint(mode)`.
    pub fn checkpoint(&mut self, mode: &str) {
        yield_now(Kind::Go, || format!("checkpoint {mode} (another process)"));
        if let Err(e) = self.ask(&format!("checkpoint {mode}")) {
            self.saw("checkpoint", &e);
        }
    }

    /// A step: closes (through `hermes_guard::close` when guarded); the child exits.
    pub fn close(mut self) {
        yield_now(Kind::Release, || "close (another process)".into());
        if let Err(e) = self.ask("close") {
            self.saw("close", &e);
        }
        self.end();
    }

    fn saw(&self, what: &str, e: &str) {
        let step = step_number();
        let mut l = self.who.ledger.lock();
        if e.starts_with("1032 ") {
            l.refusals.push((self.who.name.clone(), step));
        }
        l.errors.push(format!(
            "{} (another process) {what} at step {step}: {e}",
            self.who.name
        ));
    }

    fn ask(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().expect("the child's stdin");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("the child is gone: {e}"))?;
        self.answer()
    }

    /// The child's answer: `ok`, or `err <extended code> <message>`.
    fn answer(&mut self) -> Result<(), String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) | Err(_) => Err("the child exited without answering".into()),
            Ok(_) => match line.trim_end().strip_prefix("err ") {
                None if line.trim_end() == "ok" => Ok(()),
                None => Err(format!("the child answered {line:?}")),
                Some(e) => Err(e.to_string()),
            },
        }
    }

    /// Closes the child's stdin (it drops its connection, if any, and exits) and waits for it;
    /// what it wrote on stderr is recorded.
    fn end(&mut self) {
        drop(self.stdin.take());
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let status = self.child.wait();
        let mut l = self.who.ledger.lock();
        for line in err.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(logged) = line.strip_prefix(crate::guard_log::CHILD_PREFIX) {
                l.warnings
                    .push(format!("{} (another process): {logged}", self.who.name));
                continue;
            }
            l.errors.push(format!(
                "{} (another process) stderr: {line}",
                self.who.name
            ));
        }
        if !status.as_ref().is_ok_and(|s| s.success()) {
            l.errors.push(format!(
                "{} (another process) exited: {status:?}",
                self.who.name
            ));
        }
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            self.end();
        }
    }
}

/// The child's side (`explore --child <db> guarded|stock`): opens `db` and answers `ok` or `err
/// <extended code> <message>` to the open and to each line of its stdin: `insert <v>`, `exec
/// <sql>`, `count`, `checkpoint <mode>`, `close` (then it exits; so it does at the end of its stdin).
pub fn child_main(db: &Path, how: &str) -> ExitCode {
    crate::vfs::register();
    crate::vfs::never_sleep();
    crate::guard_log::to_stderr();
    for name in std::env::var(crate::faults::CHILD_ENV)
        .unwrap_or_default()
        .split(',')
        .filter(|n| !n.is_empty())
    {
        assert!(crate::faults::switch_on(name), "no fault {name}");
    }
    let guarded = how == "guarded";
    let answer = |r: Result<(), String>| {
        let mut out = std::io::stdout().lock();
        let _ = match r {
            Ok(()) => writeln!(out, "ok"),
            Err(e) => writeln!(out, "err {}", e.replace('\n', " ")),
        };
        let _ = out.flush();
    };
    // The scheduling VFSes, for their `xSleep` that does not sleep (outside a schedule they
    // yield nowhere: every other call goes straight to the guard or the unix VFS).
    let vfs = if guarded {
        crate::vfs::GUARDED
    } else {
        crate::vfs::STOCK
    };
    let opened = Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs).and_then(|c| {
        // The pragma, not rusqlite's `busy_timeout` (which needs `sqlite3_set_clientdata`, SQLite
        // 3.44+, absent from the system library of the `--no-default-features` build).
        c.pragma_update(None, "busy_timeout", 0)?;
        c.pragma_update(None, "journal_mode", "WAL")?;
        Ok(c)
    });
    let mut conn = match opened {
        Ok(c) => {
            answer(Ok(()));
            Some(c)
        }
        Err(e) => {
            answer(Err(failure(&e)));
            return ExitCode::SUCCESS;
        }
    };
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Some(c) = conn.as_ref() else { break };
        let (what, arg) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match what {
            "insert" => answer(
                c.execute("INSERT INTO t(v) VALUES (?1)", [arg])
                    .map(|_| ())
                    .map_err(|e| failure(&e)),
            ),
            "exec" => answer(c.execute_batch(arg).map_err(|e| failure(&e))),
            "count" => answer(
                c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                    .map(|_| ())
                    .map_err(|e| failure(&e)),
            ),
            "checkpoint" => answer(
                c.query_row(&format!("PRAGMA wal_checkpoint({arg})"), [], |r| {
                    r.get::<_, i64>(0)
                })
                .map(|_| ())
                .map_err(|e| failure(&e)),
            ),
            "close" => {
                let c = conn.take().expect("open");
                let closed = if guarded {
                    hermes_guard::close(c).map_err(|(_, e)| match e {
                        hermes_guard::GuardError::Sqlite(e) => failure(&e),
                        e => format!("-1 {e}"),
                    })
                } else {
                    c.close().map_err(|(_, e)| failure(&e))
                };
                answer(closed);
                break;
            }
            other => panic!("the child was asked {other:?}"),
        }
    }
    ExitCode::SUCCESS
}

/// An error as the child answers it: `<extended code> <message>`.
fn failure(e: &rusqlite::Error) -> String {
    let code = match e {
        rusqlite::Error::SqliteFailure(f, _) => f.extended_code,
        _ => -1,
    };
    format!("{code} {e}")
}
