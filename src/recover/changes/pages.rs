//! The inputs of the change computation, decoupled from files: the final version of each page a
//! generation wrote, the base of each, and the base of the pages it freed without writing.
//!
//! Final: a page's last frame at or before the last commit frame; pages beyond the database size
//! that commit records are left out (SQLite no longer counts them as part of the file).
//!
//! Base: the version the newer generation started from, the main file's copy at the loss.
//! SQLite's checkpoint copies a page only when its latest frame is at or below the point it
//! backfills to (a page with a later frame keeps its older copy), so, in order: (1) a page whose
//! frames all lie at or below `B` = `backfill_at_loss.backfilled` was copied at its last frame,
//! its final version: the newer generation has it, and it is no change; (2) the page the guard
//! kept from the main file at the page's first frame after the last checkpoint of its process
//! that copied it (`<file>-base`); (3) absent, when the page was beyond the main file's end when
//! the keeping began and is not kept (no checkpoint of the capturing process copied it; past the
//! cap, only when it has no frame at or below `B`); (4) unknown (another process wrote it first,
//! or the cap). A checkpoint run by another process of the generation is not seen: a page it
//! copied and the generation wrote again has a stale kept base (docs/merge-rules.md, limits).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::ChangesError;
use crate::capture::BasePages;
use crate::recover::btree::DbGeometry;
use crate::walfile::{parse_wal_header, wal_checksum, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE};

/// What a carried page was when the newer generation started from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Base {
    /// Its bytes: its last frame, when at or below the backfill mark, or the page the guard
    /// kept.
    Page(Vec<u8>),
    /// The page did not exist: it was beyond the main file's end when the generation began.
    Absent,
    /// Not known: neither backfilled nor kept (another process wrote it first, or the cap).
    Unknown,
}

/// The pages of one generation that its row changes are computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GenerationPages {
    /// Page size, reserved bytes and text encoding, from page 1 (final, else base).
    pub(crate) geometry: DbGeometry,
    /// Each carried page's version at the generation's last commit.
    pub(crate) final_pages: BTreeMap<u32, Vec<u8>>,
    /// The base of each carried page (every key of `final_pages` has one).
    pub(crate) base: BTreeMap<u32, Base>,
    /// The base version of pages the generation freed without writing them (SQLite never writes
    /// a page it puts on the freelist as a leaf): their rows were deleted by the generation.
    /// Empty until the base file records them (its flag 1).
    pub(crate) freed: BTreeMap<u32, Vec<u8>>,
    /// `backfill_at_loss.backfilled` as given (`None`: not recorded, so rule (1) took no frame
    /// and a page a checkpoint had copied may have a base the newer generation never saw).
    pub(crate) backfilled: Option<u64>,
    /// Things found while gathering the pages that a person should know.
    pub(crate) notes: Vec<String>,
}

/// One valid frame of a WAL: its page number, the database size if it is a commit frame, and
/// where its page's bytes are.
struct Frame {
    pgno: u32,
    commit_size: u32,
    page: std::ops::Range<usize>,
}

/// The valid frames of a WAL, as SQLite's recovery reads them: the header must be valid, then
/// frames are read while their salts are the header's, their page number is not 0 and their
/// checksum continues the chain. Returns the header's page size and salts too.
fn valid_frames(wal: &[u8]) -> Result<(u32, [u32; 2], Vec<Frame>), ChangesError> {
    let header = parse_wal_header(wal);
    if !header.valid {
        return Err(ChangesError::WalHeader);
    }
    let big_endian = header.magic & 1 == 1;
    let page_size = header.page_size as usize;
    let frame_size = WAL_FRAME_HEADER_SIZE + page_size;
    let salts = wal.get(16..24).unwrap_or(&[]);
    let mut cksum = header.checksum;
    let mut frames = Vec::new();
    let mut at = WAL_HEADER_SIZE;
    while let Some(frame) = wal.get(at..at + frame_size) {
        let (hdr, page) = frame.split_at(WAL_FRAME_HEADER_SIZE);
        let word = |i: usize| u32::from_be_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
        let pgno = word(0);
        if &hdr[8..16] != salts || pgno == 0 {
            break;
        }
        let next = wal_checksum(big_endian, page, wal_checksum(big_endian, &hdr[..8], cksum));
        if next != [word(16), word(20)] {
            break;
        }
        cksum = next;
        frames.push(Frame {
            pgno,
            commit_size: word(4),
            page: at + WAL_FRAME_HEADER_SIZE..at + frame_size,
        });
        at += frame_size;
    }
    Ok((header.page_size, header.salts, frames))
}

