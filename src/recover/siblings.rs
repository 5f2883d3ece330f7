//! Other captures of the same WAL generation that were healed into the live file at close.
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
use crate::capture::HealState;

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
