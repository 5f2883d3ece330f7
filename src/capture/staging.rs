//! Filling a capture's staging directory: the WAL copied from the pinned descriptor (its frames
//! scanned on the way), the kept base pages, the main image copied, and the manifest describing
//! them. Memory stays bounded by one copy buffer whatever the files' sizes.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::BorrowedFd;
use std::time::SystemTime;

use rustix::fs::OFlags;

use super::unacknowledged::{self, FailedCommit};
use super::{
    base_file, BaseEntry, BasePages, BasePagesEntry, BaseVerdict, CaptureInput, ImageMode,
    ImageSource, MainEntry, Manifest, PathGeneration, ShmEntry, WalEntry,
};
use crate::digest::{sha256_stream, ReadAt};
use crate::paths::{path_display, path_hex};
use crate::permissions::Permissions;
use crate::walfile::{parse_main_header, WalScanner, WalSummary};

const COPY_CHUNK: usize = 1 << 20;

/// An [`ImageSource`] read front to back, up to its `size()`, in chunks of at most [`COPY_CHUNK`].
struct ImageReader<'a> {
    source: &'a dyn ImageSource,
    pos: u64,
    size: u64,
}

impl io::Read for ImageReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.size - self.pos).min(buf.len().min(COPY_CHUNK) as u64) as usize;
        self.source.read_at(&mut buf[..n], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Creates `name` in the directory `dir` (it must not exist) with `permissions`, fills it and
/// fsyncs it.
pub(crate) fn write_synced(
    dir: BorrowedFd<'_>,
    name: &str,
    permissions: &Permissions,
    body: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let fd = permissions.create_file(dir, name, OFlags::WRONLY)?;
    let mut f = File::from(fd);
    body(&mut f)?;
    f.sync_all()
}

/// Writes the capture's files into `staging` (the WAL as `<name>-wal`, the kept base pages as
/// `<name>-base`, the main image as `name`), each fsynced; the manifest that describes them.
pub(super) fn fill_staging(
    input: &CaptureInput<'_>,
    staging: BorrowedFd<'_>,
    name: &str,
) -> io::Result<Manifest> {
    let wal_name = format!("{name}-wal");
    let end = unacknowledged::generation_end(input.wal, input.failed_commit.as_ref());
    let wal = copy_wal(input, staging, &wal_name, end)?;
    let base_pages = match input.base_pages {
        Some(kept) if wal.summary.header.valid => kept(wal.summary.header.salts)
            .map(|pages| write_base_pages(staging, &format!("{name}-base"), input, &pages))
            .transpose()?,
        _ => None,
    };
    let main = copy_image(input, staging, name)?;
    // After the image's last byte was read: what the judge saw then covers all of it.
    let base = Some(input.base.map_or_else(
        || {
            BaseEntry::new(
                BaseVerdict::Unknown,
                "the capturing connection had no directory watch to tell by",
            )
        },
        |judge| judge(),
    ));

    Ok(Manifest {
        version: 1,
        database: path_display(input.database),
        database_hex: path_hex(input.database),
        trigger: input.trigger,
        reason: input.reason,
        pid: std::process::id(),
        captured_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        sqlite: rusqlite::version().to_owned(),
        wal: wal_entry(input, wal_name, wal, end),
        shm: input.shm_id.map(|identity| ShmEntry { identity }),
        main: main_entry(input, name, main),
        backfill_at_loss: input.backfill_at_loss,
        main_torn: input.backfill_at_loss.is_some_and(|b| b.tears_main()),
        stale_wal: None,
        base,
        base_pages,
        path_generation_at_capture: PathGeneration::of(input.database),
    })
}

/// The WAL as copied: its sha256 (hex), its length and what its frames say.
struct CopiedWal {
    sha256: String,
    bytes: u64,
    summary: WalSummary,
}

/// Copies the pinned WAL, up to `end` (a failed commit's first frame) or whole, into `staging`
/// as `wal_name`, scanning its frames on the way.
fn copy_wal(
    input: &CaptureInput<'_>,
    staging: BorrowedFd<'_>,
    wal_name: &str,
    end: Option<u64>,
) -> io::Result<CopiedWal> {
    let mut scanner = WalScanner::new();
    let mut wal_digest = (String::new(), 0u64);
    write_synced(staging, wal_name, &input.permissions, |out| {
        let whole = ReadAt {
            file: input.wal.file(),
            pos: 0,
        };
        let src = io::Read::take(whole, end.unwrap_or(u64::MAX));
        wal_digest = sha256_stream(src, |chunk| {
            scanner.feed(chunk);
            out.write_all(chunk)
        })?;
        Ok(())
    })?;
    let (sha256, bytes) = wal_digest;
    Ok(CopiedWal {
        sha256,
        bytes,
        summary: scanner.finish(),
    })
}

/// The main image as copied: its size, its sha256 (hex) and its first 100 bytes (the header).
struct CopiedImage {
    size: u64,
    sha256: String,
    header: Vec<u8>,
}

/// Copies the main image into `staging` as `name`.
fn copy_image(
    input: &CaptureInput<'_>,
    staging: BorrowedFd<'_>,
    name: &str,
) -> io::Result<CopiedImage> {
    let main_size = input.main.size()?;
    let mut main_digest = (String::new(), 0u64);
    let mut header_bytes = Vec::with_capacity(100);
    write_synced(staging, name, &input.permissions, |out| {
        let image = ImageReader {
            source: input.main,
            pos: 0,
            size: main_size,
        };
        main_digest = sha256_stream(image, |chunk| {
            if header_bytes.len() < 100 {
                let take = (100 - header_bytes.len()).min(chunk.len());
                header_bytes.extend_from_slice(&chunk[..take]);
            }
            out.write_all(chunk)
        })?;
        Ok(())
    })?;
    let (sha256, _) = main_digest;
    Ok(CopiedImage {
        size: main_size,
        sha256,
        header: header_bytes,
    })
}

/// The manifest's entry of the WAL copied as `file` (`end`: where a failed commit was cut off).
fn wal_entry(input: &CaptureInput<'_>, file: String, wal: CopiedWal, end: Option<u64>) -> WalEntry {
    let summary = wal.summary;
    WalEntry {
        identity: input.wal.id(),
        file,
        bytes: wal.bytes,
        sha256: wal.sha256,
        header: summary.header.clone(),
        frames: summary.frames,
        commits: summary.commits,
        last_commit_frame: summary.last_commit_frame,
        generation: crate::walfile::generation_id(&summary.header, summary.first_frame_checksum),
        failed_commit: end
            .and(input.failed_commit.as_ref())
            .map(FailedCommit::entry),
    }
}

/// The manifest's entry of the main image copied as `file`.
fn main_entry(input: &CaptureInput<'_>, file: &str, main: CopiedImage) -> MainEntry {
    MainEntry {
        identity: input.main_id,
        size: main.size,
        header: parse_main_header(&main.header),
        mode: ImageMode::Copied,
        file: file.to_owned(),
        bytes: main.size,
        sha256: main.sha256,
    }
}

/// Writes the kept base pages as `file` in the staging directory; their manifest entry.
fn write_base_pages(
    staging: BorrowedFd<'_>,
    file: &str,
    input: &CaptureInput<'_>,
    pages: &BasePages,
) -> io::Result<BasePagesEntry> {
    let mut bytes = Vec::new();
    base_file::write(&mut bytes, pages)?;
    write_synced(staging, file, &input.permissions, |f| f.write_all(&bytes))?;
    let (sha256, len) = sha256_stream(&bytes[..], |_| Ok(()))?;
    Ok(BasePagesEntry {
        file: file.to_owned(),
        bytes: len,
        sha256,
        page_size: pages.page_size,
        salts: pages.salts,
        pages_at_start: pages.pages_at_start,
        kept: pages.pages.len() as u64,
        over_cap: pages.over_cap,
    })
}
