//! A WAL left with committed frames by a close whose checkpoint could not run,
//! while another connection of this process is inside its open.
//!
//! SQLite's close checkpoints and deletes the WAL only under EXCLUSIVE on the main file; an
//! opener that holds SHARED on it (SQLite takes SHARED before it looks for a `-wal`) refuses
//! that, so the WAL is kept for the next connection, as SQLite always does. Until that opener
//! opens the WAL, no connection holds it: taken away then (renamed, unlinked), its frames are in
//! no live file, and the opener creates an empty WAL and goes on without them, silently. The
//! closing connection is the last holder of the generation, so it leaves it, still pinned: its
//! WAL descriptor and its main file object are kept (`vfs/held/for_opener.rs`), and the opener's
//! stale-WAL gate settles them before anything else — the WAL still at the path is the
//! opener's to replay (the pins are let go), one taken away is captured from the kept
//! descriptor (reason `wal-lost`). Only for an opener of this process: one in another process
//! is outside what this process can see.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::{ConnectionState, Inner};
use crate::capture::ImageSource;
use crate::identity::{identity_of_path, FileId, PinnedWal};
use crate::vfs::in_use;
use crate::walfile::{WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE};

/// What became of a WAL a close left for an opener (`vfs/held/for_opener.rs` settles by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeftWal {
    /// Still at the path: the opener replays it.
    AtPath,
    /// Gone from the path (or another inode there), every committed frame's page already in the
    /// main file: another connection checkpointed it and deleted it, as SQLite does.
    Checkpointed,
    /// Gone from the path with frames the main file does not hold: taken away.
    TakenAway,
}

impl ConnectionState {
    /// At the WAL's close, with its committed frames past `nBackfill` (`frames_left`): whether
    /// this close leaves the WAL, pinned, for an opener of this process inside its open (its
    /// descriptor made the guard's own, kept with the main file object by the main file's
    /// close, [`ConnectionState::left_behind`]). Not when another guarded connection of the process
    /// has the WAL open: that connection holds the generation.
    pub(super) fn leaves_wal_to_opener(&self, inner: &mut Inner, wal: FileId) -> bool {
        let Some(main) = inner.pins.main_id else {
            return false;
        };
        if in_use::wal_open_count(main, wal) > 1 || !self.opener_inside(main) {
            return false;
        }
        match inner.pins.wal.as_mut().map(|w| w.own()) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                log::warn!(
                    "hermes-guard: {} closes leaving committed frames in {} for another \
                     connection's open, and cannot keep a descriptor of it ({e}): if it is taken \
                     away before that open, its frames are in no file",
                    self.paths.db.display(),
                    self.paths.wal.display()
                );
                return false;
            }
            None => return false,
        }
        inner.close.left = true;
        // Nobody has it open now: the opener's gate must not take it for judged.
        inner.pins.wal_here = None;
        log::debug!(
            "hermes-guard: {} closes leaving committed frames in {} for another connection of \
             this process inside its open; pinned until that open finds it",
            self.paths.db.display(),
            self.paths.wal.display()
        );
        true
    }

    /// Whether another connection of this process on this main file has opened it but not its
    /// WAL yet (inside its open, or not yet read), and is not closing: for a closed connection
    /// that left its WAL, whether an opener may still come for it.
    pub(crate) fn opener_inside_its_open(&self) -> bool {
        self.main_id().is_some_and(|main| self.opener_inside(main))
    }

    fn opener_inside(&self, main: FileId) -> bool {
        self.siblings_on(main).iter().any(|s| {
            !s.closing.started.load(Ordering::SeqCst) && !s.wal_pinned() && !s.is_retired()
        })
    }

    /// What became of the WAL this closed connection left (one `stat`; when it is gone, a read
    /// of its committed frames and of their pages in the main file).
    pub(crate) fn left_wal(&self) -> LeftWal {
        let inner = self.inner.lock();
        let Some(wal) = inner.pins.wal.as_ref() else {
            return LeftWal::AtPath;
        };
        if identity_of_path(&self.paths.wal).is_ok_and(|now| now == Some(wal.id())) {
            return LeftWal::AtPath;
        }
        match inner.loss.main_image.as_deref() {
            Some(main) if in_main_already(wal, inner.generation_end(), main) => {
                LeftWal::Checkpointed
            }
            _ => LeftWal::TakenAway,
        }
    }

    /// Whether this connection's close left its WAL for an opener (see the module's docs): its
    /// main file object is then kept with the pins.
    pub(crate) fn left_behind(&self) -> bool {
        self.inner.lock().close.left
    }
}

/// Whether the main file holds, for every page of the WAL's committed frames, the version its
/// last committed frame has (up to `end`, see `prefix::committed_prefix`): the WAL was
/// checkpointed in full. Any read that fails says no.
fn in_main_already(pinned: &PinnedWal, end: Option<u64>, main: &dyn ImageSource) -> bool {
    let Ok(prefix) = super::prefix::committed_prefix(pinned, end) else {
        return false;
    };
    let wal = pinned.file();
    let page = prefix.page as u64;
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut fh = [0u8; WAL_FRAME_HEADER_SIZE];
    for i in 0..prefix.frames {
        let at = WAL_HEADER_SIZE as u64 + i * prefix.frame_len();
        if wal.read_exact_at(&mut fh, at).is_err() {
            return false;
        }
        last.insert(u32::from_be_bytes([fh[0], fh[1], fh[2], fh[3]]), at);
    }
    let (mut in_wal, mut in_main) = (vec![0u8; page as usize], vec![0u8; page as usize]);
    last.into_iter().all(|(pgno, at)| {
        pgno > 0
            && wal
                .read_exact_at(&mut in_wal, at + WAL_FRAME_HEADER_SIZE as u64)
                .is_ok()
            && main
                .read_at(&mut in_main, u64::from(pgno - 1) * page)
                .is_ok()
            && in_wal == in_main
    })
}
