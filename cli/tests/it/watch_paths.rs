//! The directory watch must see every change to what the database's path resolves to: a move of
//! the directory or of any directory above it, and a new directory at the same path.

use crate::common;
use common::*;

#[test]
fn renaming_a_parent_of_the_database_directory_retires_the_generation() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("hermes");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "before").unwrap();
    insert(&conn, "before, again: the watch has vouched once").unwrap();
    // A restore swaps the whole tree: the parent of the database's directory moves away and a
    // new one takes its place.
    std::fs::rename(root.path().join("data"), root.path().join("data.old")).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let err = insert(&conn, "after the swap").expect_err("the write must be refused");
    assert!(is_refusal(&err), "{err}");
}

#[test]
fn renaming_the_database_directory_itself_retires_the_generation() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("hermes");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let conn = open_guarded(&path);
    insert(&conn, "before").unwrap();
    insert(&conn, "before, again").unwrap();
    std::fs::rename(&dir, root.path().join("hermes.old")).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let err = insert(&conn, "after the swap").expect_err("the write must be refused");
    assert!(is_refusal(&err), "{err}");
}

#[test]
fn a_directory_recreated_at_the_same_path_is_watched_afresh() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("hermes");
    std::fs::create_dir_all(&dir).unwrap();
    let first = open_guarded(&dir.join("state.db"));
    insert(&first, "first").unwrap();
    std::fs::rename(&dir, root.path().join("hermes.old")).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    // A new database where the old directory was, while the first connection is still open.
    let path = dir.join("state.db");
    let second = open_guarded(&path);
    insert(&second, "second").unwrap();
    insert(&second, "second, again: vouched").unwrap();
    std::fs::remove_file(sidecar(&path, "-wal")).unwrap();
    let err = insert(&second, "after the loss").expect_err("the write must be refused");
    assert!(is_refusal(&err), "{err}");
    drop(first);
}
