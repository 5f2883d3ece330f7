//! The filesystem a database is on, and whether WAL mode is safe there.
//!
//! SQLite's documentation (<https://sqlite.org/wal.html>, "WAL does not work over a network
//! filesystem") says WAL needs every process on one host, with shared memory and POSIX locks
//! that work. Network and cluster filesystems break that: a process on another host sees
//! neither the `-shm` mapping nor the locks. The guard says so plainly, once per mount, and can
//! refuse WAL there ([`UNSAFE_FS_ENV`]).
//!
//! Found by `statfs`'s magic number, once per device; for a FUSE mount, whose magic says nothing
//! of what is behind it, by the mount's type in `/proc/self/mountinfo` (`fuse.sshfs`, ...), the
//! only place the kernel says it — matched by the device number, which is the one `stat` gives
//! for a FUSE mount. Local filesystems (ext4, xfs, btrfs, tmpfs, overlayfs, f2fs, zfs, ...) are
//! never called unsafe.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// `HERMES_GUARD_UNSAFE_FS`: `warn` (the default: one WARN line per mount), `refuse` (switching
/// a database there into WAL mode fails, and a WAL there is not opened), `allow` (silent).
pub const UNSAFE_FS_ENV: &str = "HERMES_GUARD_UNSAFE_FS";

/// The filesystem a database is on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filesystem {
    /// Its type (`ext4`, `btrfs`, `nfs`, `fuse.sshfs`, ...; `unknown (0x...)` for a magic number
    /// the guard does not know).
    pub name: String,
    /// Whether SQLite's WAL mode is safe there: every process on one host, with working shared
    /// memory and POSIX locks. `true` for a filesystem the guard does not know.
    pub wal_safe: bool,
    /// Whether every change to it passes through this kernel, so that inotify sees it (the
    /// directory watch vouches only there): the local filesystems the guard knows by name.
    pub local: bool,
}

/// What the guard does with a WAL database on a filesystem where WAL is not safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsafeFsPolicy {
    /// Say it once per mount at WARN (the default).
    Warn,
    /// Refuse WAL mode there.
    Refuse,
    /// Say nothing.
    Allow,
}

/// The policy from [`UNSAFE_FS_ENV`].
pub fn unsafe_fs_policy() -> UnsafeFsPolicy {
    match std::env::var_os(UNSAFE_FS_ENV) {
        Some(v) if v.eq_ignore_ascii_case("refuse") => UnsafeFsPolicy::Refuse,
        Some(v) if v.eq_ignore_ascii_case("allow") => UnsafeFsPolicy::Allow,
        _ => UnsafeFsPolicy::Warn,
    }
}

/// Filesystems whose every change passes through this kernel (inotify sees it).
const LOCAL: &[i64] = &[
    0xEF53,      // ext2/3/4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0x794C_7630, // overlayfs
    0xF2F5_2010, // f2fs
    0x2FC1_2FC1, // zfs
    0x8584_58F6, // ramfs
];

/// Filesystems by `statfs` magic: name, and whether WAL is safe there.
const MAGIC: &[(i64, &str, bool)] = &[
    (0xEF53, "ext4", true),
    (0x5846_5342, "xfs", true),
    (0x9123_683E, "btrfs", true),
    (0x0102_1994, "tmpfs", true),
    (0x794C_7630, "overlayfs", true),
    (0xF2F5_2010, "f2fs", true),
    (0x2FC1_2FC1, "zfs", true),
    (0x8584_58F6, "ramfs", true),
    (0x4d44, "vfat", true),
    (0x2011_BAB0, "exfat", true),
    (0x5346_544e, "ntfs", true),
    (0x3153_464a, "jfs", true),
    (0x5265_4973, "reiserfs", true),
    (0xCAFE_4A11, "bcachefs", true),
    (0x6969, "nfs", false),
    (0x517B, "smb", false),
    (0xFE53_4D42, "smb2", false),
    (0xFF53_4D42, "cifs", false),
    (0x0102_1997, "9p", false),
    (0x6a65_6a63, "virtiofs", false),
    (0x00C3_6400, "ceph", false),
    (0x0BD0_0BD0, "lustre", false),
    (0x5346_414F, "afs", false),
    (0x6B41_4653, "kafs", false),
    (0x7461_636f, "ocfs2", false),
    (0x0116_1970, "gfs2", false),
    (0x2468_1357, "vboxsf", false),
];

