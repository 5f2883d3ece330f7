//! `hermes-guard captures <DB|DIR>`.

use std::path::PathBuf;
use std::process::ExitCode;

use hermes_guard::recover::{self, Capture, MergeOptions};
use serde_json::json;

use super::{given, put_path, report_error, BAD_INPUT, DONE, FAILED, LEFT_OVER};

/// `captures --help`'s exit codes.
pub const CAPTURES_EXIT_CODES: &str = "\
Exit codes:
  0  listed: every capture found verifies and no row of one is missing from the live
     database (an interrupted .partial capture is listed as such and does not count; no
     capture at all is 0 too)
  1  a capture listed is unreadable (its manifest.json cannot be read: its status says how
     to open its files) or does not verify: see its status; 1 wins over 3
  2  bad input: a usage error, or a path that does not exist or cannot be listed
  3  rows of a capture are still missing from the live database: `recover <capture>
     --into <database>` shows them, --apply merges them
Nothing is ever written.

Runbook: hermes-guard help recovery";

/// Arguments of `hermes-guard captures`.
#[derive(clap::Args)]
pub struct CapturesArgs {
    /// A database (its captures beside it) or a directory (every capture in it).
    path: PathBuf,
    /// One JSON document on stdout: an array with one object per capture.
    #[arg(long)]
    json: bool,
}

/// One capture's row: its status, and whether it counts as unreadable for the exit code.
pub fn row_of(
    entry: &recover::CaptureListing,
    given_db: Option<&PathBuf>,
) -> (serde_json::Value, bool) {
    let mut row = json!({ "partial": entry.partial });
    put_path(&mut row, "capture", &entry.path);
    if entry.partial {
        row["status"] = "interrupted (.partial): incomplete, never used; can be deleted".into();
        return (row, false);
    }
    let Some(m) = &entry.manifest else {
        row["verified"] = false.into();
        let why = entry.manifest_error.as_deref().unwrap_or("?");
        row["status"] = match given::how_to_open(&entry.path) {
            Some(hint) => format!("unreadable: {why}; {hint}"),
            None => format!("unreadable: {why}"),
        }
        .into();
        return (row, true);
    };
    row["captured_at"] = m.captured_at.clone().into();
    row["reason"] = serde_json::to_value(m.reason).unwrap_or_default();
    row["trigger"] = serde_json::to_value(m.trigger).unwrap_or_default();
    row["commits"] = m.wal.commits.into();
    row["main_torn"] = m.main_torn.into();
    let database = given_db.cloned().unwrap_or_else(|| m.database_path());
    put_path(&mut row, "database", &database);
    let healed = entry.heal.as_ref().is_some_and(|h| h.is_healed());
    row["healed"] = healed.into();
    if let Some(heal) = &entry.heal {
        row["heal"] = heal.describe().into();
    }
    let check = match recover::verify_capture(&entry.path) {
        Err(e) => {
            row["verified"] = false.into();
            row["status"] = format!("NOT verified: {e}").into();
            return (row, true);
        }
        Ok(c) => c,
    };
    row["unreadable_commits"] = check.unreadable_commits.into();
    if !check.verified() {
        row["verified"] = false.into();
        row["problems"] = check.problems.clone().into();
        row["status"] = format!("NOT verified: {}", check.problems.join("; ")).into();
        return (row, true);
    }
    if check.manifest.main.mode == hermes_guard::manifest::ImageMode::Absent {
        row["verified"] = true.into();
        row["status"] = "verified (a stale WAL set aside at the open: recover it with --main <the \
                         database file it was written on>)"
            .into();
        return (row, false);
    }
    match Capture::open(&entry.path) {
        Err(e) => {
            row["verified"] = false.into();
            row["status"] = format!("NOT verified: {e}").into();
            (row, true)
        }
        Ok(capture) => {
            row["verified"] = capture.is_clean().into();
            row["status"] = if capture.is_clean() && healed {
                "verified; healed into the live file at close (nothing to merge)".into()
            } else if capture.is_clean() {
                "verified".into()
            } else {
                format!(
                    "the files match the manifest, but integrity_check fails: {}",
                    capture.integrity().first().cloned().unwrap_or_default()
                )
                .into()
            };
            match recover::plan(&capture, &database, &MergeOptions::default()) {
                Ok(plan) => {
                    row["missing"] = plan.missing().into();
                    row["conflicts"] = plan.conflicts().into();
                }
                Err(e) => row["missing_error"] = e.to_string().into(),
            }
            (row, !capture.is_clean())
        }
    }
}

/// `hermes-guard captures <DB|DIR>`.
pub fn captures(args: CapturesArgs) -> ExitCode {
    let listed = match recover::list_captures(&args.path) {
        Ok(l) => l,
        // Whatever the cause (no such path, no permission), what was given cannot be listed.
        Err(e) => {
            let message = if args
                .path
                .symlink_metadata()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            {
                format!(
                    "{} does not exist: give the database's path (its captures are beside it) \
                     or a directory (every capture in it)",
                    args.path.display()
                )
            } else {
                format!("{} cannot be listed: {e}", args.path.display())
            };
            return report_error(args.json, &message, BAD_INPUT, false);
        }
    };
    let given_db = std::fs::metadata(&args.path)
        .map(|m| m.is_file())
        .unwrap_or(false)
        .then(|| args.path.clone());
    let mut out = Vec::new();
    let mut unreadable = 0usize;
    for entry in &listed {
        let (row, bad) = row_of(entry, given_db.as_ref());
        unreadable += usize::from(bad);
        out.push(row);
    }
    let missing: u64 = out.iter().filter_map(|r| r["missing"].as_u64()).sum();
    let code = ExitCode::from(if unreadable > 0 {
        FAILED
    } else if missing > 0 {
        LEFT_OVER
    } else {
        DONE
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return code;
    }
    if out.is_empty() {
        println!("no captures found for {}", args.path.display());
        return code;
    }
    for row in &out {
        let s = |k: &str| row[k].as_str().unwrap_or("-").to_owned();
        println!("{}", s("capture"));
        if row["partial"] == true || row.get("captured_at").is_none() {
            println!("    {}", s("status"));
            continue;
        }
        println!(
            "    when {}   why {} (trigger {})   commits {}{}",
            s("captured_at"),
            s("reason"),
            s("trigger"),
            row["commits"],
            if row["main_torn"] == true {
                "   MAIN TORN: see recover --rebuild"
            } else {
                ""
            }
        );
        println!("    {}", s("status"));
        match (row.get("missing"), row.get("missing_error")) {
            (Some(n), _) => println!(
                "    rows still missing from {}: {n}{}",
                s("database"),
                match row["conflicts"].as_u64() {
                    Some(c) if c > 0 => format!(" (and {c} conflicting keys)"),
                    _ => String::new(),
                }
            ),
            (None, Some(e)) => println!(
                "    rows still missing: unknown ({})",
                e.as_str().unwrap_or("")
            ),
            _ => {}
        }
    }
    if missing > 0 {
        println!(
            "{missing} row(s) are still missing from the live database: `hermes-guard recover \
             <capture> --into <database>` shows them, and with --apply merges them"
        );
    }
    if unreadable > 0 {
        eprintln!(
            "hermes-guard: {unreadable} capture(s) listed are unreadable or do not verify: see \
             their status above"
        );
    }
    code
}
