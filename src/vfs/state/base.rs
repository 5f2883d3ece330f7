//! Whether a capture's main image is the file its WAL generation was written on.
//!
//! Within one WAL generation the main file changes only by that generation's checkpoints (or by
//! a restore, which the guard reports as `main-replaced`/`main-overwritten`). A newer generation
//! — a connection that opened after the loss, in any process, guarded or stock — must first
//! create `<db>-wal` or `<db>-shm` (or `-journal`, or move a file in under the database's name)
//! before it can write the main file. So the image is the generation's own when the directory
//! watch, drained after the image's last byte was read, counts no creation of those names since
//! this connection pinned its `-shm` and missed no event meanwhile. Anything else — a creation,
//! a blinded or moved watch, no watch at all (a network filesystem, no inotify) — leaves the
//! base unknown, and recovery then only adds (docs/merge-rules.md). The verdict never rests on
//! timing: a creation a microsecond before the drain is counted, one after it came after the
//! image was read.
//!
//! The watch sees the database's own names only. A file with a second name (a hard link, in this
//! directory or another) can be written by a newer generation through that name, whose `-wal`
//! and `-shm` are made beside it: so an image whose file has more than one name when the capture
//! reads it is never `own`.

use super::ConnectionState;
use crate::capture::{BaseEntry, BaseVerdict};
use crate::identity::{links_at, FileId};
use crate::status::RetireReason;
use crate::vfs::watch::Creations;

impl ConnectionState {
    /// The creation counts of this database's names now (the watch's queue drained first).
    pub(super) fn creations_now(&self) -> Option<Creations> {
        let name = self.paths.db.file_name()?;
        self.watches.dir.as_ref()?.creations(name)
    }

    /// The count a sibling of this process took when it pinned the `-shm` `shm`, through the
    /// same counters as this connection's watch; `None` when there is none.
    pub(super) fn sibling_creations_at_pin(
        &self,
        shm: crate::identity::FileId,
    ) -> Option<Creations> {
        let mine = self.watches.dir.as_ref()?;
        self.siblings().iter().find_map(|s| {
            if !s.watches.dir.as_ref().is_some_and(|w| w.counts_with(mine)) {
                return None;
            }
            let inner = s.inner.lock();
            if inner.pins.shm_id == Some(shm) {
                inner.pins.creations_at_pin
            } else {
                None
            }
        })
    }

    /// The main file had `links` names at a full check: kept when the most so far, and said at
    /// WARN the first time it is more than one.
    pub(super) fn saw_links(&self, inner: &mut super::Inner, links: u64) {
        if links > 1 && inner.pins.most_links <= 1 {
            log::warn!(
                "hermes-guard: {} has {links} names (hard links): another name can be opened as a \
                 newer generation whose -wal and -shm the guard does not watch, so a capture of \
                 this database is never taken as its generation's own base, and recovery only adds \
                 rows (docs/merge-rules.md)",
                self.paths.db.display()
            );
        }
        inner.pins.most_links = inner.pins.most_links.max(links);
    }

    /// The verdict on an image just read, from the counts taken at the `-shm`'s pin;
    /// `most_links`: the most names the main file had at a full check.
    pub(super) fn judge_base(
        &self,
        at_pin: Option<Creations>,
        reason: Option<RetireReason>,
        main_id: Option<FileId>,
        most_links: u64,
    ) -> BaseEntry {
        if matches!(
            reason,
            Some(RetireReason::MainReplaced | RetireReason::MainOverwritten)
        ) {
            return BaseEntry::new(
                BaseVerdict::NotOwn,
                "the main file was replaced or overwritten under the generation: the image is \
                 the file found then, not the one its WAL was written on",
            );
        }
        if self.watches.dir.is_none() {
            return BaseEntry::new(
                BaseVerdict::Unknown,
                "no directory watch on this database's directory (a filesystem whose changes \
                 may come from elsewhere, or no inotify): nothing shows whether a newer \
                 generation checkpointed into the image before it was read",
            );
        }
        let Some(at_pin) = at_pin else {
            return BaseEntry::new(
                BaseVerdict::Unknown,
                "the connection's -shm was pinned while the directory watch could not vouch: \
                 nothing shows whether a newer generation checkpointed into the image",
            );
        };
        match self.creations_now() {
            None => BaseEntry::new(
                BaseVerdict::Unknown,
                "the directory watch can no longer vouch for the database's directory (moved, \
                 deleted or unwatched since): a newer generation may have checkpointed into \
                 the image",
            ),
            Some(now) if now.blind != at_pin.blind => BaseEntry::new(
                BaseVerdict::Unknown,
                "the directory watch may have missed events since the -shm was pinned (its queue \
                 overflowed or could not be read): a newer generation may have checkpointed \
                 into the image",
            ),
            Some(now) if now.created != at_pin.created => BaseEntry::new(
                BaseVerdict::Unknown,
                format!(
                    "the database's name, -wal, -shm or -journal was created in its directory \
                     {} time(s) after this connection pinned its files: a newer generation may \
                     have checkpointed into the image before it was read",
                    now.created - at_pin.created
                ),
            ),
            Some(_) => match self.names_of_main(main_id).unwrap_or(0).max(most_links) {
                names if names > 1 => BaseEntry::new(
                    BaseVerdict::Unknown,
                    format!(
                        "the database file has had {names} names (hard links) while this \
                         connection had it open: a newer generation may have written it through \
                         another name, whose -wal and -shm the directory watch does not see"
                    ),
                ),
                _ => self.own(),
            },
        }
    }

    /// The verdict when the watch saw nothing and the file has one name.
    fn own(&self) -> BaseEntry {
        BaseEntry::new(
            BaseVerdict::Own,
            "the directory watch, drained after the image was read, saw nothing create the \
             database's name, -wal, -shm or -journal since this connection pinned its files, and \
             the file has no other name: no newer generation wrote the main file, and the image is \
             the one the WAL was written on (with that generation's own checkpoints)",
        )
    }

    /// How many names the pinned main file has, read where the database's name is now (in the
    /// held directory); `None` when that name is no longer the pinned file or cannot be read
    /// (a replaced file is judged by its retirement reason).
    fn names_of_main(&self, main_id: Option<FileId>) -> Option<u64> {
        let dir = self.dir()?;
        let (id, links) = links_at(dir.fd(), self.paths.db.file_name()?).ok()?;
        (Some(id) == main_id).then_some(links)
    }
}
