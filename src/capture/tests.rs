//! The capture's unit tests: names, stamps, staging.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

use rustix::fs::{Mode, OFlags};

use super::names::{utc_stamp, NAME_MAX};
use super::*;

#[test]
fn utc_stamp_is_compact_date_and_time() {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_000_000);
    assert_eq!(utc_stamp(t), "20261130-005320");
}

#[test]
fn hex_is_lowercase_two_digits_per_byte() {
    assert_eq!(crate::paths::hex(&[0, 15, 255]), "000fff");
}

#[test]
fn artifact_names_do_not_collide() {
    let dir = tempfile::tempdir().unwrap();
    let fd = open_dir(rustix::fs::CWD, dir.path()).unwrap();
    let (first, first_staging) =
        reserve_staging(fd.as_fd(), "state.db", &Permissions::most_private()).unwrap();
    assert!(first.starts_with("state.db.retired-wal-"));
    assert_eq!(first_staging, format!("{first}.partial"));
    // A staging directory in progress holds its name...
    let (second, _) =
        reserve_staging(fd.as_fd(), "state.db", &Permissions::most_private()).unwrap();
    assert_ne!(first, second);
    // ...and so does a finished one.
    std::fs::rename(dir.path().join(&first_staging), dir.path().join(&first)).unwrap();
    let (third, _) = reserve_staging(fd.as_fd(), "state.db", &Permissions::most_private()).unwrap();
    assert!(third != first && third != second);
}

/// A directory this process may write in but not list is held `O_PATH`; a free name is still found
/// and made without listing it.
#[test]
fn artifact_names_are_reserved_through_a_descriptor_that_cannot_list() {
    let dir = tempfile::tempdir().unwrap();
    let fd = rustix::fs::openat(
        rustix::fs::CWD,
        dir.path(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    assert!(crate::paths::is_path_only(fd.as_fd()));
    let (first, staging) =
        reserve_staging(fd.as_fd(), "state.db", &Permissions::most_private()).unwrap();
    assert!(dir.path().join(&staging).is_dir());
    let (second, _) =
        reserve_staging(fd.as_fd(), "state.db", &Permissions::most_private()).unwrap();
    assert_ne!(first, second);
}

fn longest_dir_name(stem: &str) -> usize {
    format!(
        "{stem}{ARTIFACT_MARKER}20261130-005320-{}-{}{STAGING_SUFFIX}",
        u32::MAX,
        u32::MAX
    )
    .len()
}

#[test]
fn a_short_utf8_name_is_kept_as_it_is() {
    let name = OsStr::new("state.db");
    assert_eq!(capture_dir_stem(name), "state.db");
    assert_eq!(capture_file_name(name), "state.db");
}

#[test]
fn every_legal_name_length_fits_name_max_in_the_artifact() {
    for len in 1..=NAME_MAX {
        let raw = "s".repeat(len);
        let name = OsStr::new(&raw);
        let stem = capture_dir_stem(name);
        assert!(longest_dir_name(&stem) <= NAME_MAX, "{len}: {stem}");
        let file = capture_file_name(name);
        assert!(file.len() + "-journal".len() <= NAME_MAX, "{len}: {file}");
        if len <= DIR_STEM_MAX {
            assert_eq!(stem, raw);
        } else {
            assert!(stem.contains('~'), "{len}: {stem}");
        }
    }
}

#[test]
fn a_shortened_name_keeps_a_prefix_and_a_hash_of_the_whole_name() {
    let a = "a".repeat(250) + "1";
    let b = "a".repeat(250) + "2";
    let (sa, sb) = (
        capture_dir_stem(OsStr::new(&a)),
        capture_dir_stem(OsStr::new(&b)),
    );
    assert_ne!(sa, sb, "names differing past the cut are told apart");
    assert_eq!(sa.len(), DIR_STEM_MAX);
    assert!(sa.starts_with(&"a".repeat(DIR_STEM_MAX - 17)));
}

#[test]
fn a_shortened_name_is_cut_at_a_character_boundary() {
    let raw = "é".repeat(127); // 254 bytes
    let stem = capture_dir_stem(OsStr::new(&raw));
    assert!(stem.len() <= DIR_STEM_MAX);
    assert!(stem
        .trim_end_matches(|c: char| c.is_ascii_hexdigit())
        .ends_with("é~"));
}

#[test]
fn a_non_utf8_name_gets_a_utf8_name_with_a_hash() {
    let name = OsStr::from_bytes(b"st\xffate.db");
    let file = capture_file_name(name);
    assert!(file.starts_with("st_ate.db~"), "{file}");
    assert_eq!(file.len(), "st_ate.db~".len() + 16);
    let other = capture_file_name(OsStr::from_bytes(b"st\xfeate.db"));
    assert_ne!(file, other);
}
