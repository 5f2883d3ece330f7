//! Pure, safe, panic-free parsing of SQLite WAL files and main-database
//! headers.
//!
//! Format reference: <https://sqlite.org/fileformat2.html#walformat>, checked
//! against the bundled `sqlite3.c` (`walChecksumBytes`, `walDecodeFrame`,
//! `walIndexRecover`).
//!
//! Everything here operates on byte slices only: no I/O, no `unsafe`, no
//! panics on any input, and wrapping arithmetic throughout, so it is safe to
//! call from inside a VFS callback and suitable as a fuzz target.
//!
//! # WAL layout
//!
//! A WAL file is a 32-byte header followed by zero or more frames. Each frame
//! is a 24-byte frame header followed by one page of `page_size` bytes.
//!
//! The checksums form a chain: the header checksum covers the first 24 header
//! bytes starting from `(0, 0)`; each frame's checksum continues from the
//! previous frame's (or the header's) checksum over the first 8 bytes of the
//! frame header and then the page data. A frame is valid iff its salts equal
//! the header salts, its page number is non-zero, and its stored checksum
//! equals the chained checksum. Like SQLite's recovery, scanning stops at the
//! first invalid frame; everything after it is "torn tail" (including stale
//! frames left over from before a WAL reset, which carry old salts).

use serde::{Deserialize, Serialize};

#[cfg(test)]
mod encode;
mod main_header;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub use encode::encode_test_wal;
pub(crate) use main_header::{main_header_page_size, page_size_field};
pub use main_header::{parse_main_header, MainHeader};

/// Size in bytes of the WAL file header.
pub const WAL_HEADER_SIZE: usize = 32;

/// Size in bytes of each WAL frame header (the page data follows it).
pub const WAL_FRAME_HEADER_SIZE: usize = 24;

/// WAL magic with the low bit clear: checksums use little-endian `u32` words.
const WAL_MAGIC_LE: u32 = 0x377f_0682;

/// WAL magic with the low bit set: checksums use big-endian `u32` words.
const WAL_MAGIC_BE: u32 = 0x377f_0683;

/// The only WAL format version SQLite understands (`WAL_MAX_VERSION`).
const WAL_FORMAT_VERSION: u32 = 3_007_000;

/// Smallest legal page size.
const MIN_PAGE_SIZE: u32 = 512;

/// The smallest WAL that holds a transaction: its header and one frame of the smallest page.
pub const SMALLEST_WAL_WITH_A_FRAME: u64 =
    (WAL_HEADER_SIZE + WAL_FRAME_HEADER_SIZE) as u64 + MIN_PAGE_SIZE as u64;

/// Largest legal page size (`SQLITE_MAX_PAGE_SIZE`).
const MAX_PAGE_SIZE: u32 = 65_536;

/// The decoded 32-byte WAL header.
///
/// Fields are filled in on a best-effort basis even when `valid` is false
/// (fields that lie beyond the end of a short input read as 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WalHeader {
    /// True iff the magic is one of the two WAL magics, the format version is
    /// 3007000, the page size is a power of two in `512..=65536`, and the
    /// header checksum matches — i.e. SQLite would accept the header.
    pub valid: bool,
    /// Magic number (`0x377f0682` = little-endian checksums,
    /// `0x377f0683` = big-endian checksums).
    pub magic: u32,
    /// WAL format version (3007000).
    pub format_version: u32,
    /// Database page size in bytes.
    pub page_size: u32,
    /// Checkpoint sequence number.
    pub checkpoint_seq: u32,
    /// Salt-1 and salt-2; every valid frame repeats these.
    pub salts: [u32; 2],
    /// Stored checksum over the first 24 bytes of the header.
    pub checksum: [u32; 2],
}

