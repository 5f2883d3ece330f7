//! One `-shm` file as this process maps it: its descriptor, its regions, the dead-man switch, and
//! the shared-memory locks of every guarded connection that maps it (SQLite's `unixShmNode`, keyed
//! by the `-shm`'s own inode instead of the main file's).

use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::ffi;

use super::sys::{self, Holder, Kind};
use crate::identity::{identity_of_fd, FileId};
use crate::vfs::fork::Origin;
use crate::vfs::locked_fds;

/// `UNIX_SHM_BASE`: the first lock byte, slot 0 (the WAL write lock).
pub(super) const LOCK_BASE: i64 = 120;
/// `SQLITE_SHM_NLOCK`: the lock slots.
pub(super) const SLOTS: i64 = 8;
/// `UNIX_SHM_DMS`: the dead-man switch, read-locked by every process that maps the file.
pub(super) const DMS: i64 = LOCK_BASE + SLOTS;

/// What SQLite calls a region's size (`WALINDEX_PGSZ`) is its argument; the growth step of the
/// file is fixed (`unixShmMap`'s `pgsz`).
const GROWTH_PAGE: i64 = 4096;

/// The nodes of this process, by the `-shm` they map. A node is here from its open until the last
/// connection unmaps it. Nodes a forked child inherited are not its own (their locks are the
/// parent's): the child makes new ones ([`Node::origin`]).
static NODES: Mutex<Option<HashMap<FileId, Arc<Node>>>> = Mutex::new(None);

/// The most descriptors of `-shm` files this process no longer maps but cannot close (see
/// [`park`]).
const MAX_PARKED: usize = 64;

/// Descriptors of `-shm` files no node maps any more, held open because somebody still held a lock
/// on the file when its node went: closing one would drop every POSIX lock this process holds on
/// that inode (a stock connection's, or another copy of SQLite's). Re-tested at every purge; a
/// new node on the same inode takes its descriptor back.
static PARKED: Mutex<Option<HashMap<FileId, (OwnedFd, bool)>>> = Mutex::new(None);

/// A `-shm` mapped by guarded connections of this process.
pub(crate) struct Node {
    pub(super) id: FileId,
    pub(super) path: CString,
    fd: OwnedFd,
    readonly: bool,
    origin: Origin,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The dead-man switch could not be taken yet (a read-only `-shm` nobody has set up):
    /// SQLite's `isUnlocked`, retried at each map.
    unlocked: bool,
    /// Region `i`'s address.
    regions: Vec<usize>,
    /// The mappings made: a region shares its mapping with its neighbours where the page is
    /// larger than a region.
    maps: Vec<sys::Mapping>,
    /// Per slot: how many connections hold it shared, or -1 for exclusive.
    locks: [i32; SLOTS as usize],
    /// Connections attached.
    refs: u32,
}

/// A connection's place in a node: the node, and the slots it holds.
pub(crate) struct Attached {
    pub(super) node: Arc<Node>,
    pub(super) held: Held,
}

/// The slots a connection holds, one bit each (SQLite's `sharedMask` and `exclMask`).
#[derive(Default)]
pub(crate) struct Held {
    shared: u8,
    exclusive: u8,
}

/// What opening a `-shm` found.
pub(super) enum Opened {
    Ready(Attached),
    /// Attached, but the `-shm` is read-only and nobody has set it up yet
    /// (`SQLITE_READONLY_CANTINIT`).
    CannotInit(Attached),
}

