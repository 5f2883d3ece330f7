//! The stale-WAL judgement of an existing WAL before SQLite opens it, in this order: the
//! database file's EXCLUSIVE lock first, the kernel's lock answer on the `-shm` only when it is
//! refused.
//!
//! SQLite takes SHARED on the main file before it looks for a `-wal`, and a WAL-mode connection
//! keeps SHARED until it closes. So EXCLUSIVE on the file now at the path means nobody uses a
//! WAL *of that file*: the WAL is judged against it and set aside if it was written elsewhere,
//! whatever other processes hold on another inode. It is tried at once, before anything is read,
//! so that a guarded opener that starts first keeps a restore ahead of an unguarded one. Refused,
//! somebody holds this file: the quick look settles the common case (the WAL continues the
//! file), and only a WAL still in doubt asks whether the `-shm` is in use (`in_use.rs`): in use,
//! its holder replayed it already, as SQLite always does; not in use, an opener is on its way and
//! this one waits (`SQLITE_BUSY`, the busy handler retries).

use std::ffi::c_int;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;
use rusqlite::ffi;

use super::Holder;
use crate::capture::{sidecar, ImageSource};
use crate::identity::{identity_of_fd, identity_of_path, FileId};
use crate::status::StaleWalAction;
use crate::vfs::in_use::{self, ShmUse};
use crate::wal_base::{
    judge_wal, page_hash, quick_look, read_record, recorded_page_hash, set_aside, stale_wal_policy,
    MainNow, Mismatch, StaleWalPolicy, Verdict,
};
use crate::walfile::{parse_wal_header, SMALLEST_WAL_WITH_A_FRAME, WAL_HEADER_SIZE};

/// The former order (judged first, EXCLUSIVE after), for the connection explorer only: reached
/// when its switch (`explore-faults`) is on, through the test seam (`crate::testing::seam`).
mod old_order;
mod replaced_here;

