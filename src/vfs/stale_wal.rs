//! Issue 19, the shim's side: the WAL-base record written when a guarded writer's WAL starts a
//! generation (`crate::stale_wal` has the record, the rules and the capture; this file the hooks
//! and the wal-index reads; `stale_wal_gate.rs` the judgement of an existing WAL before SQLite
//! opens it).
//!
//! Costs: a record is due at this connection's first write and after each checkpoint (the main
//! file's sync that ends it; the WAL restarts then or at the next write): one atomic load per
//! write transaction, as the WAL write lock is taken, says whether one is due. When it is, the salts in the mapped wal-index header
//! tell whether the generation changed; if so the first 16 pages of the main file are read (one
//! `pread`) and the record written (one `fsetxattr`). The judgement runs at the WAL's open, and
//! reads files only when a WAL with frames is there.

use std::ffi::c_int;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use parking_lot::Mutex;
use rusqlite::ffi;

use super::ffi_guard;
use super::state::DbState;
use crate::capture::ImageSource;
use crate::identity::identity_of_fd;
use crate::paths::path_display;
use crate::stale_wal::{encode_record, recorded_span, write_record, Mismatch, RECORDED_PAGES};
use crate::status::{StaleWalAction, StaleWalStatus};

/// The least size of a record's buffer: above glibc's default mmap threshold (128 KiB).
const OFF_HEAP: usize = 256 * 1024;

/// The bytes a record hashes, read into the same buffer each time: one per process (issue 29: a
/// buffer per connection cost up to 256 KiB of resident memory each, records are rare, and a
/// record is written under no other lock of the guard's).
static RECORD_BUF: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Write transactions a due record waits for the restart that follows a checkpoint.
const DUE_TRIES: u8 = 4;

/// One connection's part of issue 19 (held by its `DbState`).
#[derive(Default)]
pub(crate) struct StaleWalSlot {
    /// Region 0 of the connection's wal-index mapping while it is mapped, else NULL.
    region0: AtomicPtr<u8>,
    /// The salts (as the wal-index stores them, both words) of the generation this connection
    /// last recorded (or found unrecordable); 0: none yet.
    recorded: AtomicU64,
    /// No record is due when the write lock is next taken (`false`, the default, makes the
    /// first write's record due).
    not_due: AtomicBool,
    /// Write transactions that found a due record's generation unchanged.
    tries: AtomicU8,
    /// What the open did with a stale WAL.
    report: Mutex<Option<StaleWalStatus>>,
}

impl StaleWalSlot {
    /// Region 0 was just mapped at `addr`.
    pub(crate) fn mapped(&self, addr: *const u8) {
        self.region0.store(addr as *mut u8, Ordering::Release);
    }

    /// Region 0 is about to be unmapped.
    pub(crate) fn unmapping(&self) {
        self.region0.store(std::ptr::null_mut(), Ordering::Release);
    }

    pub(crate) fn report(&self) -> Option<StaleWalStatus> {
        self.report.lock().clone()
    }

    /// Whether a record is due as the WAL write lock is taken (one load).
    #[inline(always)]
    pub(crate) fn record_due(&self) -> bool {
        !self.not_due.load(Ordering::Relaxed)
    }

    /// The WAL write lock was just asked for (`rc`: taken when `SQLITE_OK`) and
    /// [`Self::record_due`]: the record, if the generation
    /// (the salts in the mapped wal-index header) is not the one this connection recorded
    /// last. A restart happens inside a write transaction, after its lock: so while the salts
    /// are unchanged the record stays due, for a few transactions (a reader can hold the
    /// restart back indefinitely; the generation then goes on and its record stands).
    #[inline(never)]
    #[cold]
    pub(crate) fn at_write_lock(&self, rc: c_int, state: &DbState, main: &dyn ImageSource) {
        if rc != ffi::SQLITE_OK {
            return;
        }
        ffi_guard((), || {
            let p = self.region0.load(Ordering::Acquire);
            if p.is_null() {
                return;
            }
            // SAFETY: region 0 stays mapped while `region0` is not NULL: it is cleared before
            // the connection's xShmUnmap, which SQLite never runs concurrently with this
            // connection's xShmLock; the header is 4-byte aligned at the start of a page.
            let word = unsafe { salts_word(p) };
            if word != self.recorded.load(Ordering::Relaxed) {
                self.not_due.store(true, Ordering::Relaxed);
                self.tries.store(0, Ordering::Relaxed);
                self.record(state, p, word, main);
            } else if self.tries.fetch_add(1, Ordering::Relaxed) >= DUE_TRIES {
                self.not_due.store(true, Ordering::Relaxed);
                self.tries.store(0, Ordering::Relaxed);
            }
        });
    }

