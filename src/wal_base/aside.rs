//! Setting a stale WAL aside (reason `stale-wal`) and checking `recover --main`'s file against
//! the record.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustix::fs::{AtFlags, RenameFlags};

use super::error::MainCheckError;
use super::{fragment_len, hex16, judge_pages, look_at_wal, page_hash, At, Mismatch, Verdict};
use crate::capture::{
    self, CaptureError, ImageMode, MainEntry, Manifest, PathGeneration, ShmEntry, Trigger, WalEntry,
};
use crate::digest::sha256_stream;
use crate::identity::{identity_of_fd, identity_of_path, FileId};
use crate::paths::{open_dir, open_dir_to_write_in, path_display, path_hex, sync_dir};
use crate::permissions::Permissions;
use crate::status::RetireReason;
use crate::walfile::{parse_main_header, WalScanner};

/// A stale WAL set aside: where, and which other capture beside the database holds the same
/// generation with the main image it was written on (a restore by rename under a running
/// application: the replaced main file's capture), if one does.
#[derive(Debug)]
pub(crate) struct SetAside {
    /// The new capture (reason `stale-wal`).
    pub dir: PathBuf,
    /// A complete capture of the same WAL generation, at least as far, holding a main image
    /// (the one it was written on, or, reason `main-overwritten`, the file that overwrote it).
    pub also_in: Option<PathBuf>,
}

impl SetAside {
    /// The ERROR line of the open: what was done, and the one command that brings the dead
    /// generation's rows back exactly once.
    pub(crate) fn log_line(&self, wal_path: &Path, db: &Path, detail: &str) -> String {
        let done = format!(
            "hermes-guard: {} was not written on the database file now at {} ({detail}): it was \
             NOT replayed (that would undo the restore and corrupt the file). It and the -shm are \
             set aside, byte for byte, in {}; the database opens as it is.",
            wal_path.display(),
            db.display(),
            self.dir.display()
        );
        match &self.also_in {
            Some(other) => format!(
                "{done} The same generation is in {}, with a main image: `hermes-guard recover {} \
                 --into {}` brings its rows back (once: recovering this copy as well adds \
                 nothing)",
                other.display(),
                other.display(),
                db.display()
            ),
            None => format!(
                "{done} Its frames only make sense on the main file they were written on: if that \
                 file still exists (the copy taken before the restore), `hermes-guard recover {} \
                 --main <that file> --into {}` brings the dead generation's rows back",
                self.dir.display(),
                db.display()
            ),
        }
    }
}

/// A complete capture in `dir` (other than `except`) of the WAL generation `wal` describes, at
/// least as far, with its main image: the newest such, by the furthest frame. None found in a
/// directory this process cannot list (`O_PATH`).
fn same_generation_with_image(
    dir: &impl AsFd,
    stem: &str,
    except: &str,
    wal: &WalEntry,
) -> Option<String> {
    let generation = wal.generation.as_ref()?;
    let prefix = format!("{stem}{}", capture::ARTIFACT_MARKER);
    let mut best: Option<(u64, String)> = None;
    for entry in rustix::fs::Dir::read_from(dir).ok()?.flatten() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if !name.starts_with(&prefix) || name.ends_with(".partial") || name == except {
            continue;
        }
        let Some(m) = capture::read_captured_wal(dir.as_fd(), name) else {
            continue;
        };
        if m.main.mode == ImageMode::Absent
            || m.wal.generation.as_ref() != Some(generation)
            || m.wal.frames < wal.frames
        {
            continue;
        }
        if best
            .as_ref()
            .is_none_or(|(f, n)| (m.wal.frames, name) > (*f, n.as_str()))
        {
            best = Some((m.wal.frames, name.to_owned()));
        }
    }
    best.map(|(_, n)| n)
}

