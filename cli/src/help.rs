//! `hermes-guard help <topic>`: the operator's documentation, compiled into the binary, so that
//! every pointer in an error or a `--help` can be followed from an installed package (the wheel
//! carries the binary, not the repository's `docs/`).

use std::process::ExitCode;

use clap::CommandFactory;

/// The recovery runbook (docs/recovery.md).
const RECOVERY: &str = include_str!("../docs/recovery.md");
/// The capture directory and its manifest (docs/capture-format.md).
const CAPTURE_FORMAT: &str = include_str!("../docs/capture-format.md");
/// How a capture's rows are merged back (docs/merge-rules.md).
const MERGE_RULES: &str = include_str!("../docs/merge-rules.md");

/// The heading of the runbook's exit-code section, printed alone by `help exit-codes`.
const EXIT_CODES_HEADING: &str = "### Exit codes";

/// The topics, with what each is, in the order `hermes-guard help` lists them.
pub const TOPICS: [(&str, &str); 4] = [
    (
        "recovery",
        "the recovery runbook: a write was refused, what to run (docs/recovery.md)",
    ),
    (
        "exit-codes",
        "what each exit code of captures, verify, changes and recover means",
    ),
    (
        "capture-format",
        "the capture directory and manifest.json (docs/capture-format.md)",
    ),
    (
        "merge-rules",
        "how recover merges a capture's rows back, and its limits (docs/merge-rules.md)",
    ),
];

/// `help`'s own help: the topics.
pub const HELP_AFTER: &str = "\
Topics:
  recovery        the recovery runbook: a write was refused, what to run
  exit-codes      what each exit code of captures, verify, changes and recover means
  capture-format  the capture directory and manifest.json
  merge-rules     how recover merges a capture's rows back, and its limits
A command's name (e.g. `hermes-guard help recover`) prints that command's --help.

Exit codes:
  0  the topic was printed
  2  no such topic or command (the topics are listed)";

/// Arguments of `hermes-guard help`.
#[derive(clap::Args)]
pub struct HelpArgs {
    /// A topic (recovery, exit-codes, capture-format, merge-rules) or a command's name.
    topic: Option<String>,
}

/// The text of `topic`, if it is one.
pub fn topic_text(topic: &str) -> Option<&'static str> {
    match topic {
        "recovery" | "runbook" => Some(RECOVERY),
        "exit-codes" => Some(exit_codes_section()),
        "capture-format" => Some(CAPTURE_FORMAT),
        "merge-rules" => Some(MERGE_RULES),
        _ => None,
    }
}

/// The runbook's exit-code section, from its heading to the next heading: one copy of the table.
fn exit_codes_section() -> &'static str {
    let Some(start) = RECOVERY.find(EXIT_CODES_HEADING) else {
        return RECOVERY;
    };
    let rest = &RECOVERY[start..];
    let body = &rest[EXIT_CODES_HEADING.len()..];
    let end = body
        .find("\n#")
        .map_or(rest.len(), |i| EXIT_CODES_HEADING.len() + i + 1);
    &rest[..end]
}

/// `hermes-guard help [<topic>]`.
pub fn help(args: HelpArgs) -> ExitCode {
    let mut cli = crate::Cli::command();
    cli.build(); // the subcommands' usage lines say `hermes-guard <command>`
    let Some(topic) = args.topic else {
        let _ = cli.print_help();
        println!("\nHelp topics (hermes-guard help <topic>):");
        print_topics();
        return ExitCode::SUCCESS;
    };
    if let Some(text) = topic_text(&topic) {
        print!("{text}");
        if !text.ends_with('\n') {
            println!();
        }
        return ExitCode::SUCCESS;
    }
    if let Some(command) = cli.find_subcommand_mut(&topic).filter(|c| !c.is_hide_set()) {
        let _ = command.print_long_help();
        return ExitCode::SUCCESS;
    }
    eprintln!("hermes-guard: no help topic or command {topic:?}; the topics are:");
    for (name, what) in TOPICS {
        eprintln!("  {name:<15} {what}");
    }
    ExitCode::from(crate::recover_cmd::BAD_INPUT)
}

fn print_topics() {
    for (name, what) in TOPICS {
        println!("  {name:<15} {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_codes_topic_is_the_runbooks_table_and_nothing_after_it() {
        let text = topic_text("exit-codes").unwrap();
        assert!(text.starts_with(EXIT_CODES_HEADING), "{text}");
        assert!(text.contains("| 2 | bad input"), "{text}");
        assert!(
            !text[1..].contains("\n#"),
            "stops at the next heading: {text}"
        );
    }

    #[test]
    fn every_listed_topic_has_a_text_and_is_in_helps_own_help() {
        for (name, _) in TOPICS {
            assert!(topic_text(name).is_some_and(|t| !t.is_empty()), "{name}");
            assert!(HELP_AFTER.contains(&format!("  {name} ")), "{name}");
        }
    }
}
