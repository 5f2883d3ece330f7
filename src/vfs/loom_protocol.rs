//! A `loom` model of `ConnectionState`'s lock-free protocol (`src/vfs/state.rs`): the `tx` bits,
//! the `retired` flag and `verified_changes`. Not a module of the library: the test target
//! `loom_protocol` of `tests/loom/` (a workspace of its own), run by `tests/loom.sh` with
//! `--cfg loom`. Production code has no loom cfg; the few lines involved are copied here, each
//! with the function it mirrors, and must be kept in step with it.
//!
//! What it proves, over every interleaving loom explores (preemptions bounded by
//! `LOOM_MAX_PREEMPTIONS`, 3 in the script):
//!
//! 1. a retirement racing a WAL write-lock acquisition never leaves `LOCK_CHECKED` set on the
//!    retired state (so the WAL's closed gate could go by that bit alone);
//! 2. a retirement racing a full check's store of the change count always leaves
//!    `verified_changes` at `NEVER_VOUCHED`, so the fast path never vouches after it;
//! 3. both at once, with the write gate's verdict after the lock: `Refuse` once retired.
//!
//! Loom treats `SeqCst` loads and stores as `AcqRel` (tokio-rs/loom#180) but models
//! `fence(SeqCst)`. The protocol needs `SeqCst`'s single total order: (2) is the
//! store-buffering pattern (each side stores one word and then reads the other's); and (1),
//! once the connection's transaction ends between two locks, has the retirement's `fetch_and`
//! land before `end_of_transaction`'s plain `store(0)`, so the next lock's `fetch_or` reads from
//! that store and synchronises with nobody: only the total order, which follows each word's
//! modification order, makes its load of `retired` see the retirement. (Modelled without the
//! fences, loom reports exactly that interleaving in
//! `a_retirement_racing_a_whole_transaction_never_leaves_lock_checked`.) So where `state.rs`
//! relies on that order, between a `SeqCst` access and the thread's next one, the model has a
//! `fence(SeqCst)`: for these patterns the same guarantee, and one loom checks.
#![cfg(loom)]

use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use loom::sync::Arc;
use loom::thread;

// state.rs: the `tx` bits and `NEVER_VOUCHED`.
const LOCK_CHECKED: u8 = 1;
const WAL_CHECKED: u8 = 2;
const NEVER_VOUCHED: u64 = u64::MAX;

/// The atomics of `ConnectionState` the protocol uses, plus the watcher's change count
/// (`watch.rs`'s `Shared::changes`, which the fast path compares with `verified_changes`).
struct Model {
    tx: AtomicU8,
    retired: AtomicBool,
    verified_changes: AtomicU64,
    changes: AtomicU64,
}

#[derive(Debug, PartialEq, Eq)]
enum Gate {
    Go,
    Check,
    Refuse,
}

impl Model {
    fn new() -> Arc<Model> {
        Arc::new(Model {
            tx: AtomicU8::new(0),
            retired: AtomicBool::new(false),
            verified_changes: AtomicU64::new(NEVER_VOUCHED),
            changes: AtomicU64::new(0),
        })
    }

    /// `ConnectionState::write_lock(true)`.
    fn write_lock(&self) {
        self.tx
            .fetch_or(LOCK_CHECKED | WAL_CHECKED, Ordering::SeqCst);
        // `SeqCst` order between the `fetch_or` and the load (see the module's comment).
        fence(Ordering::SeqCst);
        if self.retired.load(Ordering::SeqCst) {
            self.tx.fetch_and(!LOCK_CHECKED, Ordering::SeqCst);
        }
    }

    /// `ConnectionState::write_lock` as it would be without its re-load of `retired`: the negative
    /// control, which must fail property 1.
    fn write_lock_without_reload(&self) {
        self.tx
            .fetch_or(LOCK_CHECKED | WAL_CHECKED, Ordering::SeqCst);
    }

