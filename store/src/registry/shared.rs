//! The handles a [`Registry`](super::Registry) lends ([`SharedSessionDb`]), giving them back
//! ([`ReleaseOrClose`]), and the process-wide registry's free functions.

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hermes_guard::FileId;

use super::{log_teardown_error, Inner, Registry, RegistryStats, Release, Released};
use crate::{SessionDb, StoreError};

/// One reference to a generation lent by a [`Registry`]. Derefs to the [`SessionDb`]; dropping
/// it, [closing](SharedSessionDb::close) it or [releasing](SharedSessionDb::release) it gives
/// back exactly this reference, and the last one tears the generation down.
pub struct SharedSessionDb {
    pub(super) registry: Arc<Inner>,
    pub(super) path: PathBuf,
    pub(super) serial: u64,
    pub(super) identity: FileId,
    pub(super) db: Arc<SessionDb>,
    pub(super) released: bool,
}

impl fmt::Debug for SharedSessionDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSessionDb")
            .field("path", &self.path)
            .field("generation", &self.identity)
            .field("serial", &self.serial)
            .finish()
    }
}

impl Deref for SharedSessionDb {
    type Target = SessionDb;

    fn deref(&self) -> &SessionDb {
        &self.db
    }
}

impl SharedSessionDb {
    /// The generation this handle belongs to: the main file's identity when it was opened.
    pub fn generation(&self) -> FileId {
        self.identity
    }

    /// Whether both handles share one `SessionDb` (one generation).
    pub fn same_generation(&self, other: &SharedSessionDb) -> bool {
        Arc::ptr_eq(&self.db, &other.db)
    }

    /// Releases this reference; the last one tears the generation down (outside the registry's
    /// lock). True when the registry still had the generation (false after `close_all`). A
    /// teardown error is logged: a capture failure at ERROR (the generation is then kept open,
    /// unsettled, and retried by the next acquire of its path and by `close_all`), anything else
    /// at DEBUG. Unlike [`close`](SharedSessionDb::close), it does not capture a retired
    /// generation that others still hold: their final release will.
    pub fn release(mut self) -> bool {
        let release = self.release_inner();
        if let Err(e) = &release.teardown {
            log_teardown_error(e);
        }
        release.found
    }

    /// Gives back this reference, first making sure a retired generation is captured — also
    /// when others still hold it, so the capture never waits on the last holder. On failure,
    /// notably [`StoreError::CaptureFailed`], returns the error together with the
    /// handle, still open and usable, so `close()` can be retried: the shape of
    /// [`hermes_guard::close`] and rusqlite's `Connection::close`. Never closes
    /// what other holders still use; the last reference's teardown does.
    ///
    /// Should that final teardown fail after all (the generation lost between the capture and
    /// the close), the reference is already given back: the registry keeps the generation open
    /// among the unsettled, and closing the handle handed back retries its teardown.
    // Unboxed, to keep the shape of `hermes_guard::close` and rusqlite's `Connection::close`.
    #[allow(clippy::result_large_err)]
    pub fn close(mut self) -> Result<(), (SharedSessionDb, StoreError)> {
        match self.close_inner() {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }

    fn close_inner(&mut self) -> Result<(), StoreError> {
        match self.db.ensure_captured() {
            // Closed: `close_all` closed the generation; only the reference is left to give back.
            Ok(_) | Err(StoreError::Closed { .. }) => {}
            Err(e) => return Err(e),
        }
        if self.released {
            // Handed back by a close whose final teardown failed.
            if self.registry.is_unsettled(&self.db) {
                return self.registry.retry_unsettled(&self.db);
            }
            return Ok(());
        }
        self.release_inner().teardown
    }

    fn release_inner(&mut self) -> Release {
        let nothing = |found| Release {
            found,
            teardown: Ok(()),
        };
        if std::mem::replace(&mut self.released, true) {
            return nothing(false);
        }
        match self.registry.release_ref(&self.path, self.serial) {
            Released::Unknown => nothing(false),
            Released::StillHeld => nothing(true),
            Released::Last(db) => Release {
                found: true,
                teardown: self.registry.teardown(&self.path, db),
            },
        }
    }
}

impl Drop for SharedSessionDb {
    fn drop(&mut self) {
        if let Err(e) = self.release_inner().teardown {
            log_teardown_error(&e);
        }
    }
}

/// Whatever a caller holds that should be given back without failing: a lent handle is
/// released, a `SessionDb` of its own is closed.
pub trait ReleaseOrClose {
    /// Gives it back; never fails. A capture failure is logged at ERROR, other errors at DEBUG.
    fn release_or_close(self);
}

impl ReleaseOrClose for SharedSessionDb {
    fn release_or_close(self) {
        if let Err((handle, e)) = self.close() {
            log_teardown_error(&e);
            // The reference goes back all the same: a capture still owed is retried by the final
            // teardown (then, failing, by the next acquire of the path and by close_all).
            drop(handle);
        }
    }
}

impl ReleaseOrClose for SessionDb {
    fn release_or_close(self) {
        if let Err((db, e)) = self.close() {
            log_teardown_error(&e);
            // Dropped all the same: the guard keeps the retired generation's files held and
            // `hermes_guard::retry_pending_captures()` retries the capture.
            drop(db);
        }
    }
}

/// The process-wide registry.
pub fn global() -> &'static Registry {
    static GLOBAL: OnceLock<Registry> = OnceLock::new();
    GLOBAL.get_or_init(Registry::new)
}

/// [`Registry::acquire`] on the [`global`] registry.
pub fn acquire(path: impl AsRef<Path>) -> Result<SharedSessionDb, StoreError> {
    global().acquire(path)
}

/// Releases `handle`'s reference (see [`SharedSessionDb::release`]).
pub fn release(handle: SharedSessionDb) -> bool {
    handle.release()
}

/// Gives back a lent handle or closes an own `SessionDb`, never failing: for shutdown paths.
/// A capture failure is logged at ERROR, other errors at DEBUG. An own `SessionDb` is then
/// dropped, and the guard holds its retired generation for
/// [`retry_pending_captures`](hermes_guard::retry_pending_captures); a lent handle's reference is given
/// back, and a final teardown that cannot capture leaves the generation unsettled (retried by
/// the next acquire and by `close_all`).
pub fn release_or_close(db: impl ReleaseOrClose) {
    db.release_or_close();
}

/// [`Registry::close_all`] on the [`global`] registry.
pub fn close_all() -> usize {
    global().close_all()
}

/// [`Registry::stats`] on the [`global`] registry.
pub fn stats() -> RegistryStats {
    global().stats()
}
