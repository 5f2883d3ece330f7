//! `hermes-guard captures <DB|DIR>`.

use std::path::PathBuf;
use std::process::ExitCode;

use hermes_guard::recover::{self, Capture, MergeOptions};
use serde_json::json;

use crate::database_arg::{self, Accept, DatabaseArgError};

use super::{base_words, given, put_path, report_error, BAD_INPUT, DONE, FAILED, LEFT_OVER};

/// `captures --help`'s exit codes.
pub const CAPTURES_EXIT_CODES: &str = "\
Exit codes:
  0  listed: every capture found verifies and no row of one is missing from the live
     database (an interrupted .partial capture is listed as such and does not count; no
     capture at all is 0 too)
  1  a capture listed is unreadable (its manifest.json cannot be read: its status says how
     to open its files) or does not verify: see its status; 1 wins over 3
  2  bad input: a usage error, a path that does not exist or cannot be listed, or a file
     that is not a SQLite database (as for status)
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
    /// Also print what each capture recorded as the evidence for its base (whether its main
    /// image is the file its WAL generation was written on).
    #[arg(long, short)]
    verbose: bool,
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
    row["base"] = m.base_verdict().word().into();
    row["base_evidence"] = m.base_evidence().into();
    row["base_words"] = base_words::captures_line(m, None).into();
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
    if let Some(generation) = recover::generation_id(&check.wal_check) {
        row["generation"] = generation.into();
    }
    row["frames"] = check.wal_check.last_commit_frame.unwrap_or(0).into();
    row["holds_image"] =
        (check.manifest.main.mode != hermes_guard::manifest::ImageMode::Absent).into();
    row["main_file"] = check.manifest.main.file.clone().into();
    // An image overwritten in place is not the file the WAL was written on: no --main.
    row["image_is_base"] =
        (check.manifest.reason != Some(hermes_guard::RetireReason::MainOverwritten)).into();
    let mut command = vec![
        "recover".to_owned(),
        entry.path.display().to_string(),
        "--into".to_owned(),
        database.display().to_string(),
    ];
    if check.manifest.main.mode == hermes_guard::manifest::ImageMode::Absent {
        command.splice(
            2..2,
            [
                "--main".to_owned(),
                "<the database file it was written on>".to_owned(),
            ],
        );
    }
    row["recover"] = command.into();
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
            let plan = recover::plan(&capture, &database, &MergeOptions::default());
            // The changes rule reads the generation from its pages, never image + WAL as one
            // database: that mixes two generations, and its integrity_check may fail.
            let clean = capture.is_clean()
                || matches!(&plan, Ok(p) if p.rule == hermes_guard::recover::MergeRule::Changes);
            row["verified"] = clean.into();
            row["status"] = if capture.is_clean() && healed {
                "verified; healed into the live file at close (nothing to merge)".into()
            } else if capture.is_clean() {
                "verified".into()
            } else if clean {
                "verified: the files match the manifest; its generation is read from its own \
                 pages (its image + WAL mixes two generations and is not read as one database)"
                    .into()
            } else {
                format!(
                    "the files match the manifest, but integrity_check fails: {}",
                    capture.integrity().first().cloned().unwrap_or_default()
                )
                .into()
            };
            match plan {
                Ok(plan) => {
                    row["base_words"] =
                        base_words::captures_line(capture.manifest(), Some(plan.rule)).into();
                    row["missing"] = plan.missing().into();
                    row["conflicts"] = plan.conflicts().into();
                    if let Some(by) = &plan.healed_by {
                        // Another capture of its generation healed it (as far as it says).
                        row["healed_by"] = by.clone().into();
                        if capture.is_clean() && plan.healed_at_close.is_some() {
                            row["status"] = format!(
                                "verified; its WAL generation was healed into the live file at \
                                 close from {by} (nothing to merge)"
                            )
                            .into();
                        }
                    }
                }
                Err(e) => row["missing_error"] = e.to_string().into(),
            }
            (row, !clean)
        }
    }
}