/// The note of a generation whose page 1 is in neither the WAL nor the base file.
const PAGE1_ASSUMED: &str =
    "page 1 is neither carried nor kept: no reserved bytes and UTF-8 text assumed";

/// Checks the kept base pages (`None`: no base file) against the WAL's page size and salts, and
/// notes what they lack.
fn check_kept(
    base: Option<&BasePages>,
    page_size: u32,
    salts: [u32; 2],
    notes: &mut Vec<String>,
) -> Result<(), ChangesError> {
    let Some(kept) = base else {
        notes.push(
            "no base pages were kept: only pages a checkpoint had copied have a known base"
                .to_owned(),
        );
        return Ok(());
    };
    if kept.page_size != page_size {
        return Err(ChangesError::PageSize {
            wal: page_size,
            base: kept.page_size,
        });
    }
    if kept.salts != salts {
        return Err(ChangesError::Salts {
            wal: salts,
            base: kept.salts,
        });
    }
    if let Some((pgno, page)) = kept
        .pages
        .iter()
        .find(|(_, p)| p.len() != page_size as usize)
    {
        return Err(ChangesError::BasePageLength {
            pgno: *pgno,
            len: page.len(),
            page_size,
        });
    }
    if kept.over_cap > 0 {
        notes.push(format!(
            "{} pages the generation wrote first in the capturing process have no kept base (the \
             cap)",
            kept.over_cap
        ));
    }
    Ok(())
}

/// The final version and the base of each page the `committed` frames carry up to `db_size`
/// (the pages beyond it noted and left out), by the rules in this module's comment.
fn versions(
    wal_bytes: &[u8],
    committed: &[Frame],
    db_size: u32,
    base: Option<&BasePages>,
    backfilled: Option<u64>,
    notes: &mut Vec<String>,
) -> (BTreeMap<u32, Vec<u8>>, BTreeMap<u32, Base>) {
    // Frames 1..=B (1-based) had reached the main file the newer generation started from.
    let mark = backfilled.unwrap_or(0).min(committed.len() as u64) as usize;
    let mut final_at: BTreeMap<u32, usize> = BTreeMap::new();
    let mut backfilled_at: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, frame) in committed.iter().enumerate() {
        final_at.insert(frame.pgno, i);
        if i < mark {
            backfilled_at.insert(frame.pgno, i);
        }
    }
    let beyond: Vec<u32> = final_at.range(db_size + 1..).map(|(p, _)| *p).collect();
    if !beyond.is_empty() {
        notes.push(format!(
            "pages {beyond:?} have frames but lie beyond the last commit's database size \
             ({db_size} pages): left out"
        ));
    }
    let page_of = |i: usize| wal_bytes[committed[i].page.clone()].to_vec();
    let mut final_pages = BTreeMap::new();
    let mut bases = BTreeMap::new();
    for (&pgno, &i) in final_at.range(..=db_size) {
        final_pages.insert(pgno, page_of(i));
        let copied_before = backfilled_at.contains_key(&pgno);
        let b = if i < mark {
            // Every frame of it at or below the mark: copied at its last one.
            Base::Page(page_of(i))
        } else if let Some(kept) = base.and_then(|b| b.pages.get(&pgno)) {
            Base::Page(kept.to_vec())
        } else if base.is_some_and(|b| {
            // New in the generation: a checkpoint of the capturing process that copied it
            // would have had its next frame keep that copy; one past the cap may not have.
            pgno > b.pages_at_start && !(copied_before && b.over_cap > 0)
        }) {
            Base::Absent
        } else {
            Base::Unknown
        };
        bases.insert(pgno, b);
    }
    (final_pages, bases)
}

