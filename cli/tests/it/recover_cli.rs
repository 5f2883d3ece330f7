//! The operator's commands: `captures`, `verify`, `recover`, and their bad inputs.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use rusqlite::Connection;

pub(crate) fn cli(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    hermes_guard_cli(args)
}

pub(crate) fn os(s: &str) -> &std::ffi::OsStr {
    s.as_ref()
}

/// A database with 4 rows only in its lost WAL and 10 newer rows reusing their rowids.
pub(crate) fn lost_four(dir: &Path) -> (PathBuf, PathBuf) {
    lost_rows(dir, 4)
}

/// A database with `n` rows (`retired 0`, ...), one commit each, only in its lost WAL, and 10
/// newer rows reusing their rowids: the database and the capture.
pub(crate) fn lost_rows(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    let path = dir.join("state.db");
    let conn = open_guarded(&path);
    checkpointed_history(&conn);
    for i in 0..n {
        insert(&conn, &format!("retired {i}")).unwrap();
    }
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&conn, "after").unwrap_err()));
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);
    newer_generation(&path, 10);
    (path, artifact)
}

pub(crate) fn file_bytes(p: &Path) -> Vec<u8> {
    let mut all = fs::read(p).unwrap();
    if let Ok(wal) = fs::read(sidecar(p, "-wal")) {
        all.extend(wal);
    }
    all
}

#[test]
fn captures_lists_when_why_verified_and_rows_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_four(dir.path());
    fs::create_dir(
        dir.path()
            .join("state.db.retired-wal-20200101-000000-1.partial"),
    )
    .unwrap();

    let (code, out, _) = cli(&[os("captures"), path.as_os_str(), os("--json")]);
    assert_eq!(code, 3, "rows are still missing: {out}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2, "{out}");
    let partial = list.iter().find(|c| c["partial"] == true).unwrap();
    assert!(partial["status"].as_str().unwrap().contains("interrupted"));
    let full = list.iter().find(|c| c["partial"] == false).unwrap();
    assert_eq!(full["capture"], artifact.display().to_string());
    assert_eq!(full["reason"], "wal-lost");
    assert_eq!(full["trigger"], "halt");
    assert_eq!(full["status"], "verified");
    assert_eq!(full["missing"], 4);
    assert!(full["commits"].as_u64().unwrap() >= 4);

    // By directory, in text.
    let (code, out, _) = cli(&[os("captures"), dir.path().as_os_str()]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("rows still missing from"), "{out}");
    assert!(out.contains(": 4"), "{out}");
}

#[test]
fn captures_json_carries_the_exact_bytes_of_a_non_utf8_path() {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    fs::create_dir(&odd).unwrap();
    let (path, artifact) = lost_four(&odd);

    let (code, out, _) = cli(&[os("captures"), path.as_os_str(), os("--json")]);
    assert_eq!(code, 3, "its rows are still missing: {out}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = &list[0];
    let unhex = |key: &str| -> PathBuf {
        let hex = row[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in {row}"));
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        PathBuf::from(std::ffi::OsString::from_vec(bytes))
    };
    assert_eq!(unhex("capture_hex"), artifact);
    assert_eq!(unhex("database_hex"), path);
    assert_eq!(row["status"], "verified", "{row}");
}

#[test]
fn verify_passes_only_a_complete_matching_clean_capture() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, artifact) = lost_four(dir.path());
    let (code, out, _) = cli(&[os("verify"), artifact.as_os_str()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("verified"), "{out}");

    let partial = dir
        .path()
        .join("state.db.retired-wal-20200101-000000-1.partial");
    fs::create_dir(&partial).unwrap();
    let (code, out, _) = cli(&[os("verify"), partial.as_os_str()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(".partial"), "{out}");

    let damaged = dir.path().join("damaged");
    fs::create_dir(&damaged).unwrap();
    for f in fs::read_dir(&artifact).unwrap().flatten() {
        fs::copy(f.path(), damaged.join(f.file_name())).unwrap();
    }
    let mut wal = fs::read(damaged.join("state.db-wal")).unwrap();
    wal[100] ^= 1;
    fs::write(damaged.join("state.db-wal"), &wal).unwrap();
    let (code, out, _) = cli(&[os("verify"), damaged.as_os_str(), os("--json")]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    assert!(v["message"].as_str().unwrap().contains("sha256"), "{out}");

    let (code, out, err) = cli(&[os("verify"), dir.path().as_os_str()]);
    assert_eq!(
        code, 2,
        "a directory that is not a capture is bad input: {out}{err}"
    );
}

#[test]
fn recover_prints_the_plan_changes_nothing_then_applies_with_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_four(dir.path());
    let before = file_bytes(&path);

    let (code, out, _) = cli(&[
        os("recover"),
        artifact.as_os_str(),
        os("--into"),
        path.as_os_str(),
    ]);
    // A plan is what was asked; it exits 0 (the rows to merge are in the output and in `--json`'s
    // `missing`). It used to exit 1.
    assert_eq!(code, 0, "rows to merge: {out}");
    assert!(out.contains("messages"), "{out}");
    assert!(out.contains("4 row(s) missing"), "{out}");
    assert_eq!(file_bytes(&path), before, "a plan writes nothing");

    let (code, out, _) = cli(&[
        os("recover"),
        artifact.as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--apply"),
    ]);
    // A successful merge exits 0 (it used to exit 1, which broke `set -e` scripts).
    assert_eq!(code, 0, "merged: {out}");
    assert!(out.contains("merged 4 row(s)"), "{out}");
    let (code, out, _) = cli(&[
        os("recover"),
        artifact.as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--apply"),
    ]);
    assert_eq!(code, 0, "nothing to do: {out}");
    let live = Connection::open(&path).unwrap();
    assert_eq!(count_like(&live, "retired %"), 4);
    assert!(integrity_ok(&live));
}

#[test]
fn a_conflict_left_behind_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.db");
    let conn = open_guarded(&path);
    conn.execute_batch(
        "PRAGMA wal_autocheckpoint=0; CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT);
         INSERT INTO kv VALUES ('a', 'old');",
    )
    .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch("UPDATE kv SET v = 'captured' WHERE k = 'a'")
        .unwrap();
    lose_sidecars(&path, false);
    assert!(conn.execute("INSERT INTO kv VALUES ('b', '')", []).is_err());
    let artifact = conn.guard_status().unwrap().capture.unwrap();
    close_while_restarted(conn, &path);
    Connection::open(&path)
        .unwrap()
        .execute_batch("UPDATE kv SET v = 'live' WHERE k = 'a'")
        .unwrap();
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            os("recover"),
            artifact.as_os_str(),
            os("--into"),
            path.as_os_str(),
            os("--apply"),
        ];
        a.extend(extra.iter().map(|s| os(s)));
        a
    };
    let (code, out, _) = cli(&args(&[]));
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("conflict"), "{out}");
    let (code, out, _) = cli(&args(&["--take-capture"]));
    // Merged, the conflict settled: 0 (it used to exit 1).
    assert_eq!(code, 0, "{out}");
    let v: String = Connection::open(&path)
        .unwrap()
        .query_row("SELECT v FROM kv WHERE k = 'a'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, "captured");
}