/// Captures of one WAL generation (such as a replaced main file's capture and the stale WAL set
/// aside when the application reconnected): each names the others, the one holding a main image and
/// the most frames counts the group's missing rows, and a stale WAL's `recover` command takes that
/// capture's main image as `--main` (the ledger merges the generation once whichever goes first).
fn group_generations(rows: &mut [serde_json::Value]) {
    let mut groups: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for (i, row) in rows.iter().enumerate() {
        if let Some(g) = row["generation"].as_str() {
            groups.entry(g.to_owned()).or_default().push(i);
        }
    }
    for members in groups.values().filter(|m| m.len() > 1) {
        let primary = members
            .iter()
            .copied()
            .filter(|&i| rows[i]["holds_image"] == true)
            .max_by_key(|&i| (rows[i]["frames"].as_u64(), std::cmp::Reverse(i)));
        let names: Vec<String> = members
            .iter()
            .map(|&i| rows[i]["capture"].as_str().unwrap_or("").to_owned())
            .collect();
        for (k, &i) in members.iter().enumerate() {
            let others: Vec<&String> = names
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != k)
                .map(|(_, n)| n)
                .collect();
            rows[i]["same_generation_as"] = serde_json::json!(others);
            let Some(p) = primary.filter(|&p| p != i) else {
                continue;
            };
            let primary_dir = names[members.iter().position(|&m| m == p).unwrap_or(0)].clone();
            rows[i]["missing_counted_in"] = primary_dir.clone().into();
            if rows[i]["holds_image"] == false {
                let image = std::path::Path::new(&primary_dir)
                    .join(rows[p]["main_file"].as_str().unwrap_or(""));
                if rows[p]["image_is_base"] == false {
                    // The file it was written on is gone (overwritten in place): the capture
                    // that holds the generation is the way back.
                    rows[i]["recover"] = rows[p]["recover"].clone();
                } else if let Some(cmd) = rows[i]["recover"].as_array_mut() {
                    if let Some(at) = cmd.iter().position(|w| w == "--main") {
                        cmd[at + 1] = image.display().to_string().into();
                    }
                }
                rows[i]["status"] = format!(
                    "verified (a stale WAL set aside at the open; its generation is also in \
                     {primary_dir}, which holds a main image: recover that one; this one adds \
                     nothing after it)"
                )
                .into();
            }
        }
    }
}

/// `hermes-guard captures <DB|DIR>`.
pub fn captures(args: CapturesArgs) -> ExitCode {
    // A file that is not a database, or nothing at all: the words `status` says too.
    if let Err(e) = database_arg::check(&args.path, Accept::FileOrDirectory) {
        let message = match e {
            DatabaseArgError::Missing { .. } | DatabaseArgError::DanglingLink { .. } => format!(
                "{e}; give the database's path (its captures are beside it) or a directory \
                 (every capture in it)"
            ),
            _ => e.to_string(),
        };
        return report_error(args.json, &message, BAD_INPUT, false);
    }
    let listed = match recover::list_captures(&args.path) {
        Ok(l) => l,
        // Whatever the cause (no permission, gone since), what was given cannot be listed.
        Err(e) => {
            let message = format!("{} cannot be listed: {e}", args.path.display());
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
    group_generations(&mut out);
    // A generation's missing rows once: from the capture its group merges from.
    let missing: u64 = out
        .iter()
        .filter(|r| r.get("missing_counted_in").is_none())
        .filter_map(|r| r["missing"].as_u64())
        .sum();
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
        println!("    {}", s("base_words"));
        if args.verbose {
            println!("    evidence: {}", s("base_evidence"));
        }
        println!("    {}", s("status"));
        if let Some(same) = row["same_generation_as"].as_array() {
            let names: Vec<&str> = same.iter().filter_map(|v| v.as_str()).collect();
            println!(
                "    same WAL generation as {} (merged once, whichever is recovered first)",
                names.join(", ")
            );
        }
        if let Some(command) = row["recover"].as_array() {
            let words: Vec<&str> = command.iter().filter_map(|v| v.as_str()).collect();
            println!("    recover: hermes-guard {}", words.join(" "));
        }
        if let Some(primary) = row["missing_counted_in"].as_str() {
            println!("    rows still missing: counted with {primary}");
            continue;
        }
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
            "{missing} row(s) are still missing from the live database: each capture's `recover` \
             line shows them, and with --apply merges them (captures of one WAL generation are \
             merged once, in any order)"
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
