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

/// Size in bytes of the main database file header.
const MAIN_HEADER_SIZE: usize = 100;

/// Magic string at the start of every SQLite database file.
const MAIN_MAGIC: &[u8; 16] = b"SQLite format 3\0";

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
/// below shows its use).
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

/// Builds a WAL file image, for tests and fuzz seeds.
///
/// Writes a header (magic `0x377f0683` if `big_endian_cksum`, else
/// `0x377f0682`; format version 3007000; checkpoint sequence 0) and one frame
/// per `(pgno, commit_size, page)` entry, with a correct chained checksum.
/// A `commit_size` of 0 makes a non-commit frame. Each page is zero-padded or
/// truncated to `page_size` bytes. The page size is written as given, even if
/// SQLite would reject it.
#[doc(hidden)]
#[cfg(test)]
pub fn encode_test_wal(
    page_size: u32,
    salts: [u32; 2],
    frames: &[(u32, u32, Vec<u8>)],
    big_endian_cksum: bool,
) -> Vec<u8> {
    let page_len = page_size as usize;
    let mut out = Vec::with_capacity(
        WAL_HEADER_SIZE.saturating_add(
            frames
                .len()
                .saturating_mul(WAL_FRAME_HEADER_SIZE.saturating_add(page_len)),
        ),
    );
    let magic = if big_endian_cksum {
        WAL_MAGIC_BE
    } else {
        WAL_MAGIC_LE
    };
    for word in [magic, WAL_FORMAT_VERSION, page_size, 0, salts[0], salts[1]] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    let mut ck = wal_checksum(big_endian_cksum, &out, [0, 0]);
    out.extend_from_slice(&ck[0].to_be_bytes());
    out.extend_from_slice(&ck[1].to_be_bytes());

    let mut page_buf = vec![0u8; page_len];
    for (pgno, commit, page) in frames {
        page_buf.fill(0);
        let n = page.len().min(page_len);
        page_buf[..n].copy_from_slice(&page[..n]);
        let mut fh = [0u8; 8];
        fh[..4].copy_from_slice(&pgno.to_be_bytes());
        fh[4..].copy_from_slice(&commit.to_be_bytes());
        ck = wal_checksum(big_endian_cksum, &fh, ck);
        ck = wal_checksum(big_endian_cksum, &page_buf, ck);
        out.extend_from_slice(&fh);
        out.extend_from_slice(&salts[0].to_be_bytes());
        out.extend_from_slice(&salts[1].to_be_bytes());
        out.extend_from_slice(&ck[0].to_be_bytes());
        out.extend_from_slice(&ck[1].to_be_bytes());
        out.extend_from_slice(&page_buf);
    }
    out
}

/// The decoded fields of interest from the 100-byte main database header.
///
/// Fields are filled in on a best-effort basis even when `valid` is false
/// (fields beyond the end of a short input read as 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MainHeader {
    /// True iff at least 100 bytes were given, the magic is
    /// `"SQLite format 3\0"`, and the page size is a power of two in
    /// `512..=65536`.
    pub valid: bool,
    /// Page size in bytes (the on-disk value 1 means 65536).
    pub page_size: u32,
    /// File format write version (1 = legacy/rollback, 2 = WAL).
    pub write_version: u8,
    /// File format read version (1 = legacy/rollback, 2 = WAL).
    pub read_version: u8,
    /// In-header database size in pages (offset 28).
    pub page_count: u32,
    /// File change counter (offset 24).
    pub change_counter: u32,
    /// True iff both the read and write versions are 2 (WAL mode).
    pub wal_mode: bool,
}

