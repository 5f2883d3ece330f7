//! Unit tests of the WAL-base record and the judgement.

use std::collections::HashMap;

use super::*;
use crate::walfile::parse_wal_header;

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
fn the_hash_is_unchanged_by_the_header_fragment_s_own_case() {
    // The function as it was written before the 12-byte fragment had a case of its own: records
    // already on WALs must still judge the same.
    fn reference(bytes: &[u8]) -> u64 {
        let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ bytes.len() as u64;
        let words = bytes.len() / 8;
        for w in bytes[..words * 8].chunks_exact(8) {
            h = (h ^ u64::from_le_bytes(w.try_into().unwrap()))
                .wrapping_mul(0x100_0000_01b3)
                .rotate_left(29);
        }
        for &b in &bytes[words * 8..] {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let bytes: Vec<u8> = (0..300u32).map(|i| (i * 167 + 13) as u8).collect();
    for len in 0..=bytes.len() {
        for start in [0, 1, 5] {
            let b = &bytes[start..(start + len).min(bytes.len())];
            assert_eq!(page_hash(b), reference(b), "length {}", b.len());
        }
    }
    // Pinned: a leaf page's header, and the first 112 bytes of 0, 1, 2...
    let leaf = [13, 0, 0, 0, 1, 15, 240, 0, 15, 240, 0, 0];
    assert_eq!(page_hash(&leaf), 0x4e1b_4394_1b57_b35a);
    let first: Vec<u8> = (0..112).collect();
    assert_eq!(page_hash(&first), 0x8094_1a87_8bf4_65eb);
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
