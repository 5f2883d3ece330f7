//! A WAL file read from its bytes: what SQLite's recovery reads, and what lies past the point
//! where it stops.
//!
//! The valid prefix is found exactly as `walIndexRecover` finds it: a header SQLite accepts, then
//! frames whose salts equal the header's, whose page number is not 0, and whose stored checksum
//! equals the cumulative checksum (`walChecksumBytes` in the header's byte order, continued from
//! the header's checksum over each frame's first 8 header bytes and its page). The first frame
//! that fails ends the prefix; SQLite reads nothing after it.
//!
//! Past that point, the frames are only surveyed: how many carry this WAL's salts (written for
//! this generation, so a checksum failure among them is damage, not a leftover), how many of
//! those are commit frames (transactions this generation committed that SQLite cannot read), and
//! how many still chain from the stored checksum of the frame before them (intact themselves,
//! unreachable only because an earlier frame is broken). Frames with other salts are leftovers
//! from before the WAL was last reset, which SQLite ignores by design.
//!
//! [`crate::walfile::WalScanner`] (the capture's scanner, on the VFS path) stops at the first
//! invalid frame; this reader is separate so that stopping stays free there. Both agree on the
//! prefix (tested below on randomly damaged WALs).

use std::io::{self, Read};
use std::path::Path;

use serde::Serialize;

use crate::walfile::{
    parse_wal_header, wal_checksum, WalHeader, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE,
};

/// Why the valid prefix of a WAL ends where it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PrefixEnd {
    /// The file ends at a frame boundary right after the last valid frame.
    EndOfFile,
    /// The file ends part-way through a frame.
    PartialFrame,
    /// The next frame carries other salts than the header: a leftover from before the WAL was
    /// last reset (SQLite ignores it by design).
    OtherSalts,
    /// The next frame has page number 0.
    PageNumberZero,
    /// The next frame's stored checksum is not the cumulative checksum: it, or a frame before
    /// it, was changed after it was written.
    Checksum,
    /// The 32-byte header is not one SQLite accepts (magic, version, page size, checksum):
    /// SQLite reads no frame at all.
    BadHeader,
}

impl PrefixEnd {
    /// A phrase for the operator.
    pub fn describe(self) -> &'static str {
        match self {
            PrefixEnd::EndOfFile => "the file ends there",
            PrefixEnd::PartialFrame => "the file ends part-way through the next frame",
            PrefixEnd::OtherSalts => {
                "the next frame carries other salts (a leftover from before the WAL was reset)"
            }
            PrefixEnd::PageNumberZero => "the next frame has page number 0",
            PrefixEnd::Checksum => "the next frame's checksum does not match",
            PrefixEnd::BadHeader => "the WAL header is not valid, so SQLite reads no frame",
        }
    }
}

/// What the bytes of a WAL file hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WalCheck {
    /// Bytes read (the whole file).
    pub bytes: u64,
    /// The decoded header (`valid` says whether SQLite accepts it).
    pub header: WalHeader,
    /// Frames in the valid prefix: what SQLite replays.
    pub frames: u64,
    /// Commit frames in the valid prefix: the transactions SQLite can read.
    pub commits: u64,
    /// 1-based number of the last commit frame in the prefix.
    pub last_commit_frame: Option<u64>,
    /// Why the prefix ends there.
    pub prefix_end: PrefixEnd,
    /// Whole frames after the prefix (the first one is the frame that failed).
    pub frames_after: u64,
    /// Of those, frames carrying this WAL's salts: written for this generation.
    pub frames_after_with_salts: u64,
    /// Commit frames among those: transactions this generation committed that SQLite cannot read.
    pub commits_after: u64,
    /// Frames after the first failed one whose checksum still continues from the stored checksum
    /// of the frame before them: intact, unreachable only because of an earlier frame.
    pub frames_after_intact: u64,
    /// Bytes after the last whole frame (or every byte after the header when it is not valid).
    pub partial_bytes: u64,
    /// The stored checksum of the first frame of the valid prefix (`None`: no valid frame). With
    /// the header's salts and checksum it names the generation: every copy of this WAL, however
    /// far it reads, shares them (see `recover::generation_id`).
    pub first_frame_checksum: Option<[u32; 2]>,
}

impl WalCheck {
    /// Reads `path` to its end.
    pub fn read_file(path: &Path) -> io::Result<WalCheck> {
        let file = std::fs::File::open(path)?;
        WalCheck::read(io::BufReader::with_capacity(1 << 20, file))
    }