/// Summary of a whole WAL file, as SQLite's recovery would see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WalSummary {
    /// The decoded WAL header.
    pub header: WalHeader,
    /// Total number of bytes fed (the whole file, torn tail included).
    pub bytes: u64,
    /// Number of valid frames (the scan stops at the first invalid frame).
    pub frames: u64,
    /// Number of commit frames (non-zero "db size after commit") among the
    /// valid frames.
    pub commits: u64,
    /// 1-based index of the last valid commit frame, if any.
    pub last_commit_frame: Option<u64>,
    /// Number of frames in the committed prefix: valid frames up to and
    /// including the last valid commit frame. Valid frames after it belong to
    /// an uncommitted transaction and are not counted here.
    pub committed_frames: u64,
    /// Bytes after the last valid frame: partial frames, the first invalid
    /// frame and everything following it (e.g. stale frames from before a WAL
    /// reset). When the header itself is invalid or short, this is every byte.
    pub torn_tail_bytes: u64,
    /// The stored checksum of the first valid frame (`None`: no valid frame): with the header it
    /// names the generation ([`generation_id`]).
    pub first_frame_checksum: Option<[u32; 2]>,
}

/// The identity of a WAL generation: its header's salts, checkpoint sequence and checksum, and
/// its first frame's stored checksum (`wal-gen:<salt-1>-<salt-2> ckpt:<n> cksum:<c1>-<c2>
/// frame-1:<c1>-<c2>`, lowercase hex). SQLite draws new salts whenever it starts the WAL over and
/// never rewrites a committed frame until then: every copy of one generation shares it, however
/// far it reads. `None` for a header SQLite rejects or a WAL without a valid frame.
pub fn generation_id(header: &WalHeader, first_frame_checksum: Option<[u32; 2]>) -> Option<String> {
    let first = first_frame_checksum.filter(|_| header.valid)?;
    Some(format!(
        "wal-gen:{:08x}-{:08x} ckpt:{} cksum:{:08x}-{:08x} frame-1:{:08x}-{:08x}",
        header.salts[0],
        header.salts[1],
        header.checkpoint_seq,
        header.checksum[0],
        header.checksum[1],
        first[0],
        first[1]
    ))
}

/// Where the scanner is within the WAL byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScanState {
    /// Still collecting the 32-byte WAL header.
    Header,
    /// Header was valid; decoding frames.
    Frames,
    /// Header invalid or an invalid frame was seen: the rest is torn tail.
    Torn,
}

/// Push-based scanner: feed the WAL bytes in arbitrary-size chunks, in order
/// (bounded memory: holds at most one frame).
///
/// Whole frames that lie entirely within a fed chunk are checked in place;
/// only a frame straddling chunk boundaries is copied into an internal buffer
/// of `24 + page_size` bytes, allocated once. The scanner never panics, on any
/// input, and never allocates per byte (`a_scanner_fed_in_chunks_matches_one_shot_summary`
/// in `tests.rs` shows its use).
#[derive(Debug, Clone)]
pub struct WalScanner {
    state: ScanState,
    /// Total bytes fed so far (wrapping).
    bytes: u64,
    /// Header bytes collected so far (first `hdr_len` are meaningful).
    hdr_buf: [u8; WAL_HEADER_SIZE],
    hdr_len: usize,
    /// Decoded header, once 32 bytes have arrived.
    header: Option<WalHeader>,
    /// True when checksum words are big-endian (magic low bit set).
    big_endian: bool,
    /// Raw salt bytes from the header, compared against each frame.
    salts_raw: [u8; 8],
    /// Running checksum (chained through header and all valid frames).
    cksum: [u32; 2],
    /// Frame size: `WAL_FRAME_HEADER_SIZE + page_size` (0 until known).
    frame_size: usize,
    /// Partial frame straddling chunk boundaries (never exceeds `frame_size`).
    frame_buf: Vec<u8>,
    frames: u64,
    commits: u64,
    last_commit_frame: Option<u64>,
    first_frame_checksum: Option<[u32; 2]>,
}

impl Default for WalScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl WalScanner {
    /// Creates a scanner positioned at the start of a WAL file.
    pub fn new() -> Self {
        WalScanner {
            state: ScanState::Header,
            bytes: 0,
            hdr_buf: [0; WAL_HEADER_SIZE],
            hdr_len: 0,
            header: None,
            big_endian: false,
            salts_raw: [0; 8],
            cksum: [0; 2],
            frame_size: 0,
            frame_buf: Vec::new(),
            frames: 0,
            commits: 0,
            last_commit_frame: None,
            first_frame_checksum: None,
        }
    }

