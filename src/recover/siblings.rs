//! Other captures of the same WAL generation: those healed into the live file at close, and the
//! base pages the others hold.
//!
//! A generation can be captured more than once: a peer refused at a write captures it at the
//! halt, and the writer that held it captures it again at its close — where, if nothing newer
//! was created, it heals it back into the live file (`healed.json` in *its* capture only). The
//! peer's capture then holds rows that are live already: merging it would add them twice.
//! So before a merge, the captures of the capture's database are looked
//! through for one of the same generation ([`super::generation_id`], read from its WAL's bytes)
//! whose heal reached the live file ([`crate::capture::HealState::Healed`]) — the live file the
//! merge goes into (the record's main file is the live file's inode). Its heal counts as a merge
//! of the generation up to the frames it healed: a capture that reaches no further merges
//! nothing, one that reaches further merges only what its later commits did.

use std::path::{Path, PathBuf};

use super::{list_captures, Capture, WalCheck};
use crate::capture::{BasePages, HealState, Manifest};

/// A heal of the generation by another capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SiblingHeal {
    /// That capture's directory (for display).
    pub capture: String,
    /// When its heal record was written.
    pub at: String,
    /// The WAL frames it healed (up to its last commit).
    pub frames: u64,
}

/// The furthest-reaching heal into `database` of `generation` by a capture of it other than
/// `capture`: among the captures beside `database`, beside the capture's own directory, and in
/// the fallback capture directories. Read-only; a capture that cannot be read is passed over
/// (it is not a heal anybody can show).
pub(crate) fn healed_elsewhere(
    capture: &Capture,
    generation: &str,
    database: &Path,
) -> Option<SiblingHeal> {
    let live = crate::identity::identity_of_path(database).ok().flatten()?;
    let own = std::fs::canonicalize(capture.dir()).ok();
    let mut places: Vec<PathBuf> = vec![database.to_path_buf()];
    let name = capture.manifest().database_path();
    if let (Some(parent), Some(name)) = (capture.dir().parent(), name.file_name()) {
        let beside = parent.join(name);
        if beside.is_file() {
            places.push(beside);
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut best: Option<SiblingHeal> = None;
    for place in places {
        for entry in list_captures(&place).into_iter().flatten() {
            let canonical = std::fs::canonicalize(&entry.path).ok();
            if canonical.is_none() || canonical == own || !seen.insert(canonical) {
                continue;
            }
            let (Some(m), Some(HealState::Healed { record, .. })) = (&entry.manifest, &entry.heal)
            else {
                continue;
            };
            // Healed into another file (the live one was restored or replaced since): not a
            // merge into this one.
            if record.main.is_some_and(|main| main != live) {
                continue;
            }
            if m.wal.generation.as_deref().is_some_and(|g| g != generation) {
                continue;
            }
            let wal = entry.path.join(&m.wal.file);
            let same = WalCheck::read_file(&wal)
                .ok()
                .and_then(|w| super::generation_id(&w))
                .is_some_and(|g| g == generation);
            if !same || best.as_ref().is_some_and(|b| b.frames >= record.frames) {
                continue;
            }
            best = Some(SiblingHeal {
                capture: crate::paths::path_display(&entry.path),
                at: record.at.clone(),
                frames: record.frames,
            });
        }
    }
    best
}

/// The base pages kept by the other processes that captured the generation of the capture in
/// `capture_dir` (its `manifest`), read from their `<file>-base`: each process keeps the pages it
/// wrote first, so a generation several processes wrote has its bases spread over their
/// captures. Found beside the capture's database and beside the capture; a capture of another
/// generation, or whose base file cannot be read or does not match, is passed over.
pub(crate) fn sibling_base_pages(capture_dir: &Path, manifest: &Manifest) -> Vec<BasePages> {
    let Some(generation) = manifest.wal.generation.as_deref() else {
        return Vec::new();
    };
    let own = std::fs::canonicalize(capture_dir).ok();
    let mut places = vec![manifest.database_path()];
    if let (Some(parent), Some(name)) = (capture_dir.parent(), places[0].file_name()) {
        places.push(parent.join(name));
    }
    let mut seen = std::collections::HashSet::new();
    let mut found = Vec::new();
    for place in places.iter().filter(|p| p.is_file()) {
        for entry in list_captures(place).into_iter().flatten() {
            let canonical = std::fs::canonicalize(&entry.path).ok();
            if canonical.is_none() || canonical == own || !seen.insert(canonical) {
                continue;
            }
            let Some(m) = &entry.manifest else { continue };
            let (Some(g), Some(base)) = (m.wal.generation.as_deref(), &m.base_pages) else {
                continue;
            };
            if g != generation {
                continue;
            }
            let Ok(bytes) = std::fs::read(entry.path.join(&base.file)) else {
                continue;
            };
            let digest = crate::digest::sha256_stream(&bytes[..], |_| Ok(())).map(|(d, _)| d);
            if digest.ok().as_deref() != Some(base.sha256.as_str()) {
                continue;
            }
            if let Ok(pages) = crate::capture::base_file::read(&bytes) {
                found.push(pages);
            }
        }
    }
    found
}

/// `own` with the pages of `others` (the same generation's, from sibling captures) it lacks:
/// a page only another process kept is taken from it; a page two processes kept with other
/// bytes (one read it again after a checkpoint of its own copied it) is dropped, its base
/// unknown. Pages past `own`'s start, new in the generation as this process saw it, stay
/// "absent". Returns how many pages were added.
pub(crate) fn union_base_pages(own: &mut BasePages, others: &[BasePages]) -> usize {
    let mut added = 0;
    let mut disagree = std::collections::BTreeSet::new();
    for other in others {
        if other.salts != own.salts || other.page_size != own.page_size {
            continue;
        }
        own.over_cap += other.over_cap;
        for (pgno, page) in &other.pages {
            if *pgno > own.pages_at_start || disagree.contains(pgno) {
                continue;
            }
            match own.pages.get(pgno) {
                None => {
                    own.pages.insert(*pgno, page.clone());
                    if other.freed.contains(pgno) {
                        own.freed.insert(*pgno);
                    }
                    added += 1;
                }
                Some(mine) if mine != page => {
                    disagree.insert(*pgno);
                }
                Some(_) => {}
            }
        }
    }
    for pgno in disagree {
        own.pages.remove(&pgno);
        own.freed.remove(&pgno);
    }
    added
}