    /// Reads `input` to its end.
    pub fn read(mut input: impl Read) -> io::Result<WalCheck> {
        let mut head = [0u8; WAL_HEADER_SIZE];
        let got = read_full(&mut input, &mut head)?;
        let header = parse_wal_header(head.get(..got).unwrap_or(&[]));
        let mut check = WalCheck {
            bytes: got as u64,
            header,
            frames: 0,
            commits: 0,
            last_commit_frame: None,
            prefix_end: PrefixEnd::BadHeader,
            frames_after: 0,
            frames_after_with_salts: 0,
            commits_after: 0,
            frames_after_intact: 0,
            partial_bytes: 0,
            first_frame_checksum: None,
        };
        if !check.header.valid {
            let rest = io::copy(&mut input, &mut io::sink())?;
            check.bytes += rest;
            check.partial_bytes = check.bytes;
            return Ok(check);
        }
        check.prefix_end = PrefixEnd::EndOfFile;
        let big_endian = check.header.magic & 1 == 1;
        let salts = head.get(16..24).unwrap_or(&[]).to_vec();
        let mut frame = vec![0u8; WAL_FRAME_HEADER_SIZE + check.header.page_size as usize];
        let mut chain = check.header.checksum;
        let mut in_prefix = true;
        // The stored checksum of the previous frame, once past the prefix.
        let mut previous_stored = chain;
        loop {
            let n = read_full(&mut input, &mut frame)?;
            check.bytes += n as u64;
            if n < frame.len() {
                check.partial_bytes = n as u64;
                if n > 0 && in_prefix {
                    check.prefix_end = PrefixEnd::PartialFrame;
                }
                return Ok(check);
            }
            let (fh, page) = frame.split_at(WAL_FRAME_HEADER_SIZE);
            let word = |at: usize| match fh.get(at..at + 4) {
                Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
                _ => 0,
            };
            let (pgno, commit, stored) = (word(0), word(4), [word(16), word(20)]);
            let same_salts = fh.get(8..16) == Some(&salts[..]);
            let continued = |from: [u32; 2]| {
                let ck = wal_checksum(big_endian, fh.get(..8).unwrap_or(&[]), from);
                wal_checksum(big_endian, page, ck)
            };
            if in_prefix {
                let failed = if !same_salts {
                    Some(PrefixEnd::OtherSalts)
                } else if pgno == 0 {
                    Some(PrefixEnd::PageNumberZero)
                } else if continued(chain) != stored {
                    Some(PrefixEnd::Checksum)
                } else {
                    None
                };
                match failed {
                    None => {
                        chain = stored;
                        check.frames += 1;
                        if check.frames == 1 {
                            check.first_frame_checksum = Some(stored);
                        }
                        if commit != 0 {
                            check.commits += 1;
                            check.last_commit_frame = Some(check.frames);
                        }
                        continue;
                    }
                    Some(end) => {
                        check.prefix_end = end;
                        in_prefix = false;
                    }
                }
            } else if same_salts && pgno != 0 && continued(previous_stored) == stored {
                check.frames_after_intact += 1;
            }
            check.frames_after += 1;
            if same_salts {
                check.frames_after_with_salts += 1;
                if commit != 0 {
                    check.commits_after += 1;
                }
            }
            previous_stored = stored;
        }
    }

    /// Bytes of the valid prefix (header and valid frames).
    pub fn prefix_bytes(&self) -> u64 {
        if !self.header.valid {
            return 0;
        }
        let frame = (WAL_FRAME_HEADER_SIZE as u64) + u64::from(self.header.page_size);
        WAL_HEADER_SIZE as u64 + self.frames * frame
    }

    /// 1-based number of the first frame not in the prefix, when one follows it.
    pub fn first_frame_after(&self) -> Option<u64> {
        (self.header.valid && (self.frames_after > 0 || self.partial_bytes > 0))
            .then_some(self.frames + 1)
    }

    /// One line: the prefix, and what follows it.
    pub fn describe(&self) -> String {
        if !self.header.valid {
            return format!("{} bytes; {}", self.bytes, PrefixEnd::BadHeader.describe());
        }
        let mut s = format!(
            "valid prefix: {} frame(s), {} commit(s), {} bytes of {}",
            self.frames,
            self.commits,
            self.prefix_bytes(),
            self.bytes
        );
        if self.frames_after > 0 {
            s += &format!(
                "; then {} frame(s) from frame {} ({}): {} with this WAL's salts, {} of them \
                 commit frames, {} intact after the break",
                self.frames_after,
                self.frames + 1,
                self.prefix_end.describe(),
                self.frames_after_with_salts,
                self.commits_after,
                self.frames_after_intact
            );
        }
        if self.partial_bytes > 0 {
            s += &format!(
                "; {} byte(s) of a partial frame at the end",
                self.partial_bytes
            );
        }
        s
    }
}

