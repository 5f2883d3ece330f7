//! Verifying a capture from its bytes: each file hashed and measured, the main image's header
//! decoded, the WAL read frame by frame ([`WalCheck`]), and all of it compared with the manifest.
//! A manifest that disagrees with the bytes is a failed verification, whatever its sha256 says.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::open::read_manifest;
use super::walcheck::{PrefixEnd, WalCheck};
use super::RecoverError;
use crate::capture::{base_file, BasePagesEntry, WalEntry};
use crate::digest::Hashing;
use crate::walfile::{parse_main_header, MainHeader};
use crate::Manifest;

/// One captured file as found.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct FileFound {
    /// Its name inside the capture.
    pub file: String,
    /// Its size.
    pub bytes: u64,
    /// Its sha256, hex.
    pub sha256: String,
}

/// What [`verify_capture`] found.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct CaptureCheck {
    /// The capture directory.
    #[serde(serialize_with = "ser_path")]
    pub capture: PathBuf,
    /// The main image as found.
    pub main: FileFound,
    /// Its header as found.
    pub main_header: MainHeader,
    /// The WAL as found.
    pub wal: FileFound,
    /// The WAL read from its bytes.
    pub wal_check: WalCheck,
    /// Every way the bytes disagree with the manifest, or lose a commit: empty when verified.
    pub problems: Vec<String>,
    /// Commits of the captured generation that SQLite cannot read from these bytes.
    pub unreadable_commits: u64,
    /// The manifest.
    #[serde(skip)]
    pub manifest: Manifest,
}

impl CaptureCheck {
    /// The bytes agree with the manifest and every commit it records can be read.
    pub fn verified(&self) -> bool {
        self.problems.is_empty()
    }
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::paths::path_display(p))
}

/// The heal record of a verified capture (`healed.json`, resolved against its database's
/// directory); `None` when it cannot be read.
pub fn read_heal_of(check: &CaptureCheck) -> Option<crate::capture::HealState> {
    super::open::read_heal(&check.capture, &check.manifest).ok()
}

/// Verifies the capture in `dir` from its bytes (one read of each file; writes nothing).
///
/// Fails only when there is nothing to verify: a `.partial` directory, no readable manifest, a
/// file the manifest names that is missing or unreadable. Everything else found wrong is in
/// [`CaptureCheck::problems`].
pub fn verify_capture(dir: &Path) -> Result<CaptureCheck, RecoverError> {
    let manifest = read_manifest(dir)?;
    if manifest.main.mode == crate::capture::ImageMode::Absent {
        return verify_stale_wal(dir, manifest);
    }
    let (main, header_bytes) = read_main(dir, &manifest.main.file)?;
    let main_header = parse_main_header(&header_bytes);
    let (wal, wal_check) = read_wal(dir, &manifest.wal.file)?;

    let mut problems = Vec::new();
    let m = &manifest.main;
    file_problems(&main, &m.file, m.bytes, &m.sha256, &mut problems);
    if main_header != m.header {
        problems.push(format!(
            "the database header of {} ({}) is not the one the manifest records ({})",
            m.file,
            describe_main(&main_header),
            describe_main(&m.header)
        ));
    }
    let w = &manifest.wal;
    file_problems(&wal, &w.file, w.bytes, &w.sha256, &mut problems);
    problems.extend(wal_problems(&wal_check, w));
    if let Some(base) = &manifest.base_pages {
        base_pages_problems(dir, base, w, &mut problems)?;
    }
    let unreadable_commits = unreadable_commits(&wal_check, w);
    Ok(CaptureCheck {
        capture: dir.to_path_buf(),
        main,
        main_header,
        wal,
        wal_check,
        problems,
        unreadable_commits,
        manifest,
    })
}

