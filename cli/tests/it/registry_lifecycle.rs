//! The shared registry's ownership invariants, ported from the Python registry seed:
//! retire-and-drain on replacement, no stale entry after a failed open, teardown outside the
//! lock, balanced legacy close, single flight. Each test has its own `Registry` (what the
//! Python fixture's `close_all()` + clear gave), except the one exercising the process-wide
//! functions.
//!
//! The Python tests look at `db._conn` after the last release; here the handle is consumed by
//! its release, so a teardown hook records which generation was torn down and whether it ended
//! closed.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use common::*;
use hermes_guard::FileId;
use hermes_guard_store::registry::{self, Registry};
use hermes_guard_store::{
    HeldBack, NewMessage, NewSession, RegistryStats, SessionDb, StoreError, StoreOptions,
};
use parking_lot::Mutex;

/// How long a helper thread may take before the test calls it stuck: a deadlock bound, not a
/// performance assertion.
const STUCK: Duration = Duration::from_secs(60);

fn session(id: &str) -> NewSession {
    NewSession::new(id, "cli").model("m")
}

/// Teardowns seen by a registry: (generation, closed afterwards).
#[derive(Clone, Default)]
struct Teardowns(Arc<Mutex<Vec<(FileId, bool)>>>);

impl Teardowns {
    fn registry(&self) -> Registry {
        let seen = self.clone();
        Registry::new().with_teardown(move |db| seen.record(db))
    }

    fn record(&self, db: &SessionDb) -> Result<(), StoreError> {
        let result = registry::default_teardown(db);
        self.0
            .lock()
            .push((db.generation().expect("guarded"), db.is_closed()));
        result
    }

    fn of(&self, generation: FileId) -> Vec<bool> {
        self.0
            .lock()
            .iter()
            .filter(|(g, _)| *g == generation)
            .map(|(_, closed)| *closed)
            .collect()
    }

    fn count(&self) -> usize {
        self.0.lock().len()
    }
}

// ── Inode replacement ───────────────────────────────────────────────────────────────────────

#[test]
fn live_holders_keep_working_handle_across_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let teardowns = Teardowns::default();
    let registry = teardowns.registry();

    let a = registry.acquire(&path).unwrap();
    let b = registry.acquire(&path).unwrap();
    assert!(a.same_generation(&b));
    let old = a.generation();

    replace_main_file(&path);

    let c = registry.acquire(&path).unwrap();
    assert!(
        !c.same_generation(&a),
        "new caller must get the fresh generation"
    );
    let new = c.generation();
    assert_ne!(old, new);
    assert_eq!(
        registry.stats(),
        RegistryStats {
            live_generations: 1,
            retired_generations: 1,
            references: 3,
            unsettled_generations: 0,
        }
    );

    // A and B still hold the OLD generation: alive, not closed under them; its writes fail with
    // the typed error, never a use-after-close.
    assert!(
        !a.is_closed(),
        "retired generation closed while holders live"
    );
    let err = a.create_session(&session("old-gen-session")).unwrap_err();
    assert!(
        matches!(err, StoreError::MainReplaced { .. }),
        "expected MainReplaced, got {err:?}"
    );

    // The new generation works independently.
    c.create_session(&session("new-gen-session")).unwrap();
    assert!(c.get_session("new-gen-session").unwrap().is_some());

    // Releases route to the right generation: A and B release the old one, C the new one.
    assert!(registry::release(a));
    assert!(
        !b.is_closed(),
        "one holder releasing must not tear down the other"
    );
    assert!(teardowns.of(old).is_empty());
    assert!(registry::release(b));
    assert_eq!(
        teardowns.of(old),
        [true],
        "final old-generation release tears it down"
    );
    assert!(
        !c.is_closed(),
        "old-generation teardown must not touch the new one"
    );
    assert!(teardowns.of(new).is_empty());

    assert!(registry::release(c));
    assert_eq!(teardowns.of(new), [true]);
    assert_eq!(registry.stats(), RegistryStats::default());
}

