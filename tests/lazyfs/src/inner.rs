//! The filesystem's state: the backing directory, the ids of its files, the open handles, the
//! durable [`Model`] and the steps seen; what [`crate::fs`] serves from.

use std::collections::HashMap;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use crate::model::{Entries, Model};
use crate::Fault;

/// The next id of a file or directory, shared by every mount of the process: a mount never gives
/// a file the inode number another mount gave one (a FUSE mount's device number is reused after
/// an unmount, and a capture's recorded `(dev, ino)` must not match a file of a later mount by
/// chance). The root is 1.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(2);

/// The state shared between the FUSE thread and [`crate::LazyFs`].
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) backing: PathBuf,
    /// Where unlinked (and renamed-over) files are kept, as `<id>`, so that a power cut that
    /// undoes the unlink brings back the same inode, as a disk would: `<backing>.lazyfs-unlinked`.
    pub(crate) graveyard: PathBuf,
    /// The files in the graveyard (their `st_nlink` reads 0).
    pub(crate) buried: HashMap<u64, PathBuf>,
    pub(crate) model: Model,
    /// Backing inode number to id, for the files alive in the backing directory.
    pub(crate) ids: HashMap<u64, u64>,
    /// Id to its paths relative to the backing directory ("" for the root): every link of a
    /// file, the first the one it is named by.
    pub(crate) paths: HashMap<u64, Vec<PathBuf>>,
    pub(crate) handles: HashMap<u64, Handle>,
    pub(crate) next_fh: u64,
    /// The durable steps performed, in order.
    pub(crate) steps: Vec<String>,
    /// The fault injected (a crash point, a failing fsync, a full disk).
    pub(crate) fault: Option<Fault>,
    /// Writes seen to files created through the mount (the count [`Fault::WriteFull`] uses).
    pub(crate) writes: usize,
    /// Per file, the pages (numbers) whose writes a failed fsync dropped: no later fsync makes
    /// them durable until they are written again (Linux after a writeback error).
    pub(crate) poisoned: HashMap<u64, std::collections::BTreeSet<u64>>,
    /// Files created through the mount.
    pub(crate) created: std::collections::HashSet<u64>,
    /// Set at the crash point: every operation fails with EIO from then on.
    pub(crate) frozen: bool,
}

#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) id: u64,
    pub(crate) file: File,
    pub(crate) sync_writes: bool,
}

impl Inner {
    /// The state of `backing`, everything in it durable.
    pub fn new(backing: PathBuf, fault: Option<Fault>) -> std::io::Result<Self> {
        let mut name = backing.file_name().unwrap_or_default().to_os_string();
        name.push(".lazyfs-unlinked");
        let graveyard = backing.with_file_name(name);
        std::fs::create_dir_all(&graveyard)?;
        let mut inner = Inner {
            backing,
            graveyard,
            buried: HashMap::new(),
            model: Model::default(),
            ids: HashMap::new(),
            paths: HashMap::new(),
            handles: HashMap::new(),
            next_fh: 1,
            steps: Vec::new(),
            fault,
            writes: 0,
            poisoned: HashMap::new(),
            created: Default::default(),
            frozen: false,
        };
        let root_ino = std::fs::metadata(&inner.backing)?.ino();
        inner.ids.insert(root_ino, 1);
        inner.paths.insert(1, vec![PathBuf::new()]);
        inner.model.root = 1;
        inner.model.dirs.insert(1);
        inner.baseline(1, PathBuf::new())?;
        Ok(inner)
    }

    pub(crate) fn baseline(&mut self, dir: u64, rel: PathBuf) -> std::io::Result<()> {
        let entries = self.listing(dir)?;
        for (name, &id) in &entries {
            let path = rel.join(name);
            if self.model.dirs.contains(&id) {
                self.baseline(id, path)?;
            } else {
                let full = self.backing.join(&path);
                let bytes = std::fs::read(&full)?;
                self.model
                    .file_synced(id, bytes, crate::crash::user_xattrs(&full)?);
            }
        }
        self.model.dir_synced(dir, entries);
        Ok(())
    }

