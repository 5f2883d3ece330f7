//! `recover`'s report on a terminal, and its progress bar.

use std::io::IsTerminal;

use hermes_guard::recover::{Capture, MergeReport};

use super::{label, WalFindings};

/// A progress bar on stderr when it is a terminal (and not `--json`); hidden otherwise.
pub(crate) fn progress_bar(json: bool) -> indicatif::ProgressBar {
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

/// The commits the capture holds and the ones it cannot give, in one line.
fn commits_line(capture: &Capture, wal: &WalFindings) -> String {
    let in_manifest = capture.manifest().wal.commits;
    if wal.unreadable_commits == 0 && wal.problems.is_empty() {
        return format!(
            "{} commit(s) in the WAL, every one readable",
            wal.check.commits
        );
    }
    format!(
        "{} of {} commit(s) readable: {} cannot be read",
        wal.check.commits,
        in_manifest.max(wal.check.commits + wal.unreadable_commits),
        wal.unreadable_commits
    )
}

/// The warning for a capture whose WAL the merge cannot fully use; nothing when it can.
pub(crate) fn print_wal_warning(capture: &Capture, wal: &WalFindings) {
    if wal.unreadable_commits == 0 && wal.problems.is_empty() {
        return;
    }
    println!(
        "WARNING  the capture's WAL is damaged: {}; the rows of the commits after its valid \
         prefix are not in this merge",
        commits_line(capture, wal)
    );
    for p in &wal.problems {
        println!("         {p}");
    }
    println!(
        "         (`hermes-guard verify {}` shows the WAL frame by frame; \
         `hermes-guard help recovery`, \"A damaged capture\")",
        capture.dir().display()
    );
}

/// The report; `verbose` adds the evidence the capture recorded for its base.
pub(crate) fn print_report(
    capture: &Capture,
    wal: &WalFindings,
    report: &MergeReport,
    verbose: bool,
) {
    let m = capture.manifest();
    println!("capture  {}", capture.dir().display());
    println!(
        "         {} ({}, trigger {}), {}; files match the manifest; integrity_check {}",
        m.captured_at,
        label(&m.reason),
        label(&m.trigger),
        commits_line(capture, wal),
        if capture.is_clean() {
            "ok".to_owned()
        } else if report.rule == hermes_guard::recover::MergeRule::Changes {
            "not used (image + WAL mixes two generations; the changes are read from the \
             generation's own pages)"
                .to_owned()
        } else {
            format!("FAILS ({})", capture.integrity().join("; "))
        }
    );
    println!("into     {}", report.database.display());
    println!(
        "rule     {}: {}",
        super::label(&report.rule),
        report.rule_reason
    );
    println!("base     {}", super::base_words::image_line(m));
    if verbose {
        println!("evidence {}", m.base_evidence());
    }
    println!("case     {}", case_words(report));
    if let Some(healed) = &report.healed_at_close {
        println!("healed   {healed}");
        println!(
            "\nNothing to merge: this generation's rows are in the live file already (the heal at \
             close put them there); merging them again would add every added row twice."
        );
        return;
    }
    if let Some(at) = &report.merged_before {
        println!("merged   {}", merged_before_words(report, at));
    }
    if let (Some(by), None) = (&report.healed_by, &report.merged_before) {
        println!(
            "healed   another capture of this WAL generation, {by}, was healed into the live \
             file at close up to WAL frame {}: only what the later commits did is merged",
            report.delta_from_frame
        );
    } else if report.delta_from_frame > 0 && report.merged_before.is_none() {
        println!(
            "merged   before up to WAL frame {}, from a copy that reads fewer commits: only \
             what the later commits did is merged",
            report.delta_from_frame
        );
    }
    for c in &report.created {
        println!("create   {c} (only in the capture)");
    }
    if m.main_torn {
        println!(
            "warning  the loss left the live file torn (main_torn): consider \
             `recover --rebuild --apply` with every writer stopped (`hermes-guard help \
             recovery`, \"A torn main file\")"
        );
    }
    print_wal_warning(capture, wal);
    println!();
    let mut header = vec![
        "table",
        "in capture",
        "already live",
        "to insert",
        "conflicts",
    ];
    if report.applied {
        header.push("inserted");
    }
    let mut table = crate::table::new(&header, &[1, 2, 3, 4, 5]);
    for t in &report.tables {
        let mut row = vec![
            t.table.clone(),
            t.in_capture.to_string(),
            t.already_live.to_string(),
            t.to_insert.to_string(),
            t.conflicts.to_string(),
        ];
        if report.applied {
            row.push(t.inserted.to_string());
        }
        table.add_row(row);
    }
    // Each table's row, then the lines about it.
    let rendered = crate::table::render(&table);
    let mut lines = rendered.lines();
    if let Some(header) = lines.next() {
        println!("{header}");
    }
    for (t, line) in report.tables.iter().zip(lines) {
        println!("{line}");
        for k in &t.conflict_keys {
            println!("    conflict: key {k} differs (live kept unless --take-capture)");
        }
        if t.undecided > 0 && report.rule == hermes_guard::recover::MergeRule::Changes {
            println!(
                "    {} row(s) undecided: the captured generation changed them, but the live row \
                 is not the one it changed (the newer generation changed or deleted it too), or \
                 the change cannot be read; kept live as they are ({}{}); see them side by side: \
                 hermes-guard recover {} --into {} --undecided",
                t.undecided,
                t.undecided_keys.join(", "),
                if t.undecided > t.undecided_keys.len() as u64 {
                    ", ..."
                } else {
                    ""
                },
                shell_word(&report.capture),
                shell_word(&report.database)
            );
        } else if t.undecided > 0 {
            println!(
                "    {} row(s) undecided: the capture says its generation changed or deleted \
                 them, but cannot show its image was that generation's own; kept live as they \
                 are ({}{}){}; see them side by side: hermes-guard recover {} --into {} \
                 --undecided",
                t.undecided,
                t.undecided_keys.join(", "),
                if t.undecided > t.undecided_keys.len() as u64 {
                    ", ..."
                } else {
                    ""
                },
                added_beside_words(t, report.applied),
                shell_word(&report.capture),
                shell_word(&report.database)
            );
        }
        if t.added_beside_before > 0 {
            println!(
                "    {} row(s) the captured generation changed are no longer counted undecided: \
                 the earlier merge added their captured version beside the live rows under new \
                 rowids, so they count as already live now; the live rows beside them are kept \
                 as they were",
                t.added_beside_before
            );
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
        if !t.unknown_base_pages.is_empty() {
            println!(
                "    INCOMPLETE: the capture holds no base for page(s) {:?} of this table (written \
                 first by another process, or past the kept pages' cap): a change of a row on \
                 them is not seen; `hermes-guard changes {}` lists what is known",
                t.unknown_base_pages,
                shell_word(&report.capture)
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
    if !report.unattributed_pages.is_empty() {
        println!(
            "INCOMPLETE: page(s) {:?} hold rows no table could be found for: a change on them \
             is in no table above",
            report.unattributed_pages
        );
    }
    for n in &report.change_notes {
        println!("note:    {n}");
    }
    for f in &report.fts_rebuilt {
        println!("rebuilt the full-text index {f}");
    }
    println!();
    if report.applied && report.changed() == 0 && report.merged_before.is_some() {
        println!(
            "nothing new merged into {}: this capture's generation was merged before (see \
             `merged` above) and nothing of it is missing now",
            report.database.display()
        );
    } else if report.applied {
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
        println!("every readable captured row is already in the live database; nothing to do");
    }
    let left_over = report.left_over() + wal.unreadable_commits;
    if left_over > 0 {
        println!(
            "{left_over} item(s) left over{}: see above",
            if wal.unreadable_commits > 0 {
                format!(
                    " ({} of them commits the capture cannot read)",
                    wal.unreadable_commits
                )
            } else {
                String::new()
            }
        );
    }
}

/// The `merged` line: this capture's generation is in the ledger of the live database, so its
/// added rows are not inserted again and the counts are what is left after that merge.
fn merged_before_words(report: &MergeReport, at: &str) -> String {
    let same = |from: &str| {
        let from = std::path::Path::new(from);
        from == report.capture
            || std::fs::canonicalize(from)
                .is_ok_and(|f| std::fs::canonicalize(&report.capture).is_ok_and(|c| c == f))
    };
    let by = match report.merged_from.as_deref() {
        Some(from) if same(from) => "from this capture".to_owned(),
        Some(from) => format!("from {from}, another capture of it"),
        None => "from a capture the record does not name".to_owned(),
    };
    format!(
        "this capture's WAL generation was already merged into this database on {at} ({by}, by \
         an earlier `recover --apply`): its added rows are in and are not inserted again; the \
         counts below are what is left after that merge"
    )
}

/// For an undecided line: how many of the rows were (or are to be) added beside the live ones.
fn added_beside_words(t: &hermes_guard::recover::TableReport, applied: bool) -> String {
    match t.undecided_added_beside {
        0 => String::new(),
        n => format!(
            "; the captured version of {n} of them (rows it changed) {} beside the live row \
             under a new rowid (a later run counts those as already live)",
            if applied {
                "was added"
            } else {
                "is to be added"
            }
        ),
    }
}

/// The plan's case in plain words: whether live rows may be changed or deleted.
fn case_words(report: &MergeReport) -> &'static str {
    use hermes_guard::recover::MergeRule;
    match report.rule {
        MergeRule::Delta | MergeRule::DeltaSharedWal => {
            "the capture shows its image is the file its WAL generation was written on: a live \
             row still as that image had it is updated or deleted as the captured generation \
             did; everything else is only added"
        }
        MergeRule::AddOnly => {
            "the capture cannot show its image is the file its WAL generation was written on: \
             only rows missing from the live database are added; no live row is deleted or \
             overwritten"
        }
        MergeRule::Changes => {
            "the capture holds the base of each page its generation wrote: that generation's own \
             inserts are added (beside any live row of the same rowid), its updates and deletes \
             applied where the live row is still as it found it; no other live row is touched"
        }
        MergeRule::Whole => {
            "the live file does not descend from the capture's image: only rows missing from \
             the live database are added; no live row is deleted or overwritten"
        }
    }
}

/// `path` as one word for a shell command line (quoted when it needs to be).
fn shell_word(path: &std::path::Path) -> String {
    let text = path.display().to_string();
    if text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b))
    {
        text
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// `recover --undecided`: every undecided row, the image's, the captured and the live side by
/// side.
pub(crate) fn print_undecided(report: &MergeReport) {
    let rows = |r: &Option<Vec<String>>, none: &str| {
        r.as_ref()
            .map_or_else(|| none.to_owned(), |v| format!("({})", v.join(", ")))
    };
    for t in report
        .tables
        .iter()
        .filter(|t| !t.undecided_rows.is_empty())
    {
        println!();
        let columns = t.undecided_rows[0].columns.join(", ");
        println!("undecided rows of {} ({columns}):", t.table);
        for u in &t.undecided_rows {
            println!("  {}", u.key);
            let before = match report.rule {
                hermes_guard::recover::MergeRule::Changes => "base    ",
                _ => "image   ",
            };
            if let Some(reason) = &u.reason {
                println!("    why       {reason}");
            }
            println!("    {before}  ({})", u.image.join(", "));
            println!(
                "    captured  {}",
                rows(&u.captured, "deleted by the captured generation")
            );
            println!("    live      {}", rows(&u.live, "none"));
        }
    }
}
