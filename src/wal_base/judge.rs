//! The stale-WAL judgement's sequence, in one place for its two callers: the guarded open's gate
//! (`vfs/stale_wal/gate.rs`, through the wrapped main file) and the read-only look from outside
//! (`wal_at_path.rs`, `hermes-guard status`). In this order: the WAL's header and first frame,
//! its record, the recorded pages of the main file (each read once, before the WAL's frames),
//! then — while they leave the WAL in doubt — the main file's identity and every frame of the
//! recorded pages.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use super::{
    fragment_len, hex16, judge_generation, judge_pages, look_at_wal, page_hash, read_record,
    Verdict, WalBaseRecord,
};
use crate::identity::FileId;

/// The main file as the judgement reads it now.
pub(crate) trait MainNow {
    /// Called once the record describes the WAL's generation, before any page is read: an error
    /// ends the judgement.
    fn before_pages(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// The hash (as recorded, [`recorded_page_hash`]) of page `page` (1-based) now; `None`
    /// beyond the end of the file or unreadable.
    fn page_hash(&self, page: u32, page_size: u32) -> Option<String>;
    /// The identity of the main file now at the path.
    fn identity(&self) -> io::Result<Option<FileId>>;
}

/// The recorded hash of page `page` (1-based, pages of `page_size` bytes) of a main file of
/// `size` bytes, its fragment read by `read_at(buf, offset)`: `None` beyond the end of the file
/// or unreadable.
pub(crate) fn recorded_page_hash(
    page: u32,
    page_size: u32,
    size: u64,
    read_at: impl FnOnce(&mut [u8], u64) -> io::Result<()>,
) -> Option<String> {
    let offset = u64::from(page - 1) * u64::from(page_size);
    if offset + u64::from(page_size) > size {
        return None;
    }
    let mut buf = vec![0u8; fragment_len(page, page_size)];
    read_at(&mut buf, offset).ok()?;
    Some(hex16(page_hash(&buf)))
}

/// The quick look: the header, the record, the recorded pages; `None` when they leave the WAL in
/// doubt (the full look, [`judge_wal`], then decides). An error: the WAL cannot be read.
pub(crate) fn quick_look(wal: &File, main: &mut impl MainNow) -> io::Result<Option<Verdict>> {
    Ok(first_look(wal, main)?.err())
}

/// The full judgement of the WAL `wal` against the main file `main` now. An error: the WAL (or,
/// by `main`, the main file) cannot be read.
pub(crate) fn judge_wal(wal: &File, main: &mut impl MainNow) -> io::Result<Verdict> {
    let (record, read) = match first_look(wal, main)? {
        Ok(in_doubt) => in_doubt,
        Err(verdict) => return Ok(verdict),
    };
    let now = |p: u32| {
        read.iter()
            .find(|(page, _)| *page == p)
            .and_then(|(_, h)| h.clone())
    };
    let main_now = main.identity()?;
    let pages: Vec<u32> = record.pages.iter().map(|p| p.page).collect();
    let full = look_at_wal(wal, Some(&pages))?;
    Ok(judge_pages(&record, main_now, now, &full))
}

/// The recorded pages read now, by page.
type PagesNow = Vec<(u32, Option<String>)>;

/// Up to the recorded pages: `Err(verdict)` when that decides, else the record and the pages
/// read.
fn first_look(
    wal: &File,
    main: &mut impl MainNow,
) -> io::Result<Result<(WalBaseRecord, PagesNow), Verdict>> {
    let first = look_at_wal(wal, None)?;
    let record = match judge_generation(&first, read_record(wal.as_fd())) {
        Ok(record) => record,
        Err(v) => return Ok(Err(v)),
    };
    main.before_pages()?;
    // The main file's pages, read once and before the WAL's frames: a page a checkpoint of the
    // WAL's holder wrote before this read came from a frame written before it, which the full
    // look finds; read after the look, it could come from a frame committed and copied since.
    let read: PagesNow = record
        .pages
        .iter()
        .map(|r| (r.page, main.page_hash(r.page, record.page_size)))
        .collect();
    if record
        .pages
        .iter()
        .zip(&read)
        .all(|(r, (_, now))| now.as_ref() == Some(&r.hash))
    {
        return Ok(Err(Verdict::Continues { by_pages: false }));
    }
    Ok(Ok((record, read)))
}