const FUSE_MAGIC: i64 = 0x6573_5546;

/// FUSE filesystems that reach another host (the part after `fuse.` in the mount's type).
const NETWORK_FUSE: &[&str] = &[
    "sshfs",
    "s3fs",
    "rclone",
    "gcsfuse",
    "goofys",
    "glusterfs",
    "ceph-fuse",
    "ceph",
    "juicefs",
    "mfs",
    "lizardfs",
    "seaweedfs",
    "curlftpfs",
    "smbnetfs",
    "davfs",
    "davfs2",
    "blobfuse",
    "blobfuse2",
    "mountpoint-s3",
    "cvmfs",
    "vmhgfs-fuse",
];

/// Answers by device: a mount is asked once.
static KNOWN: Mutex<Option<HashMap<u64, Filesystem>>> = Mutex::new(None);

/// The filesystem the directory `dir` is on (`None` when it cannot be asked).
pub fn of_dir(dir: &Path) -> Option<Filesystem> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    of_dir_on(dir, dev)
}

/// The filesystem the directory `dir`, on device `dev` (its `stat`'s), is on: `statfs` once per
/// device, remembered, so that an open asks no more than the device number it has already.
pub(crate) fn of_dir_on(dir: &Path, dev: u64) -> Option<Filesystem> {
    if let Some(known) = KNOWN.lock().as_ref().and_then(|m| m.get(&dev)) {
        return Some(known.clone());
    }
    let st = rustix::fs::statfs(dir).ok()?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between platforms
    let magic = crate::testing::seam::filesystem_magic().unwrap_or(st.f_type as i64);
    let fs = classify(magic, || fuse_type(dev));
    KNOWN
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(dev, fs.clone());
    Some(fs)
}

/// Mounts already said at WARN.
static WARNED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// The mount table changed: a device number may now be another mount (an unmount and a new mount
/// can reuse an anonymous one, tmpfs then NFS): every filesystem is asked afresh, and said again at
/// WARN. Called by the directory watch, which polls the mount table.
pub(crate) fn forget_mounts() {
    *KNOWN.lock() = None;
    WARNED.lock().clear();
}

/// The filesystem of the database whose directory `dir` is on device `dev`, as a connection
/// opens it: said once per mount at WARN when WAL mode is not safe there (unless
/// [`UNSAFE_FS_ENV`] is `allow`).
pub(crate) fn at_open(db: &Path, dir: &Path, dev: u64) -> Option<Filesystem> {
    let fs = of_dir_on(dir, dev)?;
    if !fs.wal_safe && unsafe_fs_policy() != UnsafeFsPolicy::Allow {
        let mut warned = WARNED.lock();
        if !warned.contains(&dev) {
            warned.push(dev);
            log::warn!(
                "hermes-guard: {} is on {} ({}): SQLite's WAL mode is not safe there (it needs \
                 every process on one host, with working shared memory and POSIX locks: \
                 https://sqlite.org/wal.html). Use a local filesystem, or journal_mode=DELETE; \
                 {}=refuse makes the guard refuse WAL mode there, =allow silences this line",
                db.display(),
                fs.name,
                dir.display(),
                UNSAFE_FS_ENV
            );
        }
    }
    Some(fs)
}