#[test]
fn bad_inputs_get_a_clear_error_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_four(dir.path());
    let before = file_bytes(&path);
    let capture_before: Vec<Vec<u8>> = ["state.db", "state.db-wal", "manifest.json"]
        .iter()
        .map(|f| fs::read(artifact.join(f)).unwrap())
        .collect();

    let run = |capture: &Path, into: &Path| {
        cli(&[
            os("recover"),
            capture.as_os_str(),
            os("--into"),
            into.as_os_str(),
            os("--apply"),
        ])
    };
    // A .partial directory.
    let partial = dir
        .path()
        .join("state.db.retired-wal-20200101-000000-1.partial");
    fs::create_dir(&partial).unwrap();
    let (code, _, err) = run(&partial, &path);
    assert_eq!(code, 2);
    assert!(
        err.contains("interrupted capture") && err.contains("nothing was written"),
        "{err}"
    );

    // A damaged capture (a byte of the main image changed).
    let damaged = dir.path().join("damaged");
    fs::create_dir(&damaged).unwrap();
    for f in fs::read_dir(&artifact).unwrap().flatten() {
        fs::copy(f.path(), damaged.join(f.file_name())).unwrap();
    }
    let mut main = fs::read(damaged.join("state.db")).unwrap();
    main[200] ^= 1;
    fs::write(damaged.join("state.db"), &main).unwrap();
    let (code, _, err) = run(&damaged, &path);
    assert_eq!(code, 2);
    assert!(err.contains("sha256") && err.contains("damaged"), "{err}");

    // A live file that is a different database.
    let other = dir.path().join("other.db");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)")
        .unwrap();
    let other_before = fs::read(&other).unwrap();
    let (code, _, err) = run(&artifact, &other);
    assert_eq!(code, 2);
    assert!(err.contains("different database"), "{err}");
    assert_eq!(fs::read(&other).unwrap(), other_before);

    // The capture's own files as the target.
    let (code, _, err) = run(&artifact, &artifact.join("state.db"));
    assert_eq!(code, 2);
    assert!(err.contains("inside the capture"), "{err}");

    // A target that does not exist is not created.
    let missing = dir.path().join("missing.db");
    let (code, _, err) = run(&artifact, &missing);
    assert_eq!(code, 2);
    assert!(err.contains("never creates"), "{err}");
    assert!(!missing.exists());

    // Not a capture at all, as JSON.
    let (code, out, _) = cli(&[
        os("recover"),
        dir.path().as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--json"),
    ]);
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["bad_input"], true);

    assert_eq!(file_bytes(&path), before, "the live database is untouched");
    let capture_after: Vec<Vec<u8>> = ["state.db", "state.db-wal", "manifest.json"]
        .iter()
        .map(|f| fs::read(artifact.join(f)).unwrap())
        .collect();
    assert_eq!(capture_after, capture_before, "the capture is untouched");
}