/// Decodes the 100-byte main database header at the start of `bytes`.
///
/// Needs at least 100 bytes; short or invalid input yields `valid: false`
/// with best-effort fields. Never panics.
pub fn parse_main_header(bytes: &[u8]) -> MainHeader {
    let raw_page_size = be_u16_at(bytes, 16);
    let page_size = if raw_page_size == 1 {
        MAX_PAGE_SIZE
    } else {
        u32::from(raw_page_size)
    };
    let write_version = bytes.get(18).copied().unwrap_or(0);
    let read_version = bytes.get(19).copied().unwrap_or(0);
    let valid = bytes.len() >= MAIN_HEADER_SIZE
        && bytes.get(..MAIN_MAGIC.len()) == Some(&MAIN_MAGIC[..])
        && page_size_ok(page_size);
    MainHeader {
        valid,
        page_size,
        write_version,
        read_version,
        page_count: be_u32_at(bytes, 28),
        change_counter: be_u32_at(bytes, 24),
        wal_mode: write_version == 2 && read_version == 2,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_scanner_fed_in_chunks_matches_one_shot_summary() {
        let wal = encode_test_wal(512, [1, 2], &[(1, 1, vec![7u8; 512])], false);
        let mut scanner = WalScanner::new();
        for chunk in wal.chunks(100) {
            scanner.feed(chunk);
        }
        let summary = scanner.finish();
        assert_eq!(summary, summarize_wal(&wal));
        assert_eq!(summary.commits, 1);
    }

    use super::*;

    const PS: u32 = 512;

    fn page(fill: u8) -> Vec<u8> {
        (0..PS as usize)
            .map(|i| fill.wrapping_add(i as u8))
            .collect()
    }

    fn frame_size() -> usize {
        WAL_FRAME_HEADER_SIZE + PS as usize
    }

    /// Byte offset of 1-based frame `k`.
    fn frame_offset(k: usize) -> usize {
        WAL_HEADER_SIZE + (k - 1) * frame_size()
    }

    /// Three transactions: pages {1,2}, {3}, {1,4,5}.
    fn three_commit_frames() -> Vec<(u32, u32, Vec<u8>)> {
        vec![
            (1, 0, page(1)),
            (2, 2, page(2)),
            (3, 3, page(3)),
            (1, 0, page(4)),
            (4, 0, page(5)),
            (5, 5, page(6)),
        ]
    }

    fn main_header_bytes(page_size_field: u16, write: u8, read: u8) -> Vec<u8> {
        let mut h = vec![0u8; 100];
        h[..16].copy_from_slice(MAIN_MAGIC);
        h[16..18].copy_from_slice(&page_size_field.to_be_bytes());
        h[18] = write;
        h[19] = read;
        h[24..28].copy_from_slice(&7u32.to_be_bytes());
        h[28..32].copy_from_slice(&42u32.to_be_bytes());
        h
    }

    #[test]
    fn hand_made_wal_with_three_commits_is_summarised() {
        let wal = encode_test_wal(
            PS,
            [0xdead_beef, 0x1234_5678],
            &three_commit_frames(),
            false,
        );
        let s = summarize_wal(&wal);
        assert!(s.header.valid);
        assert_eq!(s.header.magic, WAL_MAGIC_LE);
        assert_eq!(s.header.format_version, 3_007_000);
        assert_eq!(s.header.page_size, PS);
        assert_eq!(s.header.salts, [0xdead_beef, 0x1234_5678]);
        assert_eq!(s.bytes, wal.len() as u64);
        assert_eq!(s.frames, 6);
        assert_eq!(s.commits, 3);
        assert_eq!(s.last_commit_frame, Some(6));
        assert_eq!(s.committed_frames, 6);
        assert_eq!(s.torn_tail_bytes, 0);
    }

    #[test]
    fn both_magic_variants_are_accepted_with_their_own_byte_order() {
        let frames = three_commit_frames();
        let le = encode_test_wal(PS, [5, 6], &frames, false);
        let be = encode_test_wal(PS, [5, 6], &frames, true);
        let (sle, sbe) = (summarize_wal(&le), summarize_wal(&be));
        assert_eq!(sle.header.magic, 0x377f_0682);
        assert_eq!(sbe.header.magic, 0x377f_0683);
        assert_ne!(sle.header.checksum, sbe.header.checksum);
        for s in [&sle, &sbe] {
            assert!(s.header.valid);
            assert_eq!((s.frames, s.commits, s.committed_frames), (6, 3, 6));
        }
    }

    #[test]
    fn flipping_the_magic_byte_order_bit_invalidates_the_header() {
        let mut wal = encode_test_wal(PS, [5, 6], &three_commit_frames(), false);
        wal[3] ^= 1;
        let s = summarize_wal(&wal);
        assert!(!s.header.valid);
        assert_eq!(s.frames, 0);
        assert_eq!(s.torn_tail_bytes, wal.len() as u64);
    }

    #[test]
    fn truncation_mid_frame_counts_frames_only_up_to_the_tear() {
        let wal = encode_test_wal(PS, [1, 2], &three_commit_frames(), false);
        // Cut 100 bytes into the page data of frame 5.
        let cut = frame_offset(5) + WAL_FRAME_HEADER_SIZE + 100;
        let s = summarize_wal(&wal[..cut]);
        assert_eq!(s.frames, 4);
        assert_eq!(s.commits, 2);
        assert_eq!(s.last_commit_frame, Some(3));
        assert_eq!(s.committed_frames, 3);
        assert_eq!(s.bytes, cut as u64);
        assert_eq!(s.torn_tail_bytes, (WAL_FRAME_HEADER_SIZE + 100) as u64);
    }

    #[test]
    fn truncation_mid_frame_header_counts_frames_only_up_to_the_tear() {
        let wal = encode_test_wal(PS, [1, 2], &three_commit_frames(), false);
        let cut = frame_offset(4) + 10;
        let s = summarize_wal(&wal[..cut]);
        assert_eq!((s.frames, s.commits, s.committed_frames), (3, 2, 3));
        assert_eq!(s.torn_tail_bytes, 10);
    }

    #[test]
    fn truncation_mid_wal_header_gives_invalid_header_and_no_frames() {
        let wal = encode_test_wal(PS, [1, 2], &three_commit_frames(), false);
        let s = summarize_wal(&wal[..20]);
        assert!(!s.header.valid);
        assert_eq!(
            s.header.magic, WAL_MAGIC_LE,
            "available fields still decoded"
        );
        assert_eq!(s.header.checksum, [0, 0]);
        assert_eq!((s.frames, s.commits, s.last_commit_frame), (0, 0, None));
        assert_eq!(s.bytes, 20);
        assert_eq!(s.torn_tail_bytes, 20);
    }

    #[test]
    fn corrupted_checksum_in_frame_k_stops_the_scan_at_k_minus_one() {
        let wal = encode_test_wal(PS, [1, 2], &three_commit_frames(), false);
        for k in 1..=6 {
            let mut bad = wal.clone();
            bad[frame_offset(k) + 16] ^= 0x40; // stored checksum-1
            let s = summarize_wal(&bad);
            assert_eq!(s.frames, (k - 1) as u64, "corrupt frame {k}");
            assert_eq!(
                s.torn_tail_bytes,
                (wal.len() - frame_offset(k)) as u64,
                "corrupt frame {k}"
            );
        }
    }

    #[test]
    fn corrupted_page_data_in_frame_k_stops_the_scan_at_k_minus_one() {
        let wal = encode_test_wal(PS, [1, 2], &three_commit_frames(), true);
        let mut bad = wal.clone();
        bad[frame_offset(3) + WAL_FRAME_HEADER_SIZE + 300] ^= 1;
        let s = summarize_wal(&bad);
        assert_eq!((s.frames, s.commits, s.last_commit_frame), (2, 1, Some(2)));
    }

    #[test]
    fn frame_with_page_number_zero_is_invalid() {
        let frames = vec![(1, 1, page(1)), (0, 2, page(2)), (2, 2, page(3))];
        let s = summarize_wal(&encode_test_wal(PS, [1, 2], &frames, false));
        assert_eq!((s.frames, s.commits), (1, 1));
    }

    #[test]
    fn stale_frames_after_a_wal_reset_are_not_counted() {
        let old: Vec<_> = (1..=5).map(|i| (i, i, page(i as u8))).collect();
        let mut wal = encode_test_wal(PS, [0xaaaa_0001, 0xaaaa_0002], &old, false);
        let new = vec![(7, 0, page(70)), (8, 8, page(80))];
        let fresh = encode_test_wal(PS, [0xaaaa_0002, 0xbbbb_0003], &new, false);
        wal[..fresh.len()].copy_from_slice(&fresh);
        let s = summarize_wal(&wal);
        assert!(s.header.valid);
        assert_eq!(s.header.salts, [0xaaaa_0002, 0xbbbb_0003]);
        assert_eq!(s.frames, 2);
        assert_eq!(s.commits, 1);
        assert_eq!(s.last_commit_frame, Some(2));
        assert_eq!(s.bytes, wal.len() as u64);
        assert_eq!(s.torn_tail_bytes, (3 * frame_size()) as u64);
    }

    #[test]
    fn uncommitted_trailing_valid_frames_are_not_committed() {
        let mut frames = three_commit_frames();
        frames.push((6, 0, page(7)));
        frames.push((7, 0, page(8)));
        let s = summarize_wal(&encode_test_wal(PS, [1, 2], &frames, false));
        assert_eq!(s.frames, 8);
        assert_eq!(s.commits, 3);
        assert_eq!(s.last_commit_frame, Some(6));
        assert_eq!(s.committed_frames, 6);
        assert_eq!(s.torn_tail_bytes, 0);
    }

    #[test]
    fn wal_with_no_commit_frames_has_no_committed_prefix() {
        let frames = vec![(1, 0, page(1)), (2, 0, page(2))];
        let s = summarize_wal(&encode_test_wal(PS, [1, 2], &frames, false));
        assert_eq!((s.frames, s.commits, s.last_commit_frame), (2, 0, None));
        assert_eq!(s.committed_frames, 0);
    }

    #[test]
    fn header_only_wal_is_valid_with_no_frames() {
        let wal = encode_test_wal(PS, [1, 2], &[], false);
        let s = summarize_wal(&wal);
        assert!(s.header.valid);
        assert_eq!((s.bytes, s.frames, s.torn_tail_bytes), (32, 0, 0));
    }

    #[test]
    fn feeding_one_byte_chunks_gives_the_same_summary_as_one_chunk() {
        let mut wal = encode_test_wal(PS, [9, 9], &three_commit_frames(), true);
        wal.extend_from_slice(&[0x55; 300]); // torn tail too
        let whole = summarize_wal(&wal);
        let mut scanner = WalScanner::new();
        for b in &wal {
            scanner.feed(std::slice::from_ref(b));
        }
        assert_eq!(scanner.finish(), whole);
        assert_eq!(whole.frames, 6);
    }

    #[test]
    fn feeding_odd_sized_chunks_gives_the_same_summary_as_one_chunk() {
        let mut frames = three_commit_frames();
        frames.push((9, 0, page(9)));
        let wal = encode_test_wal(PS, [3, 4], &frames, false);
        let whole = summarize_wal(&wal);
        for size in [3, 7, 31, 32, 33, 535, 536, 537, 1000, 4096] {
            let mut scanner = WalScanner::new();
            scanner.feed(&[]);
            for chunk in wal.chunks(size) {
                scanner.feed(chunk);
                scanner.feed(&[]);
            }
            assert_eq!(scanner.finish(), whole, "chunk size {size}");
        }
    }

    #[test]
    fn all_legal_page_sizes_are_accepted() {
        let mut ps = 512;
        while ps <= 65_536 {
            let frames = vec![(1, 1, vec![0xa5; ps as usize])];
            let s = summarize_wal(&encode_test_wal(ps, [1, 2], &frames, false));
            assert!(s.header.valid, "page size {ps}");
            assert_eq!(s.frames, 1, "page size {ps}");
            ps *= 2;
        }
    }

    #[test]
    fn illegal_page_sizes_give_an_invalid_header() {
        for ps in [0, 1, 256, 513, 1000, 131_072, u32::MAX] {
            let s = summarize_wal(&encode_test_wal(ps, [1, 2], &[], false));
            assert!(!s.header.valid, "page size {ps}");
            assert_eq!(s.header.page_size, ps);
        }
    }

    #[test]
    fn wrong_format_version_gives_an_invalid_header() {
        let mut wal = encode_test_wal(PS, [1, 2], &[], true);
        wal[4..8].copy_from_slice(&3_007_001u32.to_be_bytes());
        // Recompute the header checksum so only the version is wrong.
        let ck = wal_checksum(true, &wal[..24], [0, 0]);
        wal[24..28].copy_from_slice(&ck[0].to_be_bytes());
        wal[28..32].copy_from_slice(&ck[1].to_be_bytes());
        assert!(!parse_wal_header(&wal).valid);
    }

    #[test]
    fn garbage_and_short_input_gives_invalid_without_panicking() {
        let mut seed = 0x1234_5678_u32;
        let mut garbage = vec![0u8; 5000];
        for b in &mut garbage {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            *b = (seed >> 16) as u8;
        }
        for len in [0, 1, 4, 31, 32, 33, 99, 100, 5000] {
            let input = &garbage[..len];
            let s = summarize_wal(input);
            assert!(!s.header.valid);
            assert_eq!(
                (s.frames, s.bytes, s.torn_tail_bytes),
                (0, len as u64, len as u64)
            );
            assert!(!parse_wal_header(input).valid);
            assert!(!parse_main_header(input).valid);
        }
        assert_eq!(parse_wal_header(&[]).magic, 0);
        assert_eq!(parse_main_header(&[]).page_size, 0);
    }

    #[test]
    fn randomly_mutated_wals_never_panic_and_chunking_never_changes_the_summary() {
        let base = encode_test_wal(PS, [11, 22], &three_commit_frames(), false);
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as usize % n.max(1)
        };
        for _ in 0..300 {
            let mut wal = base.clone();
            for _ in 0..next(4) {
                let i = next(wal.len());
                wal[i] ^= 1 << next(8);
            }
            wal.truncate(next(wal.len() + 1));
            let whole = summarize_wal(&wal);
            let accounted = if whole.header.valid {
                32 + whole.frames * frame_size() as u64
            } else {
                0
            };
            assert_eq!(whole.bytes, wal.len() as u64);
            assert_eq!(whole.torn_tail_bytes, whole.bytes - accounted);
            assert!(whole.committed_frames <= whole.frames);
            assert!(whole.commits <= whole.frames);
            let mut scanner = WalScanner::new();
            let mut rest = &wal[..];
            while !rest.is_empty() {
                let (chunk, tail) = rest.split_at(1 + next(rest.len()));
                scanner.feed(chunk);
                rest = tail;
            }
            assert_eq!(scanner.finish(), whole);
        }
    }

    #[test]
    fn valid_header_followed_by_garbage_frames_is_all_torn_tail() {
        let mut wal = encode_test_wal(PS, [1, 2], &[], false);
        wal.extend(std::iter::repeat_n(0xffu8, 3 * frame_size()));
        let s = summarize_wal(&wal);
        assert!(s.header.valid);
        assert_eq!(s.frames, 0);
        assert_eq!(s.torn_tail_bytes, (3 * frame_size()) as u64);
    }

    #[test]
    fn main_header_parses_valid_rollback_header() {
        let h = parse_main_header(&main_header_bytes(4096, 1, 1));
        assert_eq!(
            h,
            MainHeader {
                valid: true,
                page_size: 4096,
                write_version: 1,
                read_version: 1,
                page_count: 42,
                change_counter: 7,
                wal_mode: false,
            }
        );
    }

    #[test]
    fn main_header_page_size_field_one_means_65536() {
        let h = parse_main_header(&main_header_bytes(1, 1, 1));
        assert!(h.valid);
        assert_eq!(h.page_size, 65_536);
    }

    #[test]
    fn main_header_wal_mode_needs_both_versions_two() {
        assert!(parse_main_header(&main_header_bytes(4096, 2, 2)).wal_mode);
        assert!(!parse_main_header(&main_header_bytes(4096, 2, 1)).wal_mode);
        assert!(!parse_main_header(&main_header_bytes(4096, 1, 2)).wal_mode);
    }

    #[test]
    fn main_header_rejects_bad_magic_bad_page_size_and_short_input() {
        let mut bad_magic = main_header_bytes(4096, 2, 2);
        bad_magic[0] = b's';
        assert!(!parse_main_header(&bad_magic).valid);
        for ps in [0, 2, 256, 1000, 4097] {
            assert!(
                !parse_main_header(&main_header_bytes(ps, 1, 1)).valid,
                "{ps}"
            );
        }
        let short = &main_header_bytes(4096, 2, 2)[..99];
        let h = parse_main_header(short);
        assert!(!h.valid);
        assert_eq!(h.page_size, 4096, "best-effort fields still decoded");
    }
}