    /// The current entries of the directory `dir`, registering each.
    pub(crate) fn listing(&mut self, dir: u64) -> std::io::Result<Entries> {
        let rel = self
            .paths
            .get(&dir)
            .and_then(|p| p.first())
            .cloned()
            .ok_or(std::io::ErrorKind::NotFound)?;
        let mut entries = Entries::new();
        for entry in std::fs::read_dir(self.backing.join(&rel))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let id = self.register(&meta, rel.join(entry.file_name()), false);
            entries.insert(entry.file_name(), id);
        }
        Ok(entries)
    }

    /// The id of a backing file (a fresh one when `created`, its inode number may be reused),
    /// `rel` one of its paths (another link of a file keeps the others).
    pub(crate) fn register(&mut self, meta: &Metadata, rel: PathBuf, created: bool) -> u64 {
        let id = match self.ids.get(&meta.ino()) {
            Some(&id) if !created => id,
            _ => {
                let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.ids.insert(meta.ino(), id);
                if meta.is_dir() {
                    self.model.dirs.insert(id);
                    self.model.strict.entry(id).or_default();
                    self.model.ordered.entry(id).or_default();
                }
                self.paths.remove(&id);
                if created {
                    self.created.insert(id);
                }
                id
            }
        };
        let paths = self.paths.entry(id).or_default();
        if !paths.contains(&rel) {
            paths.push(rel);
        }
        id
    }

    /// Where the file `ino` is in the backing filesystem now (the graveyard once unlinked).
    pub(crate) fn located(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        match self.buried.get(&ino.0) {
            Some(grave) => Ok(grave.clone()),
            None => Ok(self.backing.join(self.path(ino)?)),
        }
    }

    pub(crate) fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths
            .get(&ino.0)
            .and_then(|p| p.first())
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    /// `rel` (and everything under it) no longer names anything: unlinked, or renamed over.
    pub(crate) fn forget(&mut self, rel: &Path) {
        for paths in self.paths.values_mut() {
            paths.retain(|p| !p.starts_with(rel));
        }
    }

    /// Every path under `from` now under `to` (a rename).
    pub(crate) fn moved(&mut self, from: &Path, to: &Path) {
        for p in self.paths.values_mut().flatten() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                };
            }
        }
    }

    pub(crate) fn attr(&self, id: u64, meta: &Metadata) -> FileAttr {
        let time = |secs: i64, nsecs: i64| {
            UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs.clamp(0, 999_999_999) as u32)
        };
        FileAttr {
            ino: INodeNo(id),
            size: meta.size(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: SystemTime::UNIX_EPOCH,
            kind: FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile),
            perm: (meta.mode() & 0o7777) as u16,
            nlink: if self.buried.contains_key(&id) {
                0
            } else {
                meta.nlink() as u32
            },
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Counts a durable step; false when it is the crash point (then it must not be performed).
    pub(crate) fn step(&mut self, what: String) -> bool {
        if self.fault == Some(Fault::CrashBefore(self.steps.len() + 1)) {
            self.frozen = true;
            return false;
        }
        self.steps.push(what);
        true
    }

    /// Whether the step just counted is the one [`Fault::SyncFails`] names (then it is not
    /// performed and fails with EIO; it stays counted, marked).
    pub(crate) fn sync_fails(&mut self) -> bool {
        if self.fault != Some(Fault::SyncFails(self.steps.len())) {
            return false;
        }
        if let Some(last) = self.steps.last_mut() {
            last.push_str(" (EIO)");
        }
        true
    }

    /// A write of `len` bytes at `offset` to the file `id`: whether it is the one
    /// [`Fault::WriteFull`] names (then it fails with ENOSPC, nothing written); otherwise the
    /// pages it covers are written again (no longer poisoned).
    pub(crate) fn write_fails(&mut self, id: u64, offset: u64, len: usize) -> bool {
        if self.created.contains(&id) {
            self.writes += 1;
            if self.fault == Some(Fault::WriteFull(self.writes)) {
                self.steps
                    .push(format!("write {} (ENOSPC)", self.name_of(id)));
                return true;
            }
        }
        if let Some(pages) = self.poisoned.get_mut(&id) {
            let (first, end) = (offset / PAGE, (offset + len as u64).div_ceil(PAGE));
            pages.retain(|p| !(first..end).contains(p));
        }
        false
    }

    /// A failed fsync of `id`: the pages that differ from what the disk holds are dropped from
    /// the writeback and never reach it (until written again).
    pub(crate) fn poison(&mut self, id: u64, file: &File) -> std::io::Result<()> {
        let visible = read_all(file)?;
        let synced = self.model.data.get(&id).cloned().unwrap_or_default();
        let pages = self.poisoned.entry(id).or_default();
        for (i, chunk) in visible.chunks(PAGE as usize).enumerate() {
            let at = i * PAGE as usize;
            if synced.get(at..at + chunk.len()) != Some(chunk) {
                pages.insert(i as u64);
            }
        }
        Ok(())
    }

    pub(crate) fn name_of(&self, id: u64) -> String {
        match self.paths.get(&id).and_then(|p| p.first()) {
            Some(p) if !p.as_os_str().is_empty() => p.display().to_string(),
            Some(_) => ".".to_string(),
            None => format!("<id {id}>"),
        }
    }

    /// The file `id` synced: its bytes (but the poisoned pages, which keep what the disk held)
    /// and its extended attributes are durable.
    pub(crate) fn snapshot(&mut self, id: u64, file: &File) -> std::io::Result<()> {
        let mut bytes = read_all(file)?;
        if let Some(pages) = self.poisoned.get(&id) {
            let old = self.model.data.get(&id).cloned().unwrap_or_default();
            for &p in pages {
                let start = (p * PAGE) as usize;
                let end = (start + PAGE as usize).min(bytes.len());
                for (i, b) in bytes.iter_mut().enumerate().take(end).skip(start) {
                    *b = old.get(i).copied().unwrap_or(0);
                }
            }
        }
        let xattrs = fd_xattrs(file)?;
        self.model.file_synced(id, bytes, xattrs);
        Ok(())
    }
}

