//! A database path that cannot be one — nothing at it, or a file that is not a SQLite database
//! — gets the same words and the same exit code (2, bad input) from every command that takes a
//! database: `status <db>`, `captures <db>`, `recover --into <db>` and `--main <file>`.

use crate::recover_cli::{cli, lost_four, os};

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

/// Each command given `db` as its database (`recover` with `capture`): its name and stderr,
/// once its exit code (2) and empty stdout are checked.
fn each_command_given(db: &Path, capture: &Path) -> Vec<(&'static str, String)> {
    let runs: [(&str, Vec<&OsStr>); 3] = [
        ("status", vec![os("status"), db.as_os_str()]),
        ("captures", vec![os("captures"), db.as_os_str()]),
        (
            "recover --into",
            vec![
                os("recover"),
                capture.as_os_str(),
                os("--into"),
                db.as_os_str(),
            ],
        ),
    ];
    runs.into_iter()
        .map(|(name, args)| {
            let (code, out, err) = cli(&args);
            assert_eq!(code, 2, "{name}: bad input: {out}{err}");
            assert_eq!(out, "", "{name}: the message goes to stderr");
            (name, err)
        })
        .collect()
}

#[test]
fn a_file_that_is_not_a_database_gets_the_words_of_status_from_captures_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let (_, capture) = lost_four(dir.path());
    let notes = dir.path().join("notes.txt");
    fs::write(&notes, "remember the milk\n").unwrap();
    let said = format!(
        "hermes-guard: {} is not a SQLite database file\n",
        notes.display()
    );
    for (command, err) in each_command_given(&notes, &capture) {
        let first = err.lines().next().unwrap_or("");
        assert_eq!(format!("{first}\n"), said, "{command}: {err}");
    }
    let (code, out, _) = cli(&[os("captures"), notes.as_os_str(), os("--json")]);
    assert_eq!(code, 2);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&doc["ok"], &doc["bad_input"], &doc["exit_code"]),
        (&false.into(), &true.into(), &2.into()),
        "{doc}"
    );
}

#[test]
fn a_missing_database_path_is_named_in_words_with_exit_2_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = lost_four(dir.path());
    let missing = dir.path().join("stat.db");
    let said = format!(
        "hermes-guard: no database at {}: it does not exist",
        missing.display()
    );
    for (command, err) in each_command_given(&missing, &capture) {
        assert!(err.starts_with(&said), "{command}: {err}");
        assert!(
            !err.contains("os error"),
            "{command}: no raw OS error: {err}"
        );
    }
    let (code, _, err) = cli(&[
        os("recover"),
        capture.as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--main"),
        missing.as_os_str(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with(&format!(
            "hermes-guard: --main: no database at {}: it does not exist",
            missing.display()
        )),
        "{err}"
    );
}

#[test]
fn a_database_path_in_a_missing_directory_says_the_directory_is_missing_too() {
    let dir = tempfile::tempdir().unwrap();
    let (_, capture) = lost_four(dir.path());
    let nowhere = dir.path().join("no-such-dir");
    let missing = nowhere.join("state.db");
    for (command, err) in each_command_given(&missing, &capture) {
        assert!(
            err.starts_with(&format!(
                "hermes-guard: no database at {}: it does not exist, nor does its directory {}",
                missing.display(),
                nowhere.display()
            )),
            "{command}: {err}"
        );
    }
}
