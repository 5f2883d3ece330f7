//! Whether a `-shm` or a WAL is in use, from what this process holds and from the
//! kernel's lock table — never from `/proc` text (`/proc/self/maps` names a btrfs file by its
//! superblock's device where `stat` gives the subvolume's, and `/proc/locks` hides the locks of
//! processes in other pid namespaces).
//!
//! - **In this process**: the `-shm`s guarded connections have mapped, by the identity of
//!   SQLite's own descriptor of each (`fstat`), and the WALs they have open, paired with the main
//!   file they were opened for. Counted, so that several connections of one database share an
//!   entry.
//! - **In any process, any namespace**: a write-lock test with `F_OFD_GETLK` on the `-shm`'s
//!   dead-man-switch byte, which every connection that maps the `-shm` holds a read lock on. An
//!   OFD lock test conflicts with POSIX locks of every process, this one's included, and the
//!   kernel answers it in constant time whatever else is locked on the host.
//!
//! The test needs a descriptor of the `-shm`, and closing any descriptor of a file drops every
//! POSIX lock this process holds on it — an unguarded connection of this process may be one of
//! them. A probe that finds the dead-man-switch byte unlocked by everyone is closed at once: no
//! connection of this process maps the `-shm` then (the unix VFS holds that byte for as long as
//! its shared-memory node lives, and takes no other lock on the file without it), so this
//! process holds no lock to lose. A probe that finds it locked is kept, one per `-shm` inode,
//! reused by the next test of that file (SQLite's own unix VFS keeps descriptors it cannot close
//! for the same reason), and closed once a later test, or the process's exit, finds the byte
//! unlocked by everyone. Between the test and the close, another thread of this process could
//! open the `-shm` through the unix VFS and take its lock: the test, the close and
//! that open are kept apart by the unix VFS's own mutex (`unixBigLock`,
//! `SQLITE_MUTEX_STATIC_VFS1`), which `unixOpenSharedMemory` holds from its open of the file to
//! its lock of the dead-man-switch byte, and which the probe holds from its open to its close.
//! Kept probes are rare — a WAL in doubt whose `-shm` a live connection
//! holds — and bounded ([`MAX_PROBES`]); past the bound the answer is "in use", the conservative
//! one.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags};

use super::boundary::UnixVfsMutex;
use crate::identity::{identity_of_fd, identity_of_path, FileId};

/// The dead-man-switch byte of a unix VFS `-shm` (`UNIX_SHM_DMS`).
const DMS: i64 = super::shield::UNIX_SHM_DMS;

/// The most probe descriptors kept.
const MAX_PROBES: usize = 64;

/// `-shm` inodes mapped by guarded connections of this process, with their count.
static SHM_HERE: Mutex<Option<HashMap<FileId, u32>>> = Mutex::new(None);

/// WALs guarded connections of this process have open: (main file, WAL) identities, counted.
static WAL_HERE: Mutex<Option<HashMap<(FileId, FileId), u32>>> = Mutex::new(None);
/// The same WALs by their own identity alone, counted: whether one is open for another main
/// file is then asked without a walk of every open WAL.
static WAL_IDS: Mutex<Option<HashMap<FileId, u32>>> = Mutex::new(None);

/// Probe descriptors of `-shm`s some connection holds, kept until nobody does (see the module's
/// docs).
static PROBES: Mutex<Option<HashMap<FileId, OwnedFd>>> = Mutex::new(None);

fn add<K: std::hash::Hash + Eq>(map: &Mutex<Option<HashMap<K, u32>>>, key: K) {
    *map.lock()
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert(0) += 1;
}

