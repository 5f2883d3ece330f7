//! The guard on an operating system it does not support (anything but Linux): the crate still
//! builds, so a cross-platform program can depend on it, and registering says why there is no
//! guard. The shim (`src/vfs/`) needs Linux: inotify and epoll for its directory watch,
//! `/proc/self/mountinfo` for mount changes, `MADV_WIPEONFORK` for fork safety.
//!
//! Unverified: no non-Linux standard library is installed where this was written, so no other
//! target was compiled. The rest of the crate uses portable POSIX calls (through rustix) and reads
//! `/proc` only at run time, with fallbacks, so other Unix targets are expected to build; Windows
//! is not (the capture and recovery code is written against Unix file APIs).

use crate::error::GuardError;

/// Name under which the VFS would be registered.
pub const VFS_NAME: &str = "hermes-guard";

fn unsupported() -> GuardError {
    GuardError::UnsupportedPlatform {
        os: std::env::consts::OS,
    }
}

/// Always [`GuardError::UnsupportedPlatform`]: the guard needs Linux.
pub fn register() -> Result<(), GuardError> {
    Err(unsupported())
}

/// Always [`GuardError::UnsupportedPlatform`]: the guard needs Linux.
pub fn register_as_default() -> Result<(), GuardError> {
    Err(unsupported())
}

/// Without the VFS no connection is guarded.
pub(crate) fn retired_flag(_conn: &rusqlite::Connection) -> Option<bool> {
    None
}

/// Nothing is ever pending without the VFS.
pub(crate) fn retry_pending_captures() -> usize {
    0
}

/// The environment variable naming the orphan capture directory (see the Linux build).
pub const ORPHAN_DIR_ENV: &str = "HERMES_GUARD_ORPHAN_CAPTURE_DIR";

/// Without the VFS there is nothing to capture: kept for a portable API.
pub fn set_orphan_capture_dir(_dir: Option<std::path::PathBuf>) {}
