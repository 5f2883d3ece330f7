//! The operator's commands: `captures`, `verify`, `changes`, `recover`.
//!
//! Exit codes (the same table is in each command's `--help`, in docs/recovery.md and in
//! `hermes-guard help exit-codes`):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done: what was asked was done (merged, nothing to do, a plan, a listing with nothing missing, verified, a complete `changes` report) |
//! | 1 | failed: `verify`: not verified; `captures`: a capture is unreadable or does not verify; `recover`: an error while working (I/O, SQLite, the write lock not taken within `--busy-timeout`, a merge rolled back) — nothing written; `changes`: the capture cannot be read |
//! | 2 | bad input, the same for the four commands: a usage error, a path that does not exist or is not a capture (also `recover`: a capture that disagrees with its manifest, a target that cannot receive it, `--rebuild` on a database that is not torn); a database path (`captures`, `recover --into`/`--main`, as `status`) with nothing at it or not a SQLite database file, in the words of [`crate::database_arg`] |
//! | 3 | something is left over: `recover`: commits the capture cannot read, conflicts kept live, rows refused, tables not merged, and under the `changes` rule rows undecided or pages whose change cannot be seen; `captures`: rows of a capture still missing from the live database; `changes`: rows undecided, a table incomplete or pages unattributed |

mod base_words;
mod captures;
mod changes;
mod given;
mod report;
mod verify;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use hermes_guard::recover::{
    self, Capture, ConflictPolicy, MergeOptions, MergeReport, RecoverError, WalCheck,
};
use serde_json::json;

use crate::database_arg::{self, Accept, DatabaseArgError};

pub use captures::{captures, row_of, CapturesArgs, CAPTURES_EXIT_CODES};
pub use changes::{changes, ChangesArgs, CHANGES_EXIT_CODES};
pub use verify::{verify, VerifyArgs, VERIFY_EXIT_CODES};

/// Exit code: done.
pub const DONE: u8 = 0;
/// Exit code: failed (not verified; a capture unreadable; an error while working): nothing
/// written.
pub const FAILED: u8 = 1;
/// Exit code: bad input; nothing written.
pub const BAD_INPUT: u8 = 2;
/// Exit code: done, something left over.
pub const LEFT_OVER: u8 = 3;

/// `recover --help`'s exit codes.
pub const RECOVER_EXIT_CODES: &str = "\
Exit codes:
  0  done: merged (--apply), nothing to do, or a plan printed with nothing left over
  1  failed while working (an I/O or SQLite error, the write lock not taken within
     --busy-timeout, a merge rolled back): nothing was written; fix the cause, run it again
  2  bad input (a usage error, a path that does not exist or is not a capture, a capture
     that disagrees with its manifest, a target that cannot receive it, --rebuild on a
     database that is not torn): nothing was written
  3  something is left over: commits the capture cannot read, conflicts kept live, rows
     the live schema refused, tables not merged, and under the changes rule rows undecided
     or pages whose change cannot be seen (see the report); with --apply, everything else
     was merged

Runbook: hermes-guard help recovery";

/// Arguments of `hermes-guard recover`.
#[derive(clap::Args)]
pub struct RecoverArgs {
    /// The capture directory.
    capture: PathBuf,
    /// The live database to merge into.
    #[arg(long)]
    into: PathBuf,
    /// For a capture of a stale WAL (reason `stale-wal`): the database file the WAL was written
    /// on (the copy taken before the restore). Checked against the WAL's record.
    #[arg(long, value_name = "FILE")]
    main: Option<PathBuf>,
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
    /// The live database is torn (manifest `main_torn`, or its integrity_check fails): rebuild
    /// it from the capture plus every row the live generation added, and swap it in while no
    /// other connection holds it. Refused for a database that is not torn.
    #[arg(long)]
    rebuild: bool,
    /// How long to wait for the live database's write lock: `30s`, `2m`, `500ms`, or seconds.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    busy_timeout: Duration,
    /// List, side by side, every undecided row: its base (the changes rule) or the capture's
    /// image row (add-only), the captured generation's row (or "deleted") and the live row, and
    /// why it is undecided.
    #[arg(long)]
    undecided: bool,
    /// Also print what the capture recorded as the evidence for its base (whether its main
    /// image is the file its WAL generation was written on).
    #[arg(long, short)]
    verbose: bool,
}

