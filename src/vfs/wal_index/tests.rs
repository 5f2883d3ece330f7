//! The wal-index node on real files in a temporary directory, against SQLite's protocol
//! (`os_unix.c`): the dead-man switch (`unixLockSharedMemory`), the growth and the mapping
//! (`unixShmMap`), the lock accounting (`unixShmLock`) and the unmap (`unixShmUnmap`).
//!
//! "Another process" is played by another open file description of the same file, locking with
//! `F_OFD_SETLK` (an OFD lock conflicts with the node's as another process's would), or by this
//! process's POSIX locks (a stock connection of this process). What the node holds is read from
//! such a description with `F_OFD_GETLK`, which never reports the asking description's own
//! locks. Every lock here is written out as its own `struct flock`, not through `sys.rs`'s, so
//! that the checks do not share the code they check; only the `fcntl` itself is `sys.rs`'s.

use std::ffi::{c_int, CString};
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::ffi;

use super::node::{self, Attached, Node, Opened, DMS, LOCK_BASE};
use super::sys::{self, LockCmd};

/// SQLite's region size (`WALINDEX_PGSZ`).
const REGION: usize = 32 * 1024;

const SHARED: c_int = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_SHARED;
const EXCLUSIVE: c_int = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE;
const UNLOCK_SHARED: c_int = ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_SHARED;
const UNLOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE;

/// The first read-mark slot (`WAL_READ_LOCK(0)`).
const READ_SLOT: c_int = 3;

/// A `-shm` path in a fresh temporary directory (kept alive by the returned guard).
fn shm_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db-shm");
    (dir, path)
}

/// A `-shm` left behind with `len` bytes of `0xA5`: what a crash or a previous generation leaves.
fn stale_shm(path: &Path, len: usize) {
    fs::write(path, vec![0xA5u8; len]).unwrap();
}

fn open(path: &Path, readonly_shm: bool) -> Result<Opened, c_int> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let owner = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    node::attach(None, c, Box::new(move || Ok((0o644, owner))), readonly_shm)
}

/// Attaches a connection to the node of `path`, which must be ready.
fn attach(path: &Path) -> Attached {
    match open(path, false) {
        Ok(Opened::Ready(me)) => me,
        Ok(Opened::CannotInit(_)) => panic!("{path:?}: SQLITE_READONLY_CANTINIT"),
        Err(rc) => panic!("{path:?}: attach failed with {rc}"),
    }
}

/// `xShmLock` for the connection `me`.
fn lock(me: &mut Attached, ofst: c_int, n: c_int, flags: c_int) -> c_int {
    me.node.lock(&mut me.held, ofst, n, flags)
}