/// The database's geometry from page 1 (its final version, else its base), which must agree with
/// the WAL's `page_size`; without page 1, `page_size` with no reserved bytes, noted.
fn geometry_of(
    final_pages: &BTreeMap<u32, Vec<u8>>,
    bases: &BTreeMap<u32, Base>,
    page_size: u32,
    notes: &mut Vec<String>,
) -> Result<DbGeometry, ChangesError> {
    let page1 = final_pages
        .get(&1)
        .map(Vec::as_slice)
        .or(match bases.get(&1) {
            Some(Base::Page(p)) => Some(p.as_slice()),
            _ => None,
        });
    match page1 {
        Some(page1) => {
            let g = DbGeometry::from_header(page1)
                .map_err(|source| ChangesError::Geometry { source })?;
            if g.page_size() != page_size {
                return Err(ChangesError::GeometryPageSize {
                    page1: g.page_size(),
                    wal: page_size,
                });
            }
            Ok(g)
        }
        None => {
            notes.push(PAGE1_ASSUMED.to_owned());
            DbGeometry::new(page_size, 0).map_err(|source| ChangesError::Geometry { source })
        }
    }
}

impl GenerationPages {
    /// The pages of the generation whose WAL is `wal_bytes`, with the base pages its capturing
    /// process kept (`None`: no base file, so only backfilled frames give a base) and the
    /// backfill mark at the loss (`None`: not recorded).
    pub(crate) fn from_parts(
        wal_bytes: &[u8],
        base: Option<&BasePages>,
        backfilled: Option<u64>,
    ) -> Result<GenerationPages, ChangesError> {
        let (page_size, salts, frames) = valid_frames(wal_bytes)?;
        let mut notes = Vec::new();
        check_kept(base, page_size, salts, &mut notes)?;
        let last_commit =
            frames
                .iter()
                .rposition(|f| f.commit_size != 0)
                .ok_or(ChangesError::NoCommit {
                    frames: frames.len() as u64,
                })?;
        let db_size = frames[last_commit].commit_size;
        let committed = &frames[..=last_commit];
        if backfilled.is_none() {
            notes.push(
                "the backfill mark at the loss is not recorded: frames a checkpoint had copied \
                 are not taken as bases"
                    .to_owned(),
            );
        }
        let (final_pages, bases) =
            versions(wal_bytes, committed, db_size, base, backfilled, &mut notes);
        let geometry = geometry_of(&final_pages, &bases, page_size, &mut notes)?;
        // The kept pages the generation freed without writing them (flag 1 in `<file>-base`);
        // one it wrote later (reused) is carried, and its kept page is its base above.
        let freed = base
            .map(|b| {
                b.freed
                    .iter()
                    .filter(|p| !final_pages.contains_key(p))
                    .filter_map(|p| Some((*p, b.pages.get(p)?.to_vec())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(GenerationPages {
            geometry,
            final_pages,
            base: bases,
            freed,
            backfilled,
            notes,
        })
    }

    /// The pages of the capture in `dir`: its WAL, its `<file>-base` if it has one, and its
    /// `backfill_at_loss`, raised to `merged_frames` (the frames an earlier merge of this
    /// generation took into the live database, which count as the newer generation's too).
    pub(crate) fn from_capture(
        dir: &Path,
        merged_frames: u64,
    ) -> Result<GenerationPages, ChangesError> {
        let manifest = crate::recover::read_manifest(dir)?;
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| ChangesError::Read { path, source })
        };
        let wal = read(&manifest.wal.file)?;
        let base = match &manifest.base_pages {
            Some(entry) => {
                let bytes = read(&entry.file)?;
                Some(crate::capture::base_file::read(&bytes).map_err(|source| {
                    ChangesError::BaseFile {
                        path: dir.join(&entry.file),
                        source,
                    }
                })?)
            }
            None => None,
        };
        // The pages other processes of the generation kept, from their captures of it.
        let base = base.map(|mut own| {
            let siblings = crate::recover::siblings::sibling_base_pages(dir, &manifest);
            let added = crate::recover::siblings::union_base_pages(&mut own, &siblings);
            (own, siblings.len(), added)
        });
        let sibling_note = base.as_ref().and_then(|(_, captures, added)| {
            (*captures > 0).then(|| {
                format!(
                    "{added} base page(s) taken from {captures} other capture(s) of this \
                     generation (pages another process wrote first)"
                )
            })
        });
        let base = base.map(|(own, _, _)| own);
        let backfilled = manifest
            .backfill_at_loss
            .map(|b| u64::from(b.backfilled).max(merged_frames))
            .or((merged_frames > 0).then_some(merged_frames));
        let mut pages = GenerationPages::from_parts(&wal, base.as_ref(), backfilled)?;
        pages.notes.extend(sibling_note);
        pages.header_from_image(dir, &manifest.main.file);
        Ok(pages)
    }

    /// When the generation's page 1 was neither carried nor kept, its reserved bytes and text
    /// encoding are read from the capture's main image's header: neither changes after the
    /// database is made except by `VACUUM`, which the guard sees as a new main file.
    fn header_from_image(&mut self, dir: &Path, image: &str) {
        let Some(at) = self.notes.iter().position(|n| n == PAGE1_ASSUMED) else {
            return;
        };
        let mut header = [0u8; 100];
        let read = std::fs::File::open(dir.join(image))
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut header, 0));
        let geometry = read
            .ok()
            .and_then(|()| DbGeometry::from_header(&header).ok());
        if let Some(g) = geometry.filter(|g| g.page_size() == self.geometry.page_size()) {
            self.geometry = g;
            self.notes[at] = "page 1 is neither carried nor kept: its reserved bytes and text \
                              encoding are read from the capture's main image"
                .to_owned();
        }
    }

