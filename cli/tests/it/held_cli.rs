//! `hermes-guard held`: the processes that hold retired WAL generations open, seen from outside
//! (the operator's question when a status reports `held_generations`).

use crate::common;

use common::*;
use hermes_guard::GuardExt;

/// `hermes-guard held --under <dir> --json`, parsed.
fn held_under(dir: &std::path::Path) -> serde_json::Value {
    let (code, out, err) = hermes_guard_cli(&[
        "held".as_ref(),
        "--under".as_ref(),
        dir.as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"))
}

test_alone! {
    fn a_held_retired_generation_is_listed_with_its_process_until_it_is_captured() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        wal_only_sentinel(&conn);
        lose_sidecars(&path, false);
        hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");
        drop(conn);

        let doc = held_under(dir.path());
        let me = std::process::id();
        let processes = doc["processes"].as_array().unwrap();
        assert_eq!(processes.len(), 1, "{doc}");
        assert_eq!(processes[0]["pid"], me);
        assert_eq!(
            processes[0]["wals"][0]["wal"],
            sidecar(&path, "-wal").display().to_string()
        );
        // Where the bytes can be copied from while the process lives.
        assert_eq!(processes[0]["wals"][0]["captured"], false, "{doc}");
        assert_eq!(doc["uncaptured"], 1, "{doc}");
        // Agrees with this process's own count (any guarded connection's status says it).
        let other = open_guarded(&dir.path().join("other.db"));
        assert_eq!(other.guard_status().unwrap().held_generations, 1);
        drop(other);
        let copy_from = processes[0]["wals"][0]["copy_from"].as_str().unwrap();
        assert!(copy_from.starts_with(&format!("/proc/{me}/fd/")), "{doc}");
        assert_eq!(
            std::fs::read_link(copy_from).unwrap(),
            std::path::PathBuf::from(format!("{} (deleted)", sidecar(&path, "-wal").display()))
        );

        hermes_guard::test_hooks::clear_capture_fault(dir.path());
        assert_eq!(hermes_guard::retry_pending_captures(), 0);
        let doc = held_under(dir.path());
        assert_eq!(doc["descriptors"], 0, "{doc}");
    }
}

#[test]
fn a_guarded_connection_whose_generation_is_captured_is_listed_with_nothing_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    lose_sidecars(&path, false);
    assert!(insert(&conn, "after the loss").is_err(), "refused");
    let [capture] = artifacts(dir.path()).try_into().unwrap();

    let doc = held_under(dir.path());
    let wal = &doc["processes"][0]["wals"][0];
    assert_eq!(wal["captured"], true, "{doc}");
    assert_eq!(wal["capture"], capture.display().to_string());
    assert_eq!(doc["uncaptured"], 0, "{doc}");
    let (code, out, _) =
        hermes_guard_cli(&["held".as_ref(), "--under".as_ref(), dir.path().as_os_str()]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to do"), "{out}");
    drop(conn);
}

#[test]
fn a_stock_connection_whose_wal_was_deleted_is_listed_as_not_captured_with_where_to_copy_from() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_stock(&path);
    wal_only_sentinel(&conn);
    lose_sidecars(&path, false);

    let (code, out, _) =
        hermes_guard_cli(&["held".as_ref(), "--under".as_ref(), dir.path().as_os_str()]);
    assert_eq!(code, 0);
    let line = out
        .lines()
        .find(|l| l.contains(&sidecar(&path, "-wal").display().to_string()))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("NOT captured"), "{line}");
    assert!(
        line.contains(&format!("/proc/{}/fd/", std::process::id())),
        "{line}"
    );
    drop(conn);
}

#[test]
fn held_under_a_path_that_does_not_exist_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent");
    let (code, out, err) =
        hermes_guard_cli(&["held".as_ref(), "--under".as_ref(), missing.as_os_str()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("nonexistent"), "{err}");
}
