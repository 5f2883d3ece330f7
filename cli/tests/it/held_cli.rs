//! `hermes-guard held`: the processes that hold retired WAL generations open, seen from outside
//! (the operator's question when a status reports `held_generations`).

use crate::common;

use common::*;

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
