//! How a capture that failed is tried again, and what happens to a retired generation whose
//! directory was deleted.
//!
//! - **Per generation, with back-off.** A failed capture (a full disk, a directory gone) is tried
//!   again no sooner than its back-off allows: 1 s after the first failure, doubling up to
//!   10 minutes. The opens and closes of unrelated databases, which retry the held generations
//!   (`held::retry_pending_captures`), and every refused write of the retired connection only
//!   retry a generation whose time has come. An explicit request — `hermes_guard::close`,
//!   `hermes_guard::retry_pending_captures()`, `PRAGMA hermes_guard_capture`, the connection's own
//!   close — tries at once.
//! - **Logged by construction at most O(log n) times.** A generation's failures are logged at
//!   ERROR at the 1st, 2nd, 4th, 8th, ... attempt (with the count), and every failure is counted
//!   in the status (`capture_attempts`).
//! - **A deleted directory is let go, or captured elsewhere.** When the database's directory has
//!   no link left (deleted on purpose: `rm -r`, a test's temporary directory), a capture beside
//!   the database can never be written. With an orphan capture directory configured
//!   ([`set_orphan_capture_dir`], or `HERMES_GUARD_ORPHAN_CAPTURE_DIR` for extension hosts) the
//!   capture goes there; without one the generation is let go: one WARN line, no retry, and its
//!   descriptors are released (see docs/decisions.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The first back-off, and its cap.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(600);

pub use crate::capture::fallback::ORPHAN_DIR_ENV;

/// `None`: not decided yet (the environment is read at the first need); `Some(None)`: none.
static ORPHAN_DIR: Mutex<Option<Option<PathBuf>>> = Mutex::new(None);

/// Failure log lines left out by the back-off or the let-go rate limit, process-wide (in the
/// status).
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Generations let go in this process (in the status).
static LET_GO: AtomicU64 = AtomicU64::new(0);

/// The let-go lines' rate limit: at most [`LET_GO_LINES`] per [`LET_GO_WINDOW`], process-wide
/// (a test suite that deletes a thousand temporary directories gets a few lines and a count).
const LET_GO_LINES: u32 = 5;
const LET_GO_WINDOW: Duration = Duration::from_secs(60);

struct LineWindow {
    start: Option<Instant>,
    lines: u32,
    /// Let-go lines left out since the last one written.
    left_out: u64,
}

static LET_GO_WINDOW_STATE: Mutex<LineWindow> = Mutex::new(LineWindow {
    start: None,
    lines: 0,
    left_out: 0,
});

/// A generation was let go: counts it, and says whether its line may be written now — with how
/// many were left out since the last line — or not (counted as left out).
pub(crate) fn let_go_line(now: Instant) -> Option<u64> {
    LET_GO.fetch_add(1, Ordering::Relaxed);
    let mut w = LET_GO_WINDOW_STATE.lock();
    if w.start
        .is_none_or(|start| now.duration_since(start) >= LET_GO_WINDOW)
    {
        w.start = Some(now);
        w.lines = 0;
    }
    if w.lines < LET_GO_LINES {
        w.lines += 1;
        Some(std::mem::take(&mut w.left_out))
    } else {
        w.left_out += 1;
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// Generations let go in this process.
pub(crate) fn let_go_total() -> u64 {
    LET_GO.load(Ordering::Relaxed)
}

/// Sets (or clears) the directory where a retired generation whose own directory was deleted is
/// captured. Without one such a generation is let go (logged once, its descriptors released).
pub fn set_orphan_capture_dir(dir: Option<PathBuf>) {
    *ORPHAN_DIR.lock() = Some(dir);
}

/// The orphan capture directory, if one is set (or named by [`ORPHAN_DIR_ENV`]).
pub(crate) fn orphan_capture_dir() -> Option<PathBuf> {
    ORPHAN_DIR
        .lock()
        .get_or_insert_with(|| {
            std::env::var_os(ORPHAN_DIR_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .clone()
}

/// Failure lines the back-off left out in this process.
pub(crate) fn suppressed_lines() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// When a capture is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Explicitly (a close, the API): at once, whatever the back-off says.
    Now,
    /// By a retry that runs by itself (a refused write, another database's open or close): only
    /// once the back-off has passed.
    IfDue,
}

/// One generation's capture attempts.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// Failed attempts so far.
    failures: u32,
    /// No automatic attempt before this.
    next: Option<Instant>,
}

impl Backoff {
    /// Whether an attempt of this kind may run now.
    pub(crate) fn allows(&self, attempt: Attempt, now: Instant) -> bool {
        attempt == Attempt::Now || self.next.is_none_or(|next| now >= next)
    }

    /// An attempt failed at `now`; returns whether to log it (the 1st, 2nd, 4th, ... failure).
    pub(crate) fn failed(&mut self, now: Instant) -> bool {
        self.failures = self.failures.saturating_add(1);
        let shift = (self.failures - 1).min(10);
        let wait = FIRST_BACKOFF.saturating_mul(1 << shift).min(MAX_BACKOFF);
        self.next = Some(now + wait);
        let log = self.failures.is_power_of_two();
        if !log {
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        }
        log
    }

    /// Failed attempts so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

/// Whether the directory held open by `dir` was deleted: no link left (a directory's link count
/// drops to 0 at its `rmdir`, and nothing can reach it by any path after that).
pub(crate) fn directory_deleted(dir: &crate::paths::DirHandle) -> bool {
    rustix::fs::fstat(dir.fd()).is_ok_and(|st| st.st_nlink == 0)
}

/// The orphan capture directory could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("the orphan capture directory {} (for {}) cannot be opened: {source}", dir.display(), database.display())]
pub(crate) struct OrphanDirError {
    /// The directory set for orphans' captures.
    dir: PathBuf,
    /// The database whose capture was to go there.
    database: PathBuf,
    source: std::io::Error,
}

/// The directory an orphan's capture goes into, opened (shared); `None` when none is set, an
/// error when it cannot be opened.
pub(crate) fn open_orphan_dir(
    database: &Path,
) -> Result<Option<std::sync::Arc<crate::paths::DirHandle>>, OrphanDirError> {
    let Some(dir) = orphan_capture_dir() else {
        return Ok(None);
    };
    crate::paths::DirHandle::open_shared(&dir)
        .map(Some)
        .map_err(|source| OrphanDirError {
            dir,
            database: database.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_attempts_wait_out_a_doubling_backoff_and_explicit_ones_do_not() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(b.allows(Attempt::IfDue, t0));
        b.failed(t0);
        assert!(!b.allows(Attempt::IfDue, t0 + Duration::from_millis(999)));
        assert!(b.allows(Attempt::Now, t0));
        assert!(b.allows(Attempt::IfDue, t0 + Duration::from_secs(1)));
        b.failed(t0);
        assert!(!b.allows(Attempt::IfDue, t0 + Duration::from_millis(1999)));
        assert!(b.allows(Attempt::IfDue, t0 + Duration::from_secs(2)));
    }

    #[test]
    fn the_backoff_is_capped_at_ten_minutes() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        for _ in 0..40 {
            b.failed(t0);
        }
        assert!(b.allows(Attempt::IfDue, t0 + MAX_BACKOFF));
    }

    #[test]
    fn failures_are_logged_at_powers_of_two_only() {
        let mut b = Backoff::default();
        let mut logged = Vec::new();
        for _ in 0..20 {
            if b.failed(Instant::now()) {
                logged.push(b.failures());
            }
        }
        assert_eq!(logged, vec![1, 2, 4, 8, 16]);
    }
}
