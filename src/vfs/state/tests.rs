//! `ConnectionState`'s transitions, through its seams: a [`WalGate`] that records what it was told,
//! a [`WalIndex`] that shows a chosen checkpoint progress and an in-memory [`ImageSource`]. The
//! paths are real files in a temporary directory (`ConnectionState::new` stats the database,
//! `pin_wal` opens the WAL); a generation is retired the way it is in the field, by unlinking or
//! replacing a file behind the state's back.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::capture::{Manifest, Trigger};
use crate::status::RetireReason;
use crate::walfile::encode_test_wal;
use crate::walfile::SMALLEST_WAL_WITH_A_FRAME;

/// Records every `set_open` call.
#[derive(Clone, Default)]
struct RecordingGate(Arc<Mutex<Vec<bool>>>);

impl WalGate for RecordingGate {
    fn set_open(&self, open: bool) {
        self.0.lock().push(open);
    }
}

impl RecordingGate {
    fn calls(&self) -> Vec<bool> {
        self.0.lock().clone()
    }
}

/// A wal-index that always shows the same checkpoint progress.
struct FixedIndex(Option<Backfill>);

impl WalIndex for FixedIndex {
    fn backfill(&self) -> Option<Backfill> {
        self.0
    }

    fn salts(&self) -> Option<[u32; 2]> {
        None
    }
}

/// A main image held in memory.
struct MemImage(Vec<u8>);

