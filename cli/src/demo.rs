//! `hermes-guard demo`: the loss scenario, on the stock unix VFS and on hermes-guard, side by side.
//!
//! A gateway process holds `state.db` in WAL mode with rows committed only in its WAL. Its
//! `-wal` and `-shm` are unlinked (a cleanup script, a stray close elsewhere). Another process then
//! commits a newer generation at the same path and checkpoints it. The gateway writes once more
//! and closes. With the stock VFS the write is accepted into an unlinked inode and the close
//! checkpoints the stale frames over the newer generation; with hermes-guard the write is refused,
//! the retired generation is captured, and the close leaves the newer generation alone.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use rusqlite::{Connection, OpenFlags};
use serde_json::Value;

use crate::writer::Vfs;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Arguments of `hermes-guard demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Keep the databases under this directory instead of a temporary one.
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Rows the other process commits.
    #[arg(long, default_value_t = 100)]
    rows: u32,
    /// Rows the gateway holds only in its WAL when the sidecars vanish.
    #[arg(long, default_value_t = 4)]
    wal_rows: u32,
}

const HISTORY_ROWS: i64 = 20;

/// `demo --help`'s exit codes.
pub const DEMO_EXIT_CODES: &str = "\
Exit codes:
  0  the demo ran: hermes-guard lost no committed row, and recover put every captured row back
  1  it did not: hermes-guard lost rows, recover left some out, or the demo could not run
     (the message says which)
  2  a usage error";

struct Outcome {
    committed: i64,
    live: i64,
    captured_only: i64,
    lost: i64,
    integrity: String,
    write: String,
    capture: Option<PathBuf>,
    /// Rows in the live database after `hermes-guard recover --apply` of the capture.
    after_recover: Option<i64>,
    integrity_after_recover: Option<String>,
}

pub fn run(args: DemoArgs) -> Result<()> {
    let temp;
    let root = match &args.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    println!(
        "hermes-guard demo: a gateway holds state.db in WAL mode with {} rows only in its WAL;\n\
         its -wal and -shm are unlinked; another process commits {} rows and checkpoints;\n\
         the gateway commits once more and closes.\n",
        args.wal_rows, args.rows
    );
    let stock = scenario(&root.join("stock"), Vfs::Stock, &args)?;
    let guard = scenario(&root.join("guard"), Vfs::Guard, &args)?;

    let row = |label: &str, a: String, b: String| println!("{label:<36}{a:>22}  {b:<}");
    let each =
        |label: &str, field: fn(&Outcome) -> String| row(label, field(&stock), field(&guard));
    row("", "stock unix VFS".into(), "hermes-guard".into());
    each("rows committed (acknowledged)", |o| o.committed.to_string());
    each("rows in the live database", |o| o.live.to_string());
    each("rows recoverable from the capture", |o| {
        o.captured_only.to_string()
    });
    each("rows lost", |o| o.lost.to_string());
    each("PRAGMA integrity_check", |o| o.integrity.clone());
    each("rows live after `recover --apply`", |o| {
        o.after_recover.map_or("-".into(), |n| n.to_string())
    });
    each("integrity_check after recover", |o| {
        o.integrity_after_recover
            .clone()
            .unwrap_or_else(|| "-".into())
    });
    each("the write after the loss", |o| o.write.clone());
    row(
        "capture",
        "-".into(),
        guard
            .capture
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "-".into()),
    );
    if args.keep.is_none() {
        println!("\n(pass --keep DIR to keep the databases and the capture)");
    }
    if guard.after_recover != Some(guard.committed) {
        return Err(format!(
            "after recover the live database holds {:?} of {} committed rows",
            guard.after_recover, guard.committed
        )
        .into());
    }
    if guard.lost != 0 {
        return Err(format!("hermes-guard lost {} committed rows", guard.lost).into());
    }
    Ok(())
}

fn scenario(dir: &Path, vfs: Vfs, args: &DemoArgs) -> Result<Outcome> {
    std::fs::create_dir_all(dir)?;
    let db = dir.join("state.db");
    let exe = std::env::current_exe()?;
    let vfs_arg = match vfs {
        Vfs::Stock => "stock",
        Vfs::Guard => "guard",
    };
    let mut gateway = Gateway::spawn(&exe, &db, vfs_arg, args.wal_rows)?;
    gateway.expect("ready")?;

    for suffix in ["-wal", "-shm"] {
        let mut sidecar = db.clone().into_os_string();
        sidecar.push(suffix);
        std::fs::remove_file(sidecar)?;
    }

    let write = gateway.command("write", "write")?;
    let accepted = !write["refused"].as_bool().unwrap_or(false);
    let capture = write["artifact"].as_str().map(PathBuf::from);

    let second = Command::new(&exe)
        .args(["writer", "--role", "second", "--vfs", vfs_arg, "--rows"])
        .arg(args.rows.to_string())
        .arg("--db")
        .arg(&db)
        .output()?;
    if !second.status.success() {
        return Err(format!(
            "the second writer failed: {}",
            String::from_utf8_lossy(&second.stderr)
        )
        .into());
    }

    let closed = gateway.command("close", "closed")?;
    if let Some(e) = closed["error"].as_str() {
        return Err(format!("the gateway's close failed: {e}").into());
    }
    gateway.finish()?;

    // With enough rows the stock VFS's stale checkpoint leaves a malformed file rather than a
    // silently shorter one: count what can still be read, and say so.
    let live = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let integrity = live
        .query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .unwrap_or_else(|e| e.to_string());
    let live_rows: i64 = live
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap_or(0);
    let live_gateway = count_gateway_rows(&live).unwrap_or(0);
    drop(live);

    let captured_gateway = match &capture {
        Some(artifact) => {
            let work = dir.join("recovered");
            std::fs::create_dir_all(&work)?;
            std::fs::copy(artifact.join("state.db"), work.join("state.db"))?;
            std::fs::copy(artifact.join("state.db-wal"), work.join("state.db-wal"))?;
            let recovered = Connection::open(work.join("state.db"))?;
            count_gateway_rows(&recovered)?
        }
        None => 0,
    };

    // The operator's step: merge the capture's missing rows back into the live database.
    let (after_recover, integrity_after_recover) = match &capture {
        Some(artifact) => {
            crate::recover_cmd::merge_quietly(artifact, &db)?;
            let live = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
            let rows: i64 = live.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))?;
            let check: String = live.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
            (Some(rows), Some(check))
        }
        None => (None, None),
    };

    let gateway_committed = HISTORY_ROWS + i64::from(args.wal_rows) + i64::from(accepted);
    let committed = gateway_committed + i64::from(args.rows);
    let second_live = live_rows - live_gateway;
    // A gateway row is safe if it is in the live database or in the capture.
    let gateway_safe = live_gateway.max(captured_gateway);
    let lost = (gateway_committed - gateway_safe) + (i64::from(args.rows) - second_live);
    Ok(Outcome {
        committed,
        live: live_rows,
        captured_only: (captured_gateway - live_gateway).max(0),
        lost,
        integrity,
        write: if accepted {
            "accepted silently".into()
        } else {
            "refused (READONLY_DBMOVED)".into()
        },
        capture,
        after_recover,
        integrity_after_recover,
    })
}

fn count_gateway_rows(conn: &Connection) -> Result<i64> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM messages WHERE session = 'gw-0'",
        [],
        |r| r.get(0),
    )?)
}

/// The gateway child and its two pipes.
struct Gateway {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Gateway {
    fn spawn(exe: &Path, db: &Path, vfs: &str, wal_rows: u32) -> Result<Gateway> {
        let mut child = Command::new(exe)
            .args(["writer", "--role", "gateway", "--vfs", vfs, "--wal-rows"])
            .arg(wal_rows.to_string())
            .arg("--db")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        Ok(Gateway {
            child,
            stdin,
            lines,
        })
    }

    fn expect(&mut self, event: &str) -> Result<Value> {
        let line = self
            .lines
            .next()
            .ok_or_else(|| format!("the gateway exited before {event:?}"))??;
        let value: Value = serde_json::from_str(&line)?;
        if value["event"] != event {
            return Err(format!("expected {event:?} from the gateway, got {line}").into());
        }
        Ok(value)
    }

    fn command(&mut self, command: &str, event: &str) -> Result<Value> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        self.expect(event)
    }

    fn finish(mut self) -> Result<()> {
        writeln!(self.stdin, "quit")?;
        drop(self.stdin);
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!("the gateway exited with {status}").into());
        }
        Ok(())
    }
}
