//! The FUSE passthrough: every operation is applied to the backing directory at once (visible),
//! and every durable step (fsync, fdatasync, fsyncdir, a write through `O_SYNC`/`O_DSYNC`,
//! create, mkdir, rename, unlink, rmdir, link) is counted, logged and recorded in the durable
//! [`crate::model::Model`].
//! With a crash point armed, the step of that number is not performed: the filesystem freezes
//! there and answers `EIO` to everything after, so nothing later reaches the disk.

use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::inner::{open_backing, Inner};

/// No caching of names or attributes in the kernel: every lookup comes here.
const TTL: Duration = Duration::ZERO;

/// The FUSE filesystem over an [`Inner`].
pub(crate) struct LazyFsFs(pub Arc<Mutex<Inner>>);

impl LazyFsFs {
    /// The state, or EIO once frozen at the crash point.
    fn live(&self) -> Result<MutexGuard<'_, Inner>, Errno> {
        let inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if inner.frozen {
            Err(Errno::EIO)
        } else {
            Ok(inner)
        }
    }
}

fn io(err: std::io::Error) -> Errno {
    Errno::from(err)
}

macro_rules! attempt {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(err) => return $reply.error(err),
        }
    };
}

impl Filesystem for LazyFsFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = attempt!(reply, self.live());
        let rel = attempt!(reply, s.path(parent)).join(name);
        let meta = attempt!(
            reply,
            std::fs::symlink_metadata(s.backing.join(&rel)).map_err(io)
        );
        let id = s.register(&meta, rel, false);
        reply.entry(&TTL, &s.attr(id, &meta), Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = attempt!(reply, self.live());
        let meta = match fh.and_then(|fh| s.handles.get(&fh.0)) {
            Some(h) => h.file.metadata(),
            None => std::fs::symlink_metadata(attempt!(reply, s.located(ino))),
        };
        let meta = attempt!(reply, meta.map_err(io));
        reply.attr(&TTL, &s.attr(ino.0, &meta));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = attempt!(reply, self.live());
        let path = attempt!(reply, s.located(ino));
        if let Some(size) = size {
            let done = match fh.and_then(|fh| s.handles.get(&fh.0)) {
                Some(h) => h.file.set_len(size),
                None => OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(size)),
            };
            attempt!(reply, done.map_err(io));
        }
        if let Some(mode) = mode {
            let perms = std::fs::Permissions::from_mode(mode & 0o7777);
            attempt!(reply, std::fs::set_permissions(&path, perms).map_err(io));
        }
        let meta = attempt!(reply, std::fs::symlink_metadata(&path).map_err(io));
        reply.attr(&TTL, &s.attr(ino.0, &meta));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = attempt!(reply, self.live());
        let rel = attempt!(reply, s.path(parent)).join(name);
        if !s.step(format!("mkdir {}", rel.display())) {
            return reply.error(Errno::EIO);
        }
        let path = s.backing.join(&rel);
        attempt!(reply, std::fs::create_dir(&path).map_err(io));
        let perms = std::fs::Permissions::from_mode(mode & !umask & 0o7777);
        attempt!(reply, std::fs::set_permissions(&path, perms).map_err(io));
        let meta = attempt!(reply, std::fs::symlink_metadata(&path).map_err(io));
        let id = s.register(&meta, rel, true);
        let step = s.steps.len() - 1;
        s.model
            .created(step, parent.0, &name.to_os_string(), id, true);
        reply.entry(&TTL, &s.attr(id, &meta), Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = attempt!(reply, self.live());
        let from = attempt!(reply, s.path(parent)).join(name);
        let to = attempt!(reply, s.path(newparent)).join(newname);
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        if !s.step(format!("rename {} -> {}", from.display(), to.display())) {
            return reply.error(Errno::EIO);
        }
        let mut with = rustix::fs::RenameFlags::empty();
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            with |= rustix::fs::RenameFlags::NOREPLACE;
        }
        let (a, b) = (s.backing.join(&from), s.backing.join(&to));
        if std::fs::symlink_metadata(&a).is_err() {
            return reply.error(Errno::ENOENT);
        }
        if let Ok(target) = std::fs::symlink_metadata(&b) {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return reply.error(Errno::EEXIST);
            }
            if !target.is_dir() {
                attempt!(reply, s.bury_or_remove(&to).map_err(io));
            }
        }
        let cwd = rustix::fs::CWD;
        attempt!(
            reply,
            rustix::fs::renameat_with(cwd, &a, cwd, &b, with).map_err(|e| io(e.into()))
        );
        s.forget(&to);
        s.moved(&from, &to);
        let step = s.steps.len() - 1;
        s.model.renamed(
            step,
            parent.0,
            &name.to_os_string(),
            newparent.0,
            &newname.to_os_string(),
        );
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut s = attempt!(reply, self.live());
        let from = attempt!(reply, s.path(ino));
        let to = attempt!(reply, s.path(newparent)).join(newname);
        if !s.step(format!("link {} -> {}", from.display(), to.display())) {
            return reply.error(Errno::EIO);
        }
        let path = s.backing.join(&to);
        attempt!(
            reply,
            std::fs::hard_link(s.backing.join(&from), &path).map_err(io)
        );
        let meta = attempt!(reply, std::fs::symlink_metadata(&path).map_err(io));
        s.register(&meta, to, false);
        let step = s.steps.len() - 1;
        s.model
            .created(step, newparent.0, &newname.to_os_string(), ino.0, false);
        reply.entry(&TTL, &s.attr(ino.0, &meta), Generation(0));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut s = attempt!(reply, self.live());
        let path = attempt!(reply, s.located(ino));
        let file = attempt!(reply, open_backing(&path, flags.0, None).map_err(io));
        let fh = s.add_handle(ino.0, file, flags.0);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = attempt!(reply, self.live());
        let Some(h) = s.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match h.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return reply.error(io(e)),
            }
        }
        reply.data(&buf[..got]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = attempt!(reply, self.live());
        let Some(h) = s.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let (id, sync) = (h.id, h.sync_writes);
        if s.write_fails(id, offset, data.len()) {
            return reply.error(Errno::ENOSPC);
        }
        let what = format!("O_SYNC write {}", s.name_of(id));
        if sync && !s.step(what) {
            return reply.error(Errno::EIO);
        }
        let h = &s.handles[&fh.0];
        attempt!(reply, h.file.write_all_at(data, offset).map_err(io));
        if sync {
            let file = attempt!(reply, h.file.try_clone().map_err(io));
            attempt!(reply, s.snapshot(id, &file).map_err(io));
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = attempt!(reply, self.live());
        let Some(h) = s.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let id = h.id;
        let file = attempt!(reply, h.file.try_clone().map_err(io));
        let call = if datasync { "fdatasync" } else { "fsync" };
        let what = format!("{call} {}", s.name_of(id));
        if !s.step(what) {
            return reply.error(Errno::EIO);
        }
        if s.sync_fails() {
            attempt!(reply, s.poison(id, &file).map_err(io));
            return reply.error(Errno::EIO);
        }
        attempt!(reply, s.snapshot(id, &file).map_err(io));
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _live = attempt!(reply, self.live());
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut s = attempt!(reply, self.live());
        let entries = attempt!(reply, s.listing(ino.0).map_err(io));
        let mut all = vec![
            (ino.0, FileType::Directory, OsString::from(".")),
            (1, FileType::Directory, "..".into()),
        ];
        for (name, id) in entries {
            let kind = if s.model.dirs.contains(&id) {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            all.push((id, kind, name));
        }
        for (i, (id, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(id), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = attempt!(reply, self.live());
        let what = format!("fsyncdir {}", s.name_of(ino.0));
        if !s.step(what) {
            return reply.error(Errno::EIO);
        }
        if s.sync_fails() {
            return reply.error(Errno::EIO);
        }
        let entries = attempt!(reply, s.listing(ino.0).map_err(io));
        s.model.dir_synced(ino.0, entries);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = attempt!(reply, self.live());
        let st = attempt!(
            reply,
            rustix::fs::statvfs(&s.backing).map_err(|e| io(e.into()))
        );
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            st.f_namemax as u32,
            st.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let _live = attempt!(reply, self.live());
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = attempt!(reply, self.live());
        let rel = attempt!(reply, s.path(parent)).join(name);
        if !s.step(format!("create {}", rel.display())) {
            return reply.error(Errno::EIO);
        }
        let path = s.backing.join(&rel);
        let file = attempt!(
            reply,
            open_backing(&path, flags, Some(mode & !umask)).map_err(io)
        );
        let meta = attempt!(reply, file.metadata().map_err(io));
        let id = s.register(&meta, rel, true);
        let step = s.steps.len() - 1;
        s.model
            .created(step, parent.0, &name.to_os_string(), id, false);
        let attr = s.attr(id, &meta);
        let fh = s.add_handle(id, file, flags);
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
    }

    // Extended attributes pass through (the guard keeps its WAL-base record in one); the `user.`
    // ones are durable at the file's fsync or fdatasync (the model snapshots them there).
    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let s = attempt!(reply, self.live());
        let path = attempt!(reply, s.located(ino));
        let flags = rustix::fs::XattrFlags::from_bits_retain(flags as u32);
        attempt!(
            reply,
            rustix::fs::lsetxattr(&path, name, value, flags).map_err(|e| io(e.into()))
        );
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let s = attempt!(reply, self.live());
        let path = attempt!(reply, s.located(ino));
        let mut buf = vec![0u8; 1 << 16];
        let n = attempt!(
            reply,
            rustix::fs::lgetxattr(&path, name, &mut buf[..]).map_err(|e| io(e.into()))
        );
        xattr_reply(reply, &buf[..n], size);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let s = attempt!(reply, self.live());
        let path = attempt!(reply, s.located(ino));
        let mut buf = vec![0u8; 1 << 16];
        let n = attempt!(
            reply,
            rustix::fs::llistxattr(&path, &mut buf[..]).map_err(|e| io(e.into()))
        );
        xattr_reply(reply, &buf[..n], size);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = attempt!(reply, self.live());
        let path = attempt!(reply, s.located(ino));
        attempt!(
            reply,
            rustix::fs::lremovexattr(&path, name).map_err(|e| io(e.into()))
        );
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let s = attempt!(reply, self.live());
        let Some(h) = s.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let flags = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
        attempt!(
            reply,
            rustix::fs::fallocate(&h.file, flags, offset, length).map_err(|e| io(e.into()))
        );
        reply.ok();
    }
}

impl LazyFsFs {
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let mut s = attempt!(reply, self.live());
        let rel = attempt!(reply, s.path(parent)).join(name);
        let call = if dir { "rmdir" } else { "unlink" };
        if !s.step(format!("{call} {}", rel.display())) {
            return reply.error(Errno::EIO);
        }
        let done = if dir {
            std::fs::remove_dir(s.backing.join(&rel))
        } else {
            s.bury_or_remove(&rel)
        };
        attempt!(reply, done.map_err(io));
        s.forget(&rel);
        let step = s.steps.len() - 1;
        s.model.removed(step, parent.0, &name.to_os_string());
        reply.ok();
    }
}

/// Answers a getxattr/listxattr: the size asked (`size` 0), the bytes, or ERANGE.
fn xattr_reply(reply: ReplyXattr, bytes: &[u8], size: u32) {
    if size == 0 {
        reply.size(bytes.len() as u32);
    } else if bytes.len() <= size as usize {
        reply.data(bytes);
    } else {
        reply.error(Errno::ERANGE);
    }
}