/// Finds the node of the `-shm` at `path` (`known`: its identity, when the caller knows it without
/// a `stat`), or opens one: a new `-shm` gets the main file's mode and owner (`mode_and_owner`), as
/// SQLite's does; `readonly_shm` is the URI parameter.
pub(super) fn attach(
    known: Option<FileId>,
    path: CString,
    mode_and_owner: super::ModeAndOwner,
    readonly_shm: bool,
) -> Result<Opened, c_int> {
    let origin = Origin::here();
    let mut nodes = NODES.lock();
    let nodes = nodes.get_or_insert_with(HashMap::new);
    if let Some(node) = known.and_then(|id| nodes.get(&id)) {
        if node.origin.current_cheap() {
            return Ok(Opened::Ready(node.join()));
        }
    }
    let at_path = rustix::fs::stat(path.as_c_str())
        .ok()
        .map(|st| FileId::of(&st));
    if let Some(node) = at_path.and_then(|id| nodes.get(&id)) {
        if node.origin.current_cheap() {
            return Ok(Opened::Ready(node.join()));
        }
    }
    let parked = at_path.and_then(|id| PARKED.lock().as_mut().and_then(|p| p.remove(&id)));
    let (fd, readonly) = match parked {
        Some(parked) => parked,
        None => {
            let (mode, owner) = mode_and_owner()?;
            open_file(&path, mode, owner, readonly_shm)?
        }
    };
    let id = identity_of_fd(&fd).map_err(|e| {
        log::warn!("hermes-guard: fstat of {path:?} failed: {e}");
        ffi::SQLITE_IOERR_SHMOPEN
    })?;
    if let Some(node) = nodes.get(&id) {
        if node.origin.current_cheap() {
            // Replaced back between the `stat` and the open: the node there is the one.
            park(id, fd, readonly);
            return Ok(Opened::Ready(node.join()));
        }
    }
    if !locked_fds::register(fd.as_raw_fd()) {
        // Mapped all the same (SQLite's own node is not tracked either): only a forked child that
        // outlives this process would keep the node's locks.
        log::warn!(
            "hermes-guard: too many locked descriptors in this process to track across fork: a \
             forked child shares this process's locks on {}",
            path.to_string_lossy()
        );
    }
    let node = Arc::new(Node {
        id,
        path,
        fd,
        readonly,
        origin,
        inner: Mutex::new(Inner {
            unlocked: false,
            regions: Vec::new(),
            maps: Vec::new(),
            locks: [0; SLOTS as usize],
            refs: 0,
        }),
    });
    let dms = node.lock_dead_man_switch();
    match dms {
        Ok(()) | Err(ffi::SQLITE_READONLY_CANTINIT) => {}
        Err(rc) => {
            node.purge();
            return Err(rc);
        }
    }
    node.inner.lock().unlocked = dms.is_err();
    nodes.insert(id, Arc::clone(&node));
    let attached = node.join();
    Ok(if dms.is_err() {
        Opened::CannotInit(attached)
    } else {
        Opened::Ready(attached)
    })
}

/// `robust_open` of the `-shm`: read-write and created unless `readonly_shm`, else (or when that
/// fails) read-only; a new file gets the main file's mode (the umask aside) and, as root, owner.
fn open_file(
    path: &CString,
    mode: u32,
    (uid, gid): (u32, u32),
    readonly_shm: bool,
) -> Result<(OwnedFd, bool), c_int> {
    let writable = if readonly_shm {
        None
    } else {
        sys::open(path, true, mode & 0o777).ok()
    };
    let (fd, readonly) = match writable {
        Some(fd) => (fd, false),
        None => match sys::open(path, false, mode & 0o777) {
            Ok(fd) => (fd, true),
            Err(e) => {
                log::warn!(
                    "hermes-guard: cannot open the shared memory {}: {e}",
                    path.to_string_lossy()
                );
                return Err(ffi::SQLITE_CANTOPEN);
            }
        },
    };
    if let Ok(st) = rustix::fs::fstat(&fd) {
        if st.st_size == 0 && (st.st_mode & 0o777) != (mode & 0o777) && !readonly {
            let _ = rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode & 0o777));
        }
    }
    if rustix::process::geteuid().is_root() {
        // SAFETY-free: rustix's fchown; a failure leaves the file root's, as SQLite's does.
        let _ = rustix::fs::fchown(
            &fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
    }
    Ok((fd, readonly))
}