/// The connection's main file through its own methods (the guard's table, as SQLite calls it):
/// SQLite's locks, seen by every process and by the unix VFS's bookkeeping in this one.
pub(crate) trait MainLocks {
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
pub(crate) fn before_wal_open(
    state: &impl Holder,
    main: &dyn ImageSource,
    locks: &dyn MainLocks,
    wal_path: &Path,
) -> c_int {
    if let Some(window) = crate::testing::seam::stale_wal_judged_before_exclusive() {
        return old_order::before_wal_open(state, main, locks, wal_path, window);
    }
    let db = state.db_path();
    // A WAL another connection of this process left for this open (its close kept the WAL, with
    // frames no checkpoint copied, while this open held SHARED and had no WAL yet), settled first
    // (`state/left.rs`).
    if let Some(main_id) = state.main_id() {
        crate::vfs::held::settle_for_opener(main_id);
    }
    // A connection of this process has this very WAL open for this very file: judged at its
    // open, and used since (one `stat`, the common case of a process that opens and closes
    // connections beside a long-lived one).
    let wal_now = identity_of_path(wal_path).ok().flatten();
    // The pin takes it from here when SQLite's descriptor turns out to be this inode.
    state.wal_seen_before_open(wal_now);
    if let (Some(main_id), Some(wal_id)) = (state.main_id(), wal_now) {
        if in_use::wal_open_here(main_id, wal_id) {
            return ffi::SQLITE_OK;
        }
        // ... or for another main file: this one replaced it while that connection ran.
        if let Some(other) = in_use::wal_open_here_for_another(main_id, wal_id) {
            return replaced_here::wal_of_a_replaced_file(state, main, locks, wal_path, other);
        }
    }
    let Some(wal) = open_wal(db, wal_path) else {
        return ffi::SQLITE_OK;
    };
    // No frame SQLite could replay (one `fstat`).
    if wal
        .metadata()
        .is_ok_and(|m| m.len() < SMALLEST_WAL_WITH_A_FRAME)
    {
        return ffi::SQLITE_OK;
    }
    drop(wal);
    // Another thread of this process is setting this database's WAL aside: step back at once
    // (`SQLITE_BUSY`, giving up SHARED), so that its EXCLUSIVE is not kept waiting on ours.
    if Turn::taken(state.main_id()) {
        return ffi::SQLITE_BUSY;
    }
    match exclusive(locks, 1) {
        ffi::SQLITE_OK => return under_exclusive(state, main, locks, wal_path),
        ffi::SQLITE_BUSY => {}
        rc => return no_exclusive(db, wal_path, rc),
    }
    held_by_somebody(state, main, locks, wal_path)
}

/// EXCLUSIVE refused at once: somebody holds the file at the path. The quick look (the header,
/// the record, the first pages) outside any lock settles the common case; a WAL still in doubt
/// is its holder's when its `-shm` is in use, else an opener is on its way (waited for), or it
/// is judged in full under EXCLUSIVE.
fn held_by_somebody(
    state: &impl Holder,
    main: &dyn ImageSource,
    locks: &dyn MainLocks,
    wal_path: &Path,
) -> c_int {
    let db = state.db_path();
    let Some(wal) = open_wal(db, wal_path) else {
        return ffi::SQLITE_OK;
    };
    match judge(db, main, &wal, true) {
        None | Some(Verdict::Stale(_)) => {}
        Some(verdict) => {
            say(db, &verdict);
            return ffi::SQLITE_OK;
        }
    }
    let shm_path = sidecar(db, "-shm");
    if in_use::shm_use(&shm_path).in_use() {
        return in_use_by_its_holder(state, main, &wal, wal_path);
    }
    drop(wal);
    // One set-aside of a database at a time in this process: the other threads step back
    // (`SQLITE_BUSY`, giving up their SHARED lock) instead of keeping the lock from the first.
    let Some(_turn) = Turn::take(state.main_id()) else {
        return ffi::SQLITE_BUSY;
    };
    // An opener on its way holds SHARED only until it maps the `-shm` or steps back: tried for
    // 10 to 50 ms, the span drawn at random so that two guarded openers in two processes do not
    // step back in step.
    match exclusive(locks, 10 + jitter() % 40) {
        ffi::SQLITE_OK => under_exclusive(state, main, locks, wal_path),
        ffi::SQLITE_BUSY => {
            // A connection that has the WAL open maps the -shm within moments of its SHARED
            // lock: then it is in use, not this open's to judge; else it is an opener on its
            // way, and this open waits as SQLite does.
            if in_use::shm_use(&shm_path).in_use() {
                if let Some(wal) = open_wal(db, wal_path) {
                    return in_use_by_its_holder(state, main, &wal, wal_path);
                }
                return ffi::SQLITE_OK;
            }
            log::debug!(
                "hermes-guard: {} looks stale and another opener holds {} SHARED: waiting \
                 (SQLITE_BUSY, the busy handler retries)",
                wal_path.display(),
                db.display()
            );
            ffi::SQLITE_BUSY
        }
        rc => no_exclusive(db, wal_path, rc),
    }
}

fn no_exclusive(db: &Path, wal_path: &Path, rc: c_int) -> c_int {
    log::info!(
        "hermes-guard: {} may be stale but EXCLUSIVE on {} failed (SQLite code {rc}); no \
         judgement",
        wal_path.display(),
        db.display()
    );
    ffi::SQLITE_OK
}

/// Under EXCLUSIVE on the file now at the path (released to SHARED on return): nobody has a WAL
/// of this file open and nobody can open one. The WAL at the path is judged in full against this
/// file; one that was written on another — by its pages, or because a connection that does not
/// hold this file still uses it — is set aside (or the open refused, in the strict mode).
fn under_exclusive(
    state: &impl Holder,
    main: &dyn ImageSource,
    locks: &dyn MainLocks,
    wal_path: &Path,
) -> c_int {
    let _back_to_shared = BackToShared(locks);
    let db = state.db_path();
    let Some(wal) = open_wal(db, wal_path) else {
        return ffi::SQLITE_OK;
    };
    let m = match judge(db, main, &wal, false) {
        Some(Verdict::Stale(m)) => m,
        Some(verdict) => match live_on_another_file(state, &wal, &verdict) {
            Some(m) => m,
            None => {
                say(db, &verdict);
                return ffi::SQLITE_OK;
            }
        },
        None => return ffi::SQLITE_OK,
    };
    set_aside_or_refuse(state, main, wal, wal_path, &m)
}

/// Under EXCLUSIVE, a WAL judged not written on the file at the path: set aside (a capture of
/// reason `stale-wal`, the `-shm` with it) or, in the strict mode, the open refused.
fn set_aside_or_refuse(
    state: &impl Holder,
    main: &dyn ImageSource,
    wal: File,
    wal_path: &Path,
    m: &Mismatch,
) -> c_int {
    let db = state.db_path();
    let slot = state.slot();
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
                crate::wal_base::POLICY_ENV,
                wal_path.display(),
                db.display()
            );
            slot.set_report(StaleWalAction::Refused, None, m, wal);
            ffi::SQLITE_CANTOPEN_DIRTYWAL
        }
        StaleWalPolicy::SetAside => {
            let mut header = [0u8; 100];
            let _ = main.read_at(&mut header, 0);
            match set_aside(db, &wal, identity_of_path(db).ok().flatten(), &header, m) {
                Ok(aside) => {
                    log::error!("{}", aside.log_line(wal_path, db, &m.detail));
                    slot.set_report(StaleWalAction::SetAside, Some(&aside.dir), m, wal);
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
                    slot.set_report(StaleWalAction::Refused, None, m, wal);
                    ffi::SQLITE_CANTOPEN_DIRTYWAL
                }
            }
        }
    }
}

