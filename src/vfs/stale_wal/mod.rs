//! The stale-WAL rule, the shim's side, in one room: the WAL-base record written when a guarded
//! writer's WAL starts a generation (this file: the hooks and the wal-index reads), and the
//! judgement of an existing WAL before SQLite opens it (`gate.rs`). `crate::wal_base` has the
//! record's format, the rules and the capture. The room sits below the connection's state: it
//! reaches the connection through [`Holder`], which `ConnectionState` implements.
//!
//! When: a generation's record is written before its first frame — at the release of the read
//! locks a reset takes (the new salts are in the wal-index then), or, for a generation begun on
//! an empty WAL, made at the write lock and written as SQLite writes the WAL header (the WAL's
//! write gate closed for that one write). Costs: whether a record is due (this connection's
//! first write, and after each checkpoint) is one atomic load per write transaction, as the WAL
//! write lock is taken; per new generation, the first 16 pages of the main file read (one
//! `pread`) and the record written (one `fsetxattr`). The judgement runs at the WAL's open, and
//! reads files only when a WAL with frames is there.

use std::ffi::c_int;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use parking_lot::Mutex;
use rusqlite::ffi;

mod gate;

pub(crate) use gate::{before_wal_open, MainLocks};

use super::boundary::ffi_guard;
use super::main_reads::{Header, MainReads, MappedHeader, Region0};
use crate::capture::ImageSource;
use crate::identity::{identity_of_fd, FileId, PinnedWal};
use crate::paths::path_display;
use crate::status::{StaleWalAction, StaleWalStatus};
use crate::wal_base::{
    encode_record, read_record, recorded_span, write_record, Mismatch, ENCODED_MAX, RECORDED_PAGES,
};

/// What the record's hooks and the gate need of the connection (its `ConnectionState`, which holds
/// the slot and hands itself to each hook): this room sits below the connection's state and names
/// none of its types.
pub(crate) trait Holder {
    fn db_path(&self) -> &Path;
    fn main_id(&self) -> Option<FileId>;
    fn is_retired(&self) -> bool;
    /// Closes (`true`) the WAL's write gate until the record's header is written, or opens it.
    fn hold_wal_gate_for_header(&self, hold: bool);
    /// Retires the connection: the main file is no longer what its kept pages were read from.
    fn overwritten_under_cache(&self, detail: &str);
    /// `f` on the pinned WAL, `None` when none is pinned.
    fn with_pinned_wal<R>(&self, f: impl FnOnce(&PinnedWal) -> R) -> Option<R>;
    /// The connection's slot.
    fn slot(&self) -> &StaleWalSlot;
    /// Notes what `<db>-wal` named just before SQLite opened it.
    fn wal_seen_before_open(&self, id: Option<FileId>);
}

/// The least size of a record's buffer: above glibc's default mmap threshold (128 KiB).
const OFF_HEAP: usize = 256 * 1024;

/// The bytes a record hashes, read into the same buffer each time: one per process (a buffer per
/// connection would cost up to 256 KiB of resident memory each, records are rare, and a record
/// is written under no other lock of the guard's).
static RECORD_BUF: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Write transactions a due record waits for the restart that follows a checkpoint.
const DUE_TRIES: u8 = 4;

/// One connection's part of the stale-WAL rule, that a WAL is replayed only onto the main file it
/// was written on: the WAL-base records it writes, and what its open did with a stale WAL (held by
/// its `ConnectionState`).
#[derive(Default)]
pub(crate) struct StaleWalSlot {
    /// Region 0 of the connection's wal-index mapping while it is mapped (its header's reads).
    region0: Region0,
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
    /// A record made at the write lock of a transaction that starts a generation on an empty WAL
    /// (its salts are drawn when SQLite writes the WAL header): written, salts filled in, at that
    /// header write, which the WAL's closed write gate shows. With the wal-index's salts and change
    /// counter when it was made: a header written after either changed (a reset, a commit of
    /// another connection) is not the one it was made for.
    pending: Mutex<Option<Pending>>,
    /// The first pages this connection read from the main file under a settled wal-index
    /// header (a copy in place under a cache read from the old file, `main_reads.rs`): judged at
    /// its write locks.
    main_reads: MainReads,
    /// The settled header a WAL reset replaces, taken as it asks for its locks, while pages
    /// are kept: they are judged once more at the reset.
    reset_from: Mutex<Option<Header>>,
}

