//! The CLI as a Unix tool: each exit code, `--busy-timeout`, the exit codes in `--help`,
//! `captures` failing on an unreadable capture, and `--rebuild` refusing a database that is not
//! torn.

use crate::common;
use crate::recover_cli::{cli, file_bytes, lost_four, os};

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use rusqlite::Connection;

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn rebuild_refuses_a_database_that_is_not_torn_and_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_four(dir.path());
    let before = file_bytes(&path);
    let inode = fs::metadata(&path).unwrap().ino();
    let names = names_in(dir.path());

    for apply in [false, true] {
        let mut args = vec![
            os("recover"),
            artifact.as_os_str(),
            os("--into"),
            path.as_os_str(),
            os("--rebuild"),
        ];
        if apply {
            args.push(os("--apply"));
        }
        let (code, out, err) = cli(&args);
        assert_eq!(code, 2, "apply {apply}: {out}{err}");
        assert!(
            err.contains("is not torn") && err.contains("Nothing was changed"),
            "apply {apply}: {err}"
        );
        assert!(
            err.contains("recover --apply"),
            "says what to do instead: {err}"
        );
        assert_eq!(
            file_bytes(&path),
            before,
            "apply {apply}: the file is untouched"
        );
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode, "not swapped");
        let now: Vec<String> = names_in(dir.path())
            .into_iter()
            .filter(|n| !n.ends_with("-wal") && !n.ends_with("-shm"))
            .collect();
        assert_eq!(now, names, "nothing moved aside, nothing created");
    }
    // The rows it holds are still missing, and `recover --apply` brings them back.
    let (code, out, _) = cli(&[
        os("recover"),
        artifact.as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--apply"),
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        count_like(&Connection::open(&path).unwrap(), "retired %"),
        4
    );
}

#[test]
fn a_write_lock_held_past_busy_timeout_exits_1_and_a_longer_wait_merges() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_four(dir.path());
    let apply = |timeout: &str| {
        cli(&[
            os("recover"),
            artifact.as_os_str(),
            os("--into"),
            path.as_os_str(),
            os("--apply"),
            os("--busy-timeout"),
            os(timeout),
        ])
    };
    let holder = open_stock(&path);
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let before = file_bytes(&path);
    let (code, out, err) = apply("300ms");
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("waited up to 300ms"),
        "the wait is --busy-timeout's, not a fixed 5 s: {err}"
    );
    assert!(
        err.contains("write lock") && err.contains("nothing was written"),
        "{err}"
    );
    holder.execute_batch("COMMIT").unwrap();
    assert_eq!(file_bytes(&path), before);

    // Held for a second, released by another thread: a 30 s wait takes the lock and merges.
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        holder.execute_batch("COMMIT").unwrap();
    });
    let (code, out, err) = apply("30s");
    release.join().unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("merged 4 row(s)"), "{out}");
}

#[test]
fn usage_errors_exit_2_and_help_lists_the_exit_codes() {
    let (code, _, err) = cli(&[os("recover"), os("x"), os("--into")]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = cli(&[
        os("recover"),
        os("x"),
        os("--into"),
        os("y"),
        os("--busy-timeout"),
        os("soon"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("30s"),
        "says what a duration looks like: {err}"
    );

    for (command, codes) in [
        (
            "recover",
            &[
                "  0  done",
                "  1  failed",
                "  2  bad input",
                "  3  something is left over",
            ][..],
        ),
        (
            "verify",
            &["  0  verified", "  1  NOT verified", "  2  bad input"][..],
        ),
        (
            "captures",
            &[
                "  0  listed",
                "  1  a capture listed is unreadable",
                "  2  bad input",
                "  3  rows of a capture are still missing",
            ][..],
        ),
    ] {
        let (code, out, _) = cli(&[os(command), os("--help")]);
        assert_eq!(code, 0);
        assert!(out.contains("Exit codes:"), "{command}: {out}");
        for line in codes {
            assert!(out.contains(line), "{command} --help lacks {line:?}: {out}");
        }
    }
}

#[test]
fn captures_exits_1_on_an_unreadable_manifest_before_3_for_rows_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_four(dir.path());
    let (code, out, _) = cli(&[os("captures"), path.as_os_str()]);
    assert_eq!(code, 3, "4 rows missing: {out}");

    let unreadable = dir.path().join("state.db.retired-wal-20200101-000000-9");
    fs::create_dir(&unreadable).unwrap();
    fs::write(
        unreadable.join("manifest.json"),
        b"{\"version\": 1, \"datab",
    )
    .unwrap();
    let (code, out, err) = cli(&[os("captures"), path.as_os_str()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("unreadable: "), "{out}");
    assert!(err.contains("1 capture(s) listed are unreadable"), "{err}");
    let (code, out, _) = cli(&[os("captures"), path.as_os_str(), os("--json")]);
    assert_eq!(code, 1, "{out}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2, "the good capture is still listed: {out}");
    let good = list
        .iter()
        .find(|r| r["capture"] == artifact.display().to_string())
        .unwrap();
    assert_eq!(
        (&good["status"], &good["verified"]),
        (&"verified".into(), &true.into())
    );
    let bad = list.iter().find(|r| r["verified"] == false).unwrap();
    assert!(
        bad["status"].as_str().unwrap().starts_with("unreadable"),
        "{bad}"
    );

    // A path that cannot be listed is bad input.
    let (code, _, err) = cli(&[os("captures"), dir.path().join("nowhere").as_os_str()]);
    assert_eq!(code, 2, "{err}");

    fs::remove_dir_all(&unreadable).unwrap();
    let (code, out, _) = cli(&[os("captures"), path.as_os_str()]);
    assert_eq!(code, 3, "back to rows missing: {out}");
}

#[test]
fn the_library_refuses_to_rebuild_a_healthy_database() {
    use hermes_guard::recover::{self, Capture, MergeOptions, RecoverError};
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_four(dir.path());
    let before = file_bytes(&path);
    let capture = Capture::open(&artifact).unwrap();
    assert!(!capture.manifest().main_torn);
    let err = recover::check_torn(&capture, &path).unwrap_err();
    assert!(matches!(err, RecoverError::NotTorn { .. }), "{err}");
    let err = recover::rebuild_torn(&capture, &path, &MergeOptions::default()).unwrap_err();
    assert!(matches!(err, RecoverError::NotTorn { .. }), "{err}");
    assert!(err.is_bad_input());
    assert_eq!(file_bytes(&path), before);
    assert_eq!(
        count_like(&Connection::open(&path).unwrap(), "retired %"),
        0
    );
}
