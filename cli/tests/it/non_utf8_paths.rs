//! Paths are bytes: a database whose directory or file name is not valid UTF-8 is guarded like
//! any other, and its capture records the exact bytes.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

const DIR: &[u8] = b"data-\xff\xfe";
const NAME: &[u8] = b"st\xe9te.db"; // Latin-1 e-acute: not UTF-8

fn non_utf8_dir(base: &Path) -> PathBuf {
    let dir = join_bytes(base, DIR);
    std::fs::create_dir(&dir).unwrap();
    dir
}

#[test]
fn a_wal_database_under_a_non_utf8_directory_works_through_the_guard() {
    let tmp = tempfile::tempdir().unwrap();
    let path = non_utf8_dir(tmp.path()).join("state.db");
    assert!(path.to_str().is_none());
    let conn = open_guarded(&path);
    insert(&conn, "hello").unwrap();
    assert_eq!(count_like(&conn, "hello"), 1);
    let status = conn.guard_status().unwrap();
    assert_eq!(status.database, path, "the status names the exact path");
    assert!(!status.retired);
    assert_eq!(status.main, Some(identity(&path)));
    assert_eq!(status.wal, Some(identity(&sidecar(&path, "-wal"))));
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}

#[test]
fn a_wal_loss_under_a_non_utf8_directory_is_refused_and_captured_with_the_exact_path_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = non_utf8_dir(tmp.path());
    let path = dir.join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    lose_sidecars(&path, false);

    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    let artifact = conn
        .guard_status()
        .unwrap()
        .capture
        .expect("captured at the halt");
    assert_eq!(artifact.parent(), Some(dir.as_path()));
    let manifest = manifest(&artifact);
    assert_eq!(manifest["database_hex"], hex_of(&path));
    assert_eq!(manifest["database"], path.to_string_lossy().as_ref());
    assert_eq!(manifest["main"]["file"], "state.db");
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();

    let recovered = recover_by_manifest(&artifact, &tmp.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert!(integrity_ok(&recovered));
}

#[test]
fn a_main_file_replaced_under_a_non_utf8_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = non_utf8_dir(tmp.path()).join("state.db");
    let conn = open_guarded(&path);
    wal_only_sentinel(&conn);
    replace_main_file(&path);

    let err = insert(&conn, "after the replacement").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    assert_eq!(
        conn.guard_status().unwrap().reason,
        Some(hermes_guard::RetireReason::MainReplaced)
    );
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}

#[test]
fn closing_a_database_under_a_non_utf8_directory_deletes_its_wal_as_the_stock_vfs_does() {
    let tmp = tempfile::tempdir().unwrap();
    let path = non_utf8_dir(tmp.path()).join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "hello").unwrap();
    assert!(sidecar(&path, "-wal").exists());
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    assert!(
        !sidecar(&path, "-wal").exists(),
        "the close-time xDelete of the WAL was refused"
    );
}

#[test]
fn a_wal_database_with_a_non_utf8_file_name_works_through_the_guard() {
    let tmp = tempfile::tempdir().unwrap();
    let path = join_bytes(tmp.path(), NAME);
    let conn = open_guarded(&path);
    insert(&conn, "hello").unwrap();
    let status = conn.guard_status().unwrap();
    assert_eq!(status.database, path);
    assert_eq!(status.wal, Some(identity(&sidecar(&path, "-wal"))));
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}

#[test]
fn a_wal_loss_of_a_non_utf8_file_name_is_captured_with_the_exact_name_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let path = join_bytes(tmp.path(), NAME);
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    lose_sidecars(&path, true);

    // First seen at close.
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let found = artifacts(tmp.path());
    assert_eq!(found.len(), 1, "{found:?}");
    let manifest = manifest(&found[0]);
    assert_eq!(manifest["database_hex"], hex_of(&path));
    let file = manifest["main"]["file"].as_str().unwrap();
    assert!(
        file.starts_with("st_te.db~"),
        "a UTF-8 name for the image: {file}"
    );
    assert_eq!(manifest["wal"]["file"], format!("{file}-wal"));

    let recovered = recover_by_manifest(&found[0], &tmp.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
    assert!(integrity_ok(&recovered));
}
