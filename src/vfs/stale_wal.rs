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
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use parking_lot::Mutex;
use rusqlite::ffi;

use super::ffi_guard;
use super::state::DbState;
use crate::capture::{sidecar, ImageSource};
use crate::identity::{identity_of_fd, identity_of_path, FileId};
use crate::paths::path_display;
use crate::stale_wal::{
    encode_record, file_id_of, fragment_len, hex16, judge_generation, judge_pages, look_at_wal,
    mapped_here, page_hash, read_record, recorded_span, set_aside, stale_wal_policy, write_record,
    Mismatch, StaleWalPolicy, Verdict, RECORDED_PAGES,
};
use crate::status::{StaleWalAction, StaleWalStatus};

/// The least size of a record's buffer: above glibc's default mmap threshold (128 KiB).
const OFF_HEAP: usize = 256 * 1024;

/// The bytes a record hashes, read into the same buffer each time: one per process (issue 29: a
/// buffer per connection cost up to 256 KiB of resident memory each, records are rare, and a
/// record is written under no other lock of the guard's).
static RECORD_BUF: Mutex<Vec<u8>> = Mutex::new(Vec::new());

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

/// The connection's main file through its own methods (the guard's table, as SQLite calls it):
/// SQLite's locks, seen by every process and by the unix VFS's bookkeeping in this one.
pub(super) trait MainLocks {
    /// `xLock(level)`: an SQLite result code.
    fn lock(&self, level: c_int) -> c_int;
    /// `xUnlock(level)`: an SQLite result code.
    fn unlock(&self, level: c_int) -> c_int;
}