/// `30s`, `2m`, `500ms`, `1h 30m` (humantime), or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (give a duration such as 30s, 2m, 500ms, or seconds)"))
}

/// `recover`'s error `e` about `capture` reported (as JSON too when asked): 2 for bad input, 1
/// otherwise; nothing was written.
fn fail(json: bool, e: &RecoverError, capture: &Path) -> ExitCode {
    let code = if e.is_bad_input() { BAD_INPUT } else { FAILED };
    report_error(json, &given::describe(e, capture), code, true)
}

/// An error reported on stderr (and as one JSON document on stdout when asked), exiting `code`;
/// `wrote_nothing` for a command that could have written (`recover`), to say it did not.
pub(crate) fn report_error(json: bool, message: &str, code: u8, wrote_nothing: bool) -> ExitCode {
    if json {
        println!(
            "{}",
            json!({"ok": false, "error": message, "message": message,
                   "bad_input": code == BAD_INPUT, "exit_code": code})
        );
    }
    eprintln!("hermes-guard: {message}");
    if wrote_nothing {
        eprintln!("nothing was written");
    }
    ExitCode::from(code)
}

/// The capture's WAL read from its bytes, and the commits the merge cannot use.
pub(crate) struct WalFindings {
    pub check: WalCheck,
    pub problems: Vec<String>,
    pub unreadable_commits: u64,
}

fn wal_findings(capture: &Capture) -> Result<WalFindings, RecoverError> {
    let entry = &capture.manifest().wal;
    let path = capture.dir().join(&entry.file);
    let check = WalCheck::read_file(&path).map_err(|e| RecoverError::Io {
        path,
        operation: "read the captured WAL",
        source: e,
    })?;
    Ok(WalFindings {
        problems: recover::wal_problems(&check, entry),
        unreadable_commits: recover::unreadable_commits(&check, entry),
        check,
    })
}

/// `hermes-guard recover <CAPTURE> --into <DB> [--apply] [--json]`.
pub fn recover(args: RecoverArgs) -> ExitCode {
    if let Some(main) = &args.main {
        if let Err(e) = database_arg::check(main, Accept::File) {
            return report_error(args.json, &format!("--main: {e}"), BAD_INPUT, true);
        }
    }
    let capture = match Capture::open_with_main(&args.capture, args.main.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(args.json, &e, &args.capture),
    };
    // The words `status` and `captures` say of the same path.
    if let Err(e) = database_arg::check(&args.into, Accept::File) {
        let message = match e {
            DatabaseArgError::Missing { .. } | DatabaseArgError::DanglingLink { .. } => {
                format!("{e}; recovery merges into an existing database and never creates one")
            }
            _ => e.to_string(),
        };
        return report_error(args.json, &message, BAD_INPUT, true);
    }
    let wal = match wal_findings(&capture) {
        Ok(w) => w,
        Err(e) => return fail(args.json, &e, &args.capture),
    };
    let options = MergeOptions {
        conflicts: if args.take_capture {
            ConflictPolicy::TakeCapture
        } else {
            ConflictPolicy::KeepLive
        },
        busy_timeout: args.busy_timeout,
        list_undecided: args.undecided,
    };
    if args.rebuild {
        return rebuild(&args, &capture, &wal, &options);
    }
    let result = if args.apply {
        let bar = report::progress_bar(args.json);
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
        Err(e) => return fail(args.json, &e, &args.capture),
    };
    let code = exit_code(&report, &wal);
    if args.json {
        let mut doc = serde_json::to_value(&report).unwrap_or_default();
        doc["ok"] = true.into();
        doc["exit_code"] = code.into();
        doc["main_torn"] = capture.manifest().main_torn.into();
        doc["missing"] = report.missing().into();
        doc["inserted"] = report.inserted().into();
        doc["undecided"] = report.undecided().into();
        doc["added_beside_before"] = report.added_beside_before().into();
        doc["left_over"] = (report.left_over() + wal.unreadable_commits).into();
        wal_json(&mut doc, &capture, &wal);
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        report::print_report(&capture, &wal, &report, args.verbose);
        if args.undecided {
            report::print_undecided(&report);
        }
    }
    ExitCode::from(code)
}