/// A capture of reason `stale-wal`: the WAL alone (the main file it was written on is not in
/// it); `main` is empty and `main_header` the one the manifest records.
fn verify_stale_wal(dir: &Path, manifest: Manifest) -> Result<CaptureCheck, RecoverError> {
    let (wal, wal_check) = read_wal(dir, &manifest.wal.file)?;
    let w = &manifest.wal;
    let mut problems = Vec::new();
    file_problems(&wal, &w.file, w.bytes, &w.sha256, &mut problems);
    if manifest.stale_wal.is_none() {
        problems.push("a capture without a main image must record stale_wal".into());
    }
    problems.extend(wal_problems(&wal_check, w));
    let unreadable_commits = unreadable_commits(&wal_check, w);
    Ok(CaptureCheck {
        capture: dir.to_path_buf(),
        main: FileFound {
            file: String::new(),
            bytes: 0,
            sha256: String::new(),
        },
        main_header: manifest.main.header.clone(),
        wal,
        wal_check,
        problems,
        unreadable_commits,
        manifest,
    })
}

/// What differs between the base file (`<file>-base`) and what the manifest records: its size
/// and sha256, and, read back, its page size, salts (those of the WAL: the pages are the base of
/// that generation) and page count.
fn base_pages_problems(
    dir: &Path,
    entry: &BasePagesEntry,
    wal: &WalEntry,
    problems: &mut Vec<String>,
) -> Result<(), RecoverError> {
    let path = dir.join(&entry.file);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(RecoverError::MissingFile {
                capture: dir.to_path_buf(),
                file: entry.file.clone(),
            })
        }
        Err(e) => return Err(RecoverError::io(path, "read", e)),
    };
    let mut hashing = Hashing::new(&bytes[..]);
    io::copy(&mut hashing, &mut io::sink()).map_err(|e| RecoverError::io(&path, "read", e))?;
    file_problems(
        &hashing.found(&entry.file),
        &entry.file,
        entry.bytes,
        &entry.sha256,
        problems,
    );
    match base_file::read(&bytes) {
        Err(why) => problems.push(format!("{}: {why}", entry.file)),
        Ok(pages) => {
            if pages.salts != entry.salts || (wal.header.valid && pages.salts != wal.header.salts) {
                problems.push(format!(
                    "{} holds the base of the WAL generation with salts {:?}; the manifest says \
                     {:?} and the WAL's header {:?}",
                    entry.file, pages.salts, entry.salts, wal.header.salts
                ));
            }
            if pages.page_size != entry.page_size || pages.pages.len() as u64 != entry.kept {
                problems.push(format!(
                    "{} holds {} pages of {} bytes; the manifest says {} of {}",
                    entry.file,
                    pages.pages.len(),
                    pages.page_size,
                    entry.kept,
                    entry.page_size
                ));
            }
        }
    }
    Ok(())
}

/// What differs between a file as `found` and the size and sha256 the manifest records for it.
fn file_problems(
    found: &FileFound,
    file: &str,
    bytes: u64,
    sha256: &str,
    problems: &mut Vec<String>,
) {
    if found.bytes != bytes {
        problems.push(format!(
            "{file} is {} bytes, the manifest says {bytes}",
            found.bytes
        ));
    }
    if !found.sha256.eq_ignore_ascii_case(sha256) {
        problems.push(format!(
            "the sha256 of {file} is {}, the manifest says {sha256}",
            found.sha256
        ));
    }
}

/// Commits of the generation the manifest `entry` describes that SQLite cannot read from the WAL
/// `check` read: commit frames of this generation after the valid prefix, or the commits the
/// manifest counts beyond the prefix's, whichever is more.
pub fn unreadable_commits(check: &WalCheck, entry: &WalEntry) -> u64 {
    check
        .commits_after
        .max(entry.commits.saturating_sub(check.commits))
}