fn remove<K: std::hash::Hash + Eq>(map: &Mutex<Option<HashMap<K, u32>>>, key: &K) {
    let mut map = map.lock();
    let Some(map) = map.as_mut() else { return };
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

fn contains<K: std::hash::Hash + Eq>(map: &Mutex<Option<HashMap<K, u32>>>, key: &K) -> bool {
    map.lock().as_ref().is_some_and(|m| m.contains_key(key))
}

/// A guarded connection's mapping of a `-shm`, on the process's list while this lives.
pub(crate) struct ShmHere(FileId);

impl ShmHere {
    pub(crate) fn new(id: FileId) -> ShmHere {
        add(&SHM_HERE, id);
        ShmHere(id)
    }
}

impl Drop for ShmHere {
    fn drop(&mut self) {
        remove(&SHM_HERE, &self.0);
    }
}

/// Whether a guarded connection of this process maps the `-shm` `id`.
pub(crate) fn shm_mapped_here(id: FileId) -> bool {
    contains(&SHM_HERE, &id)
}

/// A guarded connection's open WAL and the main file it was opened for, on the process's list
/// while this lives.
pub(crate) struct WalHere((FileId, FileId));

impl WalHere {
    pub(crate) fn new(main: FileId, wal: FileId) -> WalHere {
        add(&WAL_HERE, (main, wal));
        add(&WAL_IDS, wal);
        WalHere((main, wal))
    }
}

impl Drop for WalHere {
    fn drop(&mut self) {
        remove(&WAL_HERE, &self.0);
        remove(&WAL_IDS, &self.0 .1);
    }
}

/// Whether a guarded connection of this process has the WAL `wal` open for the main file `main`
/// (it judged that WAL against that file when it opened it).
pub(crate) fn wal_open_here(main: FileId, wal: FileId) -> bool {
    contains(&WAL_HERE, &(main, wal))
}

/// How many guarded connections of this process have the WAL `wal` open for the main file
/// `main`.
pub(crate) fn wal_open_count(main: FileId, wal: FileId) -> u32 {
    WAL_HERE
        .lock()
        .as_ref()
        .and_then(|m| m.get(&(main, wal)).copied())
        .unwrap_or(0)
}

/// The main file, other than `main`, for which a guarded connection of this process has the WAL
/// `wal` open: that connection's file was replaced at the path while it ran (a WAL's path follows
/// from its database's), so the WAL is the old file's.
pub(crate) fn wal_open_here_for_another(main: FileId, wal: FileId) -> Option<FileId> {
    let all = WAL_IDS
        .lock()
        .as_ref()
        .and_then(|m| m.get(&wal).copied())
        .unwrap_or(0);
    if all <= wal_open_count(main, wal) {
        return None;
    }
    // Rare: a file replaced under a connection of this process.
    let map = WAL_HERE.lock();
    map.as_ref()?
        .keys()
        .find(|(m, w)| *w == wal && *m != main)
        .map(|(m, _)| *m)
}

/// Who uses a `-shm`, as far as the kernel's lock table and this process's own maps say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShmUse {
    /// No `-shm` at the path.
    Absent,
    /// Nobody holds its dead-man-switch byte: no connection maps it.
    Unused,
    /// A guarded connection of this process maps it.
    Here,
    /// Some connection holds its dead-man-switch byte (another process, in any namespace, or an
    /// unguarded connection of this one).
    Held,
    /// The question could not be asked (unreadable, too many probes): taken as in use.
    Unknown,
}

impl ShmUse {
    /// Whether some connection may be using the `-shm`.
    pub(crate) fn in_use(self) -> bool {
        matches!(self, ShmUse::Here | ShmUse::Held | ShmUse::Unknown)
    }
}

