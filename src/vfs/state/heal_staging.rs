//! The heal's staging file: the retired WAL's committed prefix, written beside the database under
//! a name of its own before it is renamed to `<db>-wal` (`state/healing.rs`).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use rustix::fs::{AtFlags, OFlags, RenameFlags};

use super::heal_error::HealError;
use crate::capture::healed::HEALED_NAME;
use crate::identity::FileId;
use crate::paths::{sync_dir, DirHandle};
use crate::permissions::Permissions;

/// The retired WAL's committed prefix written beside the database under a staging name.
pub(super) struct Staged {
    /// The database's directory, which holds it.
    dir: Arc<DirHandle>,
    /// The staging file, open: what syncs the directory's filesystem when the directory itself
    /// cannot be read, so not fsynced (`paths::sync_dir`).
    file: File,
    /// `<db>-wal<suffix>` is its name.
    pub(super) suffix: String,
    name: std::ffi::OsString,
    pub(super) id: FileId,
    /// What the heal puts back at `<db>-wal`: its length and sha256 (hex), recorded in the
    /// `started` record, so that a reader can tell from the live `-wal` that it got there.
    pub(super) bytes: u64,
    pub(super) sha256: String,
}

impl Staged {
    /// Renames it to `name` (which nothing names now: checked under the lock; never over
    /// anything) and fsyncs the directory.
    pub(super) fn rename_into_place(&self, name: &OsStr) -> Result<FileId, HealError> {
        let dir = self.dir.fd();
        rustix::fs::renameat_with(dir, &self.name, dir, name, RenameFlags::NOREPLACE)
            .map_err(io::Error::from)
            .and_then(|()| self.sync_dir())
            .map_err(|source| HealError::PutBack {
                staged: self.id,
                source,
            })?;
        Ok(self.id)
    }

    /// Renames it from `name` back to its staging name and fsyncs the directory: whether both
    /// succeeded.
    pub(super) fn rename_back(&self, name: &OsStr) -> bool {
        let dir = self.dir.fd();
        rustix::fs::renameat_with(dir, name, dir, &self.name, RenameFlags::NOREPLACE).is_ok()
            && self.sync_dir().is_ok()
    }

    /// The heal rolled back before its commit point: the record (in `record_dir`, if any) goes
    /// first, and the staging file only once that removal is durable — while the staging file is
    /// there, a `started` record reads rolled back, never healed.
    pub(super) fn roll_back(&self, record_dir: Option<BorrowedFd<'_>>) {
        let record_gone = record_dir.is_none_or(|d| {
            let _ = rustix::fs::unlinkat(d, HEALED_NAME, AtFlags::empty());
            rustix::fs::fsync(d).is_ok()
        });
        if record_gone {
            let _ = rustix::fs::unlinkat(self.dir.fd(), &self.name, AtFlags::empty());
            let _ = self.sync_dir();
        }
    }

    /// The directory's fsync (its filesystem's, through the staging file, when the directory
    /// cannot be read: `paths::sync_dir`).
    fn sync_dir(&self) -> io::Result<()> {
        sync_dir(self.dir.fd(), self.file.as_fd())
    }
}

/// Writes the first `len` bytes of `wal` to a new file in `dir` named after `name` (the WAL's
/// name) and this process, with the database's `permissions` (its bits, its owner for a root
/// process: what SQLite gives its `-wal`), and fsyncs it and `dir`.
pub(super) fn stage(
    handle: &Arc<DirHandle>,
    name: &OsStr,
    wal: &File,
    len: u64,
    permissions: &Permissions,
) -> io::Result<Staged> {
    let dir = handle.fd();
    let suffix = format!(".hermes-guard-heal-{}", std::process::id());
    let mut staging = name.to_owned();
    staging.push(&suffix);
    let fd = permissions.create_file(dir, &staging, OFlags::WRONLY)?;
    let file = File::from(fd);
    let copied = (|| -> io::Result<(FileId, String)> {
        use sha2::Digest;
        let mut buf = vec![0u8; 1 << 20];
        let mut hash = sha2::Sha256::new();
        let mut at = 0u64;
        while at < len {
            let want = buf.len().min((len - at) as usize);
            wal.read_exact_at(&mut buf[..want], at)?;
            file.write_all_at(&buf[..want], at)?;
            hash.update(&buf[..want]);
            at += want as u64;
        }
        file.sync_all()?;
        sync_dir(dir, file.as_fd())?;
        Ok((
            crate::identity::identity_of_fd(&file)?,
            crate::paths::hex(&hash.finalize()),
        ))
    })();
    match copied {
        Ok((id, sha256)) => Ok(Staged {
            dir: handle.clone(),
            file,
            suffix,
            name: staging,
            id,
            bytes: len,
            sha256,
        }),
        Err(e) => {
            let _ = rustix::fs::unlinkat(dir, staging.as_os_str(), AtFlags::empty());
            Err(e)
        }
    }
}