#[test]
fn retired_generation_never_relent_even_after_drain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let teardowns = Teardowns::default();
    let registry = teardowns.registry();
    let first = registry.acquire(&path).unwrap();
    let old = first.generation();

    replace_main_file(&path);

    let second = registry.acquire(&path).unwrap();
    let third = registry.acquire(&path).unwrap();
    assert!(second.same_generation(&third));
    assert!(!second.same_generation(&first));
    // The retired generation is still drainable by its holder.
    assert!(registry::release(first));
    assert_eq!(teardowns.of(old), [true]);
    let fourth = registry.acquire(&path).unwrap();
    assert!(fourth.same_generation(&second), "never the retired one");
    assert_eq!(registry.live_generation(&path), Some(second.generation()));
}

#[test]
fn open_failure_after_replacement_leaves_no_stale_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let fail = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let teardowns = Teardowns::default();
    let registry = {
        let (fail, calls) = (fail.clone(), calls.clone());
        teardowns.registry().with_opener(move |path: &Path| {
            if fail.load(Ordering::SeqCst) {
                calls.fetch_add(1, Ordering::SeqCst);
                return Err(StoreError::Io {
                    database: path.to_path_buf(),
                    operation: "open",
                    source: std::io::Error::other("disk temporarily gone"),
                });
            }
            SessionDb::open(path)
        })
    };
    let old = registry.acquire(&path).unwrap();
    let old_generation = old.generation();

    replace_main_file(&path);
    fail.store(true, Ordering::SeqCst);

    let err = registry.acquire(&path).unwrap_err();
    assert!(err.to_string().contains("disk temporarily gone"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // No live entry for the path: the next acquire retries fresh.
    assert_eq!(registry.live_generation(&path), None);
    assert_eq!(registry.stats().live_generations, 0);
    assert_eq!(registry.stats().retired_generations, 1);

    fail.store(false, Ordering::SeqCst);
    let fresh = registry.acquire(&path).unwrap();
    assert!(!fresh.same_generation(&old));
    assert!(!fresh.is_closed());
    fresh.ensure_session("fresh", "cli").unwrap();

    // The old generation still drains correctly through its holder.
    assert!(registry::release(old));
    assert_eq!(teardowns.of(old_generation), [true]);
    assert!(!fresh.is_closed());
}

// ── Teardown outside the lock ───────────────────────────────────────────────────────────────

#[test]
fn final_release_does_not_hold_registry_lock_during_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let other = dir.path().join("other.db");
    // The hook needs the registry it belongs to; set once built (a cycle this test leaks).
    let this: Arc<OnceLock<Registry>> = Arc::new(OnceLock::new());
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let entered_tx = Mutex::new(entered_tx);
    let lock_free_during_teardown = Arc::new(AtomicBool::new(false));
    let registry = {
        let this = this.clone();
        let free = lock_free_during_teardown.clone();
        let path = path.clone();
        Registry::new().with_teardown(move |db| {
            if db.path() != path {
                // The probe's own database: no probing from its teardown.
                return registry::default_teardown(db);
            }
            let _ = entered_tx.lock().send(());
            // If teardown ran under the registry lock, this acquire of another database from
            // another thread would block until teardown finished, i.e. never within STUCK.
            let registry = this.get().expect("set").clone();
            let other = other.clone();
            let (done_tx, done_rx) = mpsc::channel();
            thread::spawn(move || {
                let handle = registry.acquire(&other);
                let _ = done_tx.send(handle.map(registry::release));
            });
            if let Ok(Ok(true)) = done_rx.recv_timeout(STUCK) {
                free.store(true, Ordering::SeqCst);
            }
            registry::default_teardown(db)
        })
    };
    this.set(registry.clone()).unwrap();

    let db = registry.acquire(&path).unwrap();
    let released = thread::spawn(move || registry::release(db));
    entered_rx.recv_timeout(STUCK).expect("teardown never ran");
    assert!(released.join().unwrap());
    assert!(
        lock_free_during_teardown.load(Ordering::SeqCst),
        "registry lock was HELD during teardown close — a slow WAL checkpoint here stalls \
         every other state.db acquisition"
    );
    assert_eq!(registry.stats(), RegistryStats::default());
}

