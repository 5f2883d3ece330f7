//! Opening a capture: the manifest checked against the files, and a private copy to read from.

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::{RecoverError, WalCheck};
use crate::capture::{
    capture_dir_stem, heal_state, HealState, ImageMode, ManifestError, ARTIFACT_MARKER,
    HEALED_NAME, MANIFEST_NAME,
};
use crate::digest::sha256_stream_with;
use crate::Manifest;

const PARTIAL_SUFFIX: &[u8] = b".partial";
/// The private copy's name inside its temporary directory.
const COPY_NAME: &str = "capture.db";
/// A second copy of the captured main image alone (no WAL): what the captured generation's WAL
/// was written on, attached as `pre` to take the generation's own changes against.
const IMAGE_NAME: &str = "image.db";
/// The schema name the image is attached under.
pub(crate) const IMAGE_SCHEMA: &str = "pre";
/// The WAL header's and a frame header's sizes.
const WAL_HEADER: u64 = 32;
const FRAME_HEADER: u64 = 24;

/// A capture, verified against its manifest and copied to a private temporary directory.
///
/// Everything recovery reads comes from the copy: the capture directory itself is only read,
/// once, while it is copied and hashed, and is never opened as a database (opening it would write
/// a `-shm` and could checkpoint into the captured image).
pub struct Capture {
    // Declared first: closed before the temporary directory is removed.
    conn: Connection,
    dir: PathBuf,
    manifest: Manifest,
    integrity: Vec<String>,
    copy: PathBuf,
    /// The private WAL copy read from its bytes: what SQLite replays of it.
    wal: WalCheck,
    /// WAL frames of the captured generation included in `pre`: 0 for the bare image.
    base: Cell<u64>,
    /// Whether its generation was healed into the live file at close (`healed.json`).
    heal: HealState,
    _work: tempfile::TempDir,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("dir", &self.dir)
            .field("copy", &self.copy)
            .field("integrity", &self.integrity)
            .finish()
    }
}