fn len(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

/// What `unixShmMap` grows the file to for `region`: whole groups of regions, one group per
/// system page when the page is larger than a region (`unixShmRegionPerMap`).
fn grown_len(region: usize) -> u64 {
    let page = sys::page_size();
    let per_map = (page / REGION).max(1);
    ((region + per_map) / per_map * per_map * REGION) as u64
}

/// `l_pid` must be 0 for OFD locks.
fn flock(kind: c_int, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

/// Another open file description of the `-shm`: another process's view of it, or a stock
/// connection's of this process (`posix`).
struct Other(File);

impl Other {
    fn open(path: &Path) -> Other {
        Other(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap(),
        )
    }

    fn fcntl(&self, cmd: LockCmd, fl: &mut libc::flock) -> bool {
        sys::fcntl_flock(self.0.as_raw_fd(), cmd, fl).is_ok()
    }

    /// An OFD lock of `kind` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`) on this description: whether taken.
    fn ofd(&self, kind: c_int, start: i64, len: i64) -> bool {
        self.fcntl(LockCmd::OfdSet, &mut flock(kind, start, len))
    }

    /// A POSIX lock of this process, as a stock SQLite connection here takes it.
    fn posix(&self, kind: c_int, start: i64, len: i64) -> bool {
        self.fcntl(LockCmd::PosixSet, &mut flock(kind, start, len))
    }

    /// The strongest lock in the way of a write lock on `len` bytes at `start`, as this
    /// description sees it (its own locks aside): `F_UNLCK`, `F_RDLCK` or `F_WRLCK`, and the
    /// holder's pid (-1 for an OFD lock).
    fn seen(&self, start: i64, len: i64) -> (c_int, i32) {
        let mut fl = flock(libc::F_WRLCK, start, len);
        assert!(self.fcntl(LockCmd::OfdGet, &mut fl));
        (c_int::from(fl.l_type), fl.l_pid)
    }

    fn seen_kind(&self, start: i64, len: i64) -> c_int {
        self.seen(start, len).0
    }

    fn slot(slot: c_int) -> i64 {
        LOCK_BASE + i64::from(slot)
    }
}

// --- The dead-man switch (`unixLockSharedMemory`) ---

#[test]
fn the_first_to_map_truncates_a_stale_shm_to_three_bytes_and_holds_the_dms_shared() {
    let (_dir, path) = shm_path();
    stale_shm(&path, 3 * REGION);
    let me = attach(&path);
    assert_eq!(len(&path), 3, "truncated to 3 bytes, as SQLite does");
    let other = Other::open(&path);
    assert_eq!(
        other.seen(DMS, 1),
        (libc::F_RDLCK, -1),
        "the node reads the DMS"
    );
    assert!(other.ofd(libc::F_RDLCK, DMS, 1), "a second mapper joins");
    assert!(
        !other.ofd(libc::F_WRLCK, DMS, 1),
        "nobody may truncate it now"
    );
    Node::detach(me, false);
}

#[test]
fn the_first_to_map_creates_a_missing_shm_with_three_bytes() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    assert_eq!(len(&path), 3);
    Node::detach(me, false);
}

#[test]
fn a_dms_read_locked_by_another_description_is_joined_without_truncating() {
    let (_dir, path) = shm_path();
    stale_shm(&path, 2 * REGION);
    let other = Other::open(&path);
    assert!(other.ofd(libc::F_RDLCK, DMS, 1));
    let me = attach(&path);
    assert_eq!(
        len(&path),
        2 * REGION as u64,
        "the file another mapper uses is kept"
    );
    let mut first = [0u8; 1];
    other.0.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(first, [0xA5], "its contents too");
    assert!(other.ofd(libc::F_UNLCK, DMS, 1));
    assert_eq!(
        other.seen_kind(DMS, 1),
        libc::F_RDLCK,
        "the node holds it shared too"
    );
    Node::detach(me, false);
}

#[test]
fn a_dms_read_locked_by_a_posix_lock_of_this_process_is_joined_without_truncating() {
    // A stock connection of this process maps the file (SQLite's node, POSIX locks).
    let (_dir, path) = shm_path();
    stale_shm(&path, REGION);
    let stock = Other::open(&path);
    assert!(stock.posix(libc::F_RDLCK, DMS, 1));
    let me = attach(&path);
    assert_eq!(len(&path), REGION as u64);
    Node::detach(me, false);
}

#[test]
fn a_dms_write_locked_by_another_description_answers_busy_and_leaves_the_file() {
    let (_dir, path) = shm_path();
    stale_shm(&path, REGION);
    let other = Other::open(&path);
    assert!(
        other.ofd(libc::F_WRLCK, DMS, 1),
        "another mapper is truncating"
    );
    match open(&path, false) {
        Err(rc) => assert_eq!(rc, ffi::SQLITE_BUSY),
        Ok(_) => panic!("attached while another description wrote the DMS"),
    }
    assert_eq!(len(&path), REGION as u64, "not truncated");
    // Once the other lets go without ever downgrading (it died), the next map is the first.
    assert!(other.ofd(libc::F_UNLCK, DMS, 1));
    let me = attach(&path);
    assert_eq!(len(&path), 3);
    Node::detach(me, false);
}

#[test]
fn a_readonly_shm_nobody_set_up_cannot_init_until_somebody_holds_the_dms() {
    let (_dir, path) = shm_path();
    stale_shm(&path, REGION);
    let me = match open(&path, true) {
        Ok(Opened::CannotInit(me)) => me,
        Ok(Opened::Ready(_)) => panic!("a read-only -shm nobody holds is ready"),
        Err(rc) => panic!("attach failed with {rc}"),
    };
    assert_eq!(
        me.node.map(0, REGION, false),
        (0, ffi::SQLITE_READONLY_CANTINIT),
        "still nobody holds it: retried at the map, refused again"
    );
    let other = Other::open(&path);
    assert!(other.ofd(libc::F_RDLCK, DMS, 1), "a writer maps it now");
    let (addr, rc) = me.node.map(0, REGION, false);
    assert_eq!(rc, ffi::SQLITE_READONLY, "mapped, read-only");
    assert_ne!(addr, 0);
    assert_eq!(
        len(&path),
        REGION as u64,
        "never truncated by a read-only mapper"
    );
    Node::detach(me, true);
    assert!(path.exists(), "a read-only mapper deletes nothing");
}

// --- Growth and mapping (`unixShmMap`) ---

#[test]
fn mapping_a_region_with_extend_grows_the_file_to_whole_region_groups() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    let (first, rc) = me.node.map(0, REGION, true);
    assert_eq!(rc, ffi::SQLITE_OK);
    assert_ne!(first, 0);
    assert_eq!(len(&path), grown_len(0));
    let (third, rc) = me.node.map(2, REGION, true);
    assert_eq!(rc, ffi::SQLITE_OK);
    assert_ne!(third, 0);
    assert_eq!(len(&path), grown_len(2));
    assert_eq!(
        me.node.map(0, REGION, true),
        (first, ffi::SQLITE_OK),
        "a region keeps its address as the file grows"
    );
    Node::detach(me, false);
}

