//! `hermes-guard status <db>`: is this database healthy, is anything held, are there captures —
//! in one read-only command, for a person with a shell and a database path. It reads, and writes
//! nothing:
//!
//! - the stale-WAL judgement of what is at the path (`hermes_guard::judge_wal_at_path`, the
//!   judgement a guarded open makes);
//! - the processes holding the database's deleted `-wal` open (`held`), each captured or not;
//! - its captures (beside it and in the fallback capture directories) and the rows of each still
//!   missing from the live database (`captures`);
//! - the filesystem it is on, and whether WAL mode is safe there ([`filesystem_of`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hermes_guard::WalAtPath;
use serde_json::json;

use crate::database_arg::{self, Accept};
use crate::held::{held_wal, verdict};
use crate::recover_cmd::{put_path, report_error, row_of, BAD_INPUT, DONE, LEFT_OVER};

/// `status --help`'s exit codes.
pub const STATUS_EXIT_CODES: &str = "\
Exit codes:
  0  healthy: the WAL at the path (if any) belongs to this database file, no process holds an
     uncaptured generation of it, and no capture of it has rows missing or is unreadable
  2  bad input: a usage error, or a path that does not exist or is not a SQLite database file
  3  attention: each thing to look at is listed, with what to do
Nothing is ever written.

Runbook: hermes-guard help recovery";

/// Arguments of `hermes-guard status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// The database file.
    path: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    json: bool,
}

/// The filesystem the database is on (its directory's: `statfs`, and a FUSE mount's type), for
/// the status: its type, whether SQLite's WAL mode is safe there, whether inotify sees it.
fn filesystem_of(db: &Path) -> Option<hermes_guard::Filesystem> {
    let dir = match db.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    hermes_guard::filesystem_of_dir(dir)
}

fn bad_input(json: bool, message: &str) -> ExitCode {
    report_error(json, message, BAD_INPUT, false)
}

/// The WAL's judgement as JSON and the attention line it asks for.
fn wal_part(wal: &WalAtPath) -> (serde_json::Value, String, Option<String>) {
    let (said, detail) = match wal {
        WalAtPath::NoWal => ("no -wal beside it".to_owned(), None),
        WalAtPath::NothingToReplay => ("a -wal with no frame to replay".to_owned(), None),
        WalAtPath::NoRecord => (
            "a -wal with frames but no record of the file it was written on (unguarded writers \
             only, or no extended attributes): not judged"
                .to_owned(),
            None,
        ),
        WalAtPath::OtherGeneration { .. } => (
            "a -wal of another generation than the recorded one (restarted by an unguarded \
             process): not judged"
                .to_owned(),
            None,
        ),
        WalAtPath::Continues => ("the -wal continues this database file".to_owned(), None),
        WalAtPath::Stale(m) => (format!("STALE: {}", m.detail), Some(m.detail.clone())),
        _ => ("not judged".to_owned(), None),
    };
    let mut doc = json!({"verdict": wal.name(), "said": said});
    if let Some(detail) = &detail {
        doc["detail"] = detail.clone().into();
    }
    let attention = wal.needs_attention().then(|| {
        "the -wal at the path was written on another database file: a guarded open sets it aside \
         (captured, nothing replayed); a stock open would replay it onto this file — open it \
         through the guard, or see hermes-guard help recovery"
            .to_owned()
    });
    (doc, said, attention)
}

