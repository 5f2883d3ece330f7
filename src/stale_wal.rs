//! A WAL left beside a database it was not written on (issue 19): the record that binds a WAL
//! generation to the main file it was started on, the judgement made at the open from it, and
//! the capture that sets a stale WAL aside. Safe code; the shim (`vfs/stale_wal.rs`) hands it
//! plain values.
//!
//! **The record.** When a guarded writer sees its WAL start a new generation (the salts in the
//! wal-index header differ from the ones it recorded last), it writes, as the extended attribute
//! [`RECORD_XATTR`] of the WAL inode, the generation's salts and a hash of each of the main
//! file's first [`RECORDED_PAGES`] pages as they are then. A new generation starts only on a
//! fully checkpointed WAL, so these are pages of the file every frame of the generation is
//! written on. The record is bound to the WAL inode, so it travels with the WAL: another
//! database's WAL left beside this one carries the other database's record.
//!
//! **The judgement.** Within one generation the main file changes only by checkpoints, which
//! copy frames of that same generation (frames a generation has committed are never rewritten
//! until it restarts, and then the salts change), and at their end may truncate the file to a
//! committed size. So while the WAL at the path carries the recorded salts, each recorded page
//! must be the recorded content, or the content of one of the WAL's own frames of that page, or
//! beyond a size some commit of the WAL truncated to. Anything else is a main file the WAL was
//! not written on. Where there is nothing to judge by — no record (an unguarded writer, a
//! filesystem without extended attributes), another generation than the recorded one (an
//! unguarded process restarted it) — the guard says so at INFO and lets SQLite do what it
//! always does.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::SystemTime;

use rustix::fs::AtFlags;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::capture::{
    self, CaptureError, ImageMode, MainEntry, Manifest, PathGeneration, ShmEntry, Trigger, WalEntry,
};
use crate::identity::{identity_of_fd, identity_of_path, FileId};
use crate::paths::{self, open_dir, path_display, path_hex};
use crate::status::RetireReason;
use crate::walfile::{
    parse_main_header, parse_wal_header, wal_checksum, WalHeader, WalScanner,
    WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE,
};

/// The extended attribute of a WAL inode that holds its [`WalBaseRecord`].
pub(crate) const RECORD_XATTR: &str = "user.hermes-guard.wal-base";

/// The pages a record covers: the first [`RECORDED_PAGES`], each by its header — on page 1 the
/// database header (page count, change counter, schema cookie, freelist: every growth shows)
/// and the schema's b-tree page header, on the others the first 12 bytes: a b-tree page's header
/// (its cell count and content offset change with every row added or removed there), an
/// overflow or freelist page's link.
pub(crate) const RECORDED_PAGES: u32 = 16;

/// The bytes of a recorded page a record hashes (the whole page when it is smaller).
pub(crate) fn fragment_len(page: u32, page_size: u32) -> usize {
    let header = if page == 1 { 100 + 12 } else { 12 };
    header.min(page_size as usize)
}

/// How many bytes from offset 0 hold the recorded fragments of the first `pages` pages.
pub(crate) fn recorded_span(pages: u32, page_size: u32) -> usize {
    match pages {
        0 => 0,
        n => (n as usize - 1) * page_size as usize + fragment_len(n, page_size),
    }
}

/// `h` as 16 lowercase hex digits.
pub(crate) fn hex16(h: u64) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    (0..16)
        .rev()
        .map(|i| DIGITS[((h >> (i * 4)) & 0xf) as usize] as char)
        .collect()
}

/// A 64-bit hash of `bytes` (a splitmix64 finaliser over 8-byte words): a page that changed by
/// accident, not by design, is told apart; cheap enough for the write path's budget.
pub(crate) fn page_hash(bytes: &[u8]) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let (words, rest) = bytes.as_chunks::<8>();
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ bytes.len() as u64;
    for w in words {
        h = (h ^ u64::from_le_bytes(*w))
            .wrapping_mul(0x100_0000_01b3)
            .rotate_left(29);
    }
    for &b in rest {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    mix(h)
}

/// One recorded page of the main file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PageHash {
    /// 1-based page number.
    pub page: u32,
    /// [`page_hash`] of its first [`fragment_len`] bytes, hex.
    pub hash: String,
}