#[test]
fn growth_writes_every_new_page_so_the_file_has_no_hole() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    assert_eq!(me.node.map(1, REGION, true).1, ffi::SQLITE_OK);
    let file = File::open(&path).unwrap();
    let hole = rustix::fs::seek(&file, rustix::fs::SeekFrom::Hole(0)).unwrap();
    assert_eq!(
        hole,
        len(&path),
        "a one-byte write per 4 KiB page, not a sparse ftruncate"
    );
    assert!(fs::read(&path).unwrap().iter().all(|&b| b == 0));
    Node::detach(me, false);
}

#[test]
fn a_mapped_region_is_the_files_bytes_both_ways() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    let (addr, rc) = me.node.map(1, REGION, true);
    assert_eq!(rc, ffi::SQLITE_OK);
    let other = Other::open(&path);
    assert!(me.node.write_mapped_u32(addr + 8, 0xDEAD_BEEF));
    let mut word = [0u8; 4];
    other.0.read_exact_at(&mut word, REGION as u64 + 8).unwrap();
    assert_eq!(u32::from_ne_bytes(word), 0xDEAD_BEEF);
    other
        .0
        .write_all_at(&0x0BAD_F00Du32.to_ne_bytes(), REGION as u64 + 16)
        .unwrap();
    assert_eq!(me.node.read_mapped_u32(addr + 16), Some(0x0BAD_F00D));
    Node::detach(me, false);
}

#[test]
fn two_connections_of_a_process_share_one_node_and_its_regions() {
    let (_dir, path) = shm_path();
    let a = attach(&path);
    let b = attach(&path);
    assert!(Arc::ptr_eq(&a.node, &b.node));
    let (addr, _) = a.node.map(0, REGION, true);
    assert_eq!(b.node.map(0, REGION, false), (addr, ffi::SQLITE_OK));
    Node::detach(a, false);
    Node::detach(b, false);
}

#[test]
fn without_extend_a_region_past_the_end_is_null_and_ok() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    assert_eq!(
        me.node.map(0, REGION, false),
        (0, ffi::SQLITE_OK),
        "a 3-byte file has no region 0"
    );
    assert_eq!(len(&path), 3, "and is not grown");
    assert_eq!(me.node.map(0, REGION, true).1, ffi::SQLITE_OK);
    let grown = len(&path);
    assert_eq!(me.node.map(5, REGION, false), (0, ffi::SQLITE_OK));
    assert_eq!(len(&path), grown);
    Node::detach(me, false);
}

#[test]
fn without_extend_a_region_another_mapper_grew_is_mapped() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    let other = Other::open(&path);
    assert!(other.ofd(libc::F_RDLCK, DMS, 1));
    other.0.set_len(grown_len(1)).unwrap();
    let (addr, rc) = me.node.map(1, REGION, false);
    assert_eq!(rc, ffi::SQLITE_OK);
    assert_ne!(addr, 0);
    Node::detach(me, false);
}

// --- The lock accounting (`unixShmLock`) ---

#[test]
fn a_slot_shared_by_two_connections_keeps_its_lock_until_the_last_release() {
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let mut b = attach(&path);
    let other = Other::open(&path);
    let byte = Other::slot(READ_SLOT);
    assert_eq!(lock(&mut a, READ_SLOT, 1, SHARED), ffi::SQLITE_OK);
    assert_eq!(lock(&mut b, READ_SLOT, 1, SHARED), ffi::SQLITE_OK);
    assert_eq!(other.seen_kind(byte, 1), libc::F_RDLCK);
    assert_eq!(lock(&mut a, READ_SLOT, 1, UNLOCK_SHARED), ffi::SQLITE_OK);
    assert_eq!(
        other.seen_kind(byte, 1),
        libc::F_RDLCK,
        "b still reads: the process keeps the file lock"
    );
    assert!(!other.ofd(libc::F_WRLCK, byte, 1));
    assert_eq!(lock(&mut b, READ_SLOT, 1, UNLOCK_SHARED), ffi::SQLITE_OK);
    assert_eq!(other.seen_kind(byte, 1), libc::F_UNLCK);
    Node::detach(a, false);
    Node::detach(b, false);
}