impl Capture {
    /// Opens the capture in `dir`: refuses a `.partial` directory, a directory that is not a
    /// capture, a file the manifest names that is missing, and a size or sha256 that does not
    /// match; then copies the two files to a temporary directory and opens the copy (which
    /// replays the captured WAL onto the captured image), with a copy of the image alone
    /// attached as `pre`, and runs `PRAGMA integrity_check` on it.
    /// A capture whose own check fails still opens: see [`Capture::integrity`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Capture, RecoverError> {
        Capture::open_with_main(dir, None)
    }

    /// [`Capture::open`], for a capture of reason `stale-wal` too: its WAL was written on a main
    /// file that is not in the capture (`main.mode` `absent`), and `main` is that file (the copy
    /// taken before the restore). It is checked against the WAL's record: each page the record
    /// sampled must be the recorded content or one of the WAL's own frames of it. For any other
    /// capture `main` must be `None`.
    pub fn open_with_main(
        dir: impl AsRef<Path>,
        main: Option<&Path>,
    ) -> Result<Capture, RecoverError> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = read_manifest(&dir)?;
        let heal = read_heal(&dir, &manifest)?;
        let work = tempfile::Builder::new()
            .prefix("hermes-guard-recover-")
            .tempdir()
            .map_err(|e| {
                RecoverError::io(std::env::temp_dir(), "create a private work directory", e)
            })?;
        let copy = work.path().join(COPY_NAME);
        match (manifest.main.mode, main) {
            (ImageMode::Absent, Some(main)) => {
                crate::wal_base::check_main_for_capture(&dir, &manifest, main, &copy)?
            }
            (ImageMode::Absent, None) => {
                return Err(RecoverError::NotACapture {
                    path: dir.clone(),
                    why: "it holds a stale WAL (reason stale-wal) without the database file it \
                          was written on: give that file (the copy taken before the restore) \
                          with --main"
                        .into(),
                })
            }
            (_, Some(_)) => {
                return Err(RecoverError::NotACapture {
                    path: dir.clone(),
                    why: "--main is only for a capture of a stale WAL (reason stale-wal): this \
                          one holds its main image"
                        .into(),
                })
            }
            (_, None) => copy_verified(
                &dir,
                &manifest.main.file,
                manifest.main.bytes,
                &manifest.main.sha256,
                &copy,
            )?,
        }
        let image = work.path().join(IMAGE_NAME);
        fs::copy(&copy, &image).map_err(|e| RecoverError::io(&image, "copy the main image", e))?;
        let wal_copy = work.path().join(format!("{COPY_NAME}-wal"));
        copy_verified(
            &dir,
            &manifest.wal.file,
            manifest.wal.bytes,
            &manifest.wal.sha256,
            &wal_copy,
        )?;
        let wal = WalCheck::read_file(&wal_copy)
            .map_err(|e| RecoverError::io(&wal_copy, "read the captured WAL", e))?;
        let conn = Connection::open_with_flags_and_vfs(
            &copy,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            "unix",
        )
        .map_err(|e| RecoverError::sqlite(&dir, "open the private copy of the capture", e))?;
        if manifest.base_verdict() != crate::capture::BaseVerdict::Own {
            // An image a newer generation checkpointed into may have grown past the size the WAL's
            // last commit records, with a page 1 (not in the WAL) saying so. SQLite calls that file
            // corrupt and reads nothing; with `writable_schema` it reads the generation at the
            // WAL's size — its own pages and whatever the image has at the others — which is all
            // the add-only rule takes rows from.
            conn.pragma_update(None, "writable_schema", true)
                .map_err(|e| RecoverError::sqlite(&dir, "read the capture's mixed pages", e))?;
        }
        let integrity = integrity_check(&conn)
            .unwrap_or_else(|e| vec![format!("the captured database cannot be read: {e}")]);
        // Attached after the check, which would otherwise check the image too.
        attach_base(&conn, &dir, &image)?;
        if integrity != ["ok"] {
            log::warn!(
                "hermes-guard: the capture {} fails its integrity check ({}); every readable row \
                 is still recovered, table by table",
                dir.display(),
                integrity.first().map(String::as_str).unwrap_or("")
            );
        }
        Ok(Capture {
            conn,
            dir,
            manifest,
            integrity,
            copy,
            wal,
            base: Cell::new(0),
            heal,
            _work: work,
        })
    }

    /// Whether the captured generation was healed into the live file at close (its
    /// `healed.json`): then its rows are live already and nothing is merged from it.
    pub fn heal(&self) -> &HealState {
        &self.heal
    }

    /// The capture directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// What `PRAGMA integrity_check` said of the captured generation: `["ok"]` when clean.
    pub fn integrity(&self) -> &[String] {
        &self.integrity
    }

    /// Whether the captured generation opens clean (`integrity_check` is `ok`).
    pub fn is_clean(&self) -> bool {
        self.integrity == ["ok"]
    }

    /// A connection to the private copy (never to the capture itself).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The private copy's path (inside a temporary directory removed on drop).
    pub fn private_copy(&self) -> &Path {
        &self.copy
    }

    /// The private copy of the captured main image alone (attached as `pre` unless an earlier
    /// merge of the generation moved the base on: see `set_base`).
    pub(crate) fn image_copy(&self) -> PathBuf {
        self.copy.with_file_name(IMAGE_NAME)
    }

    /// The captured WAL read from its bytes (the verified private copy): the prefix SQLite
    /// replays, and its header (salts, checkpoint sequence).
    pub(crate) fn wal_check(&self) -> &WalCheck {
        &self.wal
    }

    /// The WAL frames of the captured generation that SQLite replays: up to its last readable
    /// commit frame.
    pub(crate) fn readable_frames(&self) -> u64 {
        self.wal.last_commit_frame.unwrap_or(0)
    }

    /// Makes `pre` the captured image plus the first `frames` frames of the captured WAL (a
    /// commit boundary an earlier merge of this generation reached), so the delta is what the
    /// later commits did; 0 puts the bare image back. Each base is a fresh pair of files in the
    /// private directory (`base-<frames>.db` and its `-wal`, truncated at the frame).
    pub(crate) fn set_base(&self, frames: u64) -> Result<(), RecoverError> {
        let frames = frames.min(self.readable_frames());
        if frames == self.base.get() {
            return Ok(());
        }
        self.conn
            .execute_batch(&format!("DETACH DATABASE {IMAGE_SCHEMA}"))
            .map_err(|e| RecoverError::sqlite(&self.dir, "detach the captured main image", e))?;
        let path = if frames == 0 {
            self.image_copy()
        } else {
            let path = self.copy.with_file_name(format!("base-{frames}.db"));
            fs::copy(self.image_copy(), &path)
                .map_err(|e| RecoverError::io(&path, "copy the main image", e))?;
            let frame = FRAME_HEADER + u64::from(self.wal.header.page_size);
            let wal_path = self.copy.with_file_name(format!("base-{frames}.db-wal"));
            let shm_path = self.copy.with_file_name(format!("base-{frames}.db-shm"));
            match fs::remove_file(&shm_path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(RecoverError::io(&shm_path, "remove", e))
                }
                _ => {}
            }
            let captured_wal = self.copy.with_file_name(format!("{COPY_NAME}-wal"));
            let mut wal = File::open(&captured_wal)
                .map_err(|e| RecoverError::io(&captured_wal, "read the captured WAL", e))?
                .take(WAL_HEADER + frames * frame);
            let mut out =
                File::create(&wal_path).map_err(|e| RecoverError::io(&wal_path, "create", e))?;
            io::copy(&mut wal, &mut out).map_err(|e| RecoverError::io(&wal_path, "write", e))?;
            path
        };
        attach_base(&self.conn, &self.dir, &path)?;
        self.base.set(frames);
        Ok(())
    }
}