/// What a guarded writer records on its WAL when a generation starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WalBaseRecord {
    /// Format version: 1.
    pub v: u32,
    /// The generation's salts (`salt-1`, `salt-2` as the WAL header stores them, big-endian).
    pub salts: [u32; 2],
    /// The page size.
    pub page_size: u32,
    /// The main file the writer had open.
    pub main: Option<FileId>,
    /// Its first pages (fewer when the file is shorter).
    pub pages: Vec<PageHash>,
}

impl WalBaseRecord {
    /// (Tests: the write path builds the attribute with [`encode_record`].) The record of
    /// generation `salts` on a main file of `pages` pages (at most
    /// [`RECORDED_PAGES`] count) whose first bytes, [`recorded_span`] of them, are `first`.
    #[cfg(test)]
    pub(crate) fn new(
        salts: [u32; 2],
        page_size: u32,
        main: Option<FileId>,
        first: &[u8],
        pages: u32,
    ) -> WalBaseRecord {
        let pages = (1..=pages.min(RECORDED_PAGES))
            .filter_map(|page| {
                let at = (page as usize - 1) * page_size as usize;
                let bytes = first.get(at..at + fragment_len(page, page_size))?;
                Some(PageHash {
                    page,
                    hash: hex16(page_hash(bytes)),
                })
            })
            .collect();
        WalBaseRecord {
            v: 1,
            salts,
            page_size,
            main,
            pages,
        }
    }

