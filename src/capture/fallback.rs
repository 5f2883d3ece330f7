//! Where a capture goes when it cannot be written beside its database: the fallback capture
//! directory.
//!
//! A capture beside the database that fails for want of permission or space — `EACCES`,
//! `EPERM`, `EROFS`, `ENOSPC`, `EDQUOT` — is written instead into the orphan capture directory
//! when one is set (`hermes_guard::set_orphan_capture_dir`, `HERMES_GUARD_ORPHAN_CAPTURE_DIR`),
//! else into the per-user default [`default_dir`]: `$XDG_STATE_HOME/hermes-guard/captures`, or
//! `~/.local/state/hermes-guard/captures`, made with mode 0700. Its manifest records the
//! database's path as always; `hermes-guard captures <db>` and `recover` find it from the
//! database's path. (A database whose directory was deleted is captured there only when a
//! directory is set: a directory deleted whole is most often deleted on purpose.)

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Whether a failed write beside the database is one the fallback directory may succeed at:
/// permission, a read-only filesystem, no space or quota.
pub(crate) fn wants_fallback(e: &io::Error) -> bool {
    use rustix::io::Errno;
    // Through a creation's typed error (`src/permissions.rs`) too.
    let Some(code) = crate::permissions::os_error(e) else {
        return false;
    };
    [
        Errno::ACCESS,
        Errno::PERM,
        Errno::ROFS,
        Errno::NOSPC,
        Errno::DQUOT,
    ]
    .iter()
    .any(|errno| errno.raw_os_error() == code)
}

/// The environment variable that names the orphan (and fallback) capture directory for hosts
/// that cannot call `hermes_guard::set_orphan_capture_dir` (the loadable extension's).
pub const ORPHAN_DIR_ENV: &str = "HERMES_GUARD_ORPHAN_CAPTURE_DIR";

/// The per-user default fallback directory (not created): `$XDG_STATE_HOME/hermes-guard/captures`
/// when that is an absolute path, else `$HOME/.local/state/hermes-guard/captures`; `None`
/// without either.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|home| home.join(".local").join("state"))
        })?;
    Some(base.join("hermes-guard").join("captures"))
}

/// Creates `dir` (and its parents) if missing, the last component with mode 0700.
pub(crate) fn make_private(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// The directories a capture of a database may have gone to besides its own: the orphan capture
/// directory named in the environment (a process's own setting is not seen from another
/// process) and the per-user default.
pub(crate) fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os(ORPHAN_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Some(d) = default_dir() {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}