    /// `ConnectionState::check_pins`, its retirement's three stores (after `inner.reason` is set,
    /// under the state's mutex, which nothing else here takes).
    fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
        // `SeqCst` order between this store and the next (see the module's comment).
        fence(Ordering::SeqCst);
        self.tx.fetch_and(!LOCK_CHECKED, Ordering::SeqCst);
        self.verified_changes.store(NEVER_VOUCHED, Ordering::SeqCst);
    }

    /// `ConnectionState::check`'s tail once the path is vouched for or verified: it records the
    /// change count `c` it read first, then re-reads `retired`; then
    /// `ConnectionState::checked(Site::WalWrite)`.
    fn check(&self, c: u64) {
        self.verified_changes.store(c, Ordering::SeqCst);
        // `SeqCst` order between the store above and the load below (see the module's comment).
        fence(Ordering::SeqCst);
        if self.retired.load(Ordering::SeqCst) {
            self.verified_changes.store(NEVER_VOUCHED, Ordering::SeqCst);
        }
        self.tx.fetch_or(WAL_CHECKED, Ordering::AcqRel);
    }

    /// `ConnectionState::wal_write_gate`, up to the write-lock test (the offset half is this
    /// connection's own and not shared).
    fn wal_write_gate(&self) -> Gate {
        if self.retired.load(Ordering::Acquire) {
            return Gate::Refuse;
        }
        if self.tx.load(Ordering::Acquire) & LOCK_CHECKED != 0 {
            return Gate::Go;
        }
        Gate::Check
    }

    /// `FastWatch::current_fast`'s verdict once its `epoll_wait` found nothing ready.
    fn vouched_fast(&self) -> bool {
        self.changes.load(Ordering::Acquire) == self.verified_changes.load(Ordering::Acquire)
    }

    /// `ConnectionState::end_of_transaction`.
    fn end_of_transaction(&self) {
        self.tx.store(0, Ordering::Release);
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// Property 1: a write lock taken while the generation is retired never keeps `LOCK_CHECKED`.
#[test]
fn a_retirement_racing_a_write_lock_never_leaves_lock_checked() {
    model(|| {
        let state = Model::new();
        let conn = {
            let state = state.clone();
            thread::spawn(move || state.write_lock())
        };
        state.retire();
        conn.join().unwrap();
        assert_eq!(state.tx.load(Ordering::SeqCst) & LOCK_CHECKED, 0);
        assert_eq!(state.wal_write_gate(), Gate::Refuse);
    });
}

/// Property 1 with the transaction ending meanwhile (its `store(0)` races the retirement's
/// `fetch_and`): still no `LOCK_CHECKED`, and nothing the end cleared comes back.
#[test]
fn a_retirement_racing_a_whole_transaction_never_leaves_lock_checked() {
    model(|| {
        let state = Model::new();
        let conn = {
            let state = state.clone();
            thread::spawn(move || {
                state.write_lock();
                state.end_of_transaction();
                state.write_lock();
            })
        };
        state.retire();
        conn.join().unwrap();
        assert_eq!(state.tx.load(Ordering::SeqCst) & LOCK_CHECKED, 0);
    });
}

/// Property 2: a full check recording its change count while the generation retires leaves the
/// fast path unable to vouch.
#[test]
fn a_retirement_racing_a_check_leaves_the_fast_path_unable_to_vouch() {
    model(|| {
        let state = Model::new();
        let conn = {
            let state = state.clone();
            thread::spawn(move || state.check(0))
        };
        state.retire();
        conn.join().unwrap();
        assert_eq!(state.verified_changes.load(Ordering::SeqCst), NEVER_VOUCHED);
        assert!(!state.vouched_fast());
    });
}

/// Property 3: the lock, a check and a retirement on three threads; afterwards the gate
/// refuses, `LOCK_CHECKED` is clear and the fast path does not vouch. (The locker's own gate
/// may say `Go`, `Check` or `Refuse`, by when the retirement lands: a `Check` then refuses.)
#[test]
fn lock_check_and_retirement_on_three_threads() {
    model(|| {
        let state = Model::new();
        let locker = {
            let state = state.clone();
            thread::spawn(move || {
                state.write_lock();
                state.wal_write_gate()
            })
        };
        let checker = {
            let state = state.clone();
            thread::spawn(move || state.check(0))
        };
        state.retire();
        locker.join().unwrap();
        checker.join().unwrap();
        assert_eq!(state.tx.load(Ordering::SeqCst) & LOCK_CHECKED, 0);
        assert_eq!(state.wal_write_gate(), Gate::Refuse);
        assert!(!state.vouched_fast());
    });
}

/// The negative control: without `write_lock`'s re-load of `retired`, loom finds the
/// interleaving that leaves `LOCK_CHECKED` set on a retired state (the model can fail).
#[test]
#[should_panic]
fn without_the_reload_lock_checked_survives_a_retirement() {
    model(|| {
        let state = Model::new();
        let conn = {
            let state = state.clone();
            thread::spawn(move || state.write_lock_without_reload())
        };
        state.retire();
        conn.join().unwrap();
        assert_eq!(state.tx.load(Ordering::SeqCst) & LOCK_CHECKED, 0);
    });
}