    /// The main file was synced: the end of a checkpoint, after which the WAL restarts (a
    /// RESTART or TRUNCATE checkpoint restarts it itself, a complete one at the next write):
    /// a record is due.
    #[inline]
    pub(crate) fn checkpoint_synced(&self) {
        self.not_due.store(false, Ordering::Relaxed);
    }

    #[cold]
    fn record(&self, state: &DbState, p: *const u8, word: u64, main: &dyn ImageSource) {
        self.recorded.store(word, Ordering::Relaxed);
        if state.is_retired() {
            return;
        }
        // SAFETY: as in `at_write_lock`: offset 12 of the mapped header, aligned.
        let w3 = unsafe { load_u32(p, 12) }.to_ne_bytes();
        let (is_init, sz) = (w3[0], u16::from_ne_bytes([w3[2], w3[3]]));
        if is_init == 0 {
            return;
        }
        let page_size = if sz == 1 { 65536 } else { u32::from(sz) };
        let salts = [
            u32::from_be_bytes((word as u32).to_ne_bytes()),
            u32::from_be_bytes(((word >> 32) as u32).to_ne_bytes()),
        ];
        // The recorded fragments of the first pages in one read, into the connection's buffer
        // (zeroed once); a shorter file (a short read) is measured and read again.
        let mut buf = RECORD_BUF.lock();
        let span = recorded_span(RECORDED_PAGES, page_size);
        if buf.len() < span {
            // Kept off the heap's top: the C allocator serves this size from its own mapping,
            // so a record never moves the program break (bench --cost judges brk too).
            *buf = vec![0u8; span.max(OFF_HEAP)];
        }
        let mut pages = RECORDED_PAGES;
        if main.read_at(&mut buf[..span], 0).is_err() {
            let Ok(size) = main.size() else {
                return;
            };
            pages = (size / u64::from(page_size)).min(u64::from(RECORDED_PAGES)) as u32;
            let span = recorded_span(pages, page_size);
            if main.read_at(&mut buf[..span], 0).is_err() {
                return;
            }
        }
        let (encoded, len) = encode_record(salts, page_size, state.main_id(), &buf, pages);
        match state.with_pinned_wal(|wal| write_record(wal.file().as_fd(), &encoded[..len])) {
            Some(Err(e)) => log::debug!(
                "hermes-guard: cannot record the main file {}-wal was started on ({e}): a WAL \
                 left beside another database file after a crash will not be recognised",
                state.db_path().display()
            ),
            _ => log::trace!(
                "hermes-guard: recorded WAL generation {:08x} {:08x} of {}",
                salts[0],
                salts[1],
                state.db_path().display()
            ),
        }
    }

    pub(super) fn set_report(
        &self,
        action: StaleWalAction,
        capture: Option<&Path>,
        m: &Mismatch,
        wal: File,
    ) {
        let Ok(wal) = identity_of_fd(&wal) else {
            return;
        };
        *self.report.lock() = Some(StaleWalStatus {
            action,
            capture: capture.map(path_display),
            capture_hex: capture.and_then(crate::paths::path_hex),
            wal,
            detail: m.detail.clone(),
        });
    }
}

/// # Safety
/// `p` is region 0 of a live wal-index mapping.
unsafe fn load_u32(p: *const u8, offset: usize) -> u32 {
    // SAFETY: as the caller promises; `offset` is a multiple of 4 inside the first page, which
    // other processes write concurrently (hence the atomic load).
    unsafe { (*(p.add(offset) as *const AtomicU32)).load(Ordering::Acquire) }
}

/// `aSalt` of the first wal-index header copy (offsets 32 and 36), both words.
///
/// # Safety
/// As [`load_u32`].
unsafe fn salts_word(p: *const u8) -> u64 {
    // SAFETY: as the caller promises.
    let (a, b) = unsafe { (load_u32(p, 32), load_u32(p, 36)) };
    u64::from(a) | (u64::from(b) << 32)
}
