//! The WAL and main-header parsers' unit tests.

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

use super::main_header::MAIN_MAGIC;
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