/// Keeps `fd` open (see [`PARKED`]) or closes it when nobody holds a lock on its file.
fn park(id: FileId, fd: OwnedFd, readonly: bool) {
    let mut parked = PARKED.lock();
    let parked = parked.get_or_insert_with(HashMap::new);
    // The ones parked before: closed once nobody holds their file.
    parked.retain(|_, (fd, _)| is_held(fd));
    if !is_held(&fd) {
        return;
    }
    if parked.len() >= MAX_PARKED && !held_by_this_process(&fd) {
        return;
    }
    if parked.len() >= MAX_PARKED {
        log::warn!(
            "hermes-guard: {} -shm descriptors held open in this process past their last use \
             (another copy of SQLite here still locks those files)",
            parked.len() + 1
        );
    }
    // A second descriptor of the same file: the first one stays, this one may close only if the
    // test above said nobody holds it, which it did not.
    parked.entry(id).or_insert((fd, readonly));
}

/// Somebody holds a lock on the `-shm`'s lock bytes (in any process, this one's POSIX locks
/// included: they conflict with this description's OFD locks).
fn is_held(fd: &OwnedFd) -> bool {
    !matches!(
        sys::holder(fd.as_raw_fd(), Kind::Write, LOCK_BASE, SLOTS + 1),
        Ok(Holder::Nobody)
    )
}

fn held_by_this_process(fd: &OwnedFd) -> bool {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    matches!(
        sys::holder(fd.as_raw_fd(), Kind::Write, LOCK_BASE, SLOTS + 1),
        Ok(Holder::Reader { pid } | Holder::Writer { pid }) if pid == me
    )
}

/// A byte of the `-shm` no SQLite locks: a guarded connection that puts a fresh `-shm` in place of
/// one describing another WAL holds it (write, on the old file) from its check of the path to its
/// rename, so that two connections deciding at once do not both replace, the second one over the
/// first one's fresh file.
const REPLACING: i64 = DMS + 8;

/// Puts a fresh, empty `-shm` at `path` in place of `node`'s file, if that is still the one there
/// (another guarded connection may have replaced it first): a new file with the main file's
/// `mode` and owner, renamed over the old one. Connections that map the old file keep it.
pub(super) fn replace_file(node: &Node, mode: u32, (uid, gid): (u32, u32)) -> Result<(), c_int> {
    let fd = node.fd.as_raw_fd();
    if sys::set_lock(fd, Kind::Write, REPLACING, 1).is_err() {
        return Err(ffi::SQLITE_BUSY);
    }
    let result = (|| {
        let here = rustix::fs::stat(node.path.as_c_str())
            .ok()
            .map(|st| FileId::of(&st));
        if here != Some(node.id) {
            return Ok(());
        }
        let mut fresh = node.path.as_bytes().to_vec();
        fresh.extend_from_slice(
            format!(
                ".hermes-guard-{}",
                rustix::process::getpid().as_raw_nonzero()
            )
            .as_bytes(),
        );
        let fresh = CString::new(fresh).map_err(|_| ffi::SQLITE_CANTOPEN)?;
        let made = sys::open_new(&fresh, mode & 0o777).map_err(|e| {
            log::warn!(
                "hermes-guard: cannot make a fresh shared memory {}: {e}",
                fresh.to_string_lossy()
            );
            ffi::SQLITE_CANTOPEN
        })?;
        let _ = rustix::fs::fchmod(&made, rustix::fs::Mode::from_raw_mode(mode & 0o777));
        if rustix::process::geteuid().is_root() {
            let _ = rustix::fs::fchown(
                &made,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            );
        }
        drop(made);
        rustix::fs::rename(fresh.as_c_str(), node.path.as_c_str()).map_err(|e| {
            let _ = rustix::fs::unlink(fresh.as_c_str());
            log::warn!(
                "hermes-guard: cannot put a fresh shared memory at {}: {e}",
                node.path.to_string_lossy()
            );
            ffi::SQLITE_IOERR_SHMOPEN
        })
    })();
    let _ = sys::set_lock(fd, Kind::Unlock, REPLACING, 1);
    result
}

