//! Issue 19, the shim's side: the WAL-base record written when a guarded writer's WAL starts a
//! generation, and the judgement of an existing WAL before SQLite opens it (`crate::stale_wal`
//! has the record, the rules and the capture; this file the hooks, the wal-index reads and the
//! `-shm` probe).
//!
//! Costs: a record is due at this connection's first write and after each checkpoint (the main
//! file's sync that ends it; the WAL restarts then or at the next write): one atomic load per
//! write transaction, as the WAL write lock is taken, says whether one is due. When it is, the salts in the mapped wal-index header
//! tell whether the generation changed; if so the first 16 pages of the main file are read (one
//! `pread`) and the record written (one `fsetxattr`). The judgement runs at the WAL's open, and
//! reads files only when a WAL with frames is there.

use std::ffi::c_int;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use parking_lot::Mutex;
use rusqlite::ffi;

use super::ffi_guard;
use super::state::DbState;
use crate::capture::{sidecar, ImageSource};
use crate::identity::{identity_of_fd, identity_of_path};
use crate::paths::path_display;
use crate::stale_wal::{
    encode_record, fragment_len, hex16, judge_generation, judge_pages, look_at_wal, mapped_here,
    page_hash, read_record, recorded_span, set_aside, stale_wal_policy, write_record, Mismatch,
    StaleWalPolicy, Verdict, RECORDED_PAGES,
};
use crate::status::{StaleWalAction, StaleWalStatus};

/// The least size of a record's buffer: above glibc's default mmap threshold (128 KiB).
const OFF_HEAP: usize = 256 * 1024;

/// Write transactions a due record waits for the restart that follows a checkpoint.
const DUE_TRIES: u8 = 4;

