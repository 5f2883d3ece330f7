//! The capture of a retired generation: when it is attempted (at once, or once its back-off has
//! passed: `retry.rs`), where it is written (beside the database; an orphan's elsewhere or
//! nowhere), and what a failure leaves (the descriptors held, the error in the status).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::{ConnectionState, Inner};
use crate::capture::{self, fallback, CaptureError, CaptureInput, Captured, FailedCommit, Trigger};
use crate::identity::PinnedWal;
use crate::paths::DirHandle;
use crate::permissions::Permissions;
use crate::vfs::retry::{self, Attempt};

/// Where a capture may go (`ConnectionState::capture_dirs`).
struct CaptureDirs {
    /// The database's directory, when it can be had.
    beside: Option<Arc<DirHandle>>,
    /// It was deleted.
    deleted: bool,
    /// The orphan capture directory, open, when the database's was deleted and one is set.
    orphan: Option<Arc<DirHandle>>,
}

impl ConnectionState {
    /// Counts a refusal, captures the generation if that has not happened yet (and its back-off
    /// allows), and returns the code to hand back to SQLite.
    pub(crate) fn refuse(&self) -> i32 {
        self.checks
            .refusals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut inner = self.inner.lock();
        if inner.loss.capture.is_none() && inner.worth_capturing() {
            let _ = self.capture_locked(&mut inner, Trigger::Halt, Attempt::IfDue);
        }
        super::REFUSED
    }

    /// Makes sure a retired generation is captured, trying at once; `Ok(None)` when not retired,
    /// when there is nothing at stake, or when the generation was let go (its directory deleted,
    /// no orphan directory set: see `retry.rs`).
    pub(crate) fn ensure_captured(
        &self,
        trigger: Trigger,
    ) -> Result<Option<PathBuf>, CaptureError> {
        self.capture_if(trigger, Attempt::Now)
    }

    /// [`ConnectionState::ensure_captured`] for a retry that runs by itself (a held generation, at
    /// another database's open or close): only once the back-off has passed.
    pub(crate) fn retry_capture(&self) -> Result<Option<PathBuf>, CaptureError> {
        self.capture_if(Trigger::Close, Attempt::IfDue)
    }

