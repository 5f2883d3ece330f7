//! `hermes-guard writer`: a writer process driven over stdin, reporting JSON lines on stdout.
//!
//! The loss this crate guards against needs two processes: one whose sidecars are taken away
//! while it holds them, and another that writes a newer generation at the same path. The demo and
//! the multi-process tests run the first as this child, so it can be made to write, close and
//! exit on cue.
//!
//! Roles:
//! - `gateway`: seeds and checkpoints history, commits `--wal-rows` rows that live only in its
//!   WAL, prints `{"event":"ready",...}`, then serves the commands `write`, `close`, `quit`,
//!   `checkpoint` (TRUNCATE), `passive` (a PASSIVE checkpoint), `status` (the rows it sees and,
//!   guarded, the guard's status), `bulk N` (N rows of 400 bytes in one transaction), `rows N` (N
//!   short rows in one transaction), `ack K` (one row `ack K`: acknowledged unless refused),
//!   `begin` (BEGIN IMMEDIATE and one row, the transaction left open), `commit`,
//!   `reconnect` (closes the connection and opens the path again, as an application does after
//!   a refusal) and
//!   `backup-from PATH` (the backup API copies PATH over the live database).
//! - `second`: opens the path, commits `--rows` rows in one transaction, checkpoints (TRUNCATE),
//!   closes and prints `{"event":"done",...}`.
//! - `churn-writer`: for `--seconds`, commits one row at a time on a small table (the
//!   first pages change with every commit) and checkpoints as `--checkpoint` says: `passive` or
//!   `restart` after every commit, or `auto` (SQLite's automatic checkpoint, every 4 pages);
//!   prints `{"event":"done",...}` with its counts and the guard's status, then closes.
//! - `churn-reader`: for `--seconds`, opens a connection, reads, and closes it, over
//!   and over; prints `{"event":"done",...}` with the opens and the failed closes.

use std::io::{self, BufRead, Write};
use std::path::PathBuf;

use hermes_guard::GuardExt;
use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};

/// Which VFS a child opens its database through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Vfs {
    /// The stock unix VFS.
    Stock,
    /// hermes-guard.
    Guard,
}

/// What the child does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// The long-lived writer whose sidecars get lost.
    Gateway,
    /// Another process writing a newer generation at the same path.
    Second,
    /// A session store (`SessionDb`) that appends `--wal-rows` messages to session `st-0`
    /// (automatic checkpoints off), prints `{"event":"ready"}` and waits to be killed (or for
    /// stdin to close).
    Store,
    /// A writer committing and checkpointing for `--seconds`: churn beside which no healthy
    /// connection may be judged overwritten.
    ChurnWriter,
    /// A connection opened, read and closed over and over for `--seconds`: churn in which no
    /// close may be judged overwritten.
    ChurnReader,
}

/// How a `churn-writer` checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Checkpoint {
    /// `PRAGMA wal_checkpoint(PASSIVE)` after every commit.
    Passive,
    /// `PRAGMA wal_checkpoint(RESTART)` after every commit.
    Restart,
    /// SQLite's automatic checkpoint (PASSIVE), every 4 pages.
    Auto,
}

/// Arguments of the writer child.
#[derive(clap::Args)]
pub struct WriterArgs {
    /// Database path.
    #[arg(long)]
    db: PathBuf,
    /// VFS to open it through.
    #[arg(long, value_enum)]
    vfs: Vfs,
    /// Role of this process.
    #[arg(long, value_enum, default_value = "gateway")]
    role: Role,
    /// Rows committed only in the WAL (gateway).
    #[arg(long, default_value_t = 4)]
    wal_rows: u32,
    /// Rows of the newer generation (second).
    #[arg(long, default_value_t = 400)]
    rows: u32,
    /// How long a churn role runs.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// How a churn writer checkpoints.
    #[arg(long, value_enum, default_value = "passive")]
    checkpoint: Checkpoint,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS messages (\
    id INTEGER PRIMARY KEY, session TEXT NOT NULL, content TEXT NOT NULL)";

/// Opens `db` in WAL mode through `vfs`.
pub fn open(db: &std::path::Path, vfs: Vfs) -> Result<Connection> {
    let conn = match vfs {
        Vfs::Guard => {
            hermes_guard::register()?;
            Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME)?
        }
        Vfs::Stock => Connection::open_with_flags_and_vfs(db, OpenFlags::default(), "unix")?,
    };
    // The PRAGMA, not rusqlite's busy_timeout, which needs SQLite 3.44 (the CLI built without
    // `bundled` runs on an older system SQLite).
    conn.pragma_update(None, "busy_timeout", 10_000)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if mode != "wal" {
        return Err(format!("{} did not enter WAL mode (got {mode})", db.display()).into());
    }
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

fn emit(value: Value) -> Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{value}")?;
    out.flush()?;
    Ok(())
}

