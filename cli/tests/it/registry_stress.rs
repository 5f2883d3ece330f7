//! Threads hammer acquire / append / release while the database is restored underneath them
//! again and again: no deadlock, no leaked reference, no use of a closed handle, and the only
//! errors anyone sees are the MainReplaced kind.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use hermes_guard_store::registry::{self, Registry};
use hermes_guard_store::{NewMessage, RegistryStats, SessionDb, StoreError};
use parking_lot::Mutex;

const THREADS: usize = 4;
const RESTORES: usize = 12;
/// Appends the workers must complete between two restores, so each restore lands under load.
const PROGRESS_PER_RESTORE: usize = 8;
/// A deadlock bound, not a performance assertion.
const STUCK: Duration = Duration::from_secs(120);

/// Restores `snapshot` at `path` as a restore tool would: the stale sidecars go first, then the
/// snapshot is renamed over the path in one step.
///
/// Not `common::replace_main_file` (copy, unlink, rename): under concurrent acquires its gap
/// lets SQLite create an empty file at the path, and a copy of the live file keeps the live
/// `-wal`/`-shm` beside it, so every generation would share one WAL and `-shm` file (and a
/// process's new inode re-initialises the `-shm` another inode of the same process maps). A
/// consistent snapshot with its own fresh sidecars tests the registry, not those accidents.
fn restore(snapshot: &Path, path: &Path, n: usize) {
    let staged = path.with_extension(format!("restore-{n}"));
    fs::copy(snapshot, &staged).unwrap();
    for suffix in ["-wal", "-shm"] {
        match fs::remove_file(sidecar(path, suffix)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("removing {suffix}: {e}"),
        }
    }
    fs::rename(&staged, path).unwrap();
}

/// A closed, fully checkpointed database with the schema and one session per worker.
fn make_snapshot(dir: &Path) -> PathBuf {
    let snapshot = dir.join("snapshot.db");
    let db = SessionDb::open(&snapshot).unwrap();
    for t in 0..THREADS {
        db.ensure_session(&format!("worker-{t}"), "stress").unwrap();
    }
    db.ensure_session("main", "stress").unwrap();
    db.close().unwrap();
    assert!(
        !sidecar(&snapshot, "-wal").exists(),
        "checkpointed on close"
    );
    snapshot
}

#[derive(Default)]
struct Tally {
    appended: AtomicUsize,
    refused: AtomicUsize,
    unexpected: Mutex<Vec<String>>,
}

impl Tally {
    fn record(&self, who: &str, err: StoreError) {
        if err.is_retired() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        } else {
            // Closed included: nobody here uses a handle after giving it back.
            self.unexpected.lock().push(format!("{who}: {err:?}"));
        }
    }
}

fn worker(registry: Registry, path: PathBuf, t: usize, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let session = format!("worker-{t}");
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let db = match registry.acquire(&path) {
            Ok(db) => db,
            Err(e) => {
                tally.record(&format!("{session} acquire"), e);
                continue;
            }
        };
        match db.append_message(
            &session,
            &NewMessage::new("user", format!("{session} #{i}")),
        ) {
            Ok(_) => {
                tally.appended.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tally.record(&format!("{session} append"), e),
        }
        // Half the time read too, so retired handles are read through as well as written.
        if i.is_multiple_of(2) {
            if let Err(e) = db.get_messages(&session) {
                tally.record(&format!("{session} read"), e);
            }
        }
        // Alternate the ways a reference is given back.
        match i % 3 {
            0 => {
                registry::release(db);
            }
            1 => registry::release_or_close(db),
            _ => drop(db),
        }
    }
}

#[test]
fn acquire_release_and_append_survive_repeated_restores_underneath() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = make_snapshot(dir.path());
    let path = dir.path().join("state.db");
    fs::copy(&snapshot, &path).unwrap();

    let registry = Registry::new();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let (done_tx, done_rx) = mpsc::channel();
    for t in 0..THREADS {
        let (registry, path, stop, tally, done_tx) = (
            registry.clone(),
            path.clone(),
            stop.clone(),
            tally.clone(),
            done_tx.clone(),
        );
        thread::spawn(move || {
            worker(registry, path, t, stop, tally);
            let _ = done_tx.send(t);
        });
    }

    for n in 0..RESTORES {
        // Hold the live generation across the restore: its holder must keep a working handle
        // whose writes are refused with the typed error.
        let held = registry.acquire(&path).unwrap();
        held.append_message(
            "main",
            &NewMessage::new("user", format!("main before #{n}")),
        )
        .unwrap();
        let target = tally.appended.load(Ordering::Relaxed) + PROGRESS_PER_RESTORE;
        let mut waited = Duration::ZERO;
        while tally.appended.load(Ordering::Relaxed) < target {
            assert!(waited < STUCK, "workers stopped making progress");
            thread::sleep(Duration::from_millis(2));
            waited += Duration::from_millis(2);
        }

        restore(&snapshot, &path, n);

        let err = held
            .append_message("main", &NewMessage::new("user", format!("main after #{n}")))
            .unwrap_err();
        assert!(err.is_retired(), "{err:?}");
        assert!(
            !held.is_closed(),
            "a retired generation closed under its holder"
        );
        held.get_session("main").unwrap();
        registry::release(held);
    }

    stop.store(true, Ordering::Relaxed);
    for _ in 0..THREADS {
        done_rx.recv_timeout(STUCK).expect("a worker deadlocked");
    }

    let unexpected = tally.unexpected.lock().clone();
    assert!(unexpected.is_empty(), "unexpected errors: {unexpected:#?}");
    assert!(tally.appended.load(Ordering::Relaxed) >= RESTORES * PROGRESS_PER_RESTORE);
    assert_eq!(
        registry.stats(),
        RegistryStats::default(),
        "a reference leaked"
    );
    assert_eq!(registry.close_all(), 0);

    // What is at the path now is a sound database holding the last generation's writes only.
    let last = SessionDb::open(&path).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    assert!(integrity_ok(&raw));
    assert_eq!(
        last.search_messages("\"main after\"", 10).unwrap().len(),
        0,
        "a refused write landed"
    );
    eprintln!(
        "appended {}, refused {} across {RESTORES} restores",
        tally.appended.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed)
    );
}