    /// Feeds the next `chunk` of WAL bytes. Chunks must be fed in file order;
    /// their sizes are arbitrary (empty chunks are fine).
    pub fn feed(&mut self, chunk: &[u8]) {
        self.bytes = self.bytes.wrapping_add(chunk.len() as u64);
        let mut rest = chunk;
        loop {
            match self.state {
                ScanState::Torn => return,
                ScanState::Header => {
                    let want = WAL_HEADER_SIZE.saturating_sub(self.hdr_len);
                    let take = want.min(rest.len());
                    let (head, tail) = rest.split_at(take);
                    if let Some(dst) = self.hdr_buf.get_mut(self.hdr_len..self.hdr_len + take) {
                        dst.copy_from_slice(head);
                    }
                    self.hdr_len += take;
                    rest = tail;
                    if self.hdr_len < WAL_HEADER_SIZE {
                        return;
                    }
                    self.start_frames();
                }
                ScanState::Frames => {
                    self.feed_frames(rest);
                    return;
                }
            }
        }
    }

    /// Called once the full header has arrived: decodes it and moves to
    /// frame scanning (valid header) or the torn state (invalid header).
    fn start_frames(&mut self) {
        let header = parse_wal_header(&self.hdr_buf);
        if header.valid {
            self.big_endian = header.magic & 1 == 1;
            self.salts_raw.copy_from_slice(&self.hdr_buf[16..24]);
            self.cksum = header.checksum;
            self.frame_size = WAL_FRAME_HEADER_SIZE + header.page_size as usize;
            self.frame_buf = Vec::with_capacity(self.frame_size);
            self.state = ScanState::Frames;
        } else {
            self.state = ScanState::Torn;
        }
        self.header = Some(header);
    }

    /// Consumes all of `input` as frame bytes, switching to the torn state at
    /// the first invalid frame.
    fn feed_frames(&mut self, mut input: &[u8]) {
        let fsz = self.frame_size;
        if !self.frame_buf.is_empty() {
            // Complete the frame that straddles the previous chunk boundary.
            let take = fsz.saturating_sub(self.frame_buf.len()).min(input.len());
            let (head, tail) = input.split_at(take);
            self.frame_buf.extend_from_slice(head);
            input = tail;
            if self.frame_buf.len() < fsz {
                return;
            }
            let buf = std::mem::take(&mut self.frame_buf);
            let ok = self.accept_frame(&buf);
            self.frame_buf = buf;
            self.frame_buf.clear();
            if !ok {
                self.tear();
                return;
            }
        }
        // Whole frames directly from the caller's buffer: no copying.
        while input.len() >= fsz {
            let (frame, tail) = input.split_at(fsz);
            if !self.accept_frame(frame) {
                self.tear();
                return;
            }
            input = tail;
        }
        self.frame_buf.extend_from_slice(input);
    }

    /// Switches to the torn state and releases the frame buffer: from here on
    /// bytes are only counted.
    fn tear(&mut self) {
        self.state = ScanState::Torn;
        self.frame_buf = Vec::new();
    }

    /// Validates one complete frame (`frame.len() == frame_size`) and, if
    /// valid, records it and advances the running checksum.
    fn accept_frame(&mut self, frame: &[u8]) -> bool {
        let Some((hdr, page)) = frame.split_at_checked(WAL_FRAME_HEADER_SIZE) else {
            return false;
        };
        if hdr.get(8..16) != Some(&self.salts_raw[..]) {
            return false;
        }
        let pgno = be_u32_at(hdr, 0);
        if pgno == 0 {
            return false;
        }
        let mut ck = self.cksum;
        ck = wal_checksum(self.big_endian, hdr.get(..8).unwrap_or(&[]), ck);
        ck = wal_checksum(self.big_endian, page, ck);
        if ck != [be_u32_at(hdr, 16), be_u32_at(hdr, 20)] {
            return false;
        }
        self.cksum = ck;
        self.frames = self.frames.wrapping_add(1);
        if self.frames == 1 {
            self.first_frame_checksum = Some(ck);
        }
        if be_u32_at(hdr, 4) != 0 {
            self.commits = self.commits.wrapping_add(1);
            self.last_commit_frame = Some(self.frames);
        }
        true
    }