/// Who uses the `-shm` at `shm_path` now.
pub(crate) fn shm_use(shm_path: &Path) -> ShmUse {
    let id = match identity_of_path(shm_path) {
        Ok(Some(id)) => id,
        Ok(None) => return ShmUse::Absent,
        Err(e) => {
            log::debug!(
                "hermes-guard: cannot stat {} ({e}): taken as in use",
                shm_path.display()
            );
            return ShmUse::Unknown;
        }
    };
    if shm_mapped_here(id) {
        return ShmUse::Here;
    }
    // Outside PROBES' lock, always in this order (see the module's docs).
    let _unix = UnixVfsMutex::enter();
    let mut probes = PROBES.lock();
    let probes = probes.get_or_insert_with(HashMap::new);
    release_idle(probes);
    if !probes.contains_key(&id) {
        if probes.len() >= MAX_PROBES {
            log::debug!(
                "hermes-guard: {} probe descriptors kept already: {} taken as in use",
                MAX_PROBES,
                shm_path.display()
            );
            return ShmUse::Unknown;
        }
        let fd = match open_probe(shm_path) {
            Ok(fd) => fd,
            Err(e) => {
                log::debug!(
                    "hermes-guard: cannot open {} to ask who holds it ({e}): taken as in use",
                    shm_path.display()
                );
                return ShmUse::Unknown;
            }
        };
        // Replaced between the stat and the open: kept under the opened file's own identity,
        // released as any kept probe is once nobody holds that file.
        let opened = identity_of_fd(&fd).unwrap_or(id);
        probes.insert(opened, fd);
        if opened != id {
            return ShmUse::Unknown;
        }
    }
    match write_lock_conflicts(probes[&id].as_raw_fd(), DMS) {
        Ok(true) => ShmUse::Held,
        Ok(false) => {
            // Nobody holds the byte: no connection of this process maps the file, so closing
            // the probe drops no lock of this process's.
            probes.remove(&id);
            ShmUse::Unused
        }
        Err(e) => {
            log::debug!(
                "hermes-guard: F_OFD_GETLK on {} failed ({e}): taken as in use",
                shm_path.display()
            );
            ShmUse::Unknown
        }
    }
}

/// Closes the kept probes whose `-shm` nobody holds any more (see the module's docs).
fn release_idle(probes: &mut HashMap<FileId, OwnedFd>) {
    probes.retain(|_, fd| !matches!(write_lock_conflicts(fd.as_raw_fd(), DMS), Ok(false)));
}

/// At the process's exit: the kept probes whose `-shm` nobody holds are closed (a descriptor
/// left open on a filesystem keeps it from being unmounted, and a FUSE filesystem served by this
/// process could not answer its close any later).
pub(crate) fn release_idle_probes() {
    // At exit another thread may be inside the unix VFS: then the probes stay open.
    let Some(_unix) = UnixVfsMutex::try_enter() else {
        return;
    };
    if let Some(mut probes) = PROBES.try_lock() {
        if let Some(probes) = probes.as_mut() {
            release_idle(probes);
        }
    }
}

/// A descriptor to ask the lock table with: read-only (a lock test needs no write access),
/// never following a symbolic link, non-blocking (a FIFO planted at the name).
fn open_probe(path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// Whether a write lock on byte `byte` of `fd`'s file would conflict with a lock someone holds
/// (`F_OFD_GETLK`: POSIX and OFD locks of every process, this one's included).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn write_lock_conflicts(fd: c_int, byte: i64) -> io::Result<bool> {
    use super::wal_index::sys::{holder, Holder, Kind};
    Ok(holder(fd, Kind::Write, byte, 1)? != Holder::Nobody)
}

