//! Every legal database name can be captured: the artifact's directory and files get names that
//! fit NAME_MAX (255 bytes) whatever the database's name, so close settles and the capture
//! recovers.
//!
//! SQLite itself cannot use a name longer than 251 bytes in WAL mode (`<name>-wal` would exceed
//! NAME_MAX), so 251 is the longest name that can have a retired WAL generation.

use crate::common;

use std::path::Path;

use common::*;

/// A WAL database named with `len` bytes in `dir`. Names over 247 bytes cannot be created by
/// SQLite (the first transaction's `-journal` name would exceed NAME_MAX): those are created
/// under a short name and renamed, as a deployment might.
fn long_named_database(dir: &Path, len: usize) -> std::path::PathBuf {
    let path = dir.join(format!("{}.db", "s".repeat(len - 3)));
    let short = dir.join("short.db");
    open_stock(&short).close().map_err(|(_, e)| e).unwrap();
    std::fs::rename(&short, &path).unwrap();
    path
}

fn a_long_name_is_captured_and_closes(len: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let path = long_named_database(tmp.path(), len);
    assert_eq!(path.file_name().unwrap().len(), len);
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    lose_sidecars(&path, false);

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    let status = conn.guard_status().unwrap();
    let artifact = status
        .capture
        .unwrap_or_else(|| panic!("{len}-byte name: no capture ({:?})", status.capture_error));
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    assert_eq!(artifacts(tmp.path()), vec![artifact.clone()]);
    assert_names_fit(&artifact);
    let manifest = manifest(&artifact);
    assert_eq!(
        manifest["database"],
        path.to_str().unwrap(),
        "the full name"
    );
    let recovered = recover_by_manifest(&artifact, &tmp.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert!(integrity_ok(&recovered));
}

#[test]
fn a_220_byte_database_name_is_captured_and_closes() {
    a_long_name_is_captured_and_closes(220);
}

#[test]
fn a_240_byte_database_name_is_captured_and_closes() {
    a_long_name_is_captured_and_closes(240);
}

#[test]
fn a_247_byte_database_name_is_captured_and_closes() {
    a_long_name_is_captured_and_closes(247);
}

#[test]
fn a_251_byte_database_name_the_longest_sqlite_can_use_in_wal_mode_is_captured_and_closes() {
    a_long_name_is_captured_and_closes(251);
}