/// A record waiting for its WAL header.
struct Pending {
    encoded: [u8; ENCODED_MAX],
    len: usize,
    /// The wal-index's salts word and `iChange` when it was made.
    word: u64,
    change: u32,
}

/// Where the salts are in an encoded record (after `hgwb\x01`), as [`encode_record`] puts them.
const ENCODED_SALTS: std::ops::Range<usize> = 5..13;

impl StaleWalSlot {
    /// Region 0 was just mapped at `addr`.
    pub(crate) fn mapped(&self, addr: *const u8) {
        self.region0.mapped(addr);
    }

    /// Whether region 0 is mapped (the wal-index is in shared memory, not SQLite's heap).
    pub(crate) fn is_mapped(&self) -> bool {
        self.region0.is_mapped()
    }

    /// Region 0 is about to be unmapped.
    pub(crate) fn unmapping(&self) {
        self.region0.unmapping();
        self.main_reads.clear();
    }

    /// The mapped wal-index header when it is settled (`main_reads.rs`); `None` while nothing
    /// is mapped.
    #[inline]
    pub(crate) fn settled_header(&self) -> Option<Header> {
        self.region0.header()?.settled()
    }

    /// The main file's `amt` bytes at `ofst` were read into `buf` under the settled header
    /// `before`: kept (and judged at the next write lock) when the header is still that one.
    #[cold]
    pub(crate) fn main_read(&self, before: &Header, buf: &[u8], amt: c_int, ofst: i64) {
        if self.settled_header().as_ref() == Some(before)
            && self.main_reads.read(before, buf, amt, ofst)
        {
            self.not_due.store(false, Ordering::Relaxed);
        }
    }

    /// A WAL reset asks for its locks: the header it replaces, while pages are kept.
    #[cold]
    pub(crate) fn before_reset(&self) {
        if self.main_reads.any() {
            *self.reset_from.lock() = self.settled_header();
        }
    }