#[test]
fn a_shared_lock_taken_twice_by_one_connection_is_released_by_one_unlock() {
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let other = Other::open(&path);
    let byte = Other::slot(READ_SLOT);
    assert_eq!(lock(&mut a, READ_SLOT, 1, SHARED), ffi::SQLITE_OK);
    assert_eq!(lock(&mut a, READ_SLOT, 1, SHARED), ffi::SQLITE_OK);
    assert_eq!(lock(&mut a, READ_SLOT, 1, UNLOCK_SHARED), ffi::SQLITE_OK);
    assert_eq!(other.seen_kind(byte, 1), libc::F_UNLCK);
    Node::detach(a, false);
}

#[test]
fn an_exclusive_lock_is_refused_while_another_connection_holds_the_slot_shared() {
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let mut b = attach(&path);
    let other = Other::open(&path);
    assert_eq!(lock(&mut a, READ_SLOT, 1, SHARED), ffi::SQLITE_OK);
    assert_eq!(lock(&mut b, READ_SLOT, 1, EXCLUSIVE), ffi::SQLITE_BUSY);
    assert_eq!(
        lock(&mut b, 1, 7, EXCLUSIVE),
        ffi::SQLITE_BUSY,
        "a range over the shared slot (recovery's) too"
    );
    assert_eq!(
        lock(&mut b, 0, 1, EXCLUSIVE),
        ffi::SQLITE_OK,
        "other slots are free"
    );
    assert_eq!(lock(&mut b, 0, 1, UNLOCK_EXCLUSIVE), ffi::SQLITE_OK);
    assert_eq!(lock(&mut a, READ_SLOT, 1, UNLOCK_SHARED), ffi::SQLITE_OK);
    assert_eq!(lock(&mut b, READ_SLOT, 1, EXCLUSIVE), ffi::SQLITE_OK);
    assert_eq!(other.seen_kind(Other::slot(READ_SLOT), 1), libc::F_WRLCK);
    Node::detach(a, false);
    Node::detach(b, false);
}

#[test]
fn a_shared_lock_is_refused_while_another_connection_holds_the_slot_exclusively() {
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let mut b = attach(&path);
    assert_eq!(lock(&mut a, READ_SLOT, 1, EXCLUSIVE), ffi::SQLITE_OK);
    assert_eq!(lock(&mut b, READ_SLOT, 1, SHARED), ffi::SQLITE_BUSY);
    assert_eq!(lock(&mut a, READ_SLOT, 1, UNLOCK_EXCLUSIVE), ffi::SQLITE_OK);
    assert_eq!(lock(&mut b, READ_SLOT, 1, SHARED), ffi::SQLITE_OK);
    Node::detach(a, false);
    Node::detach(b, false);
}

#[test]
fn another_descriptions_read_lock_makes_an_exclusive_lock_busy() {
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let other = Other::open(&path);
    assert!(other.ofd(libc::F_RDLCK, LOCK_BASE, 1), "a reader elsewhere");
    assert_eq!(lock(&mut a, 0, 1, EXCLUSIVE), ffi::SQLITE_BUSY);
    assert_eq!(
        lock(&mut a, 0, 1, SHARED),
        ffi::SQLITE_OK,
        "read beside read"
    );
    assert_eq!(lock(&mut a, 0, 1, UNLOCK_SHARED), ffi::SQLITE_OK);
    assert!(other.ofd(libc::F_UNLCK, LOCK_BASE, 1));
    assert_eq!(
        lock(&mut a, 0, 1, EXCLUSIVE),
        ffi::SQLITE_OK,
        "the refusal counted nothing"
    );
    Node::detach(a, false);
}

#[test]
fn another_descriptions_write_lock_makes_a_shared_lock_busy() {
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let mut b = attach(&path);
    let other = Other::open(&path);
    let byte = Other::slot(READ_SLOT);
    assert!(other.ofd(libc::F_WRLCK, byte, 1), "a writer elsewhere");
    assert_eq!(lock(&mut a, READ_SLOT, 1, SHARED), ffi::SQLITE_BUSY);
    assert!(other.ofd(libc::F_UNLCK, byte, 1));
    assert_eq!(
        lock(&mut b, READ_SLOT, 1, EXCLUSIVE),
        ffi::SQLITE_OK,
        "a's refused shared lock was not counted"
    );
    Node::detach(a, false);
    Node::detach(b, false);
}

