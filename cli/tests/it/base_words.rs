//! What a capture's base means for the operator's data, in words, from `captures`, `recover`
//! and `demo`; the evidence the capture recorded for it only with `--verbose`.

use crate::recover_again::newer_checkpointed_first;
use crate::recover_cli::{cli, lost_four, os};

use std::ffi::OsStr;

/// The evidence a capture records when the directory watch saw nothing (base `own`).
const OWN_EVIDENCE: &str = "the directory watch, drained after the image was read, saw nothing \
                            create the database's name";

fn run(args: &[&OsStr]) -> String {
    let (code, out, err) = cli(args);
    assert!(matches!(code, 0 | 3), "{out}{err}");
    out
}

#[test]
fn captures_says_an_image_of_its_own_generation_means_recovery_replays_it() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = lost_four(dir.path());
    let out = run(&[os("captures"), path.as_os_str()]);
    assert!(
        out.contains(
            "\n    base own: this capture's main image is the database file as this generation \
             left it: recovery replays the whole generation (the rows it added, changed and \
             deleted)\n"
        ),
        "{out}"
    );
    assert!(
        !out.contains("directory watch"),
        "no evidence unasked: {out}"
    );
    let out = run(&[os("captures"), path.as_os_str(), os("--verbose")]);
    assert!(
        out.contains(&format!("\n    evidence: {OWN_EVIDENCE}")),
        "{out}"
    );
}

/// The words of a capture that holds its base pages (as every capture does now).
const CHANGES_WORDS: &str = "recovery applies this generation's own inserts, updates and \
                             deletes, read from the pages its WAL carries against their kept \
                             bases (a live row it did not change is never touched)";

#[test]
fn captures_says_an_image_that_may_hold_newer_changes_means_its_own_changes_are_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = newer_checkpointed_first(dir.path());
    let out = run(&[os("captures"), path.as_os_str()]);
    assert!(
        out.contains(&format!(
            "\n    base unknown: this capture's main image may include a newer generation's \
             changes: {CHANGES_WORDS}\n"
        )),
        "{out}"
    );
}

#[test]
fn captures_says_an_image_that_may_hold_newer_changes_without_its_base_file_means_only_missing_rows_are_added(
) {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = newer_checkpointed_first(dir.path());
    crate::common::without_base_file(&capture);
    let out = run(&[os("captures"), path.as_os_str()]);
    assert!(
        out.contains(
            "\n    base unknown: this capture's main image may include a newer generation's \
             changes: recovery adds only missing rows (no live row is changed or deleted)\n"
        ),
        "{out}"
    );
    assert!(!out.contains("evidence"), "{out}");
    let out = run(&[os("captures"), path.as_os_str(), os("-v")]);
    assert!(
        out.contains("\n    evidence: the database's name, -wal, -shm or -journal was created"),
        "{out}"
    );
}

#[test]
fn recover_says_what_the_image_is_and_verbose_adds_the_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let (path, capture) = lost_four(dir.path());
    let plan = [
        os("recover"),
        capture.as_os_str(),
        os("--into"),
        path.as_os_str(),
    ];
    let out = run(&plan);
    assert!(
        out.contains(
            "\nbase     own: this capture's main image is the database file as this generation \
             left it\ncase     "
        ),
        "{out}"
    );
    assert!(!out.contains("directory watch"), "{out}");
    let out = run(&[&plan[..], &[os("--verbose")]].concat());
    assert!(out.contains(&format!("\nevidence {OWN_EVIDENCE}")), "{out}");
}

#[test]
fn the_demo_says_the_base_in_words_and_with_verbose_its_evidence() {
    let out = run(&[os("demo")]);
    assert!(
        out.contains(
            "base own: this capture's main image is the database file as this generation left \
             it: recovery replays the whole generation"
        ),
        "{out}"
    );
    assert!(!out.contains("directory watch"), "{out}");
    let out = run(&[os("demo"), os("--newer-first"), os("--verbose")]);
    assert!(
        out.contains(&format!(
            "base unknown: this capture's main image may include a newer generation's changes: \
             {CHANGES_WORDS}"
        )),
        "{out}"
    );
    assert!(
        out.contains("\n        evidence: the database's name, -wal, -shm or -journal")
            && out.contains("\n    evidence the database's name, -wal, -shm or -journal"),
        "captures' and recover's evidence: {out}"
    );
}