#[test]
fn concurrent_acquire_and_release_no_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let registry = Registry::new();
    let (done_tx, done_rx) = mpsc::channel();
    for _ in 0..4 {
        let (registry, path, done_tx) = (registry.clone(), path.clone(), done_tx.clone());
        thread::spawn(move || {
            let result = (|| {
                for _ in 0..20 {
                    let db = registry.acquire(&path)?;
                    db.get_session("nonexistent")?;
                    registry::release(db);
                }
                Ok::<_, StoreError>(())
            })();
            let _ = done_tx.send(result);
        });
    }
    for _ in 0..4 {
        let result = done_rx.recv_timeout(STUCK).expect("worker deadlocked");
        result.unwrap();
    }
    assert_eq!(registry.stats(), RegistryStats::default());
}

// ── Legacy close semantics ──────────────────────────────────────────────────────────────────

#[test]
fn close_on_shared_instance_releases_one_refcount() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let teardowns = Teardowns::default();
    let registry = teardowns.registry();
    let a = registry.acquire(&path).unwrap();
    let b = registry.acquire(&path).unwrap();
    assert!(a.same_generation(&b));

    // Legacy close: releases one reference, does not tear down (b still holds).
    a.close().unwrap();
    assert!(
        !b.is_closed(),
        "close() must not tear down a shared instance"
    );
    assert_eq!(registry.stats().references, 1);
    b.ensure_session("still-works", "cli").unwrap();

    // Reaching past the handle to the SessionDb's own close() does not compile: the handle
    // derefs to `&SessionDb`, and `SessionDb::close` takes the store by value.

    // The count is now 1 (b's); releasing b tears down.
    let generation = b.generation();
    assert!(registry::release(b));
    assert_eq!(teardowns.of(generation), [true]);
    assert_eq!(registry.stats(), RegistryStats::default());
}

#[test]
fn close_only_call_site_does_not_leak_refcount() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let registry = Registry::new();
    for _ in 0..5 {
        let db = registry.acquire(&path).unwrap();
        db.close().unwrap();
    }
    assert_eq!(
        registry.stats(),
        RegistryStats::default(),
        "acquire+close cycles leaked references"
    );
}

#[test]
fn dropping_a_handle_releases_its_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let teardowns = Teardowns::default();
    let registry = teardowns.registry();
    let a = registry.acquire(&path).unwrap();
    {
        let _b = registry.acquire(&path).unwrap();
        assert_eq!(registry.stats().references, 2);
    }
    assert_eq!(registry.stats().references, 1);
    let generation = a.generation();
    drop(a);
    assert_eq!(teardowns.of(generation), [true]);
    assert_eq!(registry.stats(), RegistryStats::default());
}

// ── Single flight ───────────────────────────────────────────────────────────────────────────

#[test]
fn concurrent_first_acquires_share_one_generation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    // The opener reports each call and holds the first one at the gate until the second call
    // has started: both acquires are then inside an open, neither installed yet.
    let (entered_tx, entered_rx) = mpsc::channel::<usize>();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let (entered_tx, gate_rx) = (Mutex::new(entered_tx), Mutex::new(gate_rx));
    let opened = Arc::new(AtomicUsize::new(0));
    let teardowns = Teardowns::default();
    let registry = {
        let opened = opened.clone();
        teardowns.registry().with_opener(move |path: &Path| {
            let call = opened.fetch_add(1, Ordering::SeqCst);
            let _ = entered_tx.lock().send(call);
            if call == 0 {
                let _ = gate_rx.lock().recv_timeout(STUCK);
            }
            SessionDb::open(path)
        })
    };

    let acquire = |registry: Registry, path: PathBuf| thread::spawn(move || registry.acquire(path));
    let t1 = acquire(registry.clone(), path.clone());
    assert_eq!(
        entered_rx.recv_timeout(STUCK),
        Ok(0),
        "first open never started"
    );
    let t2 = acquire(registry.clone(), path.clone());
    assert_eq!(
        entered_rx.recv_timeout(STUCK),
        Ok(1),
        "second open never started"
    );
    gate_tx.send(()).unwrap();
    let first = t1.join().unwrap().unwrap();
    let second = t2.join().unwrap().unwrap();

    assert!(
        first.same_generation(&second),
        "concurrent acquires must share one generation"
    );
    assert_eq!(opened.load(Ordering::SeqCst), 2, "both acquires opened");
    // Exactly the losing open was torn down (and closed); the shared one is untouched.
    assert_eq!(teardowns.count(), 1);
    assert!(teardowns.0.lock().iter().all(|(_, closed)| *closed));
    assert!(!first.is_closed());
    assert_eq!(registry.stats().references, 2);
    first.ensure_session("shared", "cli").unwrap();
    registry::release(first);
    registry::release(second);
    assert_eq!(teardowns.count(), 2);
    assert_eq!(registry.stats(), RegistryStats::default());
}

