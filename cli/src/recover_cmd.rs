//! The operator's commands: `captures`, `verify`, `recover`.
//!
//! Exit codes of `recover` (also in docs/recovery.md):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | nothing to do: every captured row is already in the live database |
//! | 1 | rows merged (`--apply`), or rows to merge (a plan) |
//! | 2 | bad input or an error: nothing was written |
//! | 3 | conflicts or rows left over (kept live, refused, unreadable, tables not merged) |

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hermes_guard::recover::{
    self, Capture, ConflictPolicy, MergeOptions, MergeReport, RecoverError,
};
use serde_json::json;

/// Exit code: nothing to do.
pub const NOTHING_TO_DO: u8 = 0;
/// Exit code: merged, or rows to merge.
pub const MERGED: u8 = 1;
/// Exit code: bad input or an error; nothing written.
pub const BAD_INPUT: u8 = 2;
/// Exit code: conflicts or rows left over.
pub const LEFT_OVER: u8 = 3;

/// Arguments of `hermes-guard captures`.
#[derive(clap::Args)]
pub struct CapturesArgs {
    /// A database (its captures beside it) or a directory (every capture in it).
    path: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    json: bool,
}

/// Arguments of `hermes-guard verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The capture directory.
    capture: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    json: bool,
}

/// Arguments of `hermes-guard recover`.
#[derive(clap::Args)]
pub struct RecoverArgs {
    /// The capture directory.
    capture: PathBuf,
    /// The live database to merge into.
    #[arg(long)]
    into: PathBuf,
    /// Merge (one transaction through the guard). Without it, only the plan is printed.
    #[arg(long)]
    apply: bool,
    /// One JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// On a primary key present in both with different content, take the captured row
    /// (default: keep the live row and report the conflict).
    #[arg(long)]
    take_capture: bool,
    /// The live database is torn (manifest `main_torn`): rebuild it from the capture plus every
    /// row the live generation added, and swap it in while no other connection holds it.
    #[arg(long)]
    rebuild: bool,
}

fn fail(json: bool, e: &RecoverError) -> ExitCode {
    if json {
        println!(
            "{}",
            json!({"ok": false, "error": e.to_string(), "bad_input": e.is_bad_input()})
        );
    }
    eprintln!("hermes-guard: {e}");
    eprintln!("nothing was written");
    ExitCode::from(BAD_INPUT)
}