pub fn run(args: WriterArgs) -> Result<()> {
    match args.role {
        Role::Gateway => gateway(&args),
        Role::Second => second(&args),
        Role::Store => store(&args),
        Role::ChurnWriter => churn_writer(&args),
        Role::ChurnReader => churn_reader(&args),
    }
}

fn gateway(args: &WriterArgs) -> Result<()> {
    let conn = open(&args.db, args.vfs)?;
    conn.execute_batch("PRAGMA wal_autocheckpoint=0")?;
    {
        let tx = conn.unchecked_transaction()?;
        for i in 0..20 {
            tx.execute(
                "INSERT INTO messages (session, content) VALUES ('gw-0', ?1)",
                [format!("history {i}")],
            )?;
        }
        tx.commit()?;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    for i in 0..args.wal_rows {
        conn.execute(
            "INSERT INTO messages (session, content) VALUES ('gw-0', ?1)",
            [format!("uncheckpointed {i}")],
        )?;
    }
    let wal = {
        use std::os::unix::fs::MetadataExt;
        let mut path = args.db.clone().into_os_string();
        path.push("-wal");
        let meta = std::fs::metadata(path)?;
        hermes_guard::FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    };
    emit(json!({"event": "ready", "pid": std::process::id(), "wal_identity": wal}))?;

    let mut conn = Some(conn);
    for line in io::stdin().lock().lines() {
        let line = line?;
        match line.trim() {
            "write" => {
                let c = conn.as_ref().ok_or("write after close")?;
                let result = c.execute(
                    "INSERT INTO messages (session, content) VALUES ('gw-0', 'after the loss')",
                    [],
                );
                let artifact = match args.vfs {
                    Vfs::Guard => c.guard_status()?.capture,
                    Vfs::Stock => None,
                };
                emit(json!({
                    "event": "write",
                    "refused": result.is_err(),
                    "error": result.as_ref().err().map(|e| e.to_string()),
                    "extended_code": result.as_ref().err().and_then(|e| e.sqlite_error()).map(|e| e.extended_code),
                    "artifact": artifact,
                }))?;
            }
            cmd if cmd.starts_with("ack ") => {
                let c = conn.as_ref().ok_or("ack after close")?;
                let k = cmd["ack ".len()..].trim();
                let result = c.execute(
                    "INSERT INTO messages (session, content) VALUES ('gw-0', ?1)",
                    [format!("ack {k}")],
                );
                emit(json!({"event": "ack", "refused": result.is_err(),
                    "error": result.err().map(|e| e.to_string())}))?;
            }
            "begin" => {
                // `begin`: a write transaction left open (the WAL write lock held), one row in it.
                let c = conn.as_ref().ok_or("begin after close")?;
                let r = c.execute_batch(
                    "BEGIN IMMEDIATE; \
                     INSERT INTO messages (session, content) VALUES ('gw-0', 'in the open transaction')",
                );
                emit(json!({"event": "begin", "error": r.err().map(|e| e.to_string())}))?;
            }
            "commit" => {
                let c = conn.as_ref().ok_or("commit after close")?;
                let r = c.execute_batch("COMMIT");
                emit(json!({"event": "commit", "error": r.err().map(|e| e.to_string())}))?;
            }
            "reconnect" => {
                if let Some(c) = conn.take() {
                    match args.vfs {
                        Vfs::Guard => hermes_guard::close(c).map_err(|(_, e)| e)?,
                        Vfs::Stock => c.close().map_err(|(_, e)| e)?,
                    }
                }
                let c = open(&args.db, args.vfs)?;
                c.execute_batch("PRAGMA wal_autocheckpoint=0")?;
                let stale_wal = match args.vfs {
                    Vfs::Guard => c.guard_status()?.stale_wal.and_then(|s| s.capture_path()),
                    Vfs::Stock => None,
                };
                conn = Some(c);
                emit(json!({"event": "reconnected", "stale_wal_capture": stale_wal}))?;
            }
            "close" => {
                let c = conn.take().ok_or("close after close")?;
                let error = match args.vfs {
                    Vfs::Guard => hermes_guard::close(c).err().map(|(_, e)| e.to_string()),
                    Vfs::Stock => c.close().err().map(|(_, e)| e.to_string()),
                };
                emit(json!({"event": "closed", "error": error}))?;
            }
            "checkpoint" => {
                let c = conn.as_ref().ok_or("checkpoint after close")?;
                let r = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    r.get::<_, i64>(0)
                });
                emit(json!({"event": "checkpoint", "error": r.err().map(|e| e.to_string())}))?;
            }
            cmd if cmd.starts_with("bulk ") => {
                // `bulk N`: N rows of 400 bytes in one transaction (the file grows: page 1 changes).
                let c = conn.as_ref().ok_or("bulk after close")?;
                let n: u32 = cmd["bulk ".len()..].trim().parse()?;
                let tx = c.unchecked_transaction()?;
                for i in 0..n {
                    tx.execute(
                        "INSERT INTO messages (session, content) VALUES ('gw-0', ?1)",
                        [format!("bulk {i} {}", "b".repeat(400))],
                    )?;
                }
                tx.commit()?;
                emit(json!({"event": "bulk"}))?;
            }
            cmd if cmd.starts_with("rows ") => {
                // `rows N`: N short rows in one transaction.
                let c = conn.as_ref().ok_or("rows after close")?;
                let n: u32 = cmd["rows ".len()..].trim().parse()?;
                let tx = c.unchecked_transaction()?;
                {
                    let mut insert =
                        tx.prepare("INSERT INTO messages (session, content) VALUES ('gw-0', ?1)")?;
                    for i in 0..n {
                        insert.execute([format!("row {i}")])?;
                    }
                }
                tx.commit()?;
                emit(json!({"event": "rows"}))?;
            }
            cmd if cmd.starts_with("backup-from ") => {
                // `backup-from PATH`: the backup API copies PATH over this live database.
                let c = conn.as_mut().ok_or("backup after close")?;
                let src = Connection::open(cmd["backup-from ".len()..].trim())?;
                let r = rusqlite::backup::Backup::new(&src, c)
                    .and_then(|b| b.run_to_completion(1000, std::time::Duration::ZERO, None));
                emit(json!({"event": "backup", "error": r.err().map(|e| e.to_string())}))?;
            }
            "passive" => {
                let c = conn.as_ref().ok_or("passive after close")?;
                let r = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0));
                emit(json!({"event": "passive", "error": r.err().map(|e| e.to_string())}))?;
            }
            "status" => {
                // The guard's status (a guarded gateway), and the rows this connection sees.
                let c = conn.as_ref().ok_or("status after close")?;
                let rows: i64 = c.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))?;
                let status = match args.vfs {
                    Vfs::Guard => Some(serde_json::to_value(c.guard_status()?)?),
                    Vfs::Stock => None,
                };
                emit(json!({"event": "status", "rows": rows, "guard": status}))?;
            }
            "quit" => break,
            other => {
                emit(json!({"event": "error", "error": format!("unknown command {other:?}")}))?
            }
        }
    }
    drop(conn);
    Ok(())
}

