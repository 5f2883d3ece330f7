//! Upkeep: the checkpoint, the capture of a retired generation, and close.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use hermes_guard::GuardExt;

use super::{passive_checkpoint, Checkpoint, SessionDb, StoreError};

/// What [`SessionDb::close`] settled.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Closed {
    /// Where the retired generation was captured, when the handle's generation was retired
    /// and its WAL held anything to capture.
    pub capture: Option<PathBuf>,
}

impl SessionDb {
    /// Runs a PASSIVE checkpoint, which never waits for readers or writers. Never fails loudly:
    /// any error is logged at DEBUG and `None` returned. Does nothing on a closed handle or a
    /// retired generation (which the guard would refuse anyway: it is never checkpointed).
    pub fn try_wal_checkpoint(&self) -> Option<Checkpoint> {
        let slot = self.conn.lock();
        let conn = slot.as_ref()?;
        match conn.guard_status() {
            Ok(status) if status.retired => {
                log::debug!(
                    "{}: not checkpointing a retired generation",
                    self.path.display()
                );
                return None;
            }
            Ok(_) => {}
            Err(e) => log::debug!(
                "{}: guard status before checkpoint: {e}",
                self.path.display()
            ),
        }
        passive_checkpoint(conn, &self.path)
    }

    /// If this handle's generation is retired, makes sure its capture exists (trigger `close`
    /// when the loss is first seen here) and returns where it is; `Ok(None)` when the generation
    /// is live or its lost WAL held no complete frame. On failure returns
    /// [`StoreError::CaptureFailed`]; the handle is untouched and a later call retries.
    pub fn ensure_captured(&self) -> Result<Option<PathBuf>, StoreError> {
        let slot = self.conn.lock();
        let conn = slot.as_ref().ok_or_else(|| self.closed())?;
        let status = conn.ensure_captured().map_err(|e| self.capture_error(e))?;
        self.remember_capture(status.capture.as_ref());
        if status.retired {
            self.retired_seen.store(true, Ordering::Release);
        }
        Ok(status.capture)
    }

    /// Closes the handle, which it consumes. If its generation was retired, first makes sure the
    /// retired generation is captured (trigger `close` when the loss is first seen here); if that
    /// fails, hands the handle back with [`StoreError::CaptureFailed`], still open and usable, so
    /// `close()` can be retried: the shape of [`hermes_guard::close`] and
    /// rusqlite's `Connection::close`. A live handle gets a PASSIVE checkpoint first; a retired
    /// one is never checkpointed.
    ///
    /// A `SessionDb` lent by the registry is reached through a
    /// [`SharedSessionDb`](crate::registry::SharedSessionDb), never owned, so it cannot be closed
    /// here: closing the shared handle gives back exactly its reference.
    // Unboxed, to keep the shape of `hermes_guard::close` and rusqlite's `Connection::close`.
    #[allow(clippy::result_large_err)]
    pub fn close(self) -> Result<Closed, (SessionDb, StoreError)> {
        match self.close_in_place() {
            Ok(()) => Ok(Closed {
                capture: self.retired_generation_capture(),
            }),
            Err(e) => Err((self, e)),
        }
    }

    /// The close itself, for the owner and for the registry's teardown; closing a closed handle
    /// does nothing.
    pub(crate) fn close_in_place(&self) -> Result<(), StoreError> {
        let mut slot = self.conn.lock();
        let Some(conn) = slot.take() else {
            return Ok(());
        };
        match conn.ensure_captured() {
            Ok(status) => {
                self.remember_capture(status.capture.as_ref());
                if !status.retired {
                    // Keeps the WAL short for the connections that stay; best effort.
                    passive_checkpoint(&conn, &self.path);
                }
            }
            Err(e) => {
                *slot = Some(conn);
                return Err(self.capture_error(e));
            }
        }
        match hermes_guard::close(conn) {
            Ok(()) => {
                // The guard may have captured at close (the loss first seen there): read it back.
                log::debug!("{}: closed", self.path.display());
                Ok(())
            }
            Err((conn, e)) => {
                if let Ok(status) = conn.guard_status() {
                    self.remember_capture(status.capture.as_ref());
                }
                *slot = Some(conn);
                Err(self.capture_error(e))
            }
        }
    }

    /// Whether this handle has seen its generation retired (a refused write, or a status that
    /// said so). Runs no check: [`guard_status`](SessionDb::guard_status) does. Only a replaced
    /// main file stops the registry lending a generation; one whose `-wal`/`-shm` was lost is
    /// lent until its last holder releases it.
    pub fn has_seen_retirement(&self) -> bool {
        self.retired_seen.load(Ordering::Acquire)
    }
}