/// `UNIX_SHM_DMS` of the unix VFS: the `-shm` byte every connection that maps it holds a read
/// lock on (`(22 + SQLITE_SHM_NLOCK) * 4 + SQLITE_SHM_NLOCK`).
const UNIX_SHM_DMS: i64 = 128;

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
    /// The bytes a record hashes, read into the same buffer each time.
    buf: Mutex<Vec<u8>>,
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
        let mut buf = self.buf.lock();
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

    fn set_report(&self, action: StaleWalAction, capture: Option<&Path>, m: &Mismatch, wal: File) {
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

/// Before SQLite opens `wal_path` for the database of `state` (whose main file `main` reads):
/// whether an existing WAL continues the main file now at the path. `SQLITE_OK` lets the open
/// go on (after a stale WAL was set aside, SQLite creates a fresh one); otherwise the open fails
/// with the code returned (the strict mode, or a stale WAL that could not be set aside).
pub(super) fn before_wal_open(state: &DbState, main: &dyn ImageSource, wal_path: &Path) -> c_int {
    let db = state.db_path();
    let wal = match File::open(wal_path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ffi::SQLITE_OK,
        Err(e) => {
            log::info!(
                "hermes-guard: cannot read {} before SQLite opens it ({e}); no judgement of \
                 whether it belongs to {}",
                wal_path.display(),
                db.display()
            );
            return ffi::SQLITE_OK;
        }
    };
    match judge(db, main, &wal) {
        Verdict::Stale(_) => {}
        verdict => {
            say(db, &verdict);
            return ffi::SQLITE_OK;
        }
    }
    // A WAL in use is not this open's to judge: mapped by this process, or its -shm's DMS byte
    // locked by another. The lock taken here keeps other openers out until the WAL is moved.
    let shm_path = sidecar(db, "-shm");
    let _dms = match identity_of_path(&shm_path) {
        Ok(Some(id)) if mapped_here(id) => {
            log::info!(
                "hermes-guard: {} looks stale but this process uses it; no judgement",
                wal_path.display()
            );
            return ffi::SQLITE_OK;
        }
        Ok(Some(_)) => match DmsLock::take(&shm_path) {
            Ok(Some(lock)) => Some(lock),
            Ok(None) => {
                log::info!(
                    "hermes-guard: {} looks stale but another process has it open; no judgement",
                    wal_path.display()
                );
                return ffi::SQLITE_OK;
            }
            Err(e) => {
                log::info!(
                    "hermes-guard: {} looks stale but {} cannot be locked ({e}); no judgement",
                    wal_path.display(),
                    shm_path.display()
                );
                return ffi::SQLITE_OK;
            }
        },
        _ => None,
    };
    // Again, now that nobody else can start on it.
    let m = match judge(db, main, &wal) {
        Verdict::Stale(again) => again,
        verdict => {
            say(db, &verdict);
            return ffi::SQLITE_OK;
        }
    };
    let slot = state.stale_wal();
    match stale_wal_policy() {
        StaleWalPolicy::Refuse => {
            log::error!(
                "hermes-guard: refusing to open {}: {} was not written on it ({}). Nothing was \
                 moved (strict mode, {}=refuse). If the database file was restored on purpose, \
                 move {} and {}-shm away (keep them: with the database file they were written \
                 on, `hermes-guard recover` brings their rows back) and open again",
                db.display(),
                wal_path.display(),
                m.detail,
                crate::stale_wal::POLICY_ENV,
                wal_path.display(),
                db.display()
            );
            slot.set_report(StaleWalAction::Refused, None, &m, wal);
            ffi::SQLITE_CANTOPEN_DIRTYWAL
        }
        StaleWalPolicy::SetAside => {
            let mut header = [0u8; 100];
            let _ = main.read_at(&mut header, 0);
            match set_aside(db, &wal, identity_of_path(db).ok().flatten(), &header, &m) {
                Ok(dir) => {
                    log::error!(
                        "hermes-guard: {} was not written on the database file now at {} ({}): \
                         it was NOT replayed (that would undo the restore and corrupt the file). \
                         It and the -shm are set aside, byte for byte, in {}; the database opens \
                         as it is. Its frames only make sense on the main file they were written \
                         on: if that file still exists (the copy taken before the restore), \
                         `hermes-guard recover {} --main <that file>` brings the dead \
                         generation's rows back",
                        wal_path.display(),
                        db.display(),
                        m.detail,
                        dir.display(),
                        dir.display()
                    );
                    slot.set_report(StaleWalAction::SetAside, Some(&dir), &m, wal);
                    ffi::SQLITE_OK
                }
                Err(e) => {
                    log::error!(
                        "hermes-guard: {} was not written on {} ({}) and cannot be set aside \
                         ({e}); refusing the open so that it is not replayed",
                        wal_path.display(),
                        db.display(),
                        m.detail
                    );
                    slot.set_report(StaleWalAction::Refused, None, &m, wal);
                    ffi::SQLITE_CANTOPEN_DIRTYWAL
                }
            }
        }
    }
}

/// The judgement of the WAL `wal` against the main file `main` now.
fn judge(db: &Path, main: &dyn ImageSource, wal: &File) -> Verdict {
    let first = match look_at_wal(wal, None) {
        Ok(look) => look,
        Err(e) => {
            log::info!(
                "hermes-guard: cannot read the WAL of {} ({e})",
                db.display()
            );
            return Verdict::NothingToReplay;
        }
    };
    let record = match judge_generation(&first, read_record(wal.as_fd())) {
        Ok(record) => record,
        Err(verdict) => return verdict,
    };
    let main_now = identity_of_path(db).ok().flatten();
    let now = |p: u32| read_page(main, p, record.page_size);
    if record
        .pages
        .iter()
        .all(|r| now(r.page).as_ref() == Some(&r.hash))
    {
        return Verdict::Continues { by_pages: false };
    }
    let pages: Vec<u32> = record.pages.iter().map(|p| p.page).collect();
    match look_at_wal(wal, Some(&pages)) {
        Ok(full) => judge_pages(&record, main_now, now, &full),
        Err(e) => {
            log::info!(
                "hermes-guard: cannot read the WAL of {} ({e})",
                db.display()
            );
            Verdict::NothingToReplay
        }
    }
}

/// The recorded hash of page `page` (1-based) of the main file, `None` beyond its end or
/// unreadable.
fn read_page(main: &dyn ImageSource, page: u32, page_size: u32) -> Option<String> {
    let offset = u64::from(page - 1) * u64::from(page_size);
    if offset + u64::from(page_size) > main.size().ok()? {
        return None;
    }
    let mut buf = vec![0u8; fragment_len(page, page_size)];
    main.read_at(&mut buf, offset).ok()?;
    Some(hex16(page_hash(&buf)))
}

/// The verdicts that let SQLite go on, said at the level they deserve.
fn say(db: &Path, verdict: &Verdict) {
    match verdict {
        Verdict::NoRecord => log::info!(
            "hermes-guard: {}-wal holds frames but no record of the database file it was written \
             on (written by unguarded processes only, or a filesystem without extended \
             attributes): SQLite replays it as always, without a judgement",
            db.display()
        ),
        Verdict::OtherGeneration { recorded, found } => log::info!(
            "hermes-guard: {}-wal is generation {:08x} {:08x}, not the recorded {:08x} {:08x} \
             (an unguarded process restarted it): SQLite replays it as always, without a \
             judgement",
            db.display(),
            found[0],
            found[1],
            recorded[0],
            recorded[1]
        ),
        Verdict::Continues { by_pages: true } => log::debug!(
            "hermes-guard: {}-wal continues the database (changed since the WAL's generation \
             began only by checkpoints of it)",
            db.display()
        ),
        _ => {}
    }
}

/// An open-file-description write lock on the `-shm`'s DMS byte, on a descriptor of our own:
/// what SQLite's first opener takes, so no other process starts on the WAL meanwhile. An OFD
/// lock conflicts with every POSIX lock, this process's included; the descriptor's close drops
/// only this description's lock — and POSIX locks of this process on the `-shm`, of which there
/// are none (it is not mapped here, checked first).
struct DmsLock(#[allow(dead_code)] OwnedFd);

impl DmsLock {
    /// `Ok(None)`: somebody holds a lock on the byte (the WAL is in use).
    fn take(shm: &Path) -> io::Result<Option<DmsLock>> {
        let fd = rustix::fs::open(
            shm,
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )?;
        // SAFETY: `flock` is plain old data; every field the call reads is set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = UNIX_SHM_DMS as _;
        fl.l_len = 1;
        // SAFETY: F_OFD_SETLK takes a pointer to a `struct flock`, which `fl` is and which
        // outlives the call; `fd` is open.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        if rc == 0 {
            return Ok(Some(DmsLock(fd)));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(None),
            _ => Err(e),
        }
    }
}