/// Moves the stale WAL (which `wal` has open) and the `-shm` (if any) of `database` into a new
/// capture beside it, with a manifest of reason `stale-wal`. On failure everything moved is put
/// back and the staging directory removed. The WAL is hard-linked into the staging directory and
/// unlinked from the path only once the capture is renamed into place and its directory fsynced:
/// a crash at any point leaves it at the path or in a complete capture.
pub(crate) fn set_aside(
    database: &Path,
    wal: &File,
    main_now: Option<FileId>,
    main_header: &[u8],
    mismatch: &Mismatch,
) -> Result<SetAside, CaptureError> {
    let place = Place::reserve(database)?;
    let wal_id = identity_of_fd(wal).map_err(|e| io_error(database, &place.wal_src, e))?;
    let stale = StaleWal {
        file: wal,
        id: wal_id,
        main_now,
        main_header,
        mismatch,
    };
    let mut moves = Moves::default();
    match place.fill(database, &stale, &mut moves) {
        Ok(()) => {
            let final_path = place.parent.join(&place.final_name);
            crate::sqlite_log::captured(database, &final_path);
            Ok(SetAside {
                dir: final_path,
                also_in: moves.also_in.map(|n| place.parent.join(n)),
            })
        }
        Err(e) => Err(place.put_back(database, &moves, e)),
    }
}

/// The set-aside's failure on `artifact`.
fn io_error(database: &Path, artifact: &Path, source: io::Error) -> CaptureError {
    CaptureError::Io {
        database: database.to_path_buf(),
        artifact: artifact.to_path_buf(),
        source,
    }
}

/// The stale WAL being set aside, and what the open found about it.
struct StaleWal<'a> {
    file: &'a File,
    id: FileId,
    main_now: Option<FileId>,
    main_header: &'a [u8],
    mismatch: &'a Mismatch,
}

/// Where a set-aside happens: the database's directory, the names there and in the capture.
struct Place<'a> {
    parent: &'a Path,
    dir: OwnedFd,
    /// The WAL and the `-shm` at the path, relative to `dir`.
    wal_src: PathBuf,
    shm_src: PathBuf,
    stem: String,
    /// Their names in the capture.
    wal_name: String,
    shm_name: String,
    /// The database's, for the capture's directory and manifest (the WAL and -shm moved in
    /// keep SQLite's, which are the database's).
    permissions: Permissions,
    final_name: String,
    staging_name: String,
}

/// What a set-aside has done so far: undone on failure.
#[derive(Default)]
struct Moves<'p> {
    /// Renamed into the staging directory: (name at the path, name inside).
    moved: Vec<(&'p Path, &'p str)>,
    /// The WAL is hard-linked into the staging directory.
    linked: bool,
    /// Another capture of the same generation with its main image, by name.
    also_in: Option<String>,
}

impl<'a> Place<'a> {
    /// Opens the database's directory and reserves the capture's staging directory in it.
    fn reserve(database: &'a Path) -> Result<Place<'a>, CaptureError> {
        let io_err = |artifact: &Path, source: io::Error| io_error(database, artifact, source);
        let (parent, name) = capture::split_database(database)?;
        // `O_PATH` when this process may write in the directory but not list it.
        let dir = open_dir_to_write_in(rustix::fs::CWD, parent).map_err(|e| io_err(parent, e))?;
        let (wal_src, shm_src) = (
            crate::paths::sidecar(Path::new(name), "-wal"),
            crate::paths::sidecar(Path::new(name), "-shm"),
        );
        let stem = capture::capture_dir_stem(name);
        let file_name = capture::capture_file_name(name);
        let (wal_name, shm_name) = (format!("{file_name}-wal"), format!("{file_name}-shm"));
        let permissions = Permissions::of_database_in(dir.as_fd(), database);
        let (final_name, staging_name) = capture::reserve_staging(dir.as_fd(), &stem, &permissions)
            .map_err(|(staging, e)| io_err(&parent.join(staging), e))?;
        Ok(Place {
            parent,
            dir,
            wal_src,
            shm_src,
            stem,
            wal_name,
            shm_name,
            permissions,
            final_name,
            staging_name,
        })
    }

    /// Moves the WAL and the `-shm` in, writes the manifest, renames the capture into place
    /// and, once that is durable, takes the linked WAL off the path.
    fn fill<'p>(
        &'p self,
        database: &Path,
        wal: &StaleWal<'_>,
        moves: &mut Moves<'p>,
    ) -> io::Result<()> {
        let staging = open_dir(self.dir.as_fd(), Path::new(&self.staging_name))?;
        let shm_id = self.move_in(&staging, wal.id, moves)?;
        let manifest = manifest(
            database,
            wal.file,
            wal.id,
            &self.wal_name,
            shm_id,
            wal.main_now,
            wal.main_header,
            wal.mismatch,
        )?;
        moves.also_in =
            same_generation_with_image(&self.dir, &self.stem, &self.final_name, &manifest.wal);
        let json = serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?;
        capture::write_synced(
            staging.as_fd(),
            capture::MANIFEST_NAME,
            &self.permissions,
            |f| io::Write::write_all(f, &json),
        )?;
        rustix::fs::fsync(&staging)?;
        rustix::fs::renameat_with(
            &self.dir,
            self.staging_name.as_str(),
            &self.dir,
            self.final_name.as_str(),
            NOREPLACE,
        )?;
        // The directory's fsync, or its filesystem's through the capture (`paths::sync_dir`).
        sync_dir(self.dir.as_fd(), staging.as_fd())?;
        // Complete and durable: the linked WAL leaves the path now, durably. Failing here fails
        // the set-aside (the open is refused, never replayed); the capture stays.
        if moves.linked {
            unlink_captured(&self.dir, &self.wal_src, wal.id, staging.as_fd())?;
        }
        Ok(())
    }