/// The WAL's findings in a JSON document: `commits_used`, `unreadable_commits`, `wal`,
/// `wal_problems`.
fn wal_json(doc: &mut serde_json::Value, capture: &Capture, wal: &WalFindings) {
    doc["commits_in_manifest"] = capture.manifest().wal.commits.into();
    doc["commits_used"] = wal.check.commits.into();
    doc["unreadable_commits"] = wal.unreadable_commits.into();
    doc["wal"] = serde_json::to_value(&wal.check).unwrap_or_default();
    doc["wal_problems"] = wal.problems.clone().into();
}

fn exit_code(report: &MergeReport, wal: &WalFindings) -> u8 {
    if report.left_over() > 0 || wal.unreadable_commits > 0 || !wal.problems.is_empty() {
        LEFT_OVER
    } else {
        DONE
    }
}

fn rebuild(
    args: &RecoverArgs,
    capture: &Capture,
    wal: &WalFindings,
    options: &MergeOptions,
) -> ExitCode {
    let left_over_in_capture = wal.unreadable_commits > 0 || !wal.problems.is_empty();
    if !args.apply {
        let integrity = match recover::check_torn(capture, &args.into) {
            Ok(i) => i,
            Err(e) => return fail(args.json, &e, &args.capture),
        };
        let msg = format!(
            "{} is torn ({}): --rebuild replaces it with a file rebuilt from {} plus every row \
             the live generation added; the torn file is kept beside it. Stop every writer, \
             then run again with --apply.",
            args.into.display(),
            if capture.manifest().main_torn {
                "the capture records main_torn".to_owned()
            } else {
                format!("integrity_check: {}", integrity.join("; "))
            },
            capture.dir().display()
        );
        let code = if left_over_in_capture {
            LEFT_OVER
        } else {
            DONE
        };
        if args.json {
            let mut doc = json!({"ok": true, "rebuild": "planned", "message": msg,
                                 "live_integrity": integrity, "exit_code": code});
            wal_json(&mut doc, capture, wal);
            println!("{doc}");
        } else {
            println!("{msg}");
            report::print_wal_warning(capture, wal);
        }
        return ExitCode::from(code);
    }
    match recover::rebuild_torn(capture, &args.into, options) {
        Err(e) => fail(args.json, &e, &args.capture),
        Ok(r) => {
            let code = if r.from_live.left_over() > 0 || left_over_in_capture {
                LEFT_OVER
            } else {
                DONE
            };
            if args.json {
                let mut doc = serde_json::to_value(&r).unwrap_or_default();
                doc["ok"] = true.into();
                doc["exit_code"] = code.into();
                wal_json(&mut doc, capture, wal);
                println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            } else {
                println!(
                    "rebuilt {} from the capture plus {} row(s) of the live generation \
                     (integrity_check ok); the torn file is kept in {}",
                    r.database.display(),
                    r.from_live.inserted(),
                    r.kept.display()
                );
                report::print_wal_warning(capture, wal);
            }
            ExitCode::from(code)
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
pub(crate) fn put_path(row: &mut serde_json::Value, key: &str, path: &std::path::Path) {
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

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn busy_timeouts_read_as_seconds_or_with_a_unit() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("soon").unwrap_err().contains("30s"));
    }
}