fn second(args: &WriterArgs) -> Result<()> {
    let conn = open(&args.db, args.vfs)?;
    {
        let tx = conn.unchecked_transaction()?;
        for i in 0..args.rows {
            tx.execute(
                "INSERT INTO messages (session, content) VALUES ('second', ?1)",
                [format!("second generation {i}")],
            )?;
        }
        tx.commit()?;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    let total: i64 = conn.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))?;
    conn.close().map_err(|(_, e)| e)?;
    emit(json!({"event": "done", "rows": total}))
}

fn store(args: &WriterArgs) -> Result<()> {
    use hermes_guard_store::{NewMessage, NewSession};
    let db = hermes_guard_store::SessionDb::open_with(
        &args.db,
        hermes_guard_store::StoreOptions {
            wal_autocheckpoint: Some(0),
            ..hermes_guard_store::StoreOptions::default()
        },
    )?;
    if db.get_session("st-0")?.is_none() {
        db.create_session(&NewSession::new("st-0", "store writer"))?;
    }
    for i in 0..args.wal_rows {
        db.append_message(
            "st-0",
            &NewMessage::new("user", format!("dead generation {i}")),
        )?;
    }
    emit(json!({"event": "ready", "pid": std::process::id()}))?;
    for _ in io::stdin().lock().lines() {}
    Ok(())
}