/// Every way the WAL's bytes (`check`) disagree with the manifest's `entry`, or lose a commit.
pub fn wal_problems(check: &WalCheck, entry: &WalEntry) -> Vec<String> {
    let mut problems = Vec::new();
    let file = &entry.file;
    if check.header != entry.header {
        problems.push(format!(
            "the WAL header of {file} is not the one the manifest records{}",
            if check.header.valid {
                String::new()
            } else {
                " (and SQLite would not accept it)".to_owned()
            }
        ));
    }
    let ends = match check.first_frame_after() {
        Some(k) => format!(
            "the valid prefix ends before frame {k}: {}",
            check.prefix_end.describe()
        ),
        None => "the valid prefix runs to the end of the file".to_owned(),
    };
    if (check.frames, check.commits, check.last_commit_frame)
        != (entry.frames, entry.commits, entry.last_commit_frame)
    {
        problems.push(format!(
            "{file} holds {} valid frame(s) and {} commit(s) SQLite can read; the manifest says \
             {} frame(s) and {} commit(s){}",
            check.frames,
            check.commits,
            entry.frames,
            entry.commits,
            if check.commits_after == 0 {
                format!(" ({ends})")
            } else {
                String::new()
            }
        ));
    }
    if let Some(recorded) = &entry.generation {
        let found = crate::walfile::generation_id(&check.header, check.first_frame_checksum);
        if found.as_ref() != Some(recorded) {
            problems.push(format!(
                "{file} holds the WAL generation {}; the manifest says {recorded}",
                found.as_deref().unwrap_or("(none: no valid frame)")
            ));
        }
    }
    if check.commits_after > 0 {
        let k = check.frames + 1;
        let damage = match (check.prefix_end, check.frames_after_intact) {
            (PrefixEnd::Checksum, 0) => {
                format!(" — frame {k} and the frames after it were changed or overwritten")
            }
            (PrefixEnd::Checksum, n) => format!(
                " — frame {k} was changed after it was written ({n} of the {} frame(s) after it \
                 are intact)",
                check.frames_after - 1
            ),
            _ => String::new(),
        };
        problems.push(format!(
            "{file}: {} commit(s) of this generation lie after the valid prefix ({ends}); SQLite \
             cannot read them{damage}",
            check.commits_after
        ));
    }
    problems
}

fn describe_main(h: &MainHeader) -> String {
    if !h.valid {
        return "not a valid SQLite header".to_owned();
    }
    format!(
        "page size {}, {} pages, change counter {}",
        h.page_size, h.page_count, h.change_counter
    )
}

fn open(dir: &Path, name: &str) -> Result<File, RecoverError> {
    let path = dir.join(name);
    File::open(&path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            RecoverError::MissingFile {
                capture: dir.to_path_buf(),
                file: name.to_owned(),
            }
        } else {
            RecoverError::io(path, "open", e)
        }
    })
}

impl<R> Hashing<R> {
    fn found(self, file: &str) -> FileFound {
        let (sha256, bytes) = self.finish();
        FileFound {
            file: file.to_owned(),
            bytes,
            sha256,
        }
    }
}

fn read_main(dir: &Path, name: &str) -> Result<(FileFound, Vec<u8>), RecoverError> {
    let mut input = Hashing::new(io::BufReader::with_capacity(1 << 20, open(dir, name)?));
    let io_err = |e| RecoverError::io(dir.join(name), "read", e);
    let mut header = Vec::with_capacity(100);
    (&mut input)
        .take(100)
        .read_to_end(&mut header)
        .map_err(io_err)?;
    io::copy(&mut input, &mut io::sink()).map_err(io_err)?;
    Ok((input.found(name), header))
}

fn read_wal(dir: &Path, name: &str) -> Result<(FileFound, WalCheck), RecoverError> {
    let mut input = Hashing::new(io::BufReader::with_capacity(1 << 20, open(dir, name)?));
    let check =
        WalCheck::read(&mut input).map_err(|e| RecoverError::io(dir.join(name), "read", e))?;
    Ok((input.found(name), check))
}