/// Reads until `buf` is full or the input ends; the number of bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(buf.get_mut(filled..).unwrap_or(&mut [])) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walfile::{encode_test_wal, summarize_wal};

    const PS: u32 = 512;
    const FRAME: usize = WAL_FRAME_HEADER_SIZE + PS as usize;

    fn check(bytes: &[u8]) -> WalCheck {
        WalCheck::read(bytes).unwrap()
    }

    /// `n` one-frame transactions.
    fn commits(n: u32) -> Vec<(u32, u32, Vec<u8>)> {
        (1..=n).map(|i| (i, i, vec![i as u8; 64])).collect()
    }

    fn offset(frame: usize) -> usize {
        WAL_HEADER_SIZE + (frame - 1) * FRAME
    }

    #[test]
    fn an_intact_wal_is_all_prefix() {
        for big in [false, true] {
            let wal = encode_test_wal(PS, [7, 8], &commits(5), big);
            let c = check(&wal);
            assert!(c.header.valid);
            assert_eq!((c.frames, c.commits, c.last_commit_frame), (5, 5, Some(5)));
            assert_eq!(c.prefix_end, PrefixEnd::EndOfFile);
            assert_eq!(
                (c.frames_after, c.commits_after, c.partial_bytes),
                (0, 0, 0)
            );
            assert_eq!(c.prefix_bytes(), wal.len() as u64);
            assert_eq!(c.first_frame_after(), None);
        }
    }

    #[test]
    fn a_flipped_page_byte_ends_the_prefix_and_the_commits_after_it_are_counted() {
        let mut wal = encode_test_wal(PS, [7, 8], &commits(10), false);
        wal[offset(4) + WAL_FRAME_HEADER_SIZE + 10] ^= 1;
        let c = check(&wal);
        assert_eq!((c.frames, c.commits), (3, 3));
        assert_eq!(c.prefix_end, PrefixEnd::Checksum);
        assert_eq!(c.first_frame_after(), Some(4));
        assert_eq!(c.frames_after, 7);
        assert_eq!(c.frames_after_with_salts, 7);
        assert_eq!(c.commits_after, 7, "frame 4 is a commit frame too");
        assert_eq!(
            c.frames_after_intact, 6,
            "frames 5..=10 still chain from their predecessor"
        );
        assert!(c
            .describe()
            .contains("valid prefix: 3 frame(s), 3 commit(s)"));
    }

    #[test]
    fn leftover_frames_with_old_salts_are_not_commits_of_this_generation() {
        let old = encode_test_wal(PS, [1, 2], &commits(6), false);
        let new = encode_test_wal(PS, [2, 9], &commits(2), false);
        let mut wal = old.clone();
        wal[..new.len()].copy_from_slice(&new);
        let c = check(&wal);
        assert_eq!((c.frames, c.commits), (2, 2));
        assert_eq!(c.prefix_end, PrefixEnd::OtherSalts);
        assert_eq!(
            (c.frames_after, c.frames_after_with_salts, c.commits_after),
            (4, 0, 0)
        );
    }

    #[test]
    fn a_partial_last_frame_and_a_bad_header_are_told_apart() {
        let wal = encode_test_wal(PS, [7, 8], &commits(3), true);
        let c = check(&wal[..offset(3) + 100]);
        assert_eq!(
            (c.frames, c.prefix_end, c.partial_bytes),
            (2, PrefixEnd::PartialFrame, 100)
        );
        assert_eq!(c.commits_after, 0);

        let mut bad = wal.clone();
        bad[8] ^= 0x10; // page size
        let c = check(&bad);
        assert!(!c.header.valid);
        assert_eq!((c.frames, c.prefix_end), (0, PrefixEnd::BadHeader));
        assert_eq!(
            (c.bytes, c.partial_bytes),
            (wal.len() as u64, wal.len() as u64)
        );
    }

    #[test]
    fn the_prefix_agrees_with_the_capture_scanner_on_randomly_damaged_wals() {
        let mut frames = commits(6);
        frames.insert(2, (9, 0, vec![3; 64]));
        let base = encode_test_wal(PS, [11, 22], &frames, false);
        let mut seed = 0x2545_f491_u32;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as usize % n.max(1)
        };
        for _ in 0..300 {
            let mut wal = base.clone();
            for _ in 0..next(3) {
                let i = next(wal.len());
                wal[i] ^= 1 << next(8);
            }
            wal.truncate(wal.len() - next(FRAME));
            let (c, s) = (check(&wal), summarize_wal(&wal));
            assert_eq!(c.header, s.header);
            assert_eq!((c.frames, c.commits), (s.frames, s.commits));
            assert_eq!(c.last_commit_frame, s.last_commit_frame);
            assert_eq!(c.bytes, s.bytes);
            assert!(c.frames_after_intact <= c.frames_after_with_salts);
            assert!(c.frames_after_with_salts <= c.frames_after);
        }
    }
}