    fn capture_if(
        &self,
        trigger: Trigger,
        attempt: Attempt,
    ) -> Result<Option<PathBuf>, CaptureError> {
        if self.check_pins().is_none() {
            return Ok(None);
        }
        let mut inner = self.inner.lock();
        if inner.loss.capture.is_none() && !inner.worth_capturing() {
            return Ok(None);
        }
        match self.capture_locked(&mut inner, trigger, attempt) {
            Ok(dir) => Ok(Some(dir)),
            // Let go on purpose (logged once): nothing to wait for.
            Err(CaptureError::LetGo { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A full check where the connection lets go of its WAL (the WAL's close, the unmap of its
    /// shared memory), whatever SQLite asked before: a generation retired since the last check
    /// is captured now, from the descriptors still open, or kept for the retry (see
    /// [`ConnectionState::wal_closing`] and [`ConnectionState::must_hold_main`]). Up to three
    /// `stat` calls, at close only, and none while the directory watch vouches for the path.
    /// Nothing to check without a pinned WAL (rollback mode, or already closed).
    pub(crate) fn check_at_close(&self) {
        if !self.wal_pinned() && !self.is_retired() {
            return;
        }
        // Another connection of this process holds the same generation, whose last full check the
        // watch vouches for (`state/open_here.rs`).
        if self.close_left_to_sibling() {
            return;
        }
        // The directory watch vouches that nothing on the path (nor the mount table) changed since
        // the last full check, as it does for every write transaction (a retired generation is
        // never vouched for): no `stat` then. The close-time checkpoint keeps its own full check
        // (`SQLITE_FCNTL_HAS_MOVED`).
        if self.vouched_fast() {
            return;
        }
        if self.check_pins().is_some() {
            // A failure is logged and recorded in the status; the descriptors stay open.
            let _ = self.ensure_captured(Trigger::Close);
        }
    }

    /// Where the capture written at `at` is now: a capture beside the database is inside the
    /// held directory, wherever that went since (its name is there); one written elsewhere (the
    /// fallback or orphan capture directory) is where it was written.
    pub(super) fn capture_now(&self, at: &Path) -> PathBuf {
        let (Some(dir), Some(name)) = (self.dir(), at.file_name()) else {
            return at.to_path_buf();
        };
        let followed = dir.current_path().join(name);
        if followed.is_dir() {
            followed
        } else {
            at.to_path_buf()
        }
    }

    /// A commit frame is whole and the check after it must look at the files in full: until it
    /// vouches ([`ConnectionState::commit_vouched`]), the transaction that began with `failed` at
    /// its first write is no part of the generation, so a capture the check triggers leaves its
    /// frames out (`capture/unacknowledged.rs`). Nothing without a pinned WAL.
    pub(crate) fn commit_in_doubt(&self, failed: FailedCommit) {
        if let Some(slot) = self.inner.lock().generation_slot() {
            *slot.failed_commit.lock() = Some(failed);
        }
    }

    /// The check after a commit frame vouched for it after all: its frames are the generation's.
    pub(crate) fn commit_vouched(&self) {
        if let Some(slot) = &self.inner.lock().loss.generation {
            *slot.failed_commit.lock() = None;
        }
    }

    /// The last capture failure, while no capture exists.
    pub(crate) fn capture_error(&self) -> Option<String> {
        self.inner.lock().loss.capture_error.clone()
    }

    /// Whether the main file object must be kept open after SQLite closes it, because it is the
    /// only way left to the main image of an uncaptured retired generation.
    pub(crate) fn must_hold_main(&self) -> bool {
        let inner = self.inner.lock();
        inner.loss.reason.is_some()
            && inner.loss.capture.is_none()
            && !inner.close.healed
            && inner.worth_capturing()
    }

    pub(super) fn capture_locked(
        &self,
        inner: &mut Inner,
        trigger: Trigger,
        attempt: Attempt,
    ) -> Result<PathBuf, CaptureError> {
        if let Some(done) = &inner.loss.capture {
            return Ok(done.clone());
        }
        // A capture stands for the generation from then on (it is taken once): taken of a live
        // generation, it would miss every later commit.
        if inner.loss.reason.is_none() {
            return Err(CaptureError::NotRetired {
                database: self.paths.db.clone(),
            });
        }
        if let Some(directory) = &inner.loss.let_go {
            return Err(CaptureError::LetGo {
                database: self.paths.db.clone(),
                directory: directory.clone(),
            });
        }
        let now = Instant::now();
        if !inner.loss.backoff.allows(attempt, now) {
            return Err(CaptureError::Deferred {
                database: self.paths.db.clone(),
                attempts: inner.loss.backoff.failures(),
                last: inner.loss.capture_error.clone().unwrap_or_default(),
            });
        }
        let result = self.write_once(inner, trigger);
        match &result {
            Ok(dir) => {
                inner.loss.capture = Some(dir.clone());
                inner.loss.capture_error = None;
            }
            Err(e) => {
                if self.let_go_if_orphaned(inner) {
                    return Err(CaptureError::LetGo {
                        database: self.paths.db.clone(),
                        directory: inner.loss.let_go.clone().unwrap_or_default(),
                    });
                }
                if inner.loss.backoff.failed(now) {
                    log::error!(
                        "hermes-guard: could not capture the retired generation of {} (attempt \
                         {}): {e}; the descriptors stay open and the capture is retried with a \
                         back-off (at once at the connection's close or \
                         hermes_guard::retry_pending_captures)",
                        self.paths.db.display(),
                        inner.loss.backoff.failures()
                    );
                }
                inner.loss.capture_error = Some(e.to_string());
            }
        }
        result
    }

    /// One attempt: the generation's capture slot (one capture per generation in the process),
    /// then the capture beside the database, or in the orphan directory when the database's own
    /// was deleted.
    fn write_once(&self, inner: &mut Inner, trigger: Trigger) -> Result<PathBuf, CaptureError> {
        let generation = inner
            .generation_slot()
            .ok_or_else(|| CaptureError::NoPinnedIdentity {
                database: self.paths.db.clone(),
            })?;
        let failed_commit = *generation.failed_commit.lock();
        let Some(wal) = &inner.pins.wal else {
            return Err(CaptureError::NoPinnedIdentity {
                database: self.paths.db.clone(),
            });
        };
        // Held while capturing: another connection retiring the same generation waits here.
        let mut done = generation.done.lock();
        if let Some(dir) = self.already_captured(&done, wal, failed_commit.as_ref()) {
            return Ok(dir);
        }
        let Some(main) = &inner.loss.main_image else {
            return Err(CaptureError::NotHeld {
                database: self.paths.db.clone(),
                identity: wal.id(),
            });
        };
        let CaptureDirs {
            beside: dir,
            deleted,
            orphan: orphan_dir,
        } = self.capture_dirs()?;
        let (at_pin, reason, main_id, most_links) = (
            inner.pins.creations_at_pin,
            inner.loss.reason,
            inner.pins.main_id,
            inner.pins.most_links,
        );
        // The database's own permissions, read in its directory (wherever that is now), whether
        // the capture goes beside it or elsewhere; the most private when it cannot be read.
        let permissions = match dir.as_deref() {
            Some(d) if !deleted => Permissions::of_database_in(d.fd(), &self.paths.db),
            _ => Permissions::of_database(&self.paths.db),
        };
        let input = CaptureInput {
            database: &self.paths.db,
            dir: orphan_dir.as_deref().or(dir.as_deref()),
            wal,
            main: main.as_ref(),
            main_id: inner.pins.main_id,
            shm_id: inner.pins.shm_id,
            trigger,
            reason: inner.loss.reason,
            backfill_at_loss: inner.loss.backfill_at_loss,
            base: Some(&|| self.judge_base(at_pin, reason, main_id, most_links)),
            permissions,
            failed_commit,
            base_pages: Some(&|salts| self.base_pages(salts)),
        };
        let captured = self.write_or_fall_back(
            input,
            orphan_dir.is_some(),
            &mut inner.loss.unwritable_beside,
        )?;
        if orphan_dir.is_some() {
            // The capture's own WARN line names where it went; this says why there.
            log::info!(
                "hermes-guard: the directory of {} was deleted; its retired generation was \
                 captured in the orphan capture directory instead: {}",
                self.paths.db.display(),
                captured.dir.display()
            );
        }
        let dir = captured.dir.clone();
        if let (None, Some(failed)) = (failed_commit, captured.wal.failed_commit) {
            // Found by another process's capture, which left out a commit that process failed:
            // the heal at close leaves it out too.
            *generation.failed_commit.lock() = Some(failed);
        }
        *done = Some(captured);
        Ok(dir)
    }

    /// The capture this process already wrote of the generation, when it holds the same bytes
    /// (by this process's first connection to retire the generation): same size and sha256. A
    /// WAL that changed since then (a peer still attached to it appended, or restarted it and
    /// wrote again) is captured again, whole.
    fn already_captured(
        &self,
        done: &Option<Captured>,
        wal: &PinnedWal,
        failed_commit: Option<&FailedCommit>,
    ) -> Option<PathBuf> {
        let Captured { dir, wal: bytes } = done.as_ref()?;
        if bytes.is_held_by(wal, failed_commit) && dir.exists() {
            log::info!(
                "hermes-guard: the retired generation of {} is already captured in {}",
                self.paths.db.display(),
                dir.display()
            );
            return Some(dir.clone());
        }
        None
    }

    /// Where a capture may go: the database's directory (found now if the retirement did not,
    /// `state/dir.rs`), whether it was deleted, and then the orphan capture directory, if one is
    /// set. An error when it was deleted and there is nowhere else: never by path, another
    /// directory may have its name now.
    fn capture_dirs(&self) -> Result<CaptureDirs, CaptureError> {
        let dir = self.dir();
        let deleted = self.directory_deleted();
        let orphan_dir = if deleted {
            retry::open_orphan_dir(&self.paths.db).map_err(|why| CaptureError::Io {
                database: self.paths.db.clone(),
                artifact: retry::orphan_capture_dir().unwrap_or_default(),
                source: std::io::Error::other(why),
            })?
        } else {
            None
        };
        if deleted && orphan_dir.is_none() && dir.is_none() {
            return Err(CaptureError::Io {
                database: self.paths.db.clone(),
                artifact: self
                    .paths
                    .db
                    .parent()
                    .map(|p| p.to_path_buf())
                    .unwrap_or_default(),
                source: std::io::Error::other("the database's directory was deleted"),
            });
        }
        Ok(CaptureDirs {
            beside: dir,
            deleted,
            orphan: orphan_dir,
        })
    }

    /// Writes the capture `input` describes; when beside the database is not writable
    /// (permission, read-only, full) and it is not the orphan directory, in the fallback
    /// directory instead, never worse than stock (`unwritable_beside` then set).
    fn write_or_fall_back(
        &self,
        input: CaptureInput<'_>,
        orphan: bool,
        unwritable_beside: &mut bool,
    ) -> Result<Captured, CaptureError> {
        match capture::write_capture(&input) {
            Err(CaptureError::Io { source, .. })
                if !orphan && fallback::wants_fallback(&source) =>
            {
                *unwritable_beside = true;
                let fallback = open_fallback_dir(&self.paths.db, &source)?;
                let captured = capture::write_capture(&CaptureInput {
                    dir: Some(&fallback),
                    ..input
                })?;
                log::warn!(
                    "hermes-guard: the capture of {} could not be written beside it ({source}); \
                     it was written to the fallback capture directory instead: {} (`hermes-guard \
                     captures {}` finds it)",
                    self.paths.db.display(),
                    captured.dir.display(),
                    self.paths.db.display()
                );
                Ok(captured)
            }
            other => other,
        }
    }

    /// After a failed attempt: when the database's directory was deleted and no orphan capture
    /// directory is set, lets the generation go — said once at WARN, never retried, and its
    /// descriptors released as the connection's files close (see `worth_capturing`). Returns
    /// whether it did.
    fn let_go_if_orphaned(&self, inner: &mut Inner) -> bool {
        if !self.directory_deleted() || retry::orphan_capture_dir().is_some() {
            return false;
        }
        let directory = self
            .paths
            .db
            .parent()
            .map(|p| p.to_path_buf())
            .unwrap_or_default();
        if let Some(left_out) = retry::let_go_line(Instant::now()) {
            let more = if left_out > 0 {
                format!(" ({left_out} more let go since the last such line)")
            } else {
                String::new()
            };
            log::warn!(
                "hermes-guard: the directory {} of {} was deleted (no link left): its retired \
                 generation is let go uncaptured and its descriptors are released; set {} (or \
                 call hermes_guard::set_orphan_capture_dir) to capture such generations \
                 elsewhere{more}",
                directory.display(),
                self.paths.db.display(),
                retry::ORPHAN_DIR_ENV
            );
        }
        inner.loss.capture_error = Some(format!(
            "let go: its directory {} was deleted",
            directory.display()
        ));
        inner.loss.let_go = Some(directory);
        true
    }
}

/// The fallback capture directory (`capture/fallback.rs`): the orphan capture directory when one
/// is set, else the per-user default, made with mode 0700.
fn open_fallback_dir(
    database: &std::path::Path,
    beside: &std::io::Error,
) -> Result<std::sync::Arc<crate::paths::DirHandle>, CaptureError> {
    let fail = |artifact: PathBuf, why: String| CaptureError::Io {
        database: database.to_path_buf(),
        artifact,
        source: std::io::Error::other(format!(
            "not beside the database ({beside}), and not in the fallback capture directory \
             either: {why}"
        )),
    };
    if let Some(orphan) = retry::open_orphan_dir(database).map_err(|why| {
        fail(
            retry::orphan_capture_dir().unwrap_or_default(),
            why.to_string(),
        )
    })? {
        return Ok(orphan);
    }
    let Some(dir) = fallback::default_dir() else {
        return Err(fail(
            PathBuf::new(),
            format!(
                "none is set ({}) and there is no HOME",
                retry::ORPHAN_DIR_ENV
            ),
        ));
    };
    fallback::make_private(&dir)
        .and_then(|()| crate::paths::DirHandle::open_shared(&dir))
        .map_err(|e| fail(dir.clone(), e.to_string()))
}