/// Attaches `path` to `conn` as `pre`.
fn attach_base(conn: &Connection, dir: &Path, path: &Path) -> Result<(), RecoverError> {
    let uri = path.to_str().ok_or_else(|| RecoverError::BadTarget {
        database: path.to_path_buf(),
        why: "the temporary directory's path is not UTF-8: set TMPDIR".into(),
    })?;
    conn.execute(&format!("ATTACH DATABASE ?1 AS {IMAGE_SCHEMA}"), [uri])
        .map_err(|e| RecoverError::sqlite(dir, "attach the captured main image", e))?;
    Ok(())
}

/// Whether `dir`'s name says it is an interrupted capture.
pub(crate) fn is_partial(dir: &Path) -> bool {
    dir.file_name()
        .is_some_and(|n| n.as_bytes().ends_with(PARTIAL_SUFFIX))
}

/// A file name from the manifest is used only as a plain name inside the capture.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Reads and checks `dir/manifest.json` (not the files it names).
pub fn read_manifest(dir: &Path) -> Result<Manifest, RecoverError> {
    if is_partial(dir) {
        return Err(RecoverError::Partial {
            capture: dir.to_path_buf(),
        });
    }
    let not = |why: &str| RecoverError::NotACapture {
        path: dir.to_path_buf(),
        why: why.to_owned(),
    };
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(not("it is not a directory")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not("it does not exist")),
        Err(e) => return Err(RecoverError::io(dir, "stat", e)),
    }
    // The one reader of the manifest (`Manifest::read`), with recovery's checks on top.
    let manifest = match Manifest::read(dir) {
        Ok(m) => m,
        Err(ManifestError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Err(not("it has no manifest.json"))
        }
        Err(ManifestError::Read { manifest, source }) => {
            return Err(RecoverError::io(manifest, "read", source))
        }
        Err(ManifestError::Parse { source, .. }) => {
            return Err(RecoverError::Manifest {
                capture: dir.to_path_buf(),
                source,
            })
        }
    };
    if manifest.version != 1 {
        return Err(not(&format!(
            "manifest version {} is not supported (this build reads version 1)",
            manifest.version
        )));
    }
    let absent = manifest.main.mode == crate::capture::ImageMode::Absent;
    for name in [&manifest.main.file, &manifest.wal.file] {
        let allowed = is_plain_name(name) || (absent && name.is_empty());
        if !allowed {
            return Err(not(&format!(
                "the manifest names {name:?}, which is not a file name inside the capture"
            )));
        }
    }
    Ok(manifest)
}

/// Copies `dir/name` to `to`, checking its size and sha256 against the manifest's.
fn copy_verified(
    dir: &Path,
    name: &str,
    bytes: u64,
    sha256: &str,
    to: &Path,
) -> Result<(), RecoverError> {
    let from = dir.join(name);
    let mut src = match File::open(&from) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(RecoverError::MissingFile {
                capture: dir.to_path_buf(),
                file: name.to_owned(),
            })
        }
        Err(e) => return Err(RecoverError::io(&from, "open", e)),
    };
    let found = src
        .metadata()
        .map_err(|e| RecoverError::io(&from, "stat", e))?
        .len();
    if found != bytes {
        return Err(RecoverError::SizeMismatch {
            capture: dir.to_path_buf(),
            file: name.to_owned(),
            expected: bytes,
            found,
        });
    }
    let mut out = File::create(to).map_err(|e| RecoverError::io(to, "create", e))?;
    let (found, _) = sha256_stream_with(
        &mut src,
        |e| RecoverError::io(&from, "read", e),
        |chunk| {
            out.write_all(chunk)
                .map_err(|e| RecoverError::io(to, "write", e))
        },
    )?;
    if !found.eq_ignore_ascii_case(sha256) {
        return Err(RecoverError::Sha256Mismatch {
            capture: dir.to_path_buf(),
            file: name.to_owned(),
            expected: sha256.to_owned(),
            found,
        });
    }
    Ok(())
}

