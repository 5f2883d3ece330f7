//! A power-loss test filesystem (LazyFS semantics) for hermes-guard's crash-point tests.
//!
//! [`LazyFs::mount`] serves a backing directory at a mount point through FUSE. Everything written
//! is visible at once; only what an `fsync`/`fdatasync` of the file (its data) or of its directory
//! (its names) made durable survives [`LazyFs::power_cut`], which unmounts and returns the
//! [`Crash`]: [`Crash::restore`] turns the backing directory into the disk it leaves, in place
//! (a file that survives keeps its inode, as on a disk), and [`Crash::write_image`] writes a copy
//! of it into another directory, with the names
//! of [`Names::Strict`] (POSIX) or [`Names::Ordered`] (journaled metadata) and the unsynced data
//! dropped or torn ([`Data`]). With a crash point armed (`crash_before`: the 1-based number of a
//! durable step) the filesystem freezes at that step without performing it and fails everything
//! after with `EIO`: the program stops there as a power cut would stop it. See README.md.

pub mod crash;
mod fs;
pub mod harness;
mod inner;
pub mod model;
mod recovery;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crash::Crash;
pub use model::{Data, Model, Names, ALL_MODES};

/// A fault the filesystem injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The power cut at the durable step of this number (1-based): it is not performed, and
    /// every operation after it fails with `EIO`.
    CrashBefore(usize),
    /// The durable step of this number, an `fsync`, `fdatasync` or directory `fsync`, fails with
    /// `EIO` without making anything durable; the filesystem goes on. For a file, the pages it
    /// failed to write stay off the disk: a later fsync succeeds without them unless they are
    /// written again (Linux after a writeback error, the PostgreSQL "fsyncgate" case).
    SyncFails(usize),
    /// The write of this number (1-based) to a file created through the mount fails with
    /// `ENOSPC`, nothing written; the filesystem goes on.
    WriteFull(usize),
}

/// A mounted power-loss filesystem; unmounted on drop.
pub struct LazyFs {
    inner: Arc<Mutex<inner::Inner>>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl LazyFs {
    /// Mounts `backing` at `mountpoint` (both existing directories); everything already in
    /// `backing` is durable. `crash_before`: the durable step at which to freeze (1-based).
    ///
    /// Needs `/dev/fuse` and root (or `fusermount3` from the `fuse3` package).
    pub fn mount(
        backing: &Path,
        mountpoint: &Path,
        crash_before: Option<usize>,
    ) -> io::Result<Self> {
        Self::mount_with(backing, mountpoint, crash_before.map(Fault::CrashBefore))
    }

    /// [`LazyFs::mount`] with any [`Fault`] armed.
    pub fn mount_with(backing: &Path, mountpoint: &Path, fault: Option<Fault>) -> io::Result<Self> {
        let inner = Arc::new(Mutex::new(inner::Inner::new(
            backing.canonicalize()?,
            fault,
        )?));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("lazyfs".into()),
            fuser::MountOption::Subtype("lazyfs".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        config.acl = fuser::SessionACL::All;
        let session = fuser::spawn_mount(fs::LazyFsFs(inner.clone()), mountpoint, &config)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "mounting the power-loss filesystem at {} failed: {e} (it needs /dev/fuse \
                         and root, or fusermount3 from the fuse3 package)",
                        mountpoint.display()
                    ),
                )
            })?;
        Ok(LazyFs {
            inner,
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The durable steps performed so far, in order (`fsync state.db-wal`, `rename a -> b`...).
    pub fn steps(&self) -> Vec<String> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .steps
            .clone()
    }

    /// The writes seen so far to files created through the mount ([`Fault::WriteFull`] counts
    /// them).
    pub fn writes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).writes
    }

    /// Arms `fault` (after a [`LazyFs::reboot`]: the steps are counted from the reboot on).
    pub fn arm(&self, fault: Option<Fault>) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).fault = fault;
    }

    /// Whether the armed crash point was reached.
    pub fn frozen(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).frozen
    }

    /// Cuts the power: unmounts (the caller has stopped every program using the mount and closed
    /// its own files there, or the unmount fails with EBUSY after two seconds) and
    /// returns what the disk holds, to be written out with [`Crash::write_image`].
    pub fn power_cut(mut self) -> io::Result<Crash> {
        self.unmount()?;
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.crash()
    }

    /// A power cut and the reboot after it under the same mount (the caller has stopped every
    /// program using it): the backing directory becomes the disk the cut leaves under `names`
    /// and `data` ([`Crash::restore`]), and the filesystem serves it again, fault disarmed, all of
    /// it durable. A file that survives keeps its inode number at the mount and the mount its
    /// device number: the same device and inode after the cut, as a local disk gives.
    pub fn reboot(&self, names: Names, data: Data) -> io::Result<Crash> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let crash = inner.crash()?;
        let survivors: HashMap<u64, u64> = inner
            .ids
            .iter()
            .filter(|(_, id)| crash.located.contains_key(id))
            .map(|(&ino, &id)| (ino, id))
            .collect();
        crash.restore(names, data)?;
        inner.reboot(survivors)?;
        Ok(crash)
    }

    /// Unmounts; when the mount is busy (a file still open there), detaches it lazily so that no
    /// mount outlives the test, and says so.
    ///
    /// A mount that is busy for a moment is waited out first: a process another thread forks
    /// holds a copy of every descriptor open at the fork until its exec closes them, so a file
    /// the caller has closed can keep the mount busy for as long as that exec takes.
    fn unmount(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        self.wait_until_unused();
        session.umount_and_join().map_err(|e| {
            let detach =
                rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
            io::Error::new(
                e.kind(),
                format!(
                    "unmounting {} failed ({e}): something still uses it; detached lazily ({})",
                    self.mountpoint.display(),
                    match detach {
                        Ok(()) => "done".to_string(),
                        Err(d) => format!("failed too: {d}"),
                    }
                ),
            )
        })
    }

    /// Returns once nothing holds a file at the mount, or after [`BUSY_GRACE`]. Asks the kernel
    /// with `umount2(MNT_EXPIRE)`, which never unmounts on a first call: EBUSY while a file is
    /// open there, EAGAIN (the mount marked for expiry) once none is. The mark is harmless: the
    /// unmount that follows is an ordinary one. Not root (EPERM): returns at once.
    fn wait_until_unused(&self) {
        let started = std::time::Instant::now();
        while started.elapsed() < BUSY_GRACE {
            match rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::EXPIRE) {
                Err(rustix::io::Errno::BUSY) => std::thread::sleep(Duration::from_millis(10)),
                _ => return,
            }
        }
    }
}

/// How long [`LazyFs::power_cut`] waits for a busy mount to become unused before it gives up.
const BUSY_GRACE: Duration = Duration::from_secs(2);

impl Drop for LazyFs {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            eprintln!(
                "lazyfs: unmounting {} failed: {e}",
                self.mountpoint.display()
            );
        }
    }
}