    /// The attribute's value, binary: `hgwb` 1, the salts and the page size (`u32`s), the main
    /// file's dev and ino (`u64`s), the number of pages (`u8`), then per page its number
    /// (`u32`) and hash (`u64`); little-endian. No formatting on the write path.
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (dev, ino) = self.main.map_or((0, 0), |m| (m.dev, m.ino));
        let mut v = Vec::with_capacity(38 + 12 * self.pages.len());
        v.extend_from_slice(b"hgwb\x01");
        for w in [self.salts[0], self.salts[1], self.page_size] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&dev.to_le_bytes());
        v.extend_from_slice(&ino.to_le_bytes());
        v.push(self.pages.len() as u8);
        for p in &self.pages {
            v.extend_from_slice(&p.page.to_le_bytes());
            let h = u64::from_str_radix(&p.hash, 16).unwrap_or(0);
            v.extend_from_slice(&h.to_le_bytes());
        }
        v
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<WalBaseRecord> {
        let rest = bytes.strip_prefix(b"hgwb\x01")?;
        let u32_at = |o: usize| Some(u32::from_le_bytes(rest.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_le_bytes(rest.get(o..o + 8)?.try_into().ok()?));
        let salts = [u32_at(0)?, u32_at(4)?];
        let page_size = u32_at(8)?;
        let (dev, ino) = (u64_at(12)?, u64_at(20)?);
        let n = *rest.get(28)? as usize;
        let pages = (0..n)
            .map(|i| {
                let o = 29 + 12 * i;
                Some(PageHash {
                    page: u32_at(o)?,
                    hash: hex16(u64_at(o + 4)?),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        if rest.len() != 29 + 12 * n {
            return None;
        }
        Some(WalBaseRecord {
            v: 1,
            salts,
            page_size,
            main: (dev, ino).ne(&(0, 0)).then_some(FileId { dev, ino }),
            pages,
        })
    }
}

/// The longest encoded record.
pub(crate) const ENCODED_MAX: usize = 34 + 12 * RECORDED_PAGES as usize;

/// The attribute's value (as [`WalBaseRecord::encode`]) of the record of generation `salts` on a
/// main file of `pages` pages whose first [`recorded_span`] bytes are `first`, built on the
/// stack: the write path allocates nothing. Returns the buffer and its length.
pub(crate) fn encode_record(
    salts: [u32; 2],
    page_size: u32,
    main: Option<FileId>,
    first: &[u8],
    pages: u32,
) -> ([u8; ENCODED_MAX], usize) {
    let (dev, ino) = main.map_or((0, 0), |m| (m.dev, m.ino));
    let mut v = [0u8; ENCODED_MAX];
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        v[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    put(b"hgwb\x01");
    put(&salts[0].to_le_bytes());
    put(&salts[1].to_le_bytes());
    put(&page_size.to_le_bytes());
    put(&dev.to_le_bytes());
    put(&ino.to_le_bytes());
    let mut hashes = [(0u32, 0u64); RECORDED_PAGES as usize];
    let mut count = 0;
    for page in 1..=pages.min(RECORDED_PAGES) {
        let at = (page as usize - 1) * page_size as usize;
        if let Some(bytes) = first.get(at..at + fragment_len(page, page_size)) {
            hashes[count] = (page, page_hash(bytes));
            count += 1;
        }
    }
    put(&[count as u8]);
    for (page, hash) in &hashes[..count] {
        put(&page.to_le_bytes());
        put(&hash.to_le_bytes());
    }
    (v, n)
}

/// The record on the WAL `file`, if any (a filesystem without extended attributes has none).
pub(crate) fn read_record(file: BorrowedFd<'_>) -> Option<WalBaseRecord> {
    let mut buf = [0u8; 4096];
    let n = rustix::fs::fgetxattr(file, RECORD_XATTR, &mut buf).ok()?;
    WalBaseRecord::decode(buf.get(..n)?)
}

/// Writes an encoded record ([`encode_record`]) on the WAL `file`.
pub(crate) fn write_record(file: BorrowedFd<'_>, encoded: &[u8]) -> io::Result<()> {
    rustix::fs::fsetxattr(file, RECORD_XATTR, encoded, rustix::fs::XattrFlags::empty())
        .map_err(io::Error::from)
}

/// A WAL as SQLite's recovery would read it: its header, the valid frames, and for the pages
/// asked about the sha256 of each of their frames.
pub(crate) struct WalLook {
    pub header: WalHeader,
    /// Valid frames read (at most 1 when no page was asked about).
    pub frames: u64,
    /// sha256 of every valid frame of each page asked about.
    pub frames_of: HashMap<u32, Vec<String>>,
    /// The smallest database size (pages) a valid commit frame records.
    pub min_commit_size: Option<u32>,
}

/// Reads the WAL `file` from its start: the header, then frames while they are valid (the
/// header's salts, a non-zero page number, the checksum chain); only the first when `pages` is
/// `None`, else all of them, hashing the frames of `pages`.
pub(crate) fn look_at_wal(file: &File, pages: Option<&[u32]>) -> io::Result<WalLook> {
    let mut r = BufReader::with_capacity(1 << 20, At { file, pos: 0 });
    let mut hdr = [0u8; WAL_HEADER_SIZE];
    let mut look = WalLook {
        header: parse_wal_header(&[]),
        frames: 0,
        frames_of: HashMap::new(),
        min_commit_size: None,
    };
    if read_full(&mut r, &mut hdr)? < WAL_HEADER_SIZE {
        return Ok(look);
    }
    look.header = parse_wal_header(&hdr);
    if !look.header.valid {
        return Ok(look);
    }
    let big_endian = look.header.magic & 1 == 1;
    let mut ck = look.header.checksum;
    let mut fh = [0u8; WAL_FRAME_HEADER_SIZE];
    let mut page = vec![0u8; look.header.page_size as usize];
    loop {
        if read_full(&mut r, &mut fh)? < fh.len() || read_full(&mut r, &mut page)? < page.len() {
            break;
        }
        let be = |o: usize| u32::from_be_bytes([fh[o], fh[o + 1], fh[o + 2], fh[o + 3]]);
        let pgno = be(0);
        if pgno == 0 || [be(8), be(12)] != look.header.salts {
            break;
        }
        ck = wal_checksum(big_endian, &fh[..8], ck);
        ck = wal_checksum(big_endian, &page, ck);
        if ck != [be(16), be(20)] {
            break;
        }
        look.frames += 1;
        let Some(pages) = pages else {
            break;
        };
        if be(4) != 0 {
            look.min_commit_size = Some(look.min_commit_size.map_or(be(4), |m| m.min(be(4))));
        }
        if pages.contains(&pgno) {
            let len = fragment_len(pgno, look.header.page_size);
            let hash = hex16(page_hash(&page[..len]));
            look.frames_of.entry(pgno).or_default().push(hash);
        }
    }
    Ok(look)
}

/// Reads `file` from the start whatever its offset (the same descriptor is read more than once).
struct At<'a> {
    file: &'a File,
    pos: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// What the open decided about an existing WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No valid frame: SQLite will ignore the WAL; nothing to judge.
    NothingToReplay,
    /// The WAL carries no record: written by unguarded processes only, or on a filesystem
    /// without extended attributes. Stock behaviour.
    NoRecord,
    /// The WAL is of another generation than the recorded one (an unguarded process restarted
    /// it). Stock behaviour.
    OtherGeneration { recorded: [u32; 2], found: [u32; 2] },
    /// The main file is the recorded one (`by_pages`: not by its stamp, but every sampled page
    /// is the recorded one or one a checkpoint of the WAL copied): the WAL continues it.
    Continues { by_pages: bool },
    /// The WAL was written on another main file.
    Stale(Box<Mismatch>),
}

/// What did not match (`stale_wal` in the manifest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Mismatch {
    /// The record the WAL carries.
    pub recorded: WalBaseRecord,
    /// The salts of the WAL found at the path.
    pub wal_salts: [u32; 2],
    /// The main file now at the path.
    pub main_now: Option<FileId>,
    /// The first recorded page that is neither the recorded content nor one of the WAL's frames.
    pub page: u32,
    /// Its hash now (`None`: beyond the end of the file).
    pub page_hash_now: Option<String>,
    /// Frames of that page in the WAL it was compared with.
    pub page_frames_in_wal: usize,
    /// For a person.
    pub detail: String,
}

/// The first decision, from the header, the first frame and the record: `Err(verdict)` when
/// that already decides (no main file read needed).
pub(crate) fn judge_generation(
    look: &WalLook,
    record: Option<WalBaseRecord>,
) -> Result<WalBaseRecord, Verdict> {
    if !look.header.valid || look.frames == 0 {
        return Err(Verdict::NothingToReplay);
    }
    let record = record.ok_or(Verdict::NoRecord)?;
    if record.salts != look.header.salts || record.page_size != look.header.page_size {
        return Err(Verdict::OtherGeneration {
            recorded: record.salts,
            found: look.header.salts,
        });
    }
    Ok(record)
}

/// The decision page by page: `now` gives the hash (as recorded) of a page of the main file now
/// (`None` beyond its end); `full` is a look at every frame of the recorded pages.
pub(crate) fn judge_pages(
    record: &WalBaseRecord,
    main_now: Option<FileId>,
    mut now: impl FnMut(u32) -> Option<String>,
    full: &WalLook,
) -> Verdict {
    for recorded in &record.pages {
        let sha = now(recorded.page);
        let consistent = match &sha {
            Some(sha) if *sha == recorded.hash => true,
            Some(sha) => full
                .frames_of
                .get(&recorded.page)
                .is_some_and(|frames| frames.contains(sha)),
            // Beyond the end: a checkpoint truncated the file to a committed size.
            None => full.min_commit_size.is_some_and(|m| m < recorded.page),
        };
        if !consistent {
            let frames = full.frames_of.get(&recorded.page).map_or(0, Vec::len);
            return Verdict::Stale(Box::new(Mismatch {
                recorded: record.clone(),
                wal_salts: full.header.salts,
                main_now,
                page: recorded.page,
                detail: format!(
                    "the WAL's generation (salts {:08x} {:08x}) was started on a database file \
                     whose page {} hashed {}; page {} of the file now at the path hashes {}, \
                     and none of the WAL's {frames} frame(s) of that page does: the file was \
                     replaced (a restore?) after the WAL was written",
                    record.salts[0],
                    record.salts[1],
                    recorded.page,
                    recorded.hash,
                    recorded.page,
                    sha.as_deref().unwrap_or("beyond the end of the file"),
                ),
                page_hash_now: sha,
                page_frames_in_wal: frames,
            }));
        }
    }
    Verdict::Continues { by_pages: true }
}

/// What the guard does with a stale WAL (`HERMES_GUARD_STALE_WAL`, or
/// [`set_stale_wal_policy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaleWalPolicy {
    /// Move the WAL and the `-shm` into a capture (reason `stale-wal`) and open the database as
    /// it is (the default).
    SetAside,
    /// Refuse the open (`SQLITE_CANTOPEN_DIRTYWAL`), move nothing: the operator decides.
    Refuse,
}

/// 0: not set (the environment decides), 1: set aside, 2: refuse.
static POLICY: AtomicU8 = AtomicU8::new(0);

/// The environment variable that selects the strict mode in hosts that cannot call
/// [`set_stale_wal_policy`] (the loadable extension's): `refuse` (or `strict`).
pub const POLICY_ENV: &str = "HERMES_GUARD_STALE_WAL";

/// Chooses what the guard does with a stale WAL, for the whole process (overrides
/// [`POLICY_ENV`]).
pub fn set_stale_wal_policy(policy: StaleWalPolicy) {
    let v = match policy {
        StaleWalPolicy::SetAside => 1,
        StaleWalPolicy::Refuse => 2,
    };
    POLICY.store(v, Ordering::Release);
}

/// The policy in force: [`set_stale_wal_policy`]'s, else [`POLICY_ENV`]'s, else set aside.
pub fn stale_wal_policy() -> StaleWalPolicy {
    match POLICY.load(Ordering::Acquire) {
        1 => StaleWalPolicy::SetAside,
        2 => StaleWalPolicy::Refuse,
        _ => match std::env::var_os(POLICY_ENV) {
            Some(v) if v == "refuse" || v == "strict" => StaleWalPolicy::Refuse,
            _ => StaleWalPolicy::SetAside,
        },
    }
}

/// Whether this process maps the file `id` (a connection of its own uses that `-shm`).
pub(crate) fn mapped_here(id: FileId) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return true;
    };
    maps.lines().any(|line| {
        let mut f = line.split_whitespace();
        let (Some(_), Some(_), Some(_), Some(dev), Some(ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        let Some((major, minor)) = dev.split_once(':') else {
            return false;
        };
        let (Ok(major), Ok(minor), Ok(ino)) = (
            u32::from_str_radix(major, 16),
            u32::from_str_radix(minor, 16),
            ino.parse::<u64>(),
        ) else {
            return false;
        };
        ino == id.ino && rustix::fs::makedev(major, minor) as u64 == id.dev
    })
}

/// Moves the stale WAL (which `wal` has open) and the `-shm` (if any) of `database` into a new
/// capture beside it, with a manifest of reason `stale-wal`. On failure everything moved is put
/// back and the staging directory removed.
pub(crate) fn set_aside(
    database: &Path,
    wal: &File,
    main_now: Option<FileId>,
    main_header: &[u8],
    mismatch: &Mismatch,
) -> Result<PathBuf, CaptureError> {
    let io_err = |artifact: &Path, source: io::Error| CaptureError::Io {
        database: database.to_path_buf(),
        artifact: artifact.to_path_buf(),
        source,
    };
    let parent = database
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = database.file_name().ok_or_else(|| {
        io_err(
            database,
            io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
        )
    })?;
    let dir = open_dir(rustix::fs::CWD, parent).map_err(|e| io_err(parent, e))?;
    let side = |suffix: &str| {
        let mut s = name.as_bytes().to_vec();
        s.extend_from_slice(suffix.as_bytes());
        PathBuf::from(OsStr::from_bytes(&s))
    };
    let (wal_src, shm_src) = (side("-wal"), side("-shm"));
    let stem = capture::capture_dir_stem(name);
    let file_name = capture::capture_file_name(name);
    let (wal_name, shm_name) = (format!("{file_name}-wal"), format!("{file_name}-shm"));
    let (final_name, staging_name) = capture::reserve_staging(dir.as_fd(), &stem)
        .map_err(|(staging, e)| io_err(&parent.join(staging), e))?;
    let staging_path = parent.join(&staging_name);
    let final_path = parent.join(&final_name);

    let wal_id = identity_of_fd(wal).map_err(|e| io_err(&wal_src, e))?;
    let mut moved: Vec<(&Path, &str)> = Vec::new();
    let result = (|| -> io::Result<()> {
        let staging = open_dir(dir.as_fd(), Path::new(&staging_name))?;
        rustix::fs::renameat(&dir, &wal_src, &staging, wal_name.as_str())?;
        moved.push((&wal_src, &wal_name));
        let st = rustix::fs::statat(&staging, wal_name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if st.st_ino as u64 != wal_id.ino {
            return Err(io::Error::other(
                "the WAL at the path changed while it was being set aside",
            ));
        }
        let shm_id = identity_of_path(&parent.join(&shm_src)).ok().flatten();
        if shm_id.is_some() {
            match rustix::fs::renameat(&dir, &shm_src, &staging, shm_name.as_str()) {
                Ok(()) => moved.push((&shm_src, &shm_name)),
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let manifest = manifest(
            database,
            wal,
            wal_id,
            &wal_name,
            shm_id,
            main_now,
            main_header,
            mismatch,
        )?;
        let json = serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?;
        capture::write_synced(staging.as_fd(), capture::MANIFEST_NAME, |f| {
            io::Write::write_all(f, &json)
        })?;
        rustix::fs::fsync(&staging)?;
        rustix::fs::renameat(&dir, staging_name.as_str(), &dir, final_name.as_str())?;
        rustix::fs::fsync(&dir)?;
        Ok(())
    })();
    match result {
        Ok(()) => {
            crate::sqlite_log::captured(database, &final_path);
            Ok(final_path)
        }
        Err(e) => {
            if let Ok(staging) = open_dir(dir.as_fd(), Path::new(&staging_name)) {
                for (src, inside) in moved.iter().rev() {
                    let _ = rustix::fs::renameat(&staging, *inside, &dir, *src);
                }
                let _ = rustix::fs::unlinkat(&staging, capture::MANIFEST_NAME, AtFlags::empty());
            }
            let _ = rustix::fs::unlinkat(&dir, staging_name.as_str(), AtFlags::REMOVEDIR);
            Err(io_err(&staging_path, e))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn manifest(
    database: &Path,
    wal: &File,
    wal_id: FileId,
    wal_name: &str,
    shm_id: Option<FileId>,
    main_now: Option<FileId>,
    main_header: &[u8],
    mismatch: &Mismatch,
) -> io::Result<Manifest> {
    let mut scanner = WalScanner::new();
    let mut hash = Sha256::new();
    let mut bytes = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut r = At { file: wal, pos: 0 };
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        scanner.feed(&buf[..n]);
        bytes += n as u64;
    }
    let summary = scanner.finish();
    Ok(Manifest {
        version: 1,
        database: path_display(database),
        database_hex: path_hex(database),
        trigger: Trigger::Open,
        reason: Some(RetireReason::StaleWal),
        pid: std::process::id(),
        captured_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        sqlite: rusqlite::version().to_owned(),
        wal: WalEntry {
            identity: wal_id,
            file: wal_name.to_owned(),
            bytes,
            sha256: paths::hex(&hash.finalize()),
            header: summary.header,
            frames: summary.frames,
            commits: summary.commits,
            last_commit_frame: summary.last_commit_frame,
        },
        shm: shm_id.map(|identity| ShmEntry { identity }),
        main: MainEntry {
            identity: main_now,
            size: 0,
            header: parse_main_header(main_header),
            mode: ImageMode::Absent,
            file: String::new(),
            bytes: 0,
            sha256: String::new(),
        },
        path_generation_at_capture: PathGeneration {
            main: identity_of_path(database).ok().flatten(),
            wal: None,
            shm: None,
        },
        backfill_at_loss: None,
        main_torn: false,
        stale_wal: Some(mismatch.clone()),
    })
}

/// For `recover --main`: copies `main` (the database file a stale WAL was written on, as the
/// operator gives it) to `copy`, and checks it against the record in the capture's manifest,
/// by the open's rule: every sampled page the recorded content or one of the WAL's frames.
pub(crate) fn check_main_for_capture(
    dir: &Path,
    manifest: &Manifest,
    main: &Path,
    copy: &Path,
) -> Result<(), crate::recover::RecoverError> {
    use crate::recover::RecoverError;
    let wrong = |why: String| RecoverError::NotACapture {
        path: main.to_path_buf(),
        why,
    };
    std::fs::copy(main, copy).map_err(|e| RecoverError::io(main, "copy the --main file", e))?;
    let Some(m) = &manifest.stale_wal else {
        return Err(wrong(
            "the capture's manifest has no stale_wal record".into(),
        ));
    };
    let record = &m.recorded;
    let wal_path = dir.join(&manifest.wal.file);
    let wal = File::open(&wal_path).map_err(|e| RecoverError::io(&wal_path, "open", e))?;
    let pages: Vec<u32> = record.pages.iter().map(|p| p.page).collect();
    let full =
        look_at_wal(&wal, Some(&pages)).map_err(|e| RecoverError::io(&wal_path, "read", e))?;
    let image = File::open(copy).map_err(|e| RecoverError::io(copy, "open", e))?;
    let size = image
        .metadata()
        .map_err(|e| RecoverError::io(copy, "stat", e))?
        .len();
    let read = |p: u32| {
        let offset = u64::from(p - 1) * u64::from(record.page_size);
        if offset + u64::from(record.page_size) > size {
            return None;
        }
        let mut buf = vec![0u8; fragment_len(p, record.page_size)];
        std::os::unix::fs::FileExt::read_exact_at(&image, &mut buf, offset).ok()?;
        Some(hex16(page_hash(&buf)))
    };
    match judge_pages(record, identity_of_path(main).ok().flatten(), read, &full) {
        Verdict::Stale(m) => Err(wrong(format!(
            "it is not the database file the captured WAL was written on: {}",
            m.detail
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: u32 = 512;

    fn page(fill: u8) -> Vec<u8> {
        vec![fill; PS as usize]
    }

    fn hash_of(p: u32, bytes: &[u8]) -> String {
        hex16(page_hash(&bytes[..fragment_len(p, PS)]))
    }

    fn record(pages: &[Vec<u8>]) -> WalBaseRecord {
        WalBaseRecord::new([7, 9], PS, None, &pages.concat(), pages.len() as u32)
    }

    fn look(frames: &[(u32, Vec<u8>)], min_commit_size: Option<u32>) -> WalLook {
        let mut header = parse_wal_header(&[]);
        header.valid = true;
        header.salts = [7, 9];
        header.page_size = PS;
        let mut frames_of: HashMap<u32, Vec<String>> = HashMap::new();
        for (p, bytes) in frames {
            frames_of.entry(*p).or_default().push(hash_of(*p, bytes));
        }
        WalLook {
            header,
            frames: 1,
            frames_of,
            min_commit_size,
        }
    }

    #[test]
    fn the_hash_tells_pages_apart() {
        assert_ne!(page_hash(&page(1)), page_hash(&page(2)));
        let mut a = page(0);
        a[300] = 1;
        assert_ne!(page_hash(&a), page_hash(&page(0)));
        assert_eq!(page_hash(&a), page_hash(&a.clone()));
    }

    #[test]
    fn a_record_round_trips_through_its_attribute_text() {
        let mut r = record(&[page(1), page(2)]);
        r.main = Some(FileId { dev: 3, ino: 4 });
        assert_eq!(r.pages.len(), 2);
        assert_eq!(WalBaseRecord::decode(&r.encode()), Some(r.clone()));
        assert_eq!(WalBaseRecord::decode(b"{}"), None);
        assert_eq!(hex16(0xab), "00000000000000ab");
        let bytes = [page(1), page(2)].concat();
        let (stack, n) = encode_record([7, 9], PS, r.main, &bytes, 2);
        assert_eq!(&stack[..n], &r.encode()[..]);
    }

    #[test]
    fn no_record_and_another_generation_are_no_judgement() {
        let l = look(&[], None);
        assert_eq!(judge_generation(&l, None), Err(Verdict::NoRecord));
        let mut other = record(&[page(1)]);
        other.salts = [8, 1];
        assert!(matches!(
            judge_generation(&l, Some(other)),
            Err(Verdict::OtherGeneration { .. })
        ));
        let mut empty = look(&[], None);
        empty.frames = 0;
        assert_eq!(
            judge_generation(&empty, Some(record(&[page(1)]))),
            Err(Verdict::NothingToReplay)
        );
    }

    #[test]
    fn pages_recorded_or_copied_from_a_frame_continue_anything_else_is_stale() {
        let r = record(&[page(1), page(2)]);
        let l = look(&[(1, page(5)), (2, page(6))], Some(1));
        let of = |pages: [Vec<u8>; 2]| move |p: u32| Some(hash_of(p, &pages[p as usize - 1]));
        assert_eq!(
            judge_pages(&r, None, of([page(1), page(2)]), &l),
            Verdict::Continues { by_pages: true }
        );
        assert_eq!(
            judge_pages(&r, None, of([page(5), page(6)]), &l),
            Verdict::Continues { by_pages: true }
        );
        match judge_pages(&r, None, of([page(1), page(9)]), &l) {
            Verdict::Stale(m) => assert_eq!(m.page, 2),
            v => panic!("{v:?}"),
        }
        // Beyond the end: only if a commit truncated below it.
        let one = |p: u32| (p == 1).then(|| hash_of(1, &page(1)));
        assert_eq!(
            judge_pages(&r, None, one, &l),
            Verdict::Continues { by_pages: true }
        );
        assert!(matches!(
            judge_pages(&r, None, one, &look(&[], None)),
            Verdict::Stale(_)
        ));
    }
}