impl ImageSource for MemImage {
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = self
            .0
            .get(start..start + buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// A database with its `-wal` (holding `wal`) in a directory of its own, and its state with the
/// WAL pinned.
struct Fixture {
    _dir: tempfile::TempDir,
    db: PathBuf,
    state: Arc<ConnectionState>,
}

impl Fixture {
    fn new(wal: &[u8]) -> Fixture {
        // What `register` does first: without it the directory watch takes this process for a
        // forked child and never vouches.
        crate::vfs::fork::install();
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("state.db");
        fs::write(&db, b"main image").expect("write db");
        fs::write(sidecar(&db, "-wal"), wal).expect("write wal");
        let state = ConnectionState::new(db.clone(), None);
        state.pin_wal(&sidecar(&db, "-wal"), None).expect("pin wal");
        Fixture {
            _dir: dir,
            db,
            state,
        }
    }

    /// A WAL of one committed frame: enough to be worth capturing.
    fn with_a_frame() -> Fixture {
        Fixture::new(&one_frame_wal())
    }

    fn path(&self, suffix: &str) -> PathBuf {
        sidecar(&self.db, suffix)
    }

    /// Unlinks the `-wal` and runs the check that retires the generation.
    fn lose_wal(&self) -> Option<RetireReason> {
        fs::remove_file(self.path("-wal")).expect("unlink wal");
        self.state.check_pins()
    }

    fn tx(&self) -> u8 {
        self.state.checks.tx.load(Ordering::SeqCst)
    }
}

fn one_frame_wal() -> Vec<u8> {
    encode_test_wal(512, [1, 2], &[(1, 1, vec![7; 512])], false)
}

/// Replaces `path` by a new inode (a restore).
fn replace(path: &Path) {
    let new = path.with_extension("restored");
    fs::write(&new, b"restored image").expect("write");
    fs::rename(&new, path).expect("rename");
}

#[test]
fn the_wal_gate_is_open_while_live_and_closed_above_shared_and_from_the_retirement_on() {
    let f = Fixture::with_a_frame();
    let gate = RecordingGate::default();
    f.state.attach_wal_gate(Box::new(gate.clone()));
    assert_eq!(gate.calls(), [true], "attached open");

    f.state.main_lock_level(true);
    f.state.main_lock_level(true); // same side of SHARED: nothing to do
    f.state.main_lock_level(false);
    assert_eq!(gate.calls(), [true, false, true]);

    assert_eq!(f.lose_wal(), Some(RetireReason::WalLost));
    assert_eq!(
        gate.calls(),
        [true, false, true, false],
        "closed at retirement"
    );
    f.state.main_lock_level(true);
    f.state.main_lock_level(false);
    assert_eq!(
        gate.calls(),
        [true, false, true, false, false, false],
        "a retired generation's gate never opens again"
    );

    f.state.detach_wal_gate();
    let again = RecordingGate::default();
    f.state.attach_wal_gate(Box::new(again.clone()));
    assert_eq!(
        again.calls(),
        [false],
        "attached to a retired state: closed"
    );
}

#[test]
fn a_gate_attached_while_the_main_lock_is_above_shared_starts_closed() {
    let f = Fixture::with_a_frame();
    f.state.main_lock_level(true);
    let gate = RecordingGate::default();
    f.state.attach_wal_gate(Box::new(gate.clone()));
    f.state.main_lock_level(false);
    assert_eq!(gate.calls(), [false, true]);
}

#[test]
fn without_a_pinned_wal_the_main_lock_level_leaves_the_gate_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("rollback.db");
    fs::write(&db, b"x").expect("write");
    let state = ConnectionState::new(db, None);
    let gate = RecordingGate::default();
    state.attach_wal_gate(Box::new(gate.clone()));
    state.main_lock_level(true);
    state.main_lock_level(false);
    assert_eq!(
        gate.calls(),
        [true],
        "rollback mode: every transaction moves the level"
    );
}

#[test]
fn under_the_write_lock_wal_writes_follow_the_frame_rule_until_its_release() {
    let f = Fixture::with_a_frame();
    let s = &f.state;
    assert!(!s.write_lock_held(), "fresh");
    assert_eq!(s.wal_write_gate(0), Gate::Check(Site::WalWrite), "fresh");

    s.write_lock(true);
    assert_eq!(f.tx(), LOCK_CHECKED | WAL_CHECKED);
    assert!(
        s.write_lock_held(),
        "its writes: the frame rule (state/frames.rs)"
    );

    s.write_lock(false); // released: the transaction ended
    assert_eq!(f.tx(), 0);
    assert!(!s.write_lock_held());
    assert_eq!(s.wal_write_gate(8192), Gate::Check(Site::WalWrite));
}

#[test]
fn without_the_write_lock_a_check_covers_forward_writes_until_a_rewrite_or_a_commit() {
    let f = Fixture::with_a_frame();
    let s = &f.state;
    assert_eq!(s.wal_write_gate(32), Gate::Check(Site::WalWrite));
    assert_eq!(s.check(Site::WalWrite), Ok(()));
    assert_eq!(f.tx() & WAL_CHECKED, WAL_CHECKED);
    assert_eq!(s.wal_write_gate(32 + 536), Gate::Go, "forwards");
    assert_eq!(s.wal_write_gate(32 + 2 * 536), Gate::Go);
    assert_eq!(
        s.wal_write_gate(32),
        Gate::Check(Site::WalWrite),
        "at or below the last write: a new transaction after a rollback"
    );
    assert_eq!(s.check(Site::WalWrite), Ok(()));
    assert_eq!(s.wal_write_gate(32 + 536), Gate::Go);
    s.end_of_transaction(); // the commit
    assert_eq!(s.wal_write_gate(32 + 2 * 536), Gate::Check(Site::WalWrite));
}

#[test]
fn the_main_write_gate_goes_for_a_checked_checkpoint_only() {
    let f = Fixture::with_a_frame();
    let s = &f.state;
    assert_eq!(s.main_write_gate(), Gate::Check(Site::MainWrite));
    s.checkpoint_lock(true);
    assert_eq!(s.main_write_gate(), Gate::Go);
    assert!(s.checks.main_written.load(Ordering::SeqCst));
    s.checkpoint_lock(false);
    assert_eq!(s.main_write_gate(), Gate::Check(Site::MainWrite));

    assert_eq!(s.check(Site::MainWrite), Ok(()));
    assert_eq!(s.main_write_gate(), Gate::Go);
    assert_eq!(
        s.wal_write_gate(0),
        Gate::Check(Site::WalWrite),
        "a checkpoint's check is not a transaction's"
    );
    s.end_of_main_write();
    assert_eq!(s.main_write_gate(), Gate::Check(Site::MainWrite));

    // The end of a transaction ends a checkpoint's flag too; the end of a checkpoint leaves a
    // transaction's alone.
    s.checkpoint_lock(true);
    s.write_lock(true);
    s.end_of_main_write();
    assert_eq!(f.tx(), LOCK_CHECKED | WAL_CHECKED);
    s.checkpoint_lock(true);
    s.end_of_transaction();
    assert_eq!(f.tx(), 0);
}

#[test]
fn after_the_retirement_every_gate_refuses_and_no_lock_vouches() {
    let f = Fixture::with_a_frame();
    let s = &f.state;
    s.write_lock(true);
    s.checkpoint_lock(true);
    assert_eq!(f.lose_wal(), Some(RetireReason::WalLost));
    assert!(s.is_retired());
    assert_eq!(
        f.tx() & LOCK_CHECKED,
        0,
        "the retirement clears LOCK_CHECKED"
    );
    assert_eq!(s.wal_write_gate(0), Gate::Refuse);
    assert_eq!(s.main_write_gate(), Gate::Refuse);

    s.write_lock(true); // a lock taken after the retirement
    assert_eq!(f.tx() & LOCK_CHECKED, 0, "never set on a retired state");
    assert_eq!(s.wal_write_gate(1 << 20), Gate::Refuse);
    assert_eq!(s.check_pins(), Some(RetireReason::WalLost), "sticky");
}

#[test]
fn a_retirement_stops_the_fast_path_vouching() {
    let f = Fixture::with_a_frame();
    let s = &f.state;
    assert_eq!(
        s.watches.verified_changes.load(Ordering::SeqCst),
        NEVER_VOUCHED
    );
    assert!(!s.vouched_fast(), "nothing checked yet");
    assert_eq!(s.check(Site::WalWrite), Ok(()));
    if s.watches
        .dir
        .as_ref()
        .is_some_and(|w| w.current().is_some())
    {
        assert_ne!(
            s.watches.verified_changes.load(Ordering::SeqCst),
            NEVER_VOUCHED,
            "a full check that passed records the change count"
        );
    }
    f.lose_wal();
    assert_eq!(
        s.watches.verified_changes.load(Ordering::SeqCst),
        NEVER_VOUCHED
    );
    assert!(!s.vouched_fast());
    assert!(!s.check_fast(Site::WalWrite));
}

#[test]
fn a_lost_wal_records_the_backfill_the_wal_index_shows() {
    let f = Fixture::with_a_frame();
    fs::write(f.path("-shm"), [0u8; 64]).expect("write shm");
    let torn = Backfill {
        frames: 10,
        backfilled: 4,
        attempted: 4,
    };
    f.state.pin_shm(|| None, Box::new(FixedIndex(Some(torn))));
    assert!(
        f.state.inner.lock().pins.shm_id.is_some(),
        "pinned by the -shm's pathname"
    );
    assert_eq!(f.lose_wal(), Some(RetireReason::WalLost));
    let inner = f.state.inner.lock();
    assert_eq!(inner.loss.backfill_at_loss, Some(torn));
    assert!(inner.loss.backfill_at_loss.is_some_and(|b| b.tears_main()));
}

#[test]
fn a_lost_shm_is_a_retirement_of_its_own_and_records_the_backfill() {
    let f = Fixture::with_a_frame();
    fs::write(f.path("-shm"), [0u8; 64]).expect("write shm");
    let whole = Backfill {
        frames: 3,
        backfilled: 3,
        attempted: 3,
    };
    f.state.pin_shm(|| None, Box::new(FixedIndex(Some(whole))));
    fs::remove_file(f.path("-shm")).expect("unlink shm");
    assert_eq!(f.state.check_pins(), Some(RetireReason::ShmLost));
    assert_eq!(f.state.inner.lock().loss.backfill_at_loss, Some(whole));
}

#[test]
fn a_replaced_main_file_records_no_backfill() {
    let f = Fixture::with_a_frame();
    let shown = Backfill {
        frames: 10,
        backfilled: 4,
        attempted: 4,
    };
    f.state.pin_shm(|| None, Box::new(FixedIndex(Some(shown))));
    replace(&f.db);
    assert_eq!(f.state.check_pins(), Some(RetireReason::MainReplaced));
    assert_eq!(f.state.inner.lock().loss.backfill_at_loss, None);
}

#[test]
fn an_unchanged_generation_passes_and_stamps_the_main_file() {
    let f = Fixture::with_a_frame();
    assert!(
        f.state.checks.main_written.load(Ordering::SeqCst),
        "unknown at the open"
    );
    assert_eq!(f.state.check_pins(), None);
    assert!(!f.state.is_retired());
    assert!(!f.state.checks.main_written.load(Ordering::SeqCst));
    assert!(f.state.inner.lock().pins.main_stamp.is_some());
}

#[test]
fn worth_capturing_needs_a_pinned_wal_with_a_frame_unless_the_main_file_was_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pinned = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        fs::write(&path, bytes).expect("write");
        Some(PinnedWal::open(&path).expect("pin"))
    };
    let inner = |wal, reason| Inner {
        pins: pins::Pins {
            wal,
            ..pins::Pins::default()
        },
        loss: loss::Loss {
            reason: Some(reason),
            ..loss::Loss::default()
        },
        ..Inner::default()
    };
    let framed = one_frame_wal();
    assert_eq!(framed.len() as u64, SMALLEST_WAL_WITH_A_FRAME);

    assert!(
        !inner(None, RetireReason::MainReplaced).worth_capturing(),
        "no WAL"
    );
    assert!(!inner(pinned("empty", b""), RetireReason::WalLost).worth_capturing());
    let short = &framed[..framed.len() - 1];
    assert!(!inner(pinned("short", short), RetireReason::ShmLost).worth_capturing());
    assert!(inner(pinned("framed", &framed), RetireReason::WalLost).worth_capturing());
    assert!(
        inner(pinned("empty2", b""), RetireReason::MainReplaced).worth_capturing(),
        "a replaced main file's image is the retired data"
    );
    let mut let_go = inner(pinned("framed2", &framed), RetireReason::WalLost);
    let_go.loss.let_go = Some(dir.path().to_path_buf());
    assert!(
        !let_go.worth_capturing(),
        "its directory was deleted on purpose"
    );
}