/// Before SQLite opens `wal_path` for the database of `state` (whose main file `main` reads and
/// `locks` locks; SQLite holds SHARED on it): whether an existing WAL continues the main file
/// now at the path. `SQLITE_OK` lets the open go on (after a stale WAL was set aside, SQLite
/// creates a fresh one); `SQLITE_BUSY` makes SQLite give up its SHARED lock and retry through
/// the busy handler (another opener is between its SHARED lock and its use of the WAL);
/// otherwise the open fails with the code returned (the strict mode, or a stale WAL that could
/// not be set aside).
///
/// A stale WAL is judged and moved only under EXCLUSIVE on the main file: in WAL mode every open
/// connection keeps SHARED from its first read, and an opener takes SHARED before it looks for a
/// `-wal`, so while the guard holds EXCLUSIVE no process or thread has the WAL open and none can
/// open it; every opener sees the stale WAL before, or none after.
pub(super) fn before_wal_open(
    state: &DbState,
    main: &dyn ImageSource,
    locks: &dyn MainLocks,
    wal_path: &Path,
) -> c_int {
    let db = state.db_path();
    let Some(wal) = open_wal(db, wal_path) else {
        return ffi::SQLITE_OK;
    };
    // Another thread of this process is setting this database's WAL aside: step back at once
    // (`SQLITE_BUSY`, giving up SHARED), so that its EXCLUSIVE is not kept waiting on ours.
    if Turn::taken(state.main_id()) {
        return ffi::SQLITE_BUSY;
    }
    // The quick look (the header, the record, the first pages) outside the lock; a WAL it leaves
    // in doubt is read in full under the lock.
    match judge(db, main, &wal, true) {
        None | Some(Verdict::Stale(_)) => {}
        Some(verdict) => {
            say(db, &verdict);
            return ffi::SQLITE_OK;
        }
    }
    drop(wal);
    let shm_path = sidecar(db, "-shm");
    if in_use(&shm_path) {
        return ffi::SQLITE_OK;
    }
    // One set-aside of a database at a time in this process: the other threads step back
    // (`SQLITE_BUSY`, giving up their SHARED lock) instead of keeping the lock from the first.
    let Some(_turn) = Turn::take(state.main_id()) else {
        return ffi::SQLITE_BUSY;
    };
    match exclusive(locks) {
        ffi::SQLITE_OK => {}
        ffi::SQLITE_BUSY => {
            // Somebody holds SHARED. A connection that has the WAL open maps the -shm within
            // moments of its SHARED lock: then it is in use, not this open's to judge; else it
            // is an opener on its way, and this open waits as SQLite does.
            if in_use(&shm_path) {
                return ffi::SQLITE_OK;
            }
            log::debug!(
                "hermes-guard: {} looks stale and another opener holds {} SHARED: waiting \
                 (SQLITE_BUSY, the busy handler retries)",
                wal_path.display(),
                db.display()
            );
            return ffi::SQLITE_BUSY;
        }
        rc => {
            log::info!(
                "hermes-guard: {} looks stale but EXCLUSIVE on {} failed (SQLite code {rc}); no \
                 judgement",
                wal_path.display(),
                db.display()
            );
            return ffi::SQLITE_OK;
        }
    }
    let _back_to_shared = BackToShared(locks);
    // Again, on the WAL now at the path, now that nobody else can start on it.
    let Some(wal) = open_wal(db, wal_path) else {
        return ffi::SQLITE_OK;
    };
    let m = match judge(db, main, &wal, false) {
        Some(Verdict::Stale(m)) => m,
        Some(verdict) => {
            say(db, &verdict);
            return ffi::SQLITE_OK;
        }
        None => return ffi::SQLITE_OK,
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
                Ok(aside) => {
                    log::error!("{}", aside.log_line(wal_path, db, &m.detail));
                    slot.set_report(StaleWalAction::SetAside, Some(&aside.dir), &m, wal);
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

/// The WAL at `wal_path`, read-only; `None` when there is none (or it cannot be read: said at
/// INFO, and SQLite goes on as always).
fn open_wal(db: &Path, wal_path: &Path) -> Option<File> {
    match File::open(wal_path) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            log::info!(
                "hermes-guard: cannot read {} before SQLite opens it ({e}); no judgement of \
                 whether it belongs to {}",
                wal_path.display(),
                db.display()
            );
            None
        }
    }
}

/// Tries for EXCLUSIVE on the main file (from the SHARED SQLite holds) every millisecond for
/// 10 to 50 ms — an opener on its way holds SHARED only until it maps the `-shm` or steps back —
/// and leaves the file at SHARED when it fails. The span is drawn at random, so that two guarded
/// openers in two processes do not step back in step.
fn exclusive(locks: &dyn MainLocks) -> c_int {
    let tries = 10 + (jitter() % 40);
    let mut rc = ffi::SQLITE_BUSY;
    for i in 0..tries {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        rc = locks.lock(ffi::SQLITE_LOCK_EXCLUSIVE);
        if rc == ffi::SQLITE_OK {
            return rc;
        }
        // A refused EXCLUSIVE may leave PENDING: back to SHARED, as SQLite's pager does.
        locks.unlock(ffi::SQLITE_LOCK_SHARED);
        if rc != ffi::SQLITE_BUSY {
            return rc;
        }
    }
    rc
}

/// A few bits that differ between processes and threads and from call to call.
fn jitter() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = std::thread::current().id();
    let h = page_hash(format!("{t} {id:?} {}", std::process::id()).as_bytes());
    h as u32
}

/// Back to SHARED (what SQLite holds) when the set-aside is done, whatever its outcome.
struct BackToShared<'a>(&'a dyn MainLocks);

impl Drop for BackToShared<'_> {
    fn drop(&mut self) {
        self.0.unlock(ffi::SQLITE_LOCK_SHARED);
    }
}

/// Databases (main file identities) a thread of this process is setting a stale WAL aside for.
static TURNS: Mutex<Vec<FileId>> = Mutex::new(Vec::new());

/// This thread's turn at setting aside the stale WAL of one database; `None` when another
/// thread has it.
struct Turn(Option<FileId>);

impl Turn {
    /// Whether another thread has the turn for `main`.
    fn taken(main: Option<FileId>) -> bool {
        main.is_some_and(|id| TURNS.lock().contains(&id))
    }