/// `PRAGMA integrity_check`, every line.
pub(crate) fn integrity_check(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("PRAGMA integrity_check")?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    rows.collect()
}

/// One directory found beside a database by [`list_captures`].
#[derive(Debug, Clone)]
pub struct CaptureListing {
    /// The directory.
    pub path: PathBuf,
    /// An interrupted capture (`.partial`): never used.
    pub partial: bool,
    /// Its manifest, when it could be read.
    pub manifest: Option<Manifest>,
    /// Why the manifest could not be read.
    pub manifest_error: Option<String>,
    /// Whether its generation was healed into the live file at close (`None`: no manifest, or
    /// the record cannot be read: see `manifest_error`).
    pub heal: Option<HealState>,
}

/// The heal record of the capture `dir` (see `capture/healed.rs`), resolved against its
/// database's directory.
pub(crate) fn read_heal(dir: &Path, manifest: &Manifest) -> Result<HealState, RecoverError> {
    heal_state(dir, &manifest.database_path())
        .map_err(|e| RecoverError::io(dir.join(HEALED_NAME), "read the heal record", e))
}

/// The captures beside the database `path` (named `<name>.retired-wal-…`), or every capture in
/// the directory `path`, oldest first; a capture directory given itself lists just it.
pub fn list_captures(path: &Path) -> Result<Vec<CaptureListing>, RecoverError> {
    let meta = fs::metadata(path).map_err(|e| RecoverError::io(path, "stat", e))?;
    let (dir, prefix): (&Path, Vec<u8>) = if meta.is_dir() {
        if path.join(MANIFEST_NAME).exists() || is_partial(path) {
            return Ok(vec![listing(path.to_path_buf())]);
        }
        (path, Vec::new())
    } else {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().unwrap_or(OsStr::new(""));
        let mut prefix = capture_dir_stem(name).into_bytes();
        prefix.extend_from_slice(ARTIFACT_MARKER.as_bytes());
        (parent, prefix)
    };
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| RecoverError::io(dir, "list", e))? {
        let entry = entry.map_err(|e| RecoverError::io(dir, "list", e))?;
        let name = entry.file_name();
        let bytes = name.as_bytes();
        let matches = if prefix.is_empty() {
            bytes
                .windows(ARTIFACT_MARKER.len())
                .any(|w| w == ARTIFACT_MARKER.as_bytes())
        } else {
            bytes.starts_with(&prefix)
        };
        if matches && entry.path().is_dir() {
            found.push(listing(entry.path()));
        }
    }
    if !prefix.is_empty() {
        found.extend(in_fallback_dirs(path, &prefix));
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The captures of the database `path` that went to a fallback capture directory
/// (`capture/fallback.rs`) because they could not be written beside it: named like its own,
/// and recording its path in their manifest.
fn in_fallback_dirs(path: &Path, prefix: &[u8]) -> Vec<CaptureListing> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let canonical = fs::canonicalize(&absolute).ok();
    let same_database = |recorded: &Path| {
        recorded == absolute
            || (canonical.is_some() && fs::canonicalize(recorded).ok() == canonical)
    };
    let own_dir = absolute.parent().map(Path::to_path_buf);
    let mut found = Vec::new();
    for dir in crate::capture::fallback::search_dirs() {
        if Some(&dir) == own_dir.as_ref() {
            continue;
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_name().as_bytes().starts_with(prefix) || !entry.path().is_dir() {
                continue;
            }
            let listed = listing(entry.path());
            if listed
                .manifest
                .as_ref()
                .is_some_and(|m| same_database(&m.database_path()))
            {
                found.push(listed);
            }
        }
    }
    found
}

fn listing(path: PathBuf) -> CaptureListing {
    let partial = is_partial(&path);
    let (manifest, mut manifest_error) = if partial {
        (None, None)
    } else {
        match read_manifest(&path) {
            Ok(m) => (Some(m), None),
            Err(e) => (None, Some(e.to_string())),
        }
    };
    let heal = manifest.as_ref().and_then(|m| match read_heal(&path, m) {
        Ok(h) => Some(h),
        Err(e) => {
            manifest_error = Some(e.to_string());
            None
        }
    });
    CaptureListing {
        path,
        partial,
        manifest,
        manifest_error,
        heal,
    }
}