impl Inner {
    /// The state a power cut leaves: the durable model, and where each file is now with its
    /// visible bytes.
    pub(crate) fn crash(&self) -> std::io::Result<crate::Crash> {
        let (mut visible, mut located) = (HashMap::new(), HashMap::new());
        for (&ino, &id) in &self.ids {
            if self.model.dirs.contains(&id) {
                continue;
            }
            // The graveyard once unlinked, else whichever of its links still names it.
            let candidates: Vec<PathBuf> = match self.buried.get(&id) {
                Some(grave) => vec![grave.clone()],
                None => self
                    .paths
                    .get(&id)
                    .into_iter()
                    .flatten()
                    .map(|rel| self.backing.join(rel))
                    .collect(),
            };
            let found = candidates.into_iter().find(|path| {
                std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == ino && m.is_file())
            });
            if let Some(path) = found {
                visible.insert(id, std::fs::read(&path)?);
                located.insert(id, path);
            }
        }
        Ok(crate::Crash {
            model: self.model.clone(),
            visible,
            located,
            backing: self.backing.clone(),
            graveyard: self.graveyard.clone(),
        })
    }

    /// After the backing directory was restored in place ([`crate::LazyFs::reboot`]): everything
    /// in it durable, the fault disarmed; `survivors` (backing inode to id) keep their ids.
    pub(crate) fn reboot(&mut self, survivors: HashMap<u64, u64>) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.graveyard)?;
        self.buried.clear();
        self.model = Model::default();
        self.ids = survivors;
        self.ids.insert(std::fs::metadata(&self.backing)?.ino(), 1);
        self.paths.clear();
        self.paths.insert(1, vec![PathBuf::new()]);
        self.steps.clear();
        self.fault = None;
        self.frozen = false;
        self.writes = 0;
        self.poisoned.clear();
        self.created.clear();
        self.model.root = 1;
        self.model.dirs.insert(1);
        self.baseline(1, PathBuf::new())
    }

    /// Moves the file at `rel` (its last link) into the graveyard instead of freeing it; other
    /// links or a directory are removed for real.
    pub(crate) fn bury_or_remove(&mut self, rel: &Path) -> std::io::Result<()> {
        let path = self.backing.join(rel);
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            return std::fs::remove_dir(&path);
        }
        match self.ids.get(&meta.ino()) {
            Some(&id) if meta.nlink() == 1 => {
                let grave = self.graveyard.join(id.to_string());
                std::fs::rename(&path, &grave)?;
                self.buried.insert(id, grave);
                Ok(())
            }
            _ => std::fs::remove_file(&path),
        }
    }

    pub(crate) fn add_handle(&mut self, id: u64, file: File, flags: i32) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        let sync_writes = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        self.handles.insert(
            fh,
            Handle {
                id,
                file,
                sync_writes,
            },
        );
        fh
    }
}

/// The page size of the writeback (what a failed fsync drops).
const PAGE: u64 = 4096;

fn read_all(file: &File) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len() as usize;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

/// The `user.` extended attributes of the open file.
fn fd_xattrs(file: &File) -> std::io::Result<crate::model::Xattrs> {
    use std::os::unix::ffi::OsStrExt;
    let mut names = vec![0u8; 1 << 16];
    let n = rustix::fs::flistxattr(file, &mut names[..])?;
    let mut out = crate::model::Xattrs::new();
    for name in names[..n].split(|&b| b == 0) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let name = std::ffi::OsStr::from_bytes(name);
        let mut value = vec![0u8; 1 << 16];
        let len = rustix::fs::fgetxattr(file, name, &mut value[..])?;
        value.truncate(len);
        out.insert(name.to_os_string(), value);
    }
    Ok(out)
}

/// Opens a backing file with the caller's access mode; `create` (a mode) for a creation.
pub(crate) fn open_backing(path: &Path, flags: i32, create: Option<u32>) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => options.read(true).write(true), // read: the fsync snapshot
        libc::O_RDWR => options.read(true).write(true),
        _ => options.read(true),
    };
    if let Some(mode) = create {
        options.mode(mode);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        if flags & libc::O_TRUNC != 0 {
            options.truncate(true);
        }
    }
    let passed = libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    options.custom_flags(flags & passed);
    options.open(path)
}
