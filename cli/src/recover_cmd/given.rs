//! What was given on the command line, judged the same way by `captures`, `verify` and
//! `recover`: a path that is not there or not a capture is bad input (exit 2), and a capture
//! whose manifest cannot be read is told how to open its files anyway.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use hermes_guard::recover::RecoverError;

/// The marker every capture directory's name carries (`<name>.retired-wal-<UTC>-<pid>`).
const CAPTURE_MARKER: &[u8] = b".retired-wal-";

/// For a capture directory whose manifest is missing or unreadable: how to open its two files,
/// which hold every committed row of the retired generation without it. `None` when the
/// directory holds no database and its `-wal` side by side (or is an interrupted `.partial`
/// capture, never to be used).
pub(crate) fn how_to_open(dir: &Path) -> Option<String> {
    if dir.as_os_str().as_bytes().ends_with(b".partial") {
        return None;
    }
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name())
        .collect();
    names.sort();
    let database = names.iter().find(|name| {
        let bytes = name.as_bytes();
        let mut wal = name.to_os_string();
        wal.push("-wal");
        !bytes.ends_with(b"-wal")
            && !bytes.ends_with(b"-shm")
            && !bytes.ends_with(b".json")
            && names.contains(&wal)
    })?;
    let name = Path::new(database).display().to_string();
    Some(format!(
        "its two files still open as a database with every committed row: copy {name} and \
         {name}-wal (same names, side by side) into an empty directory and open the copy there, \
         e.g. `sqlite3 /tmp/rows/{name}`; never open them inside the capture"
    ))
}

/// Whether `dir` is a capture, complete or not: a directory named as one, or holding a database
/// and its `-wal`. Any other path a command was given as a capture is bad input.
pub(crate) fn looks_like_capture(dir: &Path) -> bool {
    dir.is_dir()
        && (dir.file_name().is_some_and(|n| {
            n.as_bytes()
                .windows(CAPTURE_MARKER.len())
                .any(|w| w == CAPTURE_MARKER)
        }) || how_to_open(dir).is_some())
}

/// `e`, about the capture `dir`, in words, with how to open the capture's files when its
/// manifest is what failed.
pub(crate) fn describe(e: &RecoverError, dir: &Path) -> String {
    let manifest_failed = matches!(
        e,
        RecoverError::NotACapture { .. } | RecoverError::Manifest { .. }
    );
    match how_to_open(dir).filter(|_| manifest_failed) {
        Some(hint) => format!("{e}; {hint}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_and_its_wal_side_by_side_are_named_in_the_hint() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(how_to_open(dir.path()), None);
        std::fs::write(dir.path().join("state.db-wal"), b"w").unwrap();
        assert_eq!(how_to_open(dir.path()), None, "a WAL alone is not enough");
        std::fs::write(dir.path().join("state.db"), b"d").unwrap();
        let hint = how_to_open(dir.path()).unwrap();
        assert!(hint.contains("copy state.db and state.db-wal"), "{hint}");
        assert!(looks_like_capture(dir.path()));
    }

    #[test]
    fn an_empty_directory_named_as_a_capture_looks_like_one_and_another_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("state.db.retired-wal-20200101-000000-1");
        std::fs::create_dir(&named).unwrap();
        assert!(looks_like_capture(&named));
        assert!(!looks_like_capture(dir.path()));
        assert!(!looks_like_capture(&dir.path().join("nowhere")));
    }
}
