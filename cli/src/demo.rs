//! `hermes-guard demo`: the loss scenario, on the stock unix VFS and on hermes-guard, side by side.
//!
//! A gateway process holds `state.db` in WAL mode with rows committed only in its WAL. Its
//! `-wal` and `-shm` are unlinked (a cleanup script, a stray close elsewhere). Then the gateway
//! writes once more and another process commits a newer generation at the same path and
//! checkpoints it — in that order by default, the other way round with `--newer-first` — and the
//! gateway closes. With the stock VFS the write is accepted into an unlinked inode and the close
//! checkpoints the stale frames over the newer generation; with hermes-guard the write is refused,
//! the retired generation is captured, and the close leaves the newer generation alone. On
//! hermes-guard the demo then takes the operator's step (`captures`, `recover`, the merge) and
//! counts, in both columns, the rows of each generation live at the end.
//!
//! The narration is printed from the same list of steps the scenario runs ([`Step::order`]).

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
    /// The other process commits its rows and checkpoints before the gateway's next write
    /// (by default: after it).
    #[arg(long)]
    newer_first: bool,
    /// Pass --verbose to the operator's `captures` and `recover`: each also prints the evidence
    /// the capture recorded for its base.
    #[arg(long, short)]
    verbose: bool,
}

const HISTORY_ROWS: i64 = 20;

/// `demo --help`'s exit codes.
pub const DEMO_EXIT_CODES: &str = "\
Exit codes:
  0  the demo ran: with hermes-guard no committed row was lost, and after the merge every row
     of both generations is live, once
  1  it did not: hermes-guard lost rows, or after the merge rows of either generation are
     missing or doubled, or the demo could not run (the message says which)
  2  a usage error";

/// One step of the scenario after the gateway is ready, in the order [`Step::order`] gives.
#[derive(Clone, Copy)]
enum Step {
    /// `state.db-wal` and `state.db-shm` are unlinked under the gateway.
    Unlink,
    /// The gateway writes one more row.
    GatewayWrite,
    /// Another process commits the newer generation and checkpoints it.
    NewerCommits,
    /// The gateway closes its connection.
    GatewayClose,
}

impl Step {
    /// The steps in the order they run: the gateway's write before the other process's commits,
    /// or (`--newer-first`) after them.
    fn order(newer_first: bool) -> [Step; 4] {
        use Step::*;
        if newer_first {
            [Unlink, NewerCommits, GatewayWrite, GatewayClose]
        } else {
            [Unlink, GatewayWrite, NewerCommits, GatewayClose]
        }
    }

    fn describe(self, args: &DemoArgs) -> String {
        match self {
            Step::Unlink => "state.db-wal and state.db-shm are unlinked under it (a cleanup \
                             script, a stray close elsewhere)"
                .into(),
            Step::GatewayWrite => "the gateway commits one more row".into(),
            Step::NewerCommits => format!(
                "another process opens state.db, commits {} rows (the newer generation), \
                 checkpoints (TRUNCATE) and exits",
                args.rows
            ),
            Step::GatewayClose => "the gateway closes its connection".into(),
        }
    }
}

/// Rows of one generation live at the end: distinct rows, and all copies of them.
type Live = std::result::Result<(i64, i64), String>;

struct Outcome {
    committed: i64,
    live: i64,
    captured_only: String,
    lost: i64,
    integrity: String,
    write: String,
    capture: Option<PathBuf>,
    /// Rows in the live database after the merge of the capture.
    after_recover: Option<i64>,
    integrity_after_recover: Option<String>,
    /// Rows the gateway committed (acknowledged): the retired generation.
    gateway_committed: i64,
    /// The newer generation's and the gateway's rows live at the end (after the merge, if any).
    newer_live: Live,
    retired_live: Live,
    /// The operator's commands (hermes-guard): each command line, its output, its exit code.
    operator: Vec<(String, String, Option<i32>)>,
    /// The merge of the capture: rows inserted and rows changed (inserted, updated or deleted),
    /// or why it failed.
    merged: Option<std::result::Result<(u64, u64), String>>,
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
    print!("{}", narration(&args));
    let stock = scenario(&root.join("stock"), Vfs::Stock, &args)?;
    let guard = scenario(&root.join("guard"), Vfs::Guard, &args)?;

