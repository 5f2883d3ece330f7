//! ST: the session store's `SessionDb::append_message`, as the application calls it.
//!
//! `SessionDb` always opens through hermes-guard, so the stock side cannot be the store itself:
//! it replays, through a stock connection with the store's settings, the statements
//! `append_message` runs (BEGIN IMMEDIATE; bump the session's counters; insert the message, which
//! the FTS trigger indexes; COMMIT), on a database whose schema the store itself created. The
//! ratio therefore also charges the store's own bookkeeping to the guard, a few hundred
//! nanoseconds against a synchronous=FULL commit.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use hermes_guard_store::{NewMessage, NewSession, SessionDb};
use rusqlite::{params, Connection};

use hermes_guard_cli::workloads::{
    self, payload, BenchError, Context, Session, Stopwatch, Timed, Vfs,
};

const SESSION: &str = "bench-session";

fn store_error(path: &Path, step: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Invalid(format!("{step} {}: {e}", path.display()))
}

/// An open store with one session, ready for appends: through `SessionDb` for the guard, through
/// the replayed statements for stock.
pub fn open(vfs: Vfs, dir: &Path) -> Result<Box<dyn Session>, BenchError> {
    let scratch = workloads::scratch(dir)?;
    let path = scratch.path().join("state.db");
    {
        let db = SessionDb::open(&path).map_err(|e| store_error(&path, "opening the store", e))?;
        db.create_session(&NewSession::new(SESSION, "bench"))
            .map_err(|e| store_error(&path, "creating a session in", e))?;
        db.close()
            .map_err(|(_, e)| store_error(&path, "closing the store", e))?;
    }
    Ok(match vfs {
        Vfs::Guard => Box::new(Store {
            db: SessionDb::open(&path).map_err(|e| store_error(&path, "opening the store", e))?,
            path,
            next: 0,
            _dir: scratch,
        }),
        Vfs::Stock => {
            let conn = workloads::open(Vfs::Stock, &path)?;
            // The store's settings: its busy timeout, foreign keys on, synchronous left at the
            // default.
            conn.pragma_update(None, "busy_timeout", 1_000)
                .ctx("setting busy_timeout", &path)?;
            conn.pragma_update(None, "foreign_keys", true)
                .ctx("enabling foreign keys", &path)?;
            Box::new(Replayed {
                conn,
                path,
                next: 0,
                _dir: scratch,
            })
        }
    })
}

struct Store {
    db: SessionDb,
    path: PathBuf,
    next: u64,
    _dir: tempfile::TempDir,
}

impl Session for Store {
    fn run(&mut self, messages: u64) -> Result<Timed, BenchError> {
        let clock = Stopwatch::start();
        for _ in 0..messages {
            let i = self.next;
            self.next += 1;
            self.db
                .append_message(SESSION, &NewMessage::new("user", payload(i)))
                .map_err(|e| store_error(&self.path, "appending a message to", e))?;
        }
        Ok(clock.stop(messages as f64))
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        self.db
            .close()
            .map(drop)
            .map_err(|(_, e)| store_error(&self.path, "closing the store", e))
    }
}

struct Replayed {
    conn: Connection,
    path: PathBuf,
    next: u64,
    _dir: tempfile::TempDir,
}

impl Session for Replayed {
    fn run(&mut self, messages: u64) -> Result<Timed, BenchError> {
        let (conn, path) = (&self.conn, self.path.as_path());
        let clock = Stopwatch::start();
        for _ in 0..messages {
            let i = self.next;
            self.next += 1;
            let message = NewMessage::new("user", payload(i));
            let timestamp = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            conn.execute_batch("BEGIN IMMEDIATE")
                .ctx("beginning", path)?;
            let bumped = conn
                .execute(
                    "UPDATE sessions SET message_count = message_count + 1,
                                         tool_call_count = tool_call_count + ?2
                     WHERE id = ?1",
                    params![SESSION, 0],
                )
                .ctx("bumping the session", path)?;
            if bumped != 1 {
                return Err(BenchError::Invalid(format!(
                    "{} has no session {SESSION}",
                    path.display()
                )));
            }
            conn.execute(
                "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls,
                     tool_name, timestamp, token_count, finish_reason, reasoning)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    SESSION,
                    message.role,
                    message.content,
                    message.tool_call_id,
                    None::<String>,
                    message.tool_name,
                    timestamp,
                    message.token_count,
                    message.finish_reason,
                    message.reasoning,
                ],
            )
            .ctx("inserting a message", path)?;
            std::hint::black_box(conn.last_insert_rowid());
            conn.execute_batch("COMMIT").ctx("committing", path)?;
        }
        Ok(clock.stop(messages as f64))
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        self.conn
            .close()
            .map_err(|(_, e)| e)
            .ctx("closing", &self.path)
    }
}