    /// The final version of a carried page.
    pub(crate) fn final_page(&self, pgno: u32) -> Option<&[u8]> {
        self.final_pages.get(&pgno).map(Vec::as_slice)
    }

    /// The base version of a carried page whose base is known, or of a freed page.
    pub(crate) fn base_page(&self, pgno: u32) -> Option<&[u8]> {
        match self.base.get(&pgno) {
            Some(Base::Page(p)) => Some(p),
            Some(_) => None,
            None => self.freed.get(&pgno).map(Vec::as_slice),
        }
    }

    /// Every page with a final or a base version: the carried pages and the freed ones.
    pub(crate) fn pages(&self) -> BTreeSet<u32> {
        self.final_pages
            .keys()
            .chain(self.freed.keys())
            .copied()
            .collect()
    }
}

/// The capture's main image, when it has one (the newer generation's file: for the page lookup
/// of attribution only).
pub(crate) fn capture_image(dir: &Path) -> Result<Option<Vec<u8>>, ChangesError> {
    let manifest = crate::recover::read_manifest(dir)?;
    if manifest.main.mode != crate::capture::ImageMode::Copied {
        return Ok(None);
    }
    let path = dir.join(&manifest.main.file);
    std::fs::read(&path)
        .map(Some)
        .map_err(|source| ChangesError::Read { path, source })
}

/// The pages on the freelist that `page1` heads (its first trunk at offset 32, its count at
/// 36), trunks and leaves, reading trunks through `lookup`; with a description of why the list
/// could not be read whole, if it could not (a trunk missing or malformed, a loop).
pub(crate) fn freelist<'p>(
    page1: &[u8],
    lookup: impl Fn(u32) -> Option<&'p [u8]>,
) -> (BTreeSet<u32>, Option<String>) {
    let word = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    };
    let mut pages = BTreeSet::new();
    let Some(count) = word(page1, 36) else {
        return (
            pages,
            Some("page 1 is too short for a freelist count".into()),
        );
    };
    let mut trunk = word(page1, 32).unwrap_or(0);
    while trunk != 0 {
        if !pages.insert(trunk) {
            return (pages, Some(format!("the freelist loops at trunk {trunk}")));
        }
        let Some(bytes) = lookup(trunk) else {
            return (
                pages,
                Some(format!("freelist trunk {trunk} is not available")),
            );
        };
        let (Some(next), Some(leaves)) = (word(bytes, 0), word(bytes, 4)) else {
            return (pages, Some(format!("freelist trunk {trunk} is too short")));
        };
        if (leaves as usize).saturating_mul(4) > bytes.len().saturating_sub(8) {
            return (
                pages,
                Some(format!(
                    "freelist trunk {trunk} lists {leaves} leaves, more than fit"
                )),
            );
        }
        for i in 0..leaves as usize {
            if let Some(leaf) = word(bytes, 8 + 4 * i) {
                pages.insert(leaf);
            }
        }
        if pages.len() as u64 > u64::from(count) {
            return (
                pages,
                Some(format!(
                    "the freelist holds more pages than page 1's count ({count})"
                )),
            );
        }
        trunk = next;
    }
    let problem = (pages.len() as u64 != u64::from(count)).then(|| {
        format!(
            "the freelist holds {} pages, page 1 counts {count}",
            pages.len()
        )
    });
    (pages, problem)
}