#[test]
fn a_capture_copies_the_pinned_wal_and_the_in_memory_image() {
    let f = Fixture::with_a_frame();
    let image: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    f.state
        .set_main_image(Some(Box::new(MemImage(image.clone()))));
    assert_eq!(
        f.state.ensure_captured(Trigger::Halt).ok(),
        Some(None),
        "live: nothing"
    );
    assert!(!f.state.must_hold_main());

    f.lose_wal();
    assert!(
        f.state.must_hold_main(),
        "retired, uncaptured: the image is needed"
    );
    let dir = f
        .state
        .ensure_captured(Trigger::Halt)
        .expect("capture")
        .expect("worth capturing");
    let manifest = Manifest::read(&dir).expect("manifest");
    assert_eq!(manifest.reason, Some(RetireReason::WalLost));
    assert_eq!(manifest.main.bytes, image.len() as u64);
    assert_eq!(
        fs::read(dir.join(&manifest.main.file)).expect("image"),
        image
    );
    assert_eq!(
        fs::read(dir.join(&manifest.wal.file)).expect("wal"),
        one_frame_wal()
    );
    assert_eq!((manifest.wal.frames, manifest.wal.commits), (1, 1));
    assert!(!f.state.must_hold_main(), "captured: nothing to hold");
    assert_eq!(
        f.state.ensure_captured(Trigger::Close).expect("again"),
        Some(dir),
        "one capture per generation"
    );
}