/// The filesystem of magic number `magic`; `fuse_type` gives a FUSE mount's type.
fn classify(magic: i64, fuse_type: impl FnOnce() -> Option<String>) -> Filesystem {
    if magic == FUSE_MAGIC {
        let name = fuse_type().unwrap_or_else(|| "fuse".into());
        let sub = name.strip_prefix("fuse.").unwrap_or("");
        return Filesystem {
            wal_safe: !NETWORK_FUSE.contains(&sub),
            local: false,
            name,
        };
    }
    let local = LOCAL.contains(&magic);
    match MAGIC.iter().find(|(m, _, _)| *m == magic) {
        Some((_, name, safe)) => Filesystem {
            name: (*name).into(),
            wal_safe: *safe,
            local,
        },
        None => Filesystem {
            name: format!("unknown (0x{magic:x})"),
            wal_safe: true,
            local,
        },
    }
}

/// A FUSE mount's type (`fuse.sshfs`) from `/proc/self/mountinfo`, by its device number.
fn fuse_type(dev: u64) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = format!(
        "{}:{}",
        rustix::fs::major(dev as _),
        rustix::fs::minor(dev as _)
    );
    info.lines().find_map(|line| mount_type_of(line, &want))
}

/// The type of the mount a mountinfo `line` describes, if its device is `dev` (`major:minor`).
fn mount_type_of(line: &str, dev: &str) -> Option<String> {
    let fields: Vec<&str> = line.split(' ').collect();
    if fields.get(2) != Some(&dev) {
        return None;
    }
    let sep = fields.iter().position(|f| *f == "-")?;
    fields.get(sep + 1).map(|t| (*t).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_filesystems_are_wal_safe_and_named() {
        for (magic, name) in [
            (0xEF53, "ext4"),
            (0x5846_5342, "xfs"),
            (0x9123_683E, "btrfs"),
            (0x0102_1994, "tmpfs"),
            (0x794C_7630, "overlayfs"),
        ] {
            let fs = classify(magic, || None);
            assert_eq!(fs.name, name);
            assert!(fs.wal_safe, "{name}");
            assert!(fs.local, "{name}");
        }
    }

    #[test]
    fn network_filesystems_are_not_wal_safe() {
        for magic in [0x6969, 0xFF53_4D42, 0xFE53_4D42, 0x0102_1997, 0x6a65_6a63] {
            assert!(!classify(magic, || None).wal_safe, "{magic:x}");
        }
    }

    #[test]
    fn a_fuse_mount_is_judged_by_its_type() {
        let sshfs = classify(FUSE_MAGIC, || Some("fuse.sshfs".into()));
        assert_eq!(sshfs.name, "fuse.sshfs");
        assert!(!sshfs.wal_safe);
        assert!(
            !sshfs.local,
            "inotify does not see a FUSE mount's other writers"
        );
        assert!(classify(FUSE_MAGIC, || Some("fuse.lazyfs".into())).wal_safe);
        // lxcfs serves this host's own /proc and cgroup views: no other host writes there.
        assert!(classify(FUSE_MAGIC, || Some("fuse.lxcfs".into())).wal_safe);
        assert!(
            classify(FUSE_MAGIC, || None).wal_safe,
            "an unknown FUSE mount"
        );
    }

    #[test]
    fn a_mountinfo_line_gives_the_type_of_its_device() {
        let line = "36 35 0:52 / /mnt/remote rw,nosuid,nodev - fuse.sshfs user@host:/ rw";
        assert_eq!(mount_type_of(line, "0:52").as_deref(), Some("fuse.sshfs"));
        assert_eq!(mount_type_of(line, "0:53"), None);
        let tagged = "36 35 0:52 / /mnt/x rw shared:12 master:3 - fuse.rclone remote: rw";
        assert_eq!(
            mount_type_of(tagged, "0:52").as_deref(),
            Some("fuse.rclone")
        );
    }

    #[test]
    fn the_temporary_directory_is_on_a_wal_safe_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        assert!(of_dir(dir.path()).unwrap().wal_safe);
    }
}