// ── Beyond the seed ─────────────────────────────────────────────────────────────────────────

#[test]
fn a_lost_wal_generation_is_lent_until_drained_then_opened_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let teardowns = Teardowns::default();
    let registry = teardowns.registry();
    let a = registry.acquire(&path).unwrap();
    a.ensure_session("s", "cli").unwrap();
    lose_sidecars(&path, false);
    let err = a.set_meta("k", "v").unwrap_err();
    assert!(matches!(err, StoreError::WalLost { .. }), "{err:?}");

    // The main file is the same, so the generation is: a new holder shares the lost one and
    // gets the same typed refusal (not a connection that would trip over the lost -shm).
    let b = registry.acquire(&path).unwrap();
    assert!(b.same_generation(&a));
    assert!(matches!(
        b.set_meta("k", "v"),
        Err(StoreError::WalLost { .. })
    ));
    let lost = a.generation();
    registry::release(a);
    assert!(teardowns.of(lost).is_empty());
    registry::release(b);
    assert_eq!(teardowns.of(lost), [true], "drained and torn down");

    // The application's remedy, verbatim: once released, acquire again and write.
    let fresh = registry.acquire(&path).unwrap();
    fresh.set_meta("k", "v").unwrap();
    assert_eq!(fresh.get_meta("k").unwrap().as_deref(), Some("v"));
    assert_eq!(
        artifacts(dir.path()).len(),
        1,
        "the lost generation was captured"
    );
    drop(fresh);
    assert_eq!(registry.stats(), RegistryStats::default());
}

/// A registry whose generations never checkpoint on their own, so a committed row can be left
/// in the WAL only.
fn wal_keeping_registry() -> Registry {
    Registry::new().with_opener(|path: &Path| {
        SessionDb::open_with(
            path,
            StoreOptions {
                wal_autocheckpoint: Some(0),
                ..StoreOptions::default()
            },
        )
    })
}

/// Checkpointed history, then one message that lives only in the WAL; returns its content.
fn wal_only_message(db: &SessionDb) -> String {
    db.ensure_session("gw-0", "gateway").unwrap();
    db.try_wal_checkpoint().expect("checkpoint ran");
    let sentinel = format!("{SENTINEL_PREFIX}{}", "y".repeat(2000));
    db.append_message("gw-0", &NewMessage::new("assistant", sentinel.clone()))
        .unwrap();
    sentinel
}

/// The one capture in `dir` holds `sentinel`.
#[track_caller]
fn assert_one_capture_recovering(dir: &Path, sentinel: &str) {
    let found = artifacts(dir);
    assert_eq!(found.len(), 1, "one loss, one capture: {found:?}");
    let recovered = recover(&found[0], "state.db", &dir.join("recovered"));
    assert_eq!(count_like(&recovered, sentinel), 1);
}