/// `hermes-guard status <db>`.
pub fn status(args: StatusArgs) -> ExitCode {
    let db = &args.path;
    if let Err(e) = database_arg::check(db, Accept::File) {
        return bad_input(args.json, &e.to_string());
    }
    let wal = match hermes_guard::judge_wal_at_path(db) {
        Ok(w) => w,
        Err(e) => return bad_input(args.json, &format!("{} cannot be read: {e}", db.display())),
    };
    let mut attention = Vec::new();
    let (wal_doc, wal_said, wal_attention) = wal_part(&wal);
    attention.extend(wal_attention);

    // `/proc/<pid>/fd` names the WAL by its resolved path.
    let canonical = std::fs::canonicalize(db).unwrap_or_else(|_| db.clone());
    let held = held_wal(&hermes_guard::paths::sidecar(&canonical, "-wal"));
    let mut held_rows = Vec::new();
    let mut held_lines = Vec::new();
    for h in &held {
        let mut row = json!({"pid": h.pid, "command": h.command, "descriptors": h.descriptors,
                             "captured": h.captured_in.is_some()});
        put_path(&mut row, "copy_from", &h.copy_from);
        if let Some(c) = &h.captured_in {
            put_path(&mut row, "capture", c);
        } else {
            attention.push(format!(
                "pid {} ({}) holds a retired generation of it NOT captured: copy {} before \
                 restarting that process",
                h.pid,
                h.command,
                h.copy_from.display()
            ));
        }
        held_rows.push(row);
        held_lines.push(format!(
            "pid {} ({}), {} descriptor(s): {}",
            h.pid,
            h.command,
            h.descriptors,
            verdict(h.captured_in.as_deref(), &h.copy_from)
        ));
    }

    let listed = hermes_guard::recover::list_captures(db).unwrap_or_default();
    let mut capture_rows = Vec::new();
    for entry in listed.iter().filter(|e| !e.partial) {
        let (row, bad) = row_of(entry, Some(db));
        let name = row["capture"].as_str().unwrap_or("?").to_owned();
        if bad {
            attention.push(format!(
                "capture {name}: {}",
                row["status"].as_str().unwrap_or("?")
            ));
        } else if let Some(n) = row["missing"].as_u64().filter(|n| *n > 0) {
            attention.push(format!(
                "capture {name}: {n} row(s) missing from the live database: hermes-guard \
                 recover {name} --into {} --apply",
                db.display()
            ));
        }
        capture_rows.push(row);
    }

    let filesystem = filesystem_of(db);
    if let Some(fs) = filesystem.as_ref().filter(|fs| !fs.wal_safe) {
        attention.push(format!(
            "{} is on {}, where SQLite's WAL mode is not safe (every process must be on one host, \
             with working shared memory and POSIX locks): move it to a local filesystem, or use \
             journal_mode=DELETE ({}=refuse makes the guard refuse WAL there)",
            db.display(),
            fs.name,
            hermes_guard::UNSAFE_FS_ENV
        ));
    }
    let code = if attention.is_empty() {
        DONE
    } else {
        LEFT_OVER
    };
    if args.json {
        let mut doc = json!({
            "wal": wal_doc,
            "held": held_rows,
            "captures": capture_rows,
            "attention": attention,
            "healthy": attention.is_empty(),
            "exit_code": code,
        });
        put_path(&mut doc, "database", db);
        if let Some(fs) = &filesystem {
            doc["filesystem"] =
                json!({"name": fs.name, "wal_safe": fs.wal_safe, "local": fs.local});
        }
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return ExitCode::from(code);
    }
    println!("database   {}", db.display());
    if let Some(fs) = &filesystem {
        let safe = if fs.wal_safe {
            "WAL-safe"
        } else {
            "WAL mode NOT safe here"
        };
        println!("filesystem {} ({safe})", fs.name);
    }
    println!("wal        {wal_said}");
    if held_lines.is_empty() {
        println!("held       no process holds a deleted -wal of it open");
    }
    for line in &held_lines {
        println!("held       {line}");
    }
    if capture_rows.is_empty() {
        println!("captures   none");
    }
    for row in &capture_rows {
        let missing = row["missing"]
            .as_u64()
            .map_or(String::new(), |n| format!("; {n} row(s) missing"));
        println!(
            "capture    {}: {}{missing}",
            row["capture"].as_str().unwrap_or("?"),
            row["status"].as_str().unwrap_or("?")
        );
    }
    if attention.is_empty() {
        println!("healthy");
    } else {
        println!("ATTENTION: {} thing(s)", attention.len());
        for a in &attention {
            println!("  - {a}");
        }
    }
    ExitCode::from(code)
}
