//! The loss of a generation as this connection holds it: why it retired, what the capture did
//! (where it went, its last error, its back-off), what the loss left to capture from.

use std::path::PathBuf;
use std::sync::Arc;

use super::generation::GenerationCapture;
use super::Inner;
use crate::capture::{generation_size, ImageSource};
use crate::status::{Backfill, RetireReason};
use crate::vfs::retry::Backoff;
use crate::walfile::SMALLEST_WAL_WITH_A_FRAME;

#[derive(Default)]
pub(super) struct Loss {
    /// Why the generation retired (sticky), `None` while it is live.
    pub(super) reason: Option<RetireReason>,
    /// Where the capture was written.
    pub(super) capture: Option<PathBuf>,
    /// The last capture failure, while no capture exists.
    pub(super) capture_error: Option<String>,
    /// The main file's image, to capture from.
    pub(super) main_image: Option<Box<dyn ImageSource + Send>>,
    /// The checkpoint progress the wal-index showed when the generation was retired.
    pub(super) backfill_at_loss: Option<Backfill>,
    /// This generation's capture, shared by every connection of the process that retired it;
    /// joined at the first capture attempt, left with the pinned WAL.
    pub(super) generation: Option<Arc<GenerationCapture>>,
    /// The capture's failed attempts and when the next automatic one may run (`retry.rs`).
    pub(super) backoff: Backoff,
    /// The directory (as last known) whose deletion let this generation go uncaptured.
    pub(super) let_go: Option<PathBuf>,
    /// A capture beside the database failed for want of permission or space (`EACCES`,
    /// `EROFS`, `ENOSPC`, ...): if the fallback directory fails too, the heal at close does not
    /// wait for a capture (`state/healing.rs`).
    pub(super) unwritable_beside: bool,
}

impl Inner {
    /// Whether the retired generation holds anything a capture would save. A replaced main file
    /// always does: its image is the retired data. After a lost `-wal`/`-shm` the main file is
    /// the live one, so only frames in the pinned WAL are at stake; a WAL without a whole frame
    /// (say, the fresh WAL of a connection born attached to an unlinked `-shm`) has none, and
    /// capturing it would only write a copy of the live database. No pinned WAL: nothing to
    /// capture from (rollback mode).
    pub(super) fn worth_capturing(&self) -> bool {
        let Some(wal) = &self.pins.wal else {
            return false;
        };
        if self.loss.let_go.is_some() {
            // Its directory was deleted on purpose: nothing is held for it (`retry.rs`).
            return false;
        }
        match self.loss.reason {
            Some(RetireReason::MainReplaced | RetireReason::MainOverwritten) => true,
            // Unknown size: capture rather than risk losing frames.
            _ => generation_size(wal, self.failed_commit().as_ref())
                .map_or(true, |n| n >= SMALLEST_WAL_WITH_A_FRAME),
        }
    }
}
