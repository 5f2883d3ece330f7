//! `hermes-guard changes <CAPTURE> [--rows] [--json]`: what the captured generation itself
//! changed, per table, computed from the capture alone (its pages against their bases). Reads
//! only.

use std::path::PathBuf;
use std::process::ExitCode;

use hermes_guard::recover::{self, ChangedRow, GenerationChangesReport, TableChangesReport};

use super::{given, report_error, BAD_INPUT, DONE, FAILED, LEFT_OVER};

/// `changes --help`'s exit codes.
pub const CHANGES_EXIT_CODES: &str = "\
Exit codes:
  0  complete: every change of the captured generation is decided and every page it wrote
     belongs to a table; the report is exactly what it inserted, updated and deleted
  1  failed: a captured file could not be read, the capture is interrupted (.partial), its
     manifest is unreadable, or its WAL or base file does not give the generation's pages
  2  bad input: a usage error, or a path that does not exist or is not a capture
  3  something is left over: rows undecided, a table incomplete (pages whose rows before the
     generation are unknown, e.g. a capture without <file>-base) or pages no table owns
Nothing is ever written.

Runbook: hermes-guard help recovery";

/// Values longer than this many characters are shortened in `--rows`.
const VALUE_SHOWN: usize = 48;

/// Arguments of `hermes-guard changes`.
#[derive(clap::Args)]
pub struct ChangesArgs {
    /// The capture directory.
    capture: PathBuf,
    /// List every inserted, updated (old -> new), deleted and undecided row, one a line.
    #[arg(long)]
    rows: bool,
    /// One JSON document on stdout (every row included).
    #[arg(long)]
    json: bool,
}

/// `hermes-guard changes <CAPTURE>`.
pub fn changes(args: ChangesArgs) -> ExitCode {
    let dir = &args.capture;
    let report = match recover::generation_changes(dir) {
        Ok(r) => r,
        // Not a capture at all (a typo, another directory): bad input, as for `verify`.
        Err(e) if !given::looks_like_capture(dir) => {
            return report_error(args.json, &e.to_string(), BAD_INPUT, false)
        }
        Err(e) => return report_error(args.json, &given::describe(&e, dir), FAILED, false),
    };
    let code = if report.is_complete() {
        DONE
    } else {
        LEFT_OVER
    };
    if args.json {
        let mut doc = serde_json::to_value(&report).unwrap_or_default();
        doc["ok"] = true.into();
        doc["complete"] = report.is_complete().into();
        doc["verdict"] = verdict(&report).into();
        doc["exit_code"] = code.into();
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_summary(&report);
        if args.rows {
            print_rows(&report);
        }
        println!();
        println!("{}", verdict(&report));
    }
    ExitCode::from(code)
}

/// The per-table counts, the base line and the notes.
fn print_summary(report: &GenerationChangesReport) {
    println!("capture  {}", report.capture.display());
    println!("database {}", report.database);
    println!(
        "base     {}",
        if report.has_base_file {
            "<file>-base kept: the pages the generation wrote are compared with what they held \
             before it"
        } else {
            "NO <file>-base: the bases of the pages the generation wrote are unknown (only pages \
             a checkpoint had copied have one); its changes cannot be told apart"
        }
    );
    println!();
    if report.tables.is_empty() {
        println!("no table changed");
    }
    for t in &report.tables {
        let c = &t.counts;
        println!(
            "{}: {} inserted, {} updated, {} deleted, {} undecided",
            t.name, c.inserted, c.updated, c.deleted, c.undecided
        );
        if !t.unknown_base_pages.is_empty() {
            println!(
                "    incomplete: the rows of page(s) {} before the generation are unknown, so \
                 an update or delete on them is not seen",
                pages(&t.unknown_base_pages)
            );
        }
    }
    if !report.unattributed_pages.is_empty() {
        println!(
            "unattributed page(s) {}: their rows belong to no table found, so any change on them \
             is not shown",
            pages(&report.unattributed_pages)
        );
    }
    for n in &report.notes {
        println!("note     {n}");
    }
}

/// `--rows`: every row, one a line, long values shortened.
fn print_rows(report: &GenerationChangesReport) {
    for t in &report.tables {
        println!();
        println!("rows of {}{}:", t.name, without_rowid_words(t));
        for r in &t.inserts {
            println!("  inserted   {}", row_text(r));
        }
        for u in &t.updates {
            println!(
                "  updated    {} -> {}",
                row_text(&u.old),
                values_text(&u.new)
            );
        }
        for r in &t.deletes {
            println!("  deleted    {}", row_text(r));
        }
        for u in &t.undecided {
            println!("  undecided  {}: {}", row_text(&u.row), u.reason);
        }
    }
}

fn without_rowid_words(t: &TableChangesReport) -> &'static str {
    if t.without_rowid {
        " (WITHOUT ROWID: primary key first)"
    } else {
        ""
    }
}

/// `rowid 21 (21, "gw-0", "text")`, or only the values for a `WITHOUT ROWID` row.
fn row_text(r: &ChangedRow) -> String {
    match r.rowid {
        Some(rowid) => format!("rowid {rowid} {}", values_text(r)),
        None => values_text(r),
    }
}

/// `(v1, v2, ...)`, as `recover --undecided` shows rows; `(record unreadable)` when empty.
fn values_text(r: &ChangedRow) -> String {
    if r.values.is_empty() {
        return "(record unreadable)".to_owned();
    }
    let values: Vec<String> = r.values.iter().map(|v| shorten(&v.to_string())).collect();
    format!("({})", values.join(", "))
}

/// `text` cut to [`VALUE_SHOWN`] characters, saying how long it was.
fn shorten(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= VALUE_SHOWN {
        return text.to_owned();
    }
    let head: String = text.chars().take(VALUE_SHOWN).collect();
    format!("{head}... ({chars} chars)")
}

/// Page numbers, the first few.
fn pages(list: &[u32]) -> String {
    const SHOWN: usize = 12;
    let shown: Vec<String> = list.iter().take(SHOWN).map(u32::to_string).collect();
    if list.len() > SHOWN {
        format!("{}, ... ({} in all)", shown.join(", "), list.len())
    } else {
        shown.join(", ")
    }
}

/// One line: complete, or what is left undecided; and that nothing was written.
fn verdict(report: &GenerationChangesReport) -> String {
    if report.is_complete() {
        return "complete: these are exactly the rows the captured generation inserted, updated \
                and deleted; nothing was written"
            .to_owned();
    }
    let incomplete = report.incomplete_tables().count();
    let mut parts = Vec::new();
    if report.undecided() > 0 {
        parts.push(format!("{} row(s) undecided", report.undecided()));
    }
    if incomplete > 0 {
        parts.push(format!(
            "{incomplete} table(s) incomplete (rows before the generation unknown)"
        ));
    }
    if !report.unattributed_pages.is_empty() {
        parts.push(format!(
            "{} page(s) unattributed",
            report.unattributed_pages.len()
        ));
    }
    let why = if report.has_base_file {
        ""
    } else {
        " (the capture has no <file>-base: its bases are unknown)"
    };
    format!(
        "INCOMPLETE: {}{why}; the changes above are what can be told, not all the generation \
         did; nothing was written",
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::shorten;

    #[test]
    fn long_values_are_cut_and_say_their_length() {
        assert_eq!(shorten("\"short\""), "\"short\"");
        let long = format!("\"{}\"", "x".repeat(100));
        let cut = shorten(&long);
        assert!(cut.ends_with("... (102 chars)"), "{cut}");
        assert!(cut.len() < long.len());
    }
}