impl Node {
    fn join(self: &Arc<Self>) -> Attached {
        self.inner.lock().refs += 1;
        Attached {
            node: Arc::clone(self),
            held: Held::default(),
        }
    }

    /// `unixLockSharedMemory`: the dead-man switch. Nobody holds it: this process is the first,
    /// takes it exclusively and truncates the file (whatever a crash left in it is stale), then
    /// holds it shared; somebody holds it shared: shared too; somebody is truncating: busy.
    fn lock_dead_man_switch(&self) -> Result<(), c_int> {
        let fd = self.fd.as_raw_fd();
        match sys::holder(fd, Kind::Write, DMS, 1) {
            Err(_) => return Err(ffi::SQLITE_IOERR_LOCK),
            Ok(Holder::Writer { .. }) => return Err(ffi::SQLITE_BUSY),
            Ok(Holder::Reader { .. }) => {}
            Ok(Holder::Nobody) if self.readonly => return Err(ffi::SQLITE_READONLY_CANTINIT),
            Ok(Holder::Nobody) => {
                if sys::set_lock(fd, Kind::Write, DMS, 1).is_err() {
                    return Err(ffi::SQLITE_BUSY);
                }
                if let Err(e) = sys::truncate(&self.fd, 3) {
                    log::warn!(
                        "hermes-guard: cannot truncate {}: {e}",
                        self.path.to_string_lossy()
                    );
                    return Err(ffi::SQLITE_IOERR_SHMOPEN);
                }
            }
        }
        sys::set_lock(fd, Kind::Read, DMS, 1).map_err(|_| ffi::SQLITE_BUSY)
    }

    /// `unixShmMap`: region `region` of `size` bytes, the file grown to hold it where `extend`.
    /// The address (NULL when the region does not exist and may not be made) and SQLite's code.
    pub(super) fn map(&self, region: usize, size: usize, extend: bool) -> (usize, c_int) {
        let mut inner = self.inner.lock();
        let mut rc = ffi::SQLITE_OK;
        if inner.unlocked {
            match self.lock_dead_man_switch() {
                Ok(()) => inner.unlocked = false,
                Err(e) => rc = e,
            }
        }
        if rc == ffi::SQLITE_OK {
            rc = self.grow(&mut inner, region, size, extend);
        }
        let addr = inner.regions.get(region).copied().unwrap_or(0);
        if self.readonly && rc == ffi::SQLITE_OK {
            rc = ffi::SQLITE_READONLY;
        }
        (addr, rc)
    }

    fn grow(&self, inner: &mut Inner, region: usize, size: usize, extend: bool) -> c_int {
        let per_map = (sys::page_size() / size.max(1)).max(1);
        let wanted = (region + per_map) / per_map * per_map;
        if inner.regions.len() >= wanted {
            return ffi::SQLITE_OK;
        }
        let bytes = (wanted * size) as i64;
        let st = match rustix::fs::fstat(&self.fd) {
            Ok(st) => st,
            Err(_) => return ffi::SQLITE_IOERR_SHMSIZE,
        };
        if st.st_size < bytes {
            if !extend {
                return ffi::SQLITE_OK;
            }
            for page in st.st_size / GROWTH_PAGE..bytes / GROWTH_PAGE {
                if let Err(e) = sys::write_zero_byte(&self.fd, page * GROWTH_PAGE + GROWTH_PAGE - 1)
                {
                    log::warn!(
                        "hermes-guard: cannot grow {}: {e}",
                        self.path.to_string_lossy()
                    );
                    return ffi::SQLITE_IOERR_SHMSIZE;
                }
            }
        }
        while inner.regions.len() < wanted {
            let len = size * per_map;
            let offset = (size * inner.regions.len()) as i64;
            let mapping = match sys::map(&self.fd, len, offset, self.readonly) {
                Ok(mapping) => mapping,
                Err(e) => {
                    log::warn!(
                        "hermes-guard: cannot map {}: {e}",
                        self.path.to_string_lossy()
                    );
                    return ffi::SQLITE_IOERR_SHMMAP;
                }
            };
            let addr = mapping.addr();
            inner.maps.push(mapping);
            // Listed before any connection can use it, so a forked child maps it again from a
            // description of its own (`locked_fds.rs`). A full table: the child would share the
            // parent's description through this mapping; said, not refused.
            if !locked_fds::map_region(self.fd.as_raw_fd(), addr, len, offset as usize) {
                log::warn!(
                    "hermes-guard: too many shared-memory regions in this process to track across \
                     fork: a forked child keeps its parent's description of {}",
                    self.path.to_string_lossy()
                );
            }
            inner.regions.extend((0..per_map).map(|i| addr + i * size));
        }
        ffi::SQLITE_OK
    }