#[test]
fn a_live_wal_is_let_go_at_its_close_and_may_be_deleted_while_it_is_the_one_pinned() {
    let f = Fixture::with_a_frame();
    f.state.wal_closing();
    assert!(!f.state.holds_wal());
    assert!(!f.state.wal_pinned());
    assert!(
        may_delete(&f.path("-wal")),
        "still the inode this connection wrote"
    );
}

#[test]
fn a_wal_replaced_before_its_delete_is_not_deleted() {
    let f = Fixture::with_a_frame();
    f.state.wal_closing();
    replace(&f.path("-wal"));
    assert!(!may_delete(&f.path("-wal")), "another generation's WAL now");
    assert!(
        may_delete(&f.path("-wal")),
        "asked once: the next delete is not this close's"
    );
}

#[test]
fn a_retired_wal_is_held_past_its_close_until_captured() {
    let f = Fixture::with_a_frame();
    f.state
        .set_main_image(Some(Box::new(MemImage(b"image".to_vec()))));
    f.lose_wal();
    f.state.wal_closing();
    assert!(
        f.state.holds_wal(),
        "uncaptured: the descriptor is the only way to its frames"
    );
    assert!(f.state.must_hold_main());
    let dir = f.state.ensure_captured(Trigger::Close).expect("capture");
    assert!(dir.is_some());
    f.state.main_closed();
    assert!(!f.state.holds_wal());
    assert!(!f.state.wal_pinned());
}