#[test]
fn a_failed_capture_at_final_release_keeps_the_generation_open_until_close_all_retries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let registry = wal_keeping_registry();
    let db = registry.acquire(&path).unwrap();
    let sentinel = wal_only_message(&db);
    lose_sidecars(&path, false);
    hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");

    assert!(registry::release(db));
    assert_eq!(
        registry.stats(),
        RegistryStats {
            unsettled_generations: 1,
            ..RegistryStats::default()
        },
        "released, but kept open: the capture is still owed"
    );
    assert_eq!(registry.close_all(), 1, "still failing: kept again");

    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    assert_eq!(registry.close_all(), 0);
    assert_eq!(registry.stats(), RegistryStats::default());
    assert_one_capture_recovering(dir.path(), &sentinel);
}

#[test]
fn an_unsettled_generation_refuses_acquires_of_its_path_until_its_capture_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let registry = wal_keeping_registry();
    let db = registry.acquire(&path).unwrap();
    let sentinel = wal_only_message(&db);
    lose_sidecars(&path, false);
    hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");
    assert!(registry::release(db));
    assert_eq!(registry.stats().unsettled_generations, 1);

    // Still failing: refused with the capture's own error, and nothing opened or written.
    match registry.acquire(&path) {
        Err(
            e @ StoreError::CaptureFailed {
                held_back: HeldBack::Acquire,
                ..
            },
        ) => {
            let text = e.to_string();
            assert!(text.contains("no space left on device"), "{text}");
            assert!(text.contains("nothing new was opened"), "{text}");
        }
        other => panic!("expected CaptureFailed at acquire, got {other:?}"),
    }
    assert!(artifacts(dir.path()).is_empty(), "a capture was written");
    assert!(
        !sidecar(&path, "-wal").exists(),
        "a new generation was opened"
    );
    assert_eq!(
        registry.stats(),
        RegistryStats {
            unsettled_generations: 1,
            ..RegistryStats::default()
        }
    );

    // Fixed: the same acquire settles the old generation first, then opens a working one.
    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    let fresh = registry.acquire(&path).unwrap();
    fresh.set_meta("after", "the capture").unwrap();
    assert_eq!(
        fresh.get_meta("after").unwrap().as_deref(),
        Some("the capture")
    );
    assert_eq!(
        registry.stats(),
        RegistryStats {
            live_generations: 1,
            references: 1,
            ..RegistryStats::default()
        }
    );
    assert_one_capture_recovering(dir.path(), &sentinel);
    drop(fresh);
    assert_eq!(registry.stats(), RegistryStats::default());
}

#[test]
fn closing_a_shared_handle_of_a_lost_generation_captures_it_while_others_still_hold_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let teardowns = Teardowns::default();
    let registry = teardowns.registry();
    let a = registry.acquire(&path).unwrap();
    let b = registry.acquire(&path).unwrap();
    let sentinel = wal_only_message(&a);
    lose_sidecars(&path, false);

    a.close().unwrap();

    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "close() did not capture: {found:?}");
    assert_eq!(manifest(&found[0])["trigger"], "close");
    assert_eq!(b.retired_generation_capture(), Some(found[0].clone()));
    assert!(
        teardowns.count() == 0 && !b.is_closed(),
        "b's generation torn down"
    );
    assert_eq!(registry.stats().references, 1);
    assert_one_capture_recovering(dir.path(), &sentinel);

    drop(b);
    assert_eq!(artifacts(dir.path()), found, "captured once");
    assert_eq!(registry.stats(), RegistryStats::default());
}

#[test]
fn a_close_whose_capture_fails_hands_back_the_handle_with_its_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let registry = wal_keeping_registry();
    let db = registry.acquire(&path).unwrap();
    let sentinel = wal_only_message(&db);
    lose_sidecars(&path, false);
    hermes_guard::test_hooks::inject_capture_fault(dir.path(), "no space left on device");

    let (db, err) = db.close().unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::CaptureFailed { held_back: HeldBack::Close, message, .. }
                if message.contains("no space left on device")
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("NOT closed"), "{err}");
    assert_eq!(
        registry.stats(),
        RegistryStats {
            live_generations: 1,
            references: 1,
            ..RegistryStats::default()
        },
        "the handle still holds its reference"
    );
    assert!(!db.is_closed());
    assert_eq!(db.get_session("gw-0").unwrap().unwrap().message_count, 1);
    assert!(artifacts(dir.path()).is_empty());

    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    db.close().unwrap();
    assert_eq!(registry.stats(), RegistryStats::default());
    assert_one_capture_recovering(dir.path(), &sentinel);
}