    /// `unixShmLock` for the connection `me`: the same accounting (a slot's count of shared
    /// holders in this process, -1 when one holds it exclusively), an OFD lock on the file where
    /// the process's hold changes. Never waits.
    pub(super) fn lock(&self, me: &mut Held, ofst: c_int, n: c_int, flags: c_int) -> c_int {
        if !(0..SLOTS as c_int).contains(&ofst) || n < 1 || ofst + n > SLOTS as c_int {
            return ffi::SQLITE_IOERR_SHMLOCK;
        }
        let mask = (((1u32 << (ofst + n)) - (1u32 << ofst)) & 0xff) as u8;
        let unlock = flags & ffi::SQLITE_SHM_UNLOCK != 0;
        let shared = flags & ffi::SQLITE_SHM_SHARED != 0;
        let work = if unlock {
            (me.shared | me.exclusive) & mask != 0
        } else {
            !shared || me.shared & mask == 0
        };
        if !work {
            return ffi::SQLITE_OK;
        }
        if !self.origin.current_cheap() {
            // A forked child's copy of a parent's connection: its locks are the parent's. A
            // release forgets; nothing is taken.
            if unlock {
                me.shared &= !mask;
                me.exclusive &= !mask;
                return ffi::SQLITE_OK;
            }
            return ffi::SQLITE_BUSY;
        }
        let fd = self.fd.as_raw_fd();
        let (first, count) = (ofst as usize, n as usize);
        let start = LOCK_BASE + ofst as i64;
        let mut inner = self.inner.lock();
        let locks = &mut inner.locks;
        if unlock {
            if shared && locks[first] > 1 {
                locks[first] -= 1;
                me.shared &= !mask;
                return ffi::SQLITE_OK;
            }
            if sys::set_lock(fd, Kind::Unlock, start, n as i64).is_err() {
                return ffi::SQLITE_IOERR_UNLOCK;
            }
            locks[first..first + count].fill(0);
            me.shared &= !mask;
            me.exclusive &= !mask;
            ffi::SQLITE_OK
        } else if shared {
            if locks[first] < 0 {
                return ffi::SQLITE_BUSY;
            }
            if locks[first] == 0 && sys::set_lock(fd, Kind::Read, start, 1).is_err() {
                return ffi::SQLITE_BUSY;
            }
            locks[first] += 1;
            me.shared |= mask;
            ffi::SQLITE_OK
        } else {
            if locks[first..first + count].iter().any(|&l| l != 0) {
                return ffi::SQLITE_BUSY;
            }
            if sys::set_lock(fd, Kind::Write, start, n as i64).is_err() {
                return ffi::SQLITE_BUSY;
            }
            locks[first..first + count].fill(-1);
            me.exclusive |= mask;
            ffi::SQLITE_OK
        }
    }

    /// Somebody outside this node reads the database (`SQLITE_FCNTL_EXTERNAL_READER`): a lock on
    /// one of the read slots.
    pub(super) fn external_reader(&self) -> Result<bool, c_int> {
        match sys::holder(self.fd.as_raw_fd(), Kind::Write, LOCK_BASE + 3, SLOTS - 3) {
            Ok(holder) => Ok(holder != Holder::Nobody),
            Err(_) => Err(ffi::SQLITE_IOERR_LOCK),
        }
    }

