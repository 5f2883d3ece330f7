//! `hermes-guard verify <CAPTURE>`: the capture checked from its bytes, not from its manifest.

use std::path::PathBuf;
use std::process::ExitCode;

use hermes_guard::recover::{self, Capture, CaptureCheck};
use serde_json::json;

use super::{given, report_error, BAD_INPUT, DONE, FAILED};

/// `verify --help`'s exit codes.
pub const VERIFY_EXIT_CODES: &str = "\
Exit codes:
  0  verified: both files match manifest.json (size, sha256, headers), the WAL read frame by
     frame holds exactly the frames and commits the manifest records and nothing of this
     generation after them, and the captured generation passes integrity_check
  1  NOT verified: the capture is interrupted (.partial), has no readable manifest (it says
     how to open its files), misses a file, disagrees with its manifest, holds commits
     SQLite cannot read, or fails integrity_check
  2  bad input: a usage error, or a path that does not exist or is not a capture
Nothing is ever written.

Runbook: hermes-guard help recovery";

/// Arguments of `hermes-guard verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The capture directory.
    capture: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    json: bool,
}

/// `hermes-guard verify <CAPTURE>`.
pub fn verify(args: VerifyArgs) -> ExitCode {
    let dir = &args.capture;
    let check = match recover::verify_capture(dir) {
        Ok(c) => c,
        // Not a capture at all (a typo, another directory): bad input, as for `recover`.
        Err(e) if !given::looks_like_capture(dir) => {
            return report_error(args.json, &e.to_string(), BAD_INPUT, false)
        }
        // A capture that cannot be verified (interrupted, its manifest unreadable): the verdict.
        Err(e) => {
            let message = given::describe(&e, dir);
            if args.json {
                println!(
                    "{}",
                    json!({"ok": false, "message": message, "problems": [message],
                           "bad_input": false, "exit_code": FAILED})
                );
            } else {
                println!("NOT verified: {message}");
            }
            return ExitCode::from(FAILED);
        }
    };
    // The captured generation is opened (on a private copy) only when its files are sound.
    // A stale WAL (reason stale-wal) has no main image to open it on: its bytes are all there is.
    let stale_wal = check.manifest.main.mode == hermes_guard::manifest::ImageMode::Absent;
    let integrity: Vec<String> = if stale_wal && check.verified() {
        vec!["ok".to_owned()]
    } else if check.verified() {
        match Capture::open(dir) {
            Ok(c) => c.integrity().to_vec(),
            Err(e) => vec![e.to_string()],
        }
    } else {
        Vec::new()
    };
    let clean = integrity == ["ok"];
    let ok = check.verified() && clean;
    let message = if !check.verified() {
        format!(
            "{}: the bytes disagree with the manifest or lose commits: {}",
            dir.display(),
            check.problems.join("; ")
        )
    } else if !clean {
        format!(
            "{}: the files match the manifest, but the captured database fails \
             integrity_check: {}",
            dir.display(),
            integrity.join("; ")
        )
    } else {
        format!(
            "{}: complete; {} and {} match the manifest (size, sha256, headers); the WAL's valid \
             prefix holds the manifest's {} commit(s) ({} frames) and nothing of this generation \
             follows it; the captured generation opens clean",
            dir.display(),
            check.main.file,
            check.wal.file,
            check.wal_check.commits,
            check.wal_check.frames
        )
    };
    // Whether the generation was healed into the live file at close: its rows are live.
    let heal = recover::read_heal_of(&check);
    if args.json {
        let mut doc = serde_json::to_value(&check).unwrap_or_default();
        if let Some(heal) = &heal {
            doc["healed"] = heal.is_healed().into();
            doc["heal"] = heal.describe().into();
        }
        doc["base"] = check.manifest.base_verdict().word().into();
        doc["base_evidence"] = check.manifest.base_evidence().into();
        doc["ok"] = ok.into();
        doc["message"] = message.into();
        doc["integrity"] = integrity.into();
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        if check.verified() {
            println!(
                "{} {message}",
                if ok { "verified:" } else { "NOT verified:" }
            );
        } else {
            println!(
                "NOT verified: {}: the bytes disagree with the manifest or lose commits",
                dir.display()
            );
        }
        print_details(&check);
        if let Some(heal) = heal.filter(|h| *h != hermes_guard::manifest::HealState::NotHealed) {
            println!("heal     {}", heal.describe());
        }
    }
    ExitCode::from(if ok { DONE } else { FAILED })
}

/// What was found, file by file.
fn print_details(check: &CaptureCheck) {
    let m = &check.manifest;
    println!(
        "    {}: {} bytes, sha256 {}",
        check.main.file, check.main.bytes, check.main.sha256
    );
    println!(
        "    {}: {} bytes, sha256 {}",
        check.wal.file, check.wal.bytes, check.wal.sha256
    );
    println!("    {}: {}", check.wal.file, check.wal_check.describe());
    println!("    base: {}", super::base_words::image_line(m));
    println!("    base evidence: {}", m.base_evidence());
    println!(
        "    manifest: {} frame(s), {} commit(s){}",
        m.wal.frames,
        m.wal.commits,
        if check.unreadable_commits > 0 {
            format!(
                "; {} commit(s) cannot be read from the bytes",
                check.unreadable_commits
            )
        } else {
            String::new()
        }
    );
    for p in &check.problems {
        println!("    problem: {p}");
    }
}
