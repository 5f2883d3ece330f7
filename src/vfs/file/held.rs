//! A connection's state and its main file object as entries of the process-wide held lists
//! (`vfs/held/`): the room below names neither type, and reaches them through these.

use crate::capture::{CaptureError, Trigger};
use crate::identity::FileId;
use crate::vfs::held::{HeldFile, HeldState};
use crate::vfs::state::{ConnectionState, LeftWal};
use std::path::Path;

use super::HeapFile;

impl HeldState for ConnectionState {
    fn db_path(&self) -> &Path {
        ConnectionState::db_path(self)
    }

    fn main_id(&self) -> Option<FileId> {
        ConnectionState::main_id(self)
    }

    fn holds_wal(&self) -> bool {
        ConnectionState::holds_wal(self)
    }

    fn ensure_captured(&self, trigger: Trigger) -> Result<(), CaptureError> {
        ConnectionState::ensure_captured(self, trigger).map(drop)
    }

    fn retry_capture(&self) -> Result<(), CaptureError> {
        ConnectionState::retry_capture(self).map(drop)
    }

    fn capture_error(&self) -> Option<String> {
        ConnectionState::capture_error(self)
    }

    fn main_released(&self) {
        ConnectionState::main_released(self)
    }

    fn opener_inside_its_open(&self) -> bool {
        ConnectionState::opener_inside_its_open(self)
    }

    fn left_wal_taken_away(&self) -> bool {
        self.left_wal() == LeftWal::TakenAway
    }

    fn pins_retired(&self) -> bool {
        self.check_pins().is_some()
    }
}

impl HeldFile for HeapFile {
    fn close_held(self: Box<Self>) {
        (*self).close();
    }
}
