//! A WAL image built from frames, for the tests.

use super::{
    wal_checksum, WAL_FORMAT_VERSION, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE, WAL_MAGIC_BE,
    WAL_MAGIC_LE,
};

/// Builds a WAL file image, for tests and fuzz seeds.
///
/// Writes a header (magic `0x377f0683` if `big_endian_cksum`, else
/// `0x377f0682`; format version 3007000; checkpoint sequence 0) and one frame
/// per `(pgno, commit_size, page)` entry, with a correct chained checksum.
/// A `commit_size` of 0 makes a non-commit frame. Each page is zero-padded or
/// truncated to `page_size` bytes. The page size is written as given, even if
/// SQLite would reject it.
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
