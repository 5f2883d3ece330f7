//! Upkeep: the checkpoint, the capture of a retired generation, and close.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::GuardExt;

use super::{passive_checkpoint, Checkpoint, SessionDb, StoreError};

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

    /// Closes the handle. If its generation was retired, first makes sure the retired generation
    /// is captured (trigger `close` when the loss is first seen here); if that fails, returns
    /// [`StoreError::CaptureFailed`] and stays open, usable, so a later `close()` can
    /// retry. A live handle gets a PASSIVE checkpoint first; a retired one is never checkpointed.
    /// Closing a closed handle does nothing.
    ///
    /// A `SessionDb` lent by the registry is closed through its
    /// [`SharedSessionDb`](crate::registry::SharedSessionDb) handle; here it returns
    /// [`StoreError::Shared`] and closes nothing.
    pub fn close(&self) -> Result<(), StoreError> {
        if self.shared.load(Ordering::Acquire) {
            return Err(StoreError::Shared {
                database: self.path.clone(),
            });
        }
        self.close_unshared()
    }

    /// The close itself, whoever owns the handle.
    pub(crate) fn close_unshared(&self) -> Result<(), StoreError> {
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
        match crate::close(conn) {
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

    pub(crate) fn mark_shared(&self) {
        self.shared.store(true, Ordering::Release);
    }
}