/// Elsewhere the kernel cannot be asked this way: taken as in use by the caller.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn write_lock_conflicts(_: c_int, _: i64) -> io::Result<bool> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::wal_index::sys::{fcntl_flock, LockCmd};

    fn flock(ty: c_int) -> libc::flock {
        libc::flock {
            l_type: ty as _,
            l_whence: libc::SEEK_SET as _,
            l_start: DMS as _,
            l_len: 1,
            l_pid: 0,
        }
    }

    fn lock(fd: c_int, cmd: LockCmd, ty: c_int) {
        fcntl_flock(fd, cmd, &mut flock(ty)).unwrap();
    }

    #[test]
    fn a_shm_nobody_locks_is_unused_and_a_missing_one_absent() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("a.db-shm");
        assert_eq!(shm_use(&shm), ShmUse::Absent);
        std::fs::write(&shm, [0u8; 256]).unwrap();
        assert_eq!(shm_use(&shm), ShmUse::Unused);
    }

    #[test]
    fn a_posix_read_lock_of_this_process_on_the_dms_byte_is_seen_and_survives_the_probe() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("b.db-shm");
        std::fs::write(&shm, [0u8; 256]).unwrap();
        let holder = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&shm)
            .unwrap();
        lock(holder.as_raw_fd(), LockCmd::PosixSet, libc::F_RDLCK);
        assert_eq!(shm_use(&shm), ShmUse::Held);
        assert_eq!(
            shm_use(&shm),
            ShmUse::Held,
            "asked again through the kept probe"
        );
        // The probe was never closed: the POSIX lock is still there.
        let other = std::fs::File::open(&shm).unwrap();
        let mut fl = flock(libc::F_WRLCK);
        fcntl_flock(other.as_raw_fd(), LockCmd::OfdGet, &mut fl).unwrap();
        assert_ne!(c_int::from(fl.l_type), libc::F_UNLCK);
    }

    #[test]
    fn a_probe_of_a_shm_nobody_holds_is_closed_and_a_held_ones_kept_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("d.db-shm");
        std::fs::write(&shm, [0u8; 256]).unwrap();
        let id = identity_of_path(&shm).unwrap().unwrap();
        let kept = |id| PROBES.lock().as_ref().is_some_and(|m| m.contains_key(&id));
        assert_eq!(shm_use(&shm), ShmUse::Unused);
        assert!(!kept(id), "nobody holds it: the probe is closed");
        let holder = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&shm)
            .unwrap();
        lock(holder.as_raw_fd(), LockCmd::OfdSet, libc::F_RDLCK);
        assert_eq!(shm_use(&shm), ShmUse::Held);
        assert!(kept(id), "held: the probe is kept");
        drop(holder); // its OFD lock goes with its last descriptor
        release_idle_probes();
        assert!(!kept(id), "released once nobody holds it");
    }

    #[test]
    fn a_shm_mapped_by_a_guarded_connection_here_is_in_use_without_a_probe() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("c.db-shm");
        std::fs::write(&shm, [0u8; 256]).unwrap();
        let id = identity_of_path(&shm).unwrap().unwrap();
        let here = ShmHere::new(id);
        assert_eq!(shm_use(&shm), ShmUse::Here);
        drop(here);
        assert_eq!(shm_use(&shm), ShmUse::Unused);
    }

    #[test]
    fn a_wal_is_open_here_only_for_the_main_file_it_was_opened_for() {
        let (main, other, wal) = (
            FileId { dev: 1, ino: 10 },
            FileId { dev: 1, ino: 11 },
            FileId { dev: 1, ino: 12 },
        );
        let first = WalHere::new(main, wal);
        let second = WalHere::new(main, wal);
        assert!(wal_open_here(main, wal));
        assert!(!wal_open_here(other, wal));
        drop(first);
        assert!(wal_open_here(main, wal), "one connection still has it");
        drop(second);
        assert!(!wal_open_here(main, wal));
    }

    #[test]
    fn a_probe_waits_for_the_unix_vfs_mutex_a_shm_open_of_this_process_holds() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("state.db-shm");
        std::fs::write(&shm, [0u8; 32768]).unwrap();
        let (order, seen) = std::sync::mpsc::channel::<&str>();
        let (started, start) = std::sync::mpsc::channel::<()>();
        let holder = {
            let order = order.clone();
            std::thread::spawn(move || {
                // Stands for unixOpenSharedMemory between its open and its lock.
                let held = UnixVfsMutex::enter();
                started.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                order.send("unix VFS done").unwrap();
                drop(held);
            })
        };
        start.recv().unwrap();
        assert_eq!(shm_use(&shm), ShmUse::Unused);
        order.send("probe done").unwrap();
        holder.join().unwrap();
        assert_eq!(seen.recv().unwrap(), "unix VFS done");
        assert_eq!(seen.recv().unwrap(), "probe done");
    }
}