/// Under EXCLUSIVE, for a WAL whose pages do not tell it stale: whether a connection that does
/// not hold the file at the path uses it — its `-shm` is in use while nobody holds this file —
/// and its record names another file. That is a file replaced while a connection kept the old
/// one open: its WAL (and the checkpoint progress in its `-shm`) belongs to the old inode, and a
/// replay here would mix two histories. `None`: nothing says so.
fn live_on_another_file(
    state: &impl Holder,
    wal: &File,
    verdict: &Verdict,
) -> Option<Box<Mismatch>> {
    let db = state.db_path();
    let main_now = state.main_id()?;
    let held = || {
        matches!(
            in_use::shm_use(&sidecar(db, "-shm")),
            ShmUse::Here | ShmUse::Held
        )
    };
    // The record is bound to the WAL inode: whichever generation it describes (the writer may
    // not have recorded the latest restart yet), it names the file that inode was written on.
    // Read first: a record of this very file settles it without asking who holds the `-shm`.
    match verdict {
        Verdict::Continues { .. } | Verdict::OtherGeneration { .. } => {}
        // Not taken for stale without a record: a holder of this very file whose POSIX locks a
        // stray close() of the main file dropped (an unguarded one: the shield keeps a guarded
        // one's) looks the same from here, and its WAL is the live one.
        Verdict::NoRecord if held() => {
            log::warn!(
                "hermes-guard: {}-shm is in use by a connection that does not hold {} (the file \
                 may have been replaced while it ran), and its WAL carries no record of the file \
                 it was written on (an unguarded writer): SQLite replays it as always",
                db.display(),
                db.display()
            );
            return None;
        }
        _ => return None,
    }
    let recorded = read_record(wal.as_fd())?;
    let written_on = recorded.main.filter(|on| *on != main_now)?;
    if !held() {
        return None;
    }
    let wal_salts = match verdict {
        Verdict::OtherGeneration { found, .. } => *found,
        _ => recorded.salts,
    };
    Some(Box::new(Mismatch {
        detail: format!(
            "the WAL's generation (salts {:08x} {:08x}) was started on the database file \
             {written_on}, not the one now at the path ({main_now}), and a connection that does \
             not hold this file still uses the WAL: the file was replaced while that connection \
             ran",
            wal_salts[0], wal_salts[1]
        ),
        recorded,
        wal_salts,
        main_now: Some(main_now),
        page: 0,
        page_hash_now: None,
        page_frames_in_wal: 0,
    }))
}