    /// The kept pages judged against `main` under `header`: the connection is retired
    /// (`main-overwritten`) when the file is no longer what they were read from. Whether it was.
    fn judge_main_reads(
        &self,
        state: &impl Holder,
        header: Option<&Header>,
        main: &dyn ImageSource,
    ) -> bool {
        match self.main_reads.judge(header, main) {
            Some(detail) => {
                state.overwritten_under_cache(&detail);
                true
            }
            None => false,
        }
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
    pub(crate) fn at_write_lock(&self, rc: c_int, state: &impl Holder, main: &dyn ImageSource) {
        if rc != ffi::SQLITE_OK {
            return;
        }
        ffi_guard((), || {
            // Pages this connection read from the main file under the header it now writes on,
            // still what the file holds (a copy in place since would be written over from its
            // cache)? Judged at each write lock until that header changes (its first commit):
            // due again while they are kept.
            let kept = self.main_reads.any();
            if kept && self.judge_main_reads(state, self.settled_header().as_ref(), main) {
                return;
            }
            self.at_write_lock_record(state, main);
            if kept && self.main_reads.any() {
                self.not_due.store(false, Ordering::Relaxed);
            }
        });
    }

    /// [`Self::at_write_lock`]'s record.
    fn at_write_lock_record(&self, state: &impl Holder, main: &dyn ImageSource) {
        let Some(p) = self.region0.header() else {
            return;
        };
        let word = p.salts_word();
        if p.max_frame() == 0 {
            if p.page_size().is_none() {
                // Recovery's write lock, before the wal-index is built: still due.
                return;
            }
            // An empty WAL: this transaction's first frame starts a generation whose salts SQLite
            // draws as it writes the WAL header (were it recorded at the next lock, a restore
            // before that write and a refusal of that lock would leave it unrecorded). The record
            // is made now, on the file as it is (nothing changes it before that generation's
            // checkpoint), and written at the header write, which makes it no longer due. A
            // transaction that writes no frame leaves it due, a few times.
            if self.tries.fetch_add(1, Ordering::Relaxed) >= DUE_TRIES {
                self.not_due.store(true, Ordering::Relaxed);
                self.tries.store(0, Ordering::Relaxed);
                self.drop_pending(state);
                return;
            }
            self.prepare_for_header(state, p, main);
            return;
        }
        // A record made for a header that was never written (the WAL has frames now).
        self.drop_pending(state);
        if word != self.recorded.load(Ordering::Relaxed) {
            self.not_due.store(true, Ordering::Relaxed);
            self.tries.store(0, Ordering::Relaxed);
            self.record(state, p, word, main, true);
        } else if self.tries.fetch_add(1, Ordering::Relaxed) >= DUE_TRIES {
            self.not_due.store(true, Ordering::Relaxed);
            self.tries.store(0, Ordering::Relaxed);
        }
    }

    /// The read locks 1–4 a WAL reset takes (`walRestartLog`, or a TRUNCATE checkpoint's
    /// `walRestartHdr`) were released: when the salts in the wal-index changed under them, a new
    /// generation starts on the fully checkpointed main file, and its record is written now, before
    /// the generation's first frame (at the next write lock would be too late when a restore came
    /// in between and that lock was refused). The work of one record per reset, as before, done
    /// earlier; a released lock of a RESTART checkpoint's wait (no new salts) costs one load and a
    /// compare.
    #[inline(never)]
    #[cold]
    pub(crate) fn at_wal_reset(&self, state: &impl Holder, main: &dyn ImageSource) {
        let Some(p) = self.region0.header() else {
            return;
        };
        // Pages kept under the header this reset replaced: the file may have been copied over
        // since this transaction's write lock judged them.
        let replaced = self.reset_from.lock().take();
        if replaced.is_some() && self.judge_main_reads(state, replaced.as_ref(), main) {
            return;
        }
        let word = p.salts_word();
        if word != self.recorded.load(Ordering::Relaxed) {
            self.not_due.store(true, Ordering::Relaxed);
            self.tries.store(0, Ordering::Relaxed);
            self.record(state, p, word, main, false);
        }
    }

    /// The main file was synced: the end of a checkpoint, after which the WAL restarts (a
    /// RESTART or TRUNCATE checkpoint restarts it itself, a complete one at the next write):
    /// a record is due.
    #[inline]
    pub(crate) fn checkpoint_synced(&self) {
        self.not_due.store(false, Ordering::Relaxed);
    }

    /// The record of the generation about to start on an empty WAL, salts to come: kept, and
    /// the WAL's write gate closed until its header is written ([`Self::at_wal_header`]).
    #[cold]
    fn prepare_for_header(&self, state: &impl Holder, p: MappedHeader<'_>, main: &dyn ImageSource) {
        if state.is_retired() {
            return;
        }
        // A wal-index built from an empty WAL has no page size yet: the main file's header has.
        let Some(page_size) = p
            .page_size()
            .filter(|&n| n > 0)
            .or_else(|| main_page_size(main))
        else {
            return;
        };
        if let Some((encoded, len)) = self.encode(state, [0, 0], page_size, main) {
            *self.pending.lock() = Some(Pending {
                encoded,
                len,
                word: p.salts_word(),
                change: p.change(),
            });
            state.hold_wal_gate_for_header(true);
        }
    }

    /// Forgets a record made for a header that never came, and opens the gate it closed.
    fn drop_pending(&self, state: &impl Holder) {
        if self.pending.lock().take().is_some() {
            state.hold_wal_gate_for_header(false);
        }
    }

    /// A WAL write at offset 0 through the closed gate: when a record waits for this header
    /// (`buf`, `amt` bytes), its salts are filled in and it is written on the WAL, and the gate
    /// opens again. Called only while the gate is closed (a retired generation, exclusive
    /// locking mode, or this wait): nothing on the open gate's path.
    #[inline(never)]
    #[cold]
    pub(crate) fn at_wal_header(&self, state: &impl Holder, header: &[u8]) {
        let Some(Pending {
            mut encoded,
            len,
            word: made_at,
            change,
        }) = self.pending.lock().take()
        else {
            return;
        };
        state.hold_wal_gate_for_header(false);
        let p = self.region0.header();
        if p.map(|p| (p.salts_word(), p.change())) != Some((made_at, change)) {
            return; // made in another state of the WAL: a reset's own record stands
        }
        let h = crate::walfile::parse_wal_header(header);
        if !h.valid {
            return;
        }
        let raw = &header[16..24];
        let word = u64::from(u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]))
            | (u64::from(u32::from_ne_bytes([raw[4], raw[5], raw[6], raw[7]])) << 32);
        self.recorded.store(word, Ordering::Relaxed);
        self.not_due.store(true, Ordering::Relaxed);
        self.tries.store(0, Ordering::Relaxed);
        let mut salts = [0u8; 8];
        salts[..4].copy_from_slice(&h.salts[0].to_le_bytes());
        salts[4..].copy_from_slice(&h.salts[1].to_le_bytes());
        encoded[ENCODED_SALTS].copy_from_slice(&salts);
        self.write(state, h.salts, &encoded[..len]);
    }

    /// Records generation `word` (the wal-index's salts) on the main file as it is now; with
    /// `joined` (this connection's first write lock in a generation it did not see start), not over
    /// a record of the same generation already on the WAL: that one was made when the generation
    /// started, on the file it started on, and a connection that joined it later (an opener of a
    /// restored file, above all) must not replace it with its own file's pages, which a copy in
    /// place would then match. One `fgetxattr` more per such record.
    #[cold]
    fn record(
        &self,
        state: &impl Holder,
        p: MappedHeader<'_>,
        word: u64,
        main: &dyn ImageSource,
        joined: bool,
    ) {
        self.recorded.store(word, Ordering::Relaxed);
        if state.is_retired() {
            return;
        }
        let Some(page_size) = p.page_size() else {
            return;
        };
        let salts = [
            u32::from_be_bytes((word as u32).to_ne_bytes()),
            u32::from_be_bytes(((word >> 32) as u32).to_ne_bytes()),
        ];
        if joined
            && state
                .with_pinned_wal(|wal| read_record(wal.file().as_fd()))
                .flatten()
                .is_some_and(|r| r.salts == salts)
        {
            return;
        }
        if let Some((encoded, len)) = self.encode(state, salts, page_size, main) {
            self.write(state, salts, &encoded[..len]);
        }
    }

    /// The record of generation `salts` on the main file as it is now (`None`: unreadable).
    fn encode(
        &self,
        state: &impl Holder,
        salts: [u32; 2],
        page_size: u32,
        main: &dyn ImageSource,
    ) -> Option<([u8; ENCODED_MAX], usize)> {
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
            let size = main.size().ok()?;
            pages = (size / u64::from(page_size)).min(u64::from(RECORDED_PAGES)) as u32;
            let span = recorded_span(pages, page_size);
            main.read_at(&mut buf[..span], 0).ok()?;
        }
        Some(encode_record(
            salts,
            page_size,
            state.main_id(),
            &buf,
            pages,
        ))
    }

    /// Writes an encoded record of generation `salts` on the pinned WAL.
    fn write(&self, state: &impl Holder, salts: [u32; 2], encoded: &[u8]) {
        match state.with_pinned_wal(|wal| write_record(wal.file().as_fd(), encoded)) {
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

/// The page size the main file's header gives (offset 16, big-endian; 1 means 65536), when it
/// is a power of two from 512 to 65536.
fn main_page_size(main: &dyn ImageSource) -> Option<u32> {
    let mut b = [0u8; 18];
    main.read_at(&mut b[16..], 16).ok()?;
    crate::walfile::main_header_page_size(&b)
}