    let row = |label: &str, a: String, b: String| println!("{label:<36}{a:>22}  {b:<}");
    let each =
        |label: &str, field: fn(&Outcome) -> String| row(label, field(&stock), field(&guard));
    row("", "stock unix VFS".into(), "hermes-guard".into());
    each("rows committed (acknowledged)", |o| o.committed.to_string());
    each("rows in the live database", |o| o.live.to_string());
    each("rows recoverable from the capture", |o| {
        o.captured_only.clone()
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

    println!("\nThe operator's step on hermes-guard:");
    if guard.operator.is_empty() {
        println!("  (no capture: nothing to recover)");
    }
    for (command, output, code) in &guard.operator {
        println!("$ {command}");
        for line in output.lines() {
            println!("    {line}");
        }
        println!("    (exit {})", code.map_or("?".into(), |c| c.to_string()));
    }
    match &guard.merged {
        Some(Ok((inserted, changed))) => println!(
            "The merge (what `recover --apply` runs): {inserted} row(s) inserted, {} updated or \
             deleted.",
            changed.saturating_sub(*inserted)
        ),
        Some(Err(e)) => println!("The merge (what `recover --apply` runs) failed: {e}"),
        None => {}
    }
    println!("\nAt the end (stock: after the gateway's close; hermes-guard: after the merge):");
    println!("  stock unix VFS  {}", counts(&stock, &args));
    println!("  hermes-guard    {}", counts(&guard, &args));
    if args.keep.is_none() {
        println!("\n(pass --keep DIR to keep the databases and the capture)");
    }
    if guard.lost != 0 {
        return Err(format!("hermes-guard lost {} committed rows", guard.lost).into());
    }
    if let Some(Err(e)) = &guard.merged {
        return Err(format!("with hermes-guard, recover's merge failed: {e}").into());
    }
    let whole = |live: &Live, of: i64| matches!(live, Ok((n, all)) if *n == of && *all == of);
    if !whole(&guard.newer_live, i64::from(args.rows))
        || !whole(&guard.retired_live, guard.gateway_committed)
    {
        return Err(format!("with hermes-guard, at the end: {}", counts(&guard, &args)).into());
    }
    if guard.after_recover != Some(guard.committed) {
        return Err(format!(
            "after recover the live database holds {:?} of {} committed rows",
            guard.after_recover, guard.committed
        )
        .into());
    }
    Ok(())
}

/// What the demo runs, step by step, in the order it runs them.
fn narration(args: &DemoArgs) -> String {
    let mut steps = vec![format!(
        "a gateway process opens state.db in WAL mode, commits {HISTORY_ROWS} rows and \
         checkpoints them, then commits {} rows that stay only in its WAL",
        args.wal_rows
    )];
    steps.extend(
        Step::order(args.newer_first)
            .iter()
            .map(|s| s.describe(args)),
    );
    steps.push(
        "on hermes-guard: `hermes-guard captures state.db` lists the capture, `hermes-guard \
         recover <capture> --into state.db` prints the plan, and the demo merges it (the merge \
         `--apply` runs)"
            .into(),
    );
    let mut text = wrap(
        &format!(
            "hermes-guard demo{}: in this order, on the stock unix VFS, then on hermes-guard:",
            if args.newer_first {
                " --newer-first"
            } else {
                ""
            }
        ),
        "",
        "",
    );
    for (i, step) in steps.iter().enumerate() {
        let end = if i + 1 == steps.len() { '.' } else { ';' };
        text.push_str(&wrap(&format!("{}. {step}{end}", i + 1), "  ", "     "));
    }
    text.push_str(&wrap(
        &format!(
            "The newer generation: the other process's {} rows; the retired one: the gateway's. {}",
            args.rows,
            if args.newer_first {
                "Without --newer-first, steps 3 and 4 run the other way round: the gateway \
                 writes before the other process commits."
            } else {
                "--newer-first runs steps 3 and 4 the other way round: the other process commits \
                 and checkpoints before the gateway writes."
            }
        ),
        "",
        "",
    ));
    text.push('\n');
    text
}

/// `text` wrapped at 96 columns, its first line after `first`, the others after `rest`.
fn wrap(text: &str, first: &str, rest: &str) -> String {
    let mut out = String::new();
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.len() + 1 + word.len() > 96 {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// `newer rows live: 100 of 100; retired rows live: 24 of 24`, copies beyond one counted.
fn counts(o: &Outcome, args: &DemoArgs) -> String {
    let of = |live: &Live, expected: i64| match live {
        Ok((n, all)) if all > n => format!("{n} of {expected} (and {} duplicate(s))", all - n),
        Ok((n, _)) => format!("{n} of {expected}"),
        Err(e) => format!("unreadable ({e})"),
    };
    format!(
        "newer rows live: {}; retired rows live: {}",
        of(&o.newer_live, i64::from(args.rows)),
        of(&o.retired_live, o.gateway_committed)
    )
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

    let mut write = None;
    for step in Step::order(args.newer_first) {
        match step {
            Step::Unlink => {
                for suffix in ["-wal", "-shm"] {
                    let mut sidecar = db.clone().into_os_string();
                    sidecar.push(suffix);
                    std::fs::remove_file(sidecar)?;
                }
            }
            Step::GatewayWrite => write = Some(gateway.command("write", "write")?),
            Step::NewerCommits => newer_commits(&exe, &db, vfs_arg, args.rows)?,
            Step::GatewayClose => {
                let closed = gateway.command("close", "closed")?;
                if let Some(e) = closed["error"].as_str() {
                    return Err(format!("the gateway's close failed: {e}").into());
                }
            }
        }
    }
    gateway.finish()?;
    let write = write.ok_or("the gateway did not write")?;
    let accepted = !write["refused"].as_bool().unwrap_or(false);
    let capture = write["artifact"].as_str().map(PathBuf::from);

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

    // The gateway's rows the capture holds, read as recovery reads them (a private copy).
    let captured_gateway = match &capture {
        Some(artifact) => hermes_guard::recover::Capture::open(artifact)
            .map_err(|e| e.to_string())
            .and_then(|c| count_gateway_rows(c.connection()).map_err(|e| e.to_string())),
        None => Ok(0),
    };

    // The operator's step: list the captures, plan the merge, then merge the capture's missing
    // rows back into the live database (the merge `recover --apply` runs).
    let mut operator = Vec::new();
    let (after_recover, integrity_after_recover, merged) = match &capture {
        Some(artifact) => {
            let db_arg = db.as_os_str().to_owned();
            let verbose: &[&std::ffi::OsStr] = if args.verbose {
                &["--verbose".as_ref()]
            } else {
                &[]
            };
            let captures = ["captures".as_ref(), db_arg.as_os_str()];
            operator.push(run_cli(&exe, &[&captures[..], verbose].concat())?);
            let recover = [
                "recover".as_ref(),
                artifact.as_os_str(),
                "--into".as_ref(),
                db_arg.as_os_str(),
            ];
            operator.push(run_cli(&exe, &[&recover[..], verbose].concat())?);
            // A merge that fails writes nothing: the demo says so and counts what is live.
            let merged = crate::recover_cmd::merge_quietly(artifact, &db)
                .map(|report| (report.inserted(), report.changed()))
                .map_err(|e| e.to_string());
            let live = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
            let rows: i64 = live.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))?;
            let check: String = live.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
            (Some(rows), Some(check), Some(merged))
        }
        None => (None, None, None),
    };

    // Each generation's rows live at the end.
    let (newer_live, retired_live) =
        match Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY) {
            Ok(end) => (live_of(&end, "second"), live_of(&end, "gw-0")),
            Err(e) => (Err(e.to_string()), Err(e.to_string())),
        };

    let gateway_committed = HISTORY_ROWS + i64::from(args.wal_rows) + i64::from(accepted);
    let committed = gateway_committed + i64::from(args.rows);
    let second_live = live_rows - live_gateway;
    // A gateway row is safe if it is in the live database or in the capture.
    let gateway_safe = live_gateway.max(*captured_gateway.as_ref().unwrap_or(&0));
    let lost = (gateway_committed - gateway_safe) + (i64::from(args.rows) - second_live);
    Ok(Outcome {
        committed,
        live: live_rows,
        captured_only: match &captured_gateway {
            Ok(n) => (n - live_gateway).max(0).to_string(),
            Err(e) => format!("unreadable ({e})"),
        },
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
        gateway_committed,
        newer_live,
        retired_live,
        operator,
        merged,
    })
}

/// The other process: opens `db`, commits `rows` rows, checkpoints (TRUNCATE) and exits.
fn newer_commits(exe: &Path, db: &Path, vfs: &str, rows: u32) -> Result<()> {
    let second = Command::new(exe)
        .args(["writer", "--role", "second", "--vfs", vfs, "--rows"])
        .arg(rows.to_string())
        .arg("--db")
        .arg(db)
        .output()?;
    if !second.status.success() {
        return Err(format!(
            "the second writer failed: {}",
            String::from_utf8_lossy(&second.stderr)
        )
        .into());
    }
    Ok(())
}

/// Runs `hermes-guard ARGS` (this binary): the command line as the operator types it, its
/// output (stdout, then stderr) and its exit code.
fn run_cli(exe: &Path, args: &[&std::ffi::OsStr]) -> Result<(String, String, Option<i32>)> {
    let out = Command::new(exe).args(args).output()?;
    let line = std::iter::once("hermes-guard".to_owned())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok((line, text, out.status.code()))
}

fn count_gateway_rows(conn: &Connection) -> Result<i64> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM messages WHERE session = 'gw-0'",
        [],
        |r| r.get(0),
    )?)
}

/// The rows of `session` live in `conn`: distinct ones (each row's content is its own), and all.
fn live_of(conn: &Connection, session: &str) -> Live {
    conn.query_row(
        "SELECT COUNT(DISTINCT content), COUNT(*) FROM messages WHERE session = ?1",
        [session],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .map_err(|e| e.to_string())
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