/// Without EXCLUSIVE, a WAL still in doubt whose `-shm` is in use: its holder opened it, and
/// replayed it, before this open could look, as SQLite always does. Nothing is moved. The full
/// look (once per file, WAL and generation in this process) says whether that holder undid a
/// restore: then at WARN; a WAL that continues the file (a checkpoint changed its first pages)
/// is said at DEBUG only.
fn in_use_by_its_holder(
    state: &impl Holder,
    main: &dyn ImageSource,
    wal: &File,
    wal_path: &Path,
) -> c_int {
    let db = state.db_path();
    let key = (
        state.main_id(),
        identity_of_fd(wal).ok(),
        read_record(wal.as_fd()).map(|r| r.salts),
    );
    if JUDGED_IN_USE.lock().contains(&key) {
        return ffi::SQLITE_OK;
    }
    match judge(db, main, wal, false) {
        Some(Verdict::Stale(m)) if !still_so(main, wal, &m) => log::debug!(
            "hermes-guard: {} changed while this open judged it ({}): no judgement (its holder \
             checkpoints or restarts it)",
            wal_path.display(),
            m.detail
        ),
        Some(Verdict::Stale(m)) => log::warn!(
            "hermes-guard: {} is in use by another connection but was not written on the \
             database file now at {} ({}): that connection opened it, and replayed it, before \
             this open could set it aside, as SQLite always does; nothing was moved (a restore \
             of the file may have been undone by an unguarded opener)",
            wal_path.display(),
            db.display(),
            m.detail
        ),
        Some(verdict) => {
            say(db, &verdict);
            let mut judged = JUDGED_IN_USE.lock();
            if judged.len() >= 32 {
                judged.remove(0);
            }
            judged.push(key);
        }
        None => {}
    }
    ffi::SQLITE_OK
}

/// A WAL in use is judged under no lock that keeps its holders still: their checkpoints write the
/// main file's pages and their resets start a generation over the old one's frames while the
/// judgement reads them. A reset writes the WAL header at offset 0 before the new generation's
/// first frame, so frames read past it may be another generation's, and a page read while a
/// checkpoint wrote it may be neither version. `Stale` stands only when, read again after the look,
/// the WAL header and the record are still the generation judged and the page found differing still
/// hashes as it did; otherwise the judgement is not made (its holder replayed the WAL long before:
/// this is a report, not a decision).
fn still_so(main: &dyn ImageSource, wal: &File, m: &Mismatch) -> bool {
    let mut head = [0u8; WAL_HEADER_SIZE];
    if wal.read_exact_at(&mut head, 0).is_err() {
        return false;
    }
    let header = parse_wal_header(&head);
    read_page(main, m.page, m.recorded.page_size) == m.page_hash_now
        && header.valid
        && header.salts == m.recorded.salts
        && header.salts == m.wal_salts
        && read_record(wal.as_fd()).is_some_and(|r| r.salts == m.recorded.salts)
}

/// WALs found in use and continuing their file, by (file, WAL, generation): not read again.
type JudgedKey = (Option<FileId>, Option<FileId>, Option<[u32; 2]>);
static JUDGED_IN_USE: Mutex<Vec<JudgedKey>> = Mutex::new(Vec::new());

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

/// Tries for EXCLUSIVE on the main file (from the SHARED SQLite holds) `tries` times, a
/// millisecond apart, and leaves the file at SHARED when it fails.
fn exclusive(locks: &dyn MainLocks, tries: u32) -> c_int {
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

/// The judgement of the WAL `wal` against the main file `main` now (`crate::wal_base`'s
/// sequence, read through the wrapped main file).
///
/// `quick`: stop before the full read of the WAL, answering `None` when every other test left
/// the WAL in doubt (the full look is then made under the lock).
fn judge(db: &Path, main: &dyn ImageSource, wal: &File, quick: bool) -> Option<Verdict> {
    let mut now = MainAt { db, main };
    let judged = if quick {
        quick_look(wal, &mut now)
    } else {
        judge_wal(wal, &mut now).map(Some)
    };
    judged.unwrap_or_else(|e| {
        log::info!(
            "hermes-guard: cannot read the WAL of {} ({e})",
            db.display()
        );
        Some(Verdict::NothingToReplay)
    })
}

/// The main file at `db`, read through the wrapped file object.
struct MainAt<'a> {
    db: &'a Path,
    main: &'a dyn ImageSource,
}

impl MainNow for MainAt<'_> {
    fn page_hash(&self, page: u32, page_size: u32) -> Option<String> {
        read_page(self.main, page, page_size)
    }

    /// Unknown when it cannot be read (the judgement goes on without it).
    fn identity(&self) -> io::Result<Option<FileId>> {
        Ok(identity_of_path(self.db).ok().flatten())
    }
}

/// The recorded hash of page `page` (1-based) of the main file, `None` beyond its end or
/// unreadable.
fn read_page(main: &dyn ImageSource, page: u32, page_size: u32) -> Option<String> {
    let size = main.size().ok()?;
    recorded_page_hash(page, page_size, size, |buf, offset| {
        main.read_at(buf, offset)
    })
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
