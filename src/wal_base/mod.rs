//! The WAL-base record and what is judged from it, platform-independent: the record that binds
//! a WAL generation to the main file it was started on, the judgement of a WAL left beside a
//! database it was not written on (a stale WAL), and the capture that sets a stale WAL aside.
//! Safe code; the shim's side of the stale-WAL rule (`vfs/stale_wal/`: the hooks that write the
//! record, the gate at the WAL's open) hands it plain values.
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
use std::ffi::CStr;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::identity::FileId;
pub use crate::wal_base_record::{Mismatch, PageHash, WalBaseRecord};
use crate::walfile::{
    parse_wal_header, wal_checksum, WalHeader, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE,
};

/// The extended attribute of a WAL inode that holds its [`WalBaseRecord`] (a C string: passed to
/// the kernel as it is, not copied and scanned for a NUL at each checkpoint's read and write).
pub(crate) const RECORD_XATTR: &CStr = c"user.hermes-guard.wal-base";

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
    // The common fragment, a page header of 12 bytes (every recorded page but the first), with
    // its length known: the loops unroll into straight-line code (each checkpoint's judgement
    // and record hash fifteen of them). The same value either way.
    match <&[u8; HEADER_FRAGMENT]>::try_from(bytes) {
        Ok(fragment) => hash_bytes(fragment),
        Err(_) => hash_bytes(bytes),
    }
}

/// The bytes of a recorded page other than the first (its b-tree page header).
const HEADER_FRAGMENT: usize = 12;

/// [`page_hash`]'s function, inlined into each of its two cases.
#[inline(always)]
fn hash_bytes(bytes: &[u8]) -> u64 {
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
    // The count, then each page's number and hash, written in place as they are hashed.
    let entries = n + 1;
    let mut count = 0;
    for page in 1..=pages.min(RECORDED_PAGES) {
        let at = (page as usize - 1) * page_size as usize;
        if let Some(bytes) = first.get(at..at + fragment_len(page, page_size)) {
            let entry = &mut v[entries + 12 * count..entries + 12 * (count + 1)];
            entry[..4].copy_from_slice(&page.to_le_bytes());
            entry[4..].copy_from_slice(&page_hash(bytes).to_le_bytes());
            count += 1;
        }
    }
    v[entries - 1] = count as u8;
    (v, entries + 12 * count)
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
pub(super) use crate::digest::ReadAt as At;

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

mod aside;
pub(crate) use aside::{check_main_for_capture, set_aside};
mod error;
pub(crate) use error::MainCheckError;
mod judge;
pub(crate) use judge::{judge_wal, quick_look, recorded_page_hash, MainNow};

#[cfg(test)]
mod tests;