    /// Whether the dead-man switch is held by this node, in this process (the status: a forked
    /// child's copy holds nothing).
    pub(super) fn dead_man_switch_held(&self) -> bool {
        self.origin.current_cheap() && !self.inner.lock().unlocked
    }

    /// Whether somebody else (another process, or a stock connection of this one) maps the `-shm`.
    pub(super) fn shared_beyond_node(&self) -> bool {
        !matches!(
            sys::holder(self.fd.as_raw_fd(), Kind::Write, DMS, 1),
            Ok(Holder::Nobody)
        )
    }

    /// `unixShmUnmap`: the connection `me` lets go (releasing what it still holds); with the last
    /// one, the file is unlinked where `delete` and it is still the one at its path, and the node
    /// goes.
    pub(super) fn detach(me: Attached, delete: bool) {
        let Attached { node, mut held } = me;
        for slot in 0..SLOTS as c_int {
            let bit = 1u8 << slot;
            let kind = if held.exclusive & bit != 0 {
                ffi::SQLITE_SHM_EXCLUSIVE
            } else if held.shared & bit != 0 {
                ffi::SQLITE_SHM_SHARED
            } else {
                continue;
            };
            node.lock(&mut held, slot, 1, ffi::SQLITE_SHM_UNLOCK | kind);
        }
        let mut nodes = NODES.lock();
        let last = {
            let mut inner = node.inner.lock();
            inner.refs = inner.refs.saturating_sub(1);
            inner.refs == 0
        };
        if !last {
            return;
        }
        if let Some(map) = nodes.as_mut() {
            if map.get(&node.id).is_some_and(|n| Arc::ptr_eq(n, &node)) {
                map.remove(&node.id);
            }
        }
        drop(nodes);
        if delete && !node.readonly && node.origin.current_cheap() {
            // By name, as SQLite does, but only the file this node maps: a `-shm` made anew at the
            // path meanwhile is another generation's.
            let here = rustix::fs::stat(node.path.as_c_str())
                .ok()
                .map(|st| FileId::of(&st));
            if here == Some(node.id) {
                let _ = rustix::fs::unlink(node.path.as_c_str());
            }
        }
        node.purge();
    }

    /// The `u32` at `addr` in one of this node's mappings (`None` outside them), for tests.
    #[cfg(test)]
    pub(super) fn read_mapped_u32(&self, addr: usize) -> Option<u32> {
        let inner = self.inner.lock();
        inner.maps.iter().find_map(|m| m.read_u32(addr))
    }

    /// Writes `value` at `addr` in one of this node's writable mappings (`false`: none holds
    /// it), for tests.
    #[cfg(test)]
    pub(super) fn write_mapped_u32(&self, addr: usize, value: u32) -> bool {
        let inner = self.inner.lock();
        inner.maps.iter().any(|m| m.write_u32(addr, value))
    }

    /// Unlocks, unmaps, and closes or parks the descriptor. Only for a node no connection maps.
    fn purge(self: Arc<Self>) {
        let here = self.origin.current_cheap();
        {
            let mut inner = self.inner.lock();
            let fd = self.fd.as_raw_fd();
            if here {
                // Explicitly: a mapping keeps the description, and its locks, alive past a close.
                let _ = sys::set_lock(fd, Kind::Unlock, LOCK_BASE, SLOTS + 1);
            }
            locked_fds::forget_regions(fd);
            // No connection maps the node any more, and the state dropped its view of region 0
            // before its unmap: nothing reads through these addresses now.
            for mapping in inner.maps.drain(..) {
                mapping.unmap();
            }
            inner.regions.clear();
            locked_fds::unregister(fd);
        }
        match Arc::try_unwrap(self) {
            Ok(node) if here => park(node.id, node.fd, node.readonly),
            // A forked child's copy: its descriptor is its own (detached at the fork) and holds
            // no lock; closing it drops no lock of the parent's.
            Ok(_) => {}
            Err(still) => log::warn!(
                "hermes-guard: the wal-index node of {} is referenced after its last connection \
                 left; its descriptor stays open",
                still.path.to_string_lossy()
            ),
        }
    }
}