    fn take(main: Option<FileId>) -> Option<Turn> {
        let Some(id) = main else {
            return Some(Turn(None));
        };
        let mut turns = TURNS.lock();
        if turns.contains(&id) {
            return None;
        }
        turns.push(id);
        Some(Turn(Some(id)))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(id) = self.0 {
            TURNS.lock().retain(|t| *t != id);
        }
    }
}

/// Whether the WAL's `-shm` is in use: mapped by a connection of this process, or its
/// dead-man-switch byte locked by another process (read from `/proc/locks`:
/// opening the `-shm` to ask `fcntl` would drop this process's own POSIX locks on it at the
/// close). Said at INFO when it is.
fn in_use(shm_path: &Path) -> bool {
    let Ok(Some(id)) = identity_of_path(shm_path) else {
        return false;
    };
    let why = if mapped_here(id) {
        "this process uses it"
    } else if dms_locked(id) {
        "another process has it open"
    } else {
        return false;
    };
    log::warn!(
        "hermes-guard: the WAL beside {} looks stale (not written on the database file now at \
         the path) but {why}: it was opened, and replayed, before this open could set it aside, \
         as SQLite always does; nothing was moved (a restore of the file may have been undone \
         by that opener)",
        shm_path.display()
    );
    true
}

/// Whether `/proc/locks` lists a lock on the `-shm` `id` covering its dead-man-switch byte.
/// Unreadable: taken as locked (the open goes on as stock's would).
fn dms_locked(id: FileId) -> bool {
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return true;
    };
    locks
        .lines()
        .filter(|l| !l.contains("->"))
        .any(|line| lock_line_covers(line, id, UNIX_SHM_DMS))
}

/// Whether one line of `/proc/locks` (`1: POSIX ADVISORY READ 1234 08:01:5678 128 128`) is a
/// lock on the file `id` whose range holds `byte`.
fn lock_line_covers(line: &str, id: FileId, byte: i64) -> bool {
    let f: Vec<&str> = line.split_whitespace().collect();
    let Some(at) = f.iter().position(|w| w.matches(':').count() == 2) else {
        return false;
    };
    let (Some(file), Some(start), Some(end)) = (f.get(at), f.get(at + 1), f.get(at + 2)) else {
        return false;
    };
    // `maj:min:ino`: the device in hex, the inode in decimal.
    let Some((dev, ino)) = file.rsplit_once(':') else {
        return false;
    };
    if file_id_of(dev, ino) != Some(id) {
        return false;
    }
    let start = start.parse::<i64>().unwrap_or(i64::MAX);
    let end = if *end == "EOF" {
        i64::MAX
    } else {
        end.parse::<i64>().unwrap_or(-1)
    };
    (start..=end).contains(&byte)
}

/// The judgement of the WAL `wal` against the main file `main` now.
///
/// `quick`: stop before the full read of the WAL, answering `None` when every other test left
/// the WAL in doubt (the full look is then made under the lock).
fn judge(db: &Path, main: &dyn ImageSource, wal: &File, quick: bool) -> Option<Verdict> {
    let first = match look_at_wal(wal, None) {
        Ok(look) => look,
        Err(e) => {
            log::info!(
                "hermes-guard: cannot read the WAL of {} ({e})",
                db.display()
            );
            return Some(Verdict::NothingToReplay);
        }
    };
    let record = match judge_generation(&first, read_record(wal.as_fd())) {
        Ok(record) => record,
        Err(v) => return Some(v),
    };
    let now = |p: u32| read_page(main, p, record.page_size);
    if record
        .pages
        .iter()
        .all(|r| now(r.page).as_ref() == Some(&r.hash))
    {
        return Some(Verdict::Continues { by_pages: false });
    }
    if quick {
        return None;
    }
    let main_now = identity_of_path(db).ok().flatten();
    let pages: Vec<u32> = record.pages.iter().map(|p| p.page).collect();
    match look_at_wal(wal, Some(&pages)) {
        Ok(full) => Some(judge_pages(&record, main_now, now, &full)),
        Err(e) => {
            log::info!(
                "hermes-guard: cannot read the WAL of {} ({e})",
                db.display()
            );
            Some(Verdict::NothingToReplay)
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