/// `hermes-guard captures <DB|DIR>`.
pub fn captures(args: CapturesArgs) -> ExitCode {
    let listed = match recover::list_captures(&args.path) {
        Ok(l) => l,
        Err(e) => return fail(args.json, &e),
    };
    let given_db = std::fs::metadata(&args.path)
        .map(|m| m.is_file())
        .unwrap_or(false)
        .then(|| args.path.clone());
    let mut out = Vec::new();
    for entry in &listed {
        let mut row = json!({ "partial": entry.partial });
        put_path(&mut row, "capture", &entry.path);
        if entry.partial {
            row["status"] = "interrupted (.partial): incomplete, never used; can be deleted".into();
            out.push(row);
            continue;
        }
        let Some(m) = &entry.manifest else {
            row["status"] = format!(
                "unreadable: {}",
                entry.manifest_error.as_deref().unwrap_or("?")
            )
            .into();
            out.push(row);
            continue;
        };
        row["captured_at"] = m.captured_at.clone().into();
        row["reason"] = serde_json::to_value(m.reason).unwrap_or_default();
        row["trigger"] = serde_json::to_value(m.trigger).unwrap_or_default();
        row["commits"] = m.wal.commits.into();
        row["main_torn"] = m.main_torn.into();
        let database = given_db.clone().unwrap_or_else(|| m.database_path());
        put_path(&mut row, "database", &database);
        match Capture::open(&entry.path) {
            Err(e) => row["status"] = format!("NOT verified: {e}").into(),
            Ok(capture) => {
                row["status"] = if capture.is_clean() {
                    "verified".into()
                } else {
                    format!(
                        "verified files, but integrity_check fails: {}",
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
            }
        }
        out.push(row);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if out.is_empty() {
        println!("no captures found for {}", args.path.display());
        return ExitCode::SUCCESS;
    }
    for row in &out {
        let s = |k: &str| row[k].as_str().unwrap_or("-").to_owned();
        println!("{}", s("capture"));
        if row["partial"] == true {
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
    ExitCode::SUCCESS
}

/// `hermes-guard verify <CAPTURE>`: 0 only for a complete capture whose files match the manifest
/// and open clean; 1 otherwise.
pub fn verify(args: VerifyArgs) -> ExitCode {
    let (ok, message) = match Capture::open(&args.capture) {
        Err(e) => (false, e.to_string()),
        Ok(c) if !c.is_clean() => (
            false,
            format!(
                "{}: the files match the manifest, but the captured database fails \
                 integrity_check: {}",
                args.capture.display(),
                c.integrity().join("; ")
            ),
        ),
        Ok(c) => (
            true,
            format!(
                "{}: complete; {} and {} match the manifest (size, sha256); the captured \
                 generation ({} commits in the WAL) opens clean",
                args.capture.display(),
                c.manifest().main.file,
                c.manifest().wal.file,
                c.manifest().wal.commits
            ),
        ),
    };
    if args.json {
        println!("{}", json!({"ok": ok, "message": message}));
    } else if ok {
        println!("verified: {message}");
    } else {
        println!("NOT verified: {message}");
    }
    ExitCode::from(if ok { 0 } else { 1 })
}

/// `hermes-guard recover <CAPTURE> --into <DB> [--apply] [--json]`.
pub fn recover(args: RecoverArgs) -> ExitCode {
    let capture = match Capture::open(&args.capture) {
        Ok(c) => c,
        Err(e) => return fail(args.json, &e),
    };
    let options = MergeOptions {
        conflicts: if args.take_capture {
            ConflictPolicy::TakeCapture
        } else {
            ConflictPolicy::KeepLive
        },
        ..MergeOptions::default()
    };
    if args.rebuild {
        return rebuild(&args, &capture, &options);
    }
    let result = if args.apply {
        let bar = progress_bar(args.json);
        let r = recover::apply(&capture, &args.into, &options, &mut |p| {
            bar.set_length(p.total);
            bar.set_position(p.done);
            bar.set_message(p.table.to_owned());
        });
        bar.finish_and_clear();
        r
    } else {
        recover::plan(&capture, &args.into, &options)
    };
    let report = match result {
        Ok(r) => r,
        Err(e) => return fail(args.json, &e),
    };
    let code = exit_code(&report);
    if args.json {
        let mut doc = serde_json::to_value(&report).unwrap_or_default();
        doc["ok"] = true.into();
        doc["exit_code"] = code.into();
        doc["main_torn"] = capture.manifest().main_torn.into();
        doc["missing"] = report.missing().into();
        doc["inserted"] = report.inserted().into();
        doc["left_over"] = report.left_over().into();
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_report(&capture, &report);
    }
    ExitCode::from(code)
}

fn exit_code(report: &MergeReport) -> u8 {
    if report.left_over() > 0 {
        LEFT_OVER
    } else if report.missing() > 0 || report.tables.iter().any(|t| t.replaced > 0) {
        MERGED
    } else {
        NOTHING_TO_DO
    }
}

fn progress_bar(json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(0), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len} rows")
    {
        bar.set_style(style);
    }
    bar
}

fn print_report(capture: &Capture, report: &MergeReport) {
    let m = capture.manifest();
    println!("capture  {}", capture.dir().display());
    println!(
        "         {} ({}, trigger {}), {} commits in the WAL; files match the manifest; \
         integrity_check {}",
        m.captured_at,
        label(&m.reason),
        label(&m.trigger),
        m.wal.commits,
        if capture.is_clean() {
            "ok".to_owned()
        } else {
            format!("FAILS ({})", capture.integrity().join("; "))
        }
    );
    println!("into     {}", report.database.display());
    println!("rule     {}: {}", label(&report.rule), report.rule_reason);
    if let Some(at) = &report.merged_before {
        println!("merged   before, at {at}: its added rows are not inserted again");
    }
    for c in &report.created {
        println!("create   {c} (only in the capture)");
    }
    if m.main_torn {
        println!(
            "warning  the loss left the live file torn (main_torn): consider \
             `recover --rebuild --apply` with every writer stopped (docs/recovery.md)"
        );
    }
    println!();
    println!(
        "{:<28}{:>12}{:>14}{:>11}{:>11}{}",
        "table",
        "in capture",
        "already live",
        "to insert",
        "conflicts",
        if report.applied { "   inserted" } else { "" }
    );
    for t in &report.tables {
        println!(
            "{:<28}{:>12}{:>14}{:>11}{:>11}{}",
            t.table,
            t.in_capture,
            t.already_live,
            t.to_insert,
            t.conflicts,
            if report.applied {
                format!("{:>11}", t.inserted)
            } else {
                String::new()
            }
        );
        for k in &t.conflict_keys {
            println!("    conflict: key {k} differs (live kept unless --take-capture)");
        }
        if t.to_update + t.to_delete > 0 {
            println!(
                "    {} row(s) to update and {} to delete as the captured generation did",
                t.to_update, t.to_delete
            );
        }
        if t.replaced > 0 {
            println!(
                "    {} conflicting row(s) overwritten with the captured ones",
                t.replaced
            );
        }
        if t.new_rowids > 0 {
            println!(
                "    {} row(s) inserted under new rowids (theirs were reused)",
                t.new_rowids
            );
        }
        if t.rejected > 0 {
            println!(
                "    {} row(s) refused by the live schema's constraints",
                t.rejected
            );
        }
        for u in &t.unreadable {
            println!(
                "    UNREADABLE in the capture: rows after rowid {} and before {}{}: {}",
                u.after_rowid.map_or("(start)".into(), |r| r.to_string()),
                u.before_rowid.map_or("(end)".into(), |r| r.to_string()),
                u.at_most
                    .map_or(String::new(), |n| format!(" (at most {n})")),
                u.error
            );
        }
    }
    for n in &report.not_merged {
        println!("not merged: {}: {}", n.table, n.reason);
    }
    for f in &report.fts_rebuilt {
        println!("rebuilt the full-text index {f}");
    }
    println!();
    if report.applied {
        println!(
            "merged {} row(s) into {} in one transaction; foreign_key_check clean",
            report.changed(),
            report.database.display()
        );
    } else if report.missing() > 0 {
        println!(
            "{} row(s) missing from the live database; nothing was written. Run again with \
             --apply to merge them.",
            report.missing()
        );
    } else {
        println!("every captured row is already in the live database; nothing to do");
    }
    if report.left_over() > 0 {
        println!("{} item(s) left over: see above", report.left_over());
    }
}

fn rebuild(args: &RecoverArgs, capture: &Capture, options: &MergeOptions) -> ExitCode {
    if !args.apply {
        let msg = format!(
            "--rebuild replaces {} with a file rebuilt from {} plus every row the live \
             generation added; the torn file is kept beside it. Stop every writer, then run \
             again with --apply.",
            args.into.display(),
            capture.dir().display()
        );
        if args.json {
            println!(
                "{}",
                json!({"ok": true, "rebuild": "planned", "message": msg})
            );
        } else {
            println!("{msg}");
        }
        return ExitCode::from(MERGED);
    }
    match recover::rebuild_torn(capture, &args.into, options) {
        Err(e) => fail(args.json, &e),
        Ok(r) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                println!(
                    "rebuilt {} from the capture plus {} row(s) of the live generation \
                     (integrity_check ok); the torn file is kept in {}",
                    r.database.display(),
                    r.from_live.inserted(),
                    r.kept.display()
                );
            }
            ExitCode::from(if r.from_live.left_over() > 0 {
                LEFT_OVER
            } else {
                MERGED
            })
        }
    }
}

/// For the demo: merge `capture` into `database`, quietly.
pub fn merge_quietly(capture: &Path, database: &Path) -> Result<MergeReport, RecoverError> {
    let capture = Capture::open(capture)?;
    recover::apply(&capture, database, &MergeOptions::default(), &mut |_| {})
}

/// A manifest field as its JSON string (`"wal-lost"`, `"halt"`), `-` when absent.
fn label(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "-".to_owned(),
    }
}

/// `row[key]` = `path` as a display string and, only when its bytes are not UTF-8, `row[key_hex]`
/// = its exact bytes in lowercase hex (as in the manifest), so a script can use the real path.
fn put_path(row: &mut serde_json::Value, key: &str, path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    row[key] = path.display().to_string().into();
    if path.to_str().is_none() {
        let hex: String = path
            .as_os_str()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        row[format!("{key}_hex")] = hex.into();
    }
}
