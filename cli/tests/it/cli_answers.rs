//! What `captures`, `verify` and `recover` answer for the same inputs (a path that is not there,
//! rows still missing, a capture without its manifest), every command's `--help` ending with its
//! exit codes, and `hermes-guard help <topic>` printing the docs compiled into the binary. The
//! Python package gives the same answers: python/tests/test_cli_parity.py.

use crate::common;
use crate::recover_cli::{cli, lost_four, os};

use std::fs;
use std::path::Path;

use common::*;
use rusqlite::Connection;

/// The repository's docs, as the binary was built from them.
fn doc(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_path_that_does_not_exist_is_bad_input_on_stderr_for_captures_verify_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = lost_four(dir.path());
    let typo = dir.path().join("stat.db");
    let nowhere = dir.path().join("no-such-dir").join("state.db");
    for given in [&typo, &nowhere] {
        let runs = [
            ("captures", cli(&[os("captures"), given.as_os_str()])),
            ("verify", cli(&[os("verify"), given.as_os_str()])),
            (
                "recover",
                cli(&[
                    os("recover"),
                    given.as_os_str(),
                    os("--into"),
                    path.as_os_str(),
                ]),
            ),
        ];
        for (command, (code, out, err)) in runs {
            assert_eq!(code, 2, "{command} {}: {out}{err}", given.display());
            assert_eq!(out, "", "{command}: the message goes to stderr");
            assert!(
                err.contains(&given.display().to_string()) && err.contains("does not exist"),
                "{command}: {err}"
            );
            assert_eq!(
                err.contains("nothing was written"),
                command == "recover",
                "only recover could have written: {command}: {err}"
            );
        }
    }
}

#[test]
fn captures_exits_3_while_rows_are_missing_and_0_once_recover_merged_them() {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = lost_four(dir.path());
    let (code, out, err) = cli(&[os("captures"), path.as_os_str()]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("4 row(s) are still missing") && out.contains("recover"),
        "says what is left and what to run: {out}"
    );
    let (code, out, err) = cli(&[
        os("recover"),
        capture.as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--apply"),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = cli(&[os("captures"), path.as_os_str(), os("--json")]);
    assert_eq!(code, 0, "{out}{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["missing"], 0, "{rows}");
}

#[test]
fn a_capture_without_its_manifest_is_unreadable_and_every_command_says_how_to_open_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = lost_four(dir.path());
    fs::remove_file(capture.join("manifest.json")).unwrap();
    let how = "copy state.db and state.db-wal";

    let (code, out, err) = cli(&[os("captures"), path.as_os_str()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("unreadable: ") && out.contains(how), "{out}");
    let (code, out, err) = cli(&[os("verify"), capture.as_os_str()]);
    assert_eq!(code, 1, "a capture that cannot be verified: {out}{err}");
    assert!(
        out.starts_with("NOT verified: ") && out.contains(how),
        "{out}"
    );
    let (code, out, err) = cli(&[
        os("recover"),
        capture.as_os_str(),
        os("--into"),
        path.as_os_str(),
    ]);
    assert_eq!(code, 2, "recover cannot use it: {out}{err}");
    assert!(err.contains(how), "{err}");
}

#[test]
fn the_two_files_of_a_capture_without_its_manifest_open_as_a_database_with_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = lost_four(dir.path());
    fs::remove_file(capture.join("manifest.json")).unwrap();
    // What the hint says: copy both, same names, side by side, and open the copy.
    let rows = dir.path().join("rows");
    fs::create_dir(&rows).unwrap();
    for name in ["state.db", "state.db-wal"] {
        fs::copy(capture.join(name), rows.join(name)).unwrap();
    }
    let copy = Connection::open(rows.join("state.db")).unwrap();
    assert_eq!(count_like(&copy, "retired %"), 4);
    assert_eq!(
        count_like(&Connection::open(&path).unwrap(), "retired %"),
        0,
        "the rows were only in the capture"
    );
}

#[test]
fn every_commands_help_ends_with_its_exit_codes() {
    for command in [
        "captures", "verify", "recover", "held", "demo", "bench", "help",
    ] {
        let (code, out, err) = cli(&[os(command), os("--help")]);
        assert_eq!(code, 0, "{command}: {err}");
        let codes = out
            .rfind("Exit codes:")
            .unwrap_or_else(|| panic!("{command} --help has no exit codes: {out}"));
        assert!(
            out.rfind("Options:").is_some_and(|o| o < codes),
            "{command}: the exit codes come last: {out}"
        );
        assert!(out[codes..].contains("  0  "), "{command}: {out}");
        assert!(out[codes..].contains("  2  "), "{command}: {out}");
    }
}

#[test]
fn the_readme_says_the_exit_codes_in_the_words_of_the_commands_help() {
    let (code, out, err) = cli(&[os("--help")]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("Exit codes:"))
        .unwrap_or_else(|| panic!("--help has no exit-code line: {out}"));
    let readme =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    assert!(
        readme.lines().any(|l| l == line),
        "README.md has not the line `hermes-guard --help` prints: {line}"
    );
}

#[test]
fn help_topics_print_the_docs_compiled_into_the_binary() {
    for (topic, file) in [
        ("recovery", "recovery.md"),
        ("capture-format", "capture-format.md"),
        ("merge-rules", "merge-rules.md"),
    ] {
        let (code, out, err) = cli(&[os("help"), os(topic)]);
        assert_eq!(code, 0, "{topic}: {err}");
        assert_eq!(out, doc(file), "{topic}");
    }
    let (code, out, _) = cli(&[os("help"), os("exit-codes")]);
    assert_eq!(code, 0);
    assert!(out.starts_with("### Exit codes"), "{out}");
    assert!(
        doc("recovery.md").contains(&out),
        "the runbook's own section: {out}"
    );
    let (code, out, err) = cli(&[os("help"), os("recovry")]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.contains("\"recovry\"") && err.contains("recovery"),
        "{err}"
    );
}

#[test]
fn every_pointer_in_help_names_a_topic_that_prints() {
    let mut texts = vec![cli(&[os("--help")]).1];
    for command in ["captures", "verify", "recover", "held", "demo", "bench"] {
        texts.push(cli(&[os(command), os("--help")]).1);
    }
    for text in &texts {
        assert!(
            !text.contains("docs/"),
            "points at a file the package does not ship: {text}"
        );
        for pointer in text.split("hermes-guard help ").skip(1) {
            let topic: String = pointer
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            let (code, _, err) = cli(&[os("help"), os(&topic)]);
            assert_eq!(code, 0, "help {topic:?}: {err}");
        }
    }
}