    /// Links (or renames) the WAL `wal_id` into `staging` and renames the `-shm` there, if one
    /// is at the path: its identity.
    fn move_in<'p>(
        &'p self,
        staging: &OwnedFd,
        wal_id: FileId,
        moves: &mut Moves<'p>,
    ) -> io::Result<Option<FileId>> {
        let dir = &self.dir;
        // Linked in, not renamed: the WAL stays at the path until the capture is complete and
        // durable, so a crash (a kill, a power cut) before that never leaves it in the `.partial`
        // directory alone. A filesystem without hard links renames.
        match rustix::fs::linkat(
            dir,
            &self.wal_src,
            staging,
            self.wal_name.as_str(),
            AtFlags::empty(),
        ) {
            Ok(()) => moves.linked = true,
            Err(_) => {
                rustix::fs::renameat_with(
                    dir,
                    &self.wal_src,
                    staging,
                    self.wal_name.as_str(),
                    NOREPLACE,
                )?;
                moves.moved.push((&self.wal_src, &self.wal_name));
            }
        }
        let st = rustix::fs::statat(staging, self.wal_name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if st.st_ino as u64 != wal_id.ino {
            return Err(io::Error::other(
                "the WAL at the path changed while it was being set aside",
            ));
        }
        let shm_id = identity_of_path(&self.parent.join(&self.shm_src))
            .ok()
            .flatten();
        if shm_id.is_some() {
            match rustix::fs::renameat_with(
                dir,
                &self.shm_src,
                staging,
                self.shm_name.as_str(),
                NOREPLACE,
            ) {
                Ok(()) => moves.moved.push((&self.shm_src, &self.shm_name)),
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(shm_id)
    }

    /// After failure `e`: puts back what was moved, never over anything that appeared at the
    /// path since; whatever cannot go back stays in the staging directory, and the error says so.
    fn put_back(&self, database: &Path, moves: &Moves<'_>, e: io::Error) -> CaptureError {
        let dir = &self.dir;
        let staging_path = self.parent.join(&self.staging_name);
        let mut kept = Vec::new();
        if let Ok(staging) = open_dir(dir.as_fd(), Path::new(&self.staging_name)) {
            if moves.linked {
                let _ = rustix::fs::unlinkat(&staging, self.wal_name.as_str(), AtFlags::empty());
            }
            for (src, inside) in moves.moved.iter().rev() {
                if rustix::fs::renameat_with(&staging, *inside, dir, *src, NOREPLACE).is_err() {
                    kept.push(*inside);
                }
            }
            let _ = rustix::fs::unlinkat(&staging, capture::MANIFEST_NAME, AtFlags::empty());
        }
        if kept.is_empty() {
            let _ = rustix::fs::unlinkat(dir, self.staging_name.as_str(), AtFlags::REMOVEDIR);
            return io_error(database, &staging_path, e);
        }
        io_error(
            database,
            &staging_path,
            io::Error::other(format!(
                "{e}; {} could not be put back (something now has its name) and stay(s) in {}",
                kept.join(", "),
                staging_path.display()
            )),
        )
    }
}

/// Unlinks `name` in `dir` if it is still the WAL `wal` (linked into the capture), and fsyncs `dir`
/// (its filesystem through `witness`, a descriptor of the capture, when `dir` cannot be read).
fn unlink_captured(
    dir: &impl AsFd,
    name: &Path,
    wal: FileId,
    witness: BorrowedFd<'_>,
) -> io::Result<()> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if st.st_ino as u64 == wal.ino {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    sync_dir(dir.as_fd(), witness)
}

/// Every rename of a set-aside: never over an existing name.
const NOREPLACE: RenameFlags = RenameFlags::NOREPLACE;

#[allow(clippy::too_many_arguments)]
fn manifest(
    database: &Path,
    wal: &File,
    wal_id: FileId,
    wal_name: &str,
    shm_id: Option<FileId>,
    main_now: Option<FileId>,
    main_header: &[u8],
    mismatch: &Mismatch,
) -> io::Result<Manifest> {
    let mut scanner = WalScanner::new();
    let (sha256, bytes) = sha256_stream(At { file: wal, pos: 0 }, |chunk| {
        scanner.feed(chunk);
        Ok(())
    })?;
    let summary = scanner.finish();
    Ok(Manifest {
        version: 1,
        database: path_display(database),
        database_hex: path_hex(database),
        trigger: Trigger::Open,
        reason: Some(RetireReason::StaleWal),
        pid: std::process::id(),
        captured_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        sqlite: rusqlite::version().to_owned(),
        wal: WalEntry {
            identity: wal_id,
            file: wal_name.to_owned(),
            bytes,
            sha256,
            header: summary.header.clone(),
            frames: summary.frames,
            commits: summary.commits,
            last_commit_frame: summary.last_commit_frame,
            generation: crate::walfile::generation_id(
                &summary.header,
                summary.first_frame_checksum,
            ),
            failed_commit: None,
        },
        shm: shm_id.map(|identity| ShmEntry { identity }),
        main: MainEntry {
            identity: main_now,
            size: 0,
            header: parse_main_header(main_header),
            mode: ImageMode::Absent,
            file: String::new(),
            bytes: 0,
            sha256: String::new(),
        },
        path_generation_at_capture: PathGeneration {
            main: identity_of_path(database).ok().flatten(),
            wal: None,
            shm: None,
            wal_salts: None,
        },
        backfill_at_loss: None,
        main_torn: false,
        stale_wal: Some(mismatch.clone()),
        base: Some(crate::capture::BaseEntry::new(
            crate::capture::BaseVerdict::NotOwn,
            "no main image: the WAL was set aside at the open, beside a main file it was not \
             written on; `recover --main` takes the file it was written on, checked against the \
             WAL's record",
        )),
        base_pages: None,
    })
}

/// For `recover --main`: copies `main` (the database file a stale WAL was written on, as the
/// operator gives it) to `copy`, and checks it against the record in the capture's manifest,
/// by the open's rule: every sampled page the recorded content or one of the WAL's frames.
pub(crate) fn check_main_for_capture(
    dir: &Path,
    manifest: &Manifest,
    main: &Path,
    copy: &Path,
) -> Result<(), MainCheckError> {
    let wrong = |why: String| MainCheckError::Refused {
        path: main.to_path_buf(),
        why,
    };
    std::fs::copy(main, copy).map_err(|e| MainCheckError::io(main, "copy the --main file", e))?;
    let Some(m) = &manifest.stale_wal else {
        return Err(wrong(
            "the capture's manifest has no stale_wal record".into(),
        ));
    };
    let record = &m.recorded;
    let wal_path = dir.join(&manifest.wal.file);
    let wal = File::open(&wal_path).map_err(|e| MainCheckError::io(&wal_path, "open", e))?;
    let pages: Vec<u32> = record.pages.iter().map(|p| p.page).collect();
    let full =
        look_at_wal(&wal, Some(&pages)).map_err(|e| MainCheckError::io(&wal_path, "read", e))?;
    let image = File::open(copy).map_err(|e| MainCheckError::io(copy, "open", e))?;
    let size = image
        .metadata()
        .map_err(|e| MainCheckError::io(copy, "stat", e))?
        .len();
    let read = |p: u32| {
        let offset = u64::from(p - 1) * u64::from(record.page_size);
        if offset + u64::from(record.page_size) > size {
            return None;
        }
        let mut buf = vec![0u8; fragment_len(p, record.page_size)];
        std::os::unix::fs::FileExt::read_exact_at(&image, &mut buf, offset).ok()?;
        Some(hex16(page_hash(&buf)))
    };
    match judge_pages(record, identity_of_path(main).ok().flatten(), read, &full) {
        Verdict::Stale(m) => Err(wrong(format!(
            "it is not the database file the captured WAL was written on: {}",
            m.detail
        ))),
        _ => Ok(()),
    }
}