#[test]
fn a_posix_lock_of_this_process_makes_the_node_busy() {
    // A stock connection of this process holds the WAL write lock.
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let stock = Other::open(&path);
    assert!(stock.posix(libc::F_WRLCK, LOCK_BASE, 1));
    assert_eq!(lock(&mut a, 0, 1, EXCLUSIVE), ffi::SQLITE_BUSY);
    assert_eq!(lock(&mut a, 0, 1, SHARED), ffi::SQLITE_BUSY);
    assert!(stock.posix(libc::F_UNLCK, LOCK_BASE, 1));
    assert_eq!(lock(&mut a, 0, 1, EXCLUSIVE), ffi::SQLITE_OK);
    assert!(
        !stock.posix(libc::F_RDLCK, LOCK_BASE, 1),
        "and the node's lock keeps the stock connection out"
    );
    Node::detach(a, false);
}

#[test]
fn a_detach_releases_the_slots_the_connection_still_holds() {
    let (_dir, path) = shm_path();
    let mut a = attach(&path);
    let b = attach(&path);
    let other = Other::open(&path);
    assert_eq!(lock(&mut a, 0, 1, EXCLUSIVE), ffi::SQLITE_OK);
    assert_eq!(lock(&mut a, READ_SLOT, 1, SHARED), ffi::SQLITE_OK);
    Node::detach(a, false);
    assert_eq!(other.seen_kind(LOCK_BASE, 8), libc::F_UNLCK);
    assert_eq!(
        other.seen_kind(DMS, 1),
        libc::F_RDLCK,
        "b still maps the file"
    );
    Node::detach(b, false);
    assert_eq!(
        other.seen_kind(LOCK_BASE, 9),
        libc::F_UNLCK,
        "and now nobody"
    );
}

// --- The unmap (`unixShmUnmap`) ---

#[test]
fn the_last_detach_with_delete_unlinks_the_shm() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    Node::detach(me, true);
    assert!(!path.exists());
}

#[test]
fn a_detach_with_delete_that_is_not_the_last_unlinks_nothing() {
    let (_dir, path) = shm_path();
    let a = attach(&path);
    let b = attach(&path);
    Node::detach(a, true);
    assert!(path.exists());
    Node::detach(b, false);
    assert!(path.exists());
}

#[test]
fn a_detach_with_delete_leaves_another_file_at_the_path() {
    let (dir, path) = shm_path();
    let me = attach(&path);
    let moved = dir.path().join("moved-shm");
    fs::rename(&path, &moved).unwrap();
    fs::write(&path, b"another generation's").unwrap();
    let new_ino = fs::metadata(&path).unwrap().ino();
    Node::detach(me, true);
    assert_eq!(
        fs::metadata(&path).map(|m| m.ino()).ok(),
        Some(new_ino),
        "the file now at the path is not the node's: kept"
    );
    assert!(
        moved.exists(),
        "the node's own file is not unlinked by another name"
    );
}

#[test]
fn the_last_detach_without_delete_keeps_the_file_and_drops_the_dms() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    let other = Other::open(&path);
    Node::detach(me, false);
    assert!(path.exists());
    assert_eq!(other.seen_kind(LOCK_BASE, 9), libc::F_UNLCK);
    assert!(
        other.ofd(libc::F_WRLCK, DMS, 1),
        "the next mapper is the first"
    );
}

#[test]
fn the_last_detach_keeps_the_posix_locks_this_process_holds_on_the_shm() {
    // A stock connection of this process maps the file too: closing any descriptor of the inode
    // would drop its POSIX locks, so the node's descriptor outlives the node (parked).
    let (_dir, path) = shm_path();
    let me = attach(&path);
    let stock = Other::open(&path);
    let checker = Other::open(&path);
    assert!(stock.posix(libc::F_RDLCK, DMS, 1));
    assert!(stock.posix(libc::F_RDLCK, LOCK_BASE + 3, 1));
    Node::detach(me, false);
    let pid = rustix::process::getpid().as_raw_nonzero().get();
    assert_eq!(checker.seen(DMS, 1), (libc::F_RDLCK, pid));
    assert_eq!(checker.seen(LOCK_BASE + 3, 1), (libc::F_RDLCK, pid));
}

#[test]
fn a_connection_after_the_last_detach_is_the_first_again() {
    let (_dir, path) = shm_path();
    let me = attach(&path);
    assert_eq!(me.node.map(0, REGION, true).1, ffi::SQLITE_OK);
    Node::detach(me, false);
    stale_shm(&path, REGION);
    let me = attach(&path);
    assert_eq!(len(&path), 3, "nobody held the DMS: truncated again");
    Node::detach(me, false);
}