/// Churn: a writer that keeps the first pages changing, checkpointing as asked, beside which
/// the overwrite judgement must retire no healthy connection.
fn churn_writer(args: &WriterArgs) -> Result<()> {
    let conn = open(&args.db, args.vfs)?;
    let auto = if args.checkpoint == Checkpoint::Auto {
        4
    } else {
        0
    };
    conn.execute_batch(&format!("PRAGMA wal_autocheckpoint={auto}"))?;
    let checkpoint = match args.checkpoint {
        Checkpoint::Passive => Some("PRAGMA wal_checkpoint(PASSIVE)"),
        Checkpoint::Restart => Some("PRAGMA wal_checkpoint(RESTART)"),
        Checkpoint::Auto => None,
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(args.seconds);
    let (mut commits, mut failed, mut busy) = (0u64, 0u64, 0u64);
    let mut first_error = None;
    let pid = std::process::id();
    while std::time::Instant::now() < until {
        // A small table: every commit rewrites pages among the first 16, whose headers the
        // WAL-base record hashes.
        let r = conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; \
             INSERT INTO messages (session, content) VALUES ('churn-{pid}', '{}'); \
             DELETE FROM messages WHERE session = 'churn-{pid}' AND id NOT IN \
               (SELECT id FROM messages WHERE session = 'churn-{pid}' ORDER BY id DESC LIMIT 40); \
             COMMIT",
            "c".repeat(200 + (commits % 7) as usize * 50)
        ));
        match r {
            Ok(()) => commits += 1,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                failed += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
        if let Some(sql) = checkpoint {
            match conn.query_row(sql, [], |r| r.get::<_, i64>(0)) {
                Ok(b) => busy += b as u64,
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    let status = match args.vfs {
        Vfs::Guard => Some(serde_json::to_value(conn.guard_status()?)?),
        Vfs::Stock => None,
    };
    let close = match args.vfs {
        Vfs::Guard => hermes_guard::close(conn).err().map(|(_, e)| e.to_string()),
        Vfs::Stock => conn.close().err().map(|(_, e)| e.to_string()),
    };
    emit(
        json!({"event": "done", "commits": commits, "failed": failed, "busy": busy,
        "error": first_error, "guard": status, "close_error": close}),
    )
}

/// Churn: a connection opened, read and closed, over and over; nothing written. Each close is
/// judged beside the writers' checkpoints, and none may be retired.
fn churn_reader(args: &WriterArgs) -> Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(args.seconds);
    let (mut opens, mut failed, mut retired) = (0u64, 0u64, 0u64);
    let mut first_error = None;
    while std::time::Instant::now() < until {
        let conn = match open(&args.db, args.vfs) {
            Ok(c) => c,
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
                continue;
            }
        };
        opens += 1;
        if let Err(e) = conn.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get::<_, i64>(0))
        {
            failed += 1;
            first_error.get_or_insert(e.to_string());
        }
        let close = match args.vfs {
            Vfs::Guard => {
                if conn.guard_status()?.retired {
                    retired += 1;
                }
                hermes_guard::close(conn).err().map(|(_, e)| e.to_string())
            }
            Vfs::Stock => conn.close().err().map(|(_, e)| e.to_string()),
        };
        if let Some(e) = close {
            failed += 1;
            first_error.get_or_insert(e);
        }
    }
    emit(
        json!({"event": "done", "opens": opens, "failed": failed, "retired": retired,
        "error": first_error}),
    )
}