#[test]
fn a_final_teardown_failing_after_the_release_is_retried_by_closing_the_handle_handed_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    // The loss lands between close()'s capture check and the final teardown, with the disk
    // full: the reference is already given back when the capture fails.
    let struck = Arc::new(AtomicBool::new(false));
    let registry = {
        let (struck, path, dir) = (struck.clone(), path.clone(), dir.path().to_path_buf());
        wal_keeping_registry().with_teardown(move |db| {
            if !struck.swap(true, Ordering::SeqCst) {
                lose_sidecars(&path, false);
                hermes_guard::test_hooks::inject_capture_fault(&dir, "no space left on device");
            }
            registry::default_teardown(db)
        })
    };
    let db = registry.acquire(&path).unwrap();
    let sentinel = wal_only_message(&db);

    let (db, err) = db.close().unwrap_err();
    assert!(matches!(err, StoreError::CaptureFailed { .. }), "{err:?}");
    assert_eq!(
        registry.stats(),
        RegistryStats {
            unsettled_generations: 1,
            ..RegistryStats::default()
        },
        "released, and kept open until captured"
    );
    assert!(!db.is_closed());
    assert_eq!(db.get_messages("gw-0").unwrap().len(), 1);

    hermes_guard::test_hooks::clear_capture_fault(dir.path());
    db.close().unwrap();
    assert_eq!(registry.stats(), RegistryStats::default());
    assert_one_capture_recovering(dir.path(), &sentinel);
}

#[test]
fn a_panic_while_holding_handles_or_inside_the_opener_leaks_no_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let registry = Registry::new();
    let (holder, p) = (registry.clone(), path.clone());
    let unwound = thread::spawn(move || {
        let _a = holder.acquire(&p).unwrap();
        let _b = holder.acquire(&p).unwrap();
        panic!("the caller panics while holding two handles");
    })
    .join();
    assert!(unwound.is_err());
    assert_eq!(registry.stats(), RegistryStats::default());

    let panicking = Registry::new().with_opener(|_: &Path| panic!("the opener panics"));
    let (opener, p) = (panicking.clone(), path.clone());
    assert!(thread::spawn(move || opener.acquire(&p).map(drop))
        .join()
        .is_err());
    assert_eq!(panicking.stats(), RegistryStats::default());

    let db = registry.acquire(&path).unwrap();
    db.ensure_session("after the panics", "cli").unwrap();
}

#[test]
fn close_all_closes_every_generation_and_outstanding_handles_get_closed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new();
    let a = registry.acquire(dir.path().join("a.db")).unwrap();
    let old = registry.acquire(dir.path().join("b.db")).unwrap();
    replace_main_file(&dir.path().join("b.db"));
    let new = registry.acquire(dir.path().join("b.db")).unwrap();
    assert_eq!(registry.stats().retired_generations, 1);

    assert_eq!(registry.close_all(), 0);
    assert_eq!(registry.stats(), RegistryStats::default());
    for handle in [&a, &old, &new] {
        assert!(handle.is_closed());
        assert!(matches!(
            handle.get_session("x"),
            Err(StoreError::Closed { .. })
        ));
    }
    assert!(!registry::release(a), "the registry no longer has it");
    drop((old, new));
    assert_eq!(registry.stats(), RegistryStats::default());
}

#[test]
fn the_process_wide_registry_lends_and_drains() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = registry::acquire(&path).unwrap();
    let b = registry::acquire(dir.path().join(".").join("state.db")).unwrap();
    assert!(
        a.same_generation(&b),
        "one generation per path, however spelled"
    );
    a.ensure_session("s", "cli").unwrap();
    assert!(registry::release(a));
    registry::release_or_close(b);
    assert_eq!(registry::stats(), RegistryStats::default());
    assert_eq!(registry::close_all(), 0);
}
