//! The names a capture writes: its directory's stem, the files inside it, and a free directory
//! name. Each fits `NAME_MAX`, whatever the database's name.

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

use rustix::fs::AtFlags;
use sha2::{Digest, Sha256};

use super::{ARTIFACT_MARKER, STAGING_SUFFIX};
use crate::paths;
use crate::permissions::Permissions;

/// The longest file name Linux filesystems accept, in bytes.
pub const NAME_MAX: usize = 255;
/// Hex digits of the name hash in a shortened name (64 bits of sha256).
const NAME_HASH_HEX: usize = 16;
/// The most an artifact directory's name adds after its stem: the marker, `yyyymmdd-HHMMSS`,
/// `-<pid>` (10 digits at most), `-<n>` (likewise) and `.partial`.
const DIR_SUFFIX_MAX: usize = ARTIFACT_MARKER.len() + 15 + 11 + 11 + STAGING_SUFFIX.len();
/// The longest stem of an artifact directory's name.
pub const DIR_STEM_MAX: usize = NAME_MAX - DIR_SUFFIX_MAX;
/// The longest name of the main image inside an artifact: SQLite appends at most `-journal` to
/// a database's name (`-wal` for the WAL beside it, `-shm` when the copy is opened).
pub const FILE_STEM_MAX: usize = NAME_MAX - "-journal".len();

/// The name a capture gives `name` in a place that holds at most `max` bytes: `name` itself
/// when it is UTF-8, fits and does not end as a shortened name does (`~` and 16 lowercase hex
/// digits), else the longest prefix of it (cut at a character boundary, each invalid UTF-8
/// sequence shown as `_`) that leaves room for `~` and the first 16 hex digits of the sha256 of
/// the full name's bytes. Always UTF-8, never longer than `max`; a name kept as it is never
/// equals another name's shortened form.
pub fn fitted_name(name: &OsStr, max: usize) -> String {
    let bytes = name.as_bytes();
    if let Ok(s) = std::str::from_utf8(bytes) {
        if s.len() <= max && !looks_shortened(s) {
            return s.to_owned();
        }
    }
    let hash = paths::hex(&Sha256::digest(bytes)[..NAME_HASH_HEX / 2]);
    let room = max.saturating_sub(1 + NAME_HASH_HEX);
    let mut stem = String::with_capacity(room);
    for c in String::from_utf8_lossy(bytes).chars() {
        let c = if c == char::REPLACEMENT_CHARACTER {
            '_'
        } else {
            c
        };
        if stem.len() + c.len_utf8() > room {
            break;
        }
        stem.push(c);
    }
    format!("{stem}~{hash}")
}

/// Whether `s` ends as [`fitted_name`]'s shortened names do: `~` and 16 lowercase hex digits.
fn looks_shortened(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > NAME_HASH_HEX
        && b[b.len() - NAME_HASH_HEX - 1] == b'~'
        && b[b.len() - NAME_HASH_HEX..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// The stem of the artifact directory of a database named `name`:
/// `<stem>.retired-wal-<UTC>-<pid>[-n][.partial]` always fits [`NAME_MAX`].
pub fn capture_dir_stem(name: &OsStr) -> String {
    fitted_name(name, DIR_STEM_MAX)
}

/// The name of the main image inside the artifact of a database named `name`; the WAL is this
/// plus `-wal`. Opening the two as a database still fits `-shm` and `-journal` in [`NAME_MAX`].
pub fn capture_file_name(name: &OsStr) -> String {
    fitted_name(name, FILE_STEM_MAX)
}

/// Picks the first free `<stem>.retired-wal-<UTC>-<pid>[-n]` in `dir` and creates its
/// `.partial` staging directory, with `permissions` from its `mkdirat` on; returns (final name,
/// staging name).
pub(crate) fn reserve_staging(
    dir: BorrowedFd<'_>,
    stem: &str,
    permissions: &Permissions,
) -> Result<(String, String), (String, io::Error)> {
    let stamp = utc_stamp(SystemTime::now());
    let base = format!("{stem}{ARTIFACT_MARKER}{stamp}-{}", std::process::id());
    for n in 0u32.. {
        let candidate = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let staging = format!("{candidate}{STAGING_SUFFIX}");
        match rustix::fs::statat(dir, &candidate, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => continue,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err((staging, e.into())),
        }
        match permissions.create_dir(dir, &staging) {
            Ok(_) => return Ok((candidate, staging)),
            Err(e) if e.errno() == rustix::io::Errno::EXIST => continue,
            Err(e) => return Err((staging, e.into())),
        }
    }
    Err((
        format!("{base}{STAGING_SUFFIX}"),
        io::Error::other("no free artifact name"),
    ))
}

/// `yyyymmdd-HHMMSS` in UTC.
pub(super) fn utc_stamp(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_seconds(t).to_string(); // 2026-11-29T19:35:18Z
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    format!("{}-{}", &digits[..8], &digits[8..14])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_looks_shortened_is_shortened_too_and_never_collides() {
        // Found by the property tests: 255 `a`s shorten to 180 `a`s, `~` and a hash; a database
        // named exactly that shortened form used to keep its name and share the stem.
        let long = "a".repeat(255);
        let shortened = capture_dir_stem(OsStr::new(&long));
        assert!(looks_shortened(&shortened));
        let lookalike = capture_dir_stem(OsStr::new(&shortened));
        assert_ne!(lookalike, shortened);
        assert!(lookalike.len() <= DIR_STEM_MAX);
        // Ordinary names are kept, `~` and all.
        assert_eq!(capture_dir_stem(OsStr::new("state.db~1")), "state.db~1");
        assert_eq!(capture_dir_stem(OsStr::new("state.db")), "state.db");
    }
}
