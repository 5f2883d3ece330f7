//! A connection dropped while its capture cannot be written: the guard logs at ERROR, keeps the
//! descriptors, and a later retry captures. It runs alone, in a process of its own
//! (`test_alone!`), because the pending list and the logger are process-wide.

use crate::common;

use std::sync::Mutex;

use common::*;

struct Recorder(Mutex<Vec<(log::Level, String)>>);

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((record.level(), record.args().to_string()));
    }
    fn flush(&self) {}
}

static RECORDER: Recorder = Recorder(Mutex::new(Vec::new()));

test_alone! {
    fn dropped_connection_with_failed_capture_is_held_logged_and_retried() {
        log::set_logger(&RECORDER).unwrap();
        log::set_max_level(log::LevelFilter::Debug);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        let sentinel = wal_only_sentinel(&conn);
        let wal_id = identity(&sidecar(&path, "-wal"));
        lose_sidecars(&path, false);

        hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");
        drop(conn);

        assert!(artifacts(dir.path()).is_empty());
        assert_eq!(
            hermes_guard::retry_pending_captures(),
            1,
            "the generation is held"
        );
        let errors: Vec<String> = RECORDER
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(level, _)| *level == log::Level::Error)
            .map(|(_, m)| m.clone())
            .collect();
        assert!(
            errors.iter().any(|m| m.contains("no space left on device")),
            "the failure must be logged at ERROR: {errors:?}"
        );
        // The retired WAL is still reachable through the held descriptor.
        assert!(!descriptor_contents(wal_id).is_empty());

        hermes_guard::test_hooks::clear_capture_fault(dir.path());
        assert_eq!(hermes_guard::retry_pending_captures(), 0);
        let found = artifacts(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(manifest(&found[0])["trigger"], "close");
        let recovered = recover(&found[0], "state.db", &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
        assert!(integrity_ok(&recovered));
    }
}
