//! Property tests of the WAL parser (`proptest`): chunking never changes the summary, no input
//! panics, a generated WAL round-trips its counts, and a truncated WAL keeps exactly its whole
//! frames. Case counts are bounded so the module runs in a second or two under `cargo test`.

use proptest::prelude::*;

use super::main_header::parse_main_header;
use super::*;

/// One frame: (page number, "db size after commit" (0: not a commit), page bytes, zero-padded).
type Frame = (u32, u32, Vec<u8>);

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        // No regression files in the source tree: a failure prints its minimal input.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Small legal page sizes, so a case stays cheap.
fn page_size() -> impl Strategy<Value = u32> {
    prop_oneof![Just(512u32), Just(1024), Just(2048)]
}

fn frames() -> impl Strategy<Value = Vec<Frame>> {
    let commit = prop_oneof![Just(0u32), 1u32..=u32::MAX];
    prop::collection::vec(
        (
            1u32..=u32::MAX,
            commit,
            prop::collection::vec(any::<u8>(), 0..48),
        ),
        0..8,
    )
}

/// A valid WAL image, with the frames it was built from.
fn valid_wal() -> impl Strategy<Value = (u32, Vec<Frame>, Vec<u8>)> {
    (page_size(), any::<[u32; 2]>(), frames(), any::<bool>()).prop_map(
        |(ps, salts, frames, big_endian)| {
            let wal = encode_test_wal(ps, salts, &frames, big_endian);
            (ps, frames, wal)
        },
    )
}

/// A valid WAL with a few bits flipped and its tail cut somewhere: mostly-valid input that
/// reaches deep into the frame checks, which uniformly random bytes never do.
fn damaged_wal() -> impl Strategy<Value = Vec<u8>> {
    (
        valid_wal(),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 0..4),
        any::<prop::sample::Index>(),
    )
        .prop_map(|((_, _, mut wal), flips, cut)| {
            for (at, bit) in flips {
                let i = at.index(wal.len());
                wal[i] ^= 1 << bit;
            }
            let keep = cut.index(wal.len() + 1);
            wal.truncate(keep);
            wal
        })
}

/// Any input: uniformly random bytes, or a damaged valid WAL.
fn any_wal_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![prop::collection::vec(any::<u8>(), 0..2048), damaged_wal()]
}

/// `bytes` fed to a scanner in chunks cut at `cuts` (indices into the input, in any order).
fn scan_in_chunks(bytes: &[u8], cuts: &[prop::sample::Index]) -> WalSummary {
    let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    let mut scanner = WalScanner::new();
    for pair in at.windows(2) {
        // Repeated cuts make empty chunks, which must change nothing either.
        scanner.feed(&bytes[pair[0]..pair[1]]);
    }
    scanner.finish()
}

/// The summary a WAL of `frames` (whole and valid) must have, cut after `whole` frames.
fn expected_counts(frames: &[Frame], whole: usize) -> (u64, u64, Option<u64>) {
    let kept = &frames[..whole];
    let commits = kept.iter().filter(|(_, commit, _)| *commit != 0).count() as u64;
    let last = kept
        .iter()
        .rposition(|(_, commit, _)| *commit != 0)
        .map(|i| i as u64 + 1);
    (kept.len() as u64, commits, last)
}

proptest! {
    #![proptest_config(config())]

    /// `WalScanner` fed in arbitrary chunks equals `summarize_wal` in one shot.
    #[test]
    fn chunked_scan_equals_one_shot(
        bytes in any_wal_bytes(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        prop_assert_eq!(scan_in_chunks(&bytes, &cuts), summarize_wal(&bytes));
    }

    /// No input panics, and every summary accounts for each byte it was fed.
    #[test]
    fn arbitrary_bytes_never_panic_and_are_accounted_for(bytes in any_wal_bytes()) {
        let s = summarize_wal(&bytes);
        let _ = parse_wal_header(&bytes);
        let _ = parse_main_header(&bytes);
        prop_assert_eq!(s.bytes, bytes.len() as u64);
        let accounted = if s.header.valid {
            WAL_HEADER_SIZE as u64
                + s.frames * (WAL_FRAME_HEADER_SIZE as u64 + u64::from(s.header.page_size))
        } else {
            prop_assert_eq!(s.frames, 0);
            0
        };
        prop_assert_eq!(s.torn_tail_bytes, s.bytes - accounted);
        prop_assert!(s.commits <= s.frames);
        prop_assert!(s.committed_frames <= s.frames);
        prop_assert_eq!(s.committed_frames, s.last_commit_frame.unwrap_or(0));
    }

    /// A WAL built frame by frame reads back with exactly those frames and commits.
    #[test]
    fn a_generated_wal_round_trips_its_counts((ps, frames, wal) in valid_wal()) {
        let s = summarize_wal(&wal);
        prop_assert!(s.header.valid);
        prop_assert_eq!(s.header.page_size, ps);
        prop_assert_eq!(s.header.format_version, WAL_FORMAT_VERSION);
        let (n, commits, last) = expected_counts(&frames, frames.len());
        prop_assert_eq!((s.frames, s.commits, s.last_commit_frame), (n, commits, last));
        prop_assert_eq!(s.committed_frames, last.unwrap_or(0));
        prop_assert_eq!(s.torn_tail_bytes, 0);
        prop_assert_eq!(s.bytes, wal.len() as u64);
    }

    /// Cut anywhere, a WAL keeps its whole frames only, and its committed prefix is the one of
    /// those whole frames: a partial frame never counts, nor commits.
    #[test]
    fn truncation_keeps_only_whole_frames_and_their_commits(
        (ps, frames, wal) in valid_wal(),
        cut in any::<prop::sample::Index>(),
    ) {
        let cut = cut.index(wal.len() + 1);
        let s = summarize_wal(&wal[..cut]);
        if cut < WAL_HEADER_SIZE {
            prop_assert!(!s.header.valid);
            prop_assert_eq!((s.frames, s.commits, s.committed_frames), (0, 0, 0));
            prop_assert_eq!(s.torn_tail_bytes, cut as u64);
        } else {
            let frame_size = WAL_FRAME_HEADER_SIZE + ps as usize;
            let whole = (cut - WAL_HEADER_SIZE) / frame_size;
            let (n, commits, last) = expected_counts(&frames, whole);
            prop_assert!(s.header.valid);
            prop_assert_eq!((s.frames, s.commits, s.last_commit_frame), (n, commits, last));
            prop_assert_eq!(s.committed_frames, last.unwrap_or(0));
            prop_assert_eq!(
                s.torn_tail_bytes,
                ((cut - WAL_HEADER_SIZE) % frame_size) as u64
            );
        }
    }
}