    /// Ends the scan and returns the summary of everything fed.
    pub fn finish(self) -> WalSummary {
        let header = match self.header {
            Some(h) => h,
            None => parse_wal_header(self.hdr_buf.get(..self.hdr_len).unwrap_or(&[])),
        };
        let torn_tail_bytes = if header.valid {
            let accounted = (WAL_HEADER_SIZE as u64)
                .wrapping_add(self.frames.wrapping_mul(self.frame_size as u64));
            self.bytes.saturating_sub(accounted)
        } else {
            self.bytes
        };
        WalSummary {
            header,
            bytes: self.bytes,
            frames: self.frames,
            commits: self.commits,
            last_commit_frame: self.last_commit_frame,
            committed_frames: self.last_commit_frame.unwrap_or(0),
            torn_tail_bytes,
            first_frame_checksum: self.first_frame_checksum,
        }
    }
}

/// Reads a big-endian `u32` at `off`, or 0 if it does not fit in `bytes`.
fn be_u32_at(bytes: &[u8], off: usize) -> u32 {
    match bytes.get(off..off.wrapping_add(4)) {
        Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
        _ => 0,
    }
}

/// Reads a big-endian `u16` at `off`, or 0 if it does not fit in `bytes`.
fn be_u16_at(bytes: &[u8], off: usize) -> u16 {
    match bytes.get(off..off.wrapping_add(2)) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        _ => 0,
    }
}

/// SQLite's `walChecksumBytes`: continues the checksum `s` over `data`,
/// interpreted as pairs of `u32` words in big- or little-endian order.
///
/// `data.len()` is a multiple of 8 for every real use; a trailing partial
/// 8-byte group (only possible for corrupt sizes) is ignored.
pub(crate) fn wal_checksum(big_endian: bool, data: &[u8], s: [u32; 2]) -> [u32; 2] {
    let (words, _) = data.as_chunks::<8>();
    if big_endian {
        checksum_words(words, s, u32::from_be_bytes)
    } else {
        checksum_words(words, s, u32::from_le_bytes)
    }
}

/// Tight checksum loop, monomorphised per byte order.
#[inline(always)]
fn checksum_words<F: Fn([u8; 4]) -> u32>(words: &[[u8; 8]], s: [u32; 2], load: F) -> [u32; 2] {
    let [mut s1, mut s2] = s;
    for &[a0, a1, a2, a3, b0, b1, b2, b3] in words {
        s1 = s1.wrapping_add(load([a0, a1, a2, a3])).wrapping_add(s2);
        s2 = s2.wrapping_add(load([b0, b1, b2, b3])).wrapping_add(s1);
    }
    [s1, s2]
}

/// True iff `page_size` is a power of two in `512..=65536`.
fn page_size_ok(page_size: u32) -> bool {
    page_size.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size)
}

/// Decodes the 32-byte WAL header at the start of `bytes`.
///
/// Invalid or short input yields `valid: false`, with the fields decoded on a
/// best-effort basis (fields beyond the end of `bytes` are 0). Never panics.
pub fn parse_wal_header(bytes: &[u8]) -> WalHeader {
    let magic = be_u32_at(bytes, 0);
    let format_version = be_u32_at(bytes, 4);
    let page_size = be_u32_at(bytes, 8);
    let checksum = [be_u32_at(bytes, 24), be_u32_at(bytes, 28)];
    let valid = match bytes.get(..24) {
        Some(covered) if bytes.len() >= WAL_HEADER_SIZE => {
            (magic == WAL_MAGIC_LE || magic == WAL_MAGIC_BE)
                && format_version == WAL_FORMAT_VERSION
                && page_size_ok(page_size)
                && wal_checksum(magic & 1 == 1, covered, [0, 0]) == checksum
        }
        _ => false,
    };
    WalHeader {
        valid,
        magic,
        format_version,
        page_size,
        checkpoint_seq: be_u32_at(bytes, 12),
        salts: [be_u32_at(bytes, 16), be_u32_at(bytes, 20)],
        checksum,
    }
}

/// Summarises a complete WAL file held in memory (one `feed` + `finish`).
#[cfg(any(test, feature = "test-hooks"))]
pub fn summarize_wal(bytes: &[u8]) -> WalSummary {
    let mut scanner = WalScanner::new();
    scanner.feed(bytes);
    scanner.finish()
}
