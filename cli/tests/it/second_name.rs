//! A database file with a second name (a hard link, in its own directory or another). A newer
//! generation that opens the file through the other name makes its `-wal` and `-shm` beside that
//! name, where the guard's directory watch does not look, and checkpoints into the one inode both
//! names share. The retired generation's capture must then not claim its image as its own
//! (`base own` would replay it as a delta and undo the newer generation's rows): its base is
//! `unknown`, its evidence names the links, and after the runbook every row of both generations
//! is live exactly once.

use crate::common;

use std::path::Path;

use common::*;

/// W (guarded, this process) has three rows in its WAL when its `-wal` and `-shm` are removed; a
/// stock process then commits two rows through `link` and truncates its WAL into the file; W's
/// next write is refused and captured.
fn lost_while_written_through(link: &Path, path: &Path) {
    lost_and_captured(link, path, Link::MadeAfterOpen);
}

/// When the second name is made, and whether it is still there at the capture.
#[derive(Clone, Copy, PartialEq)]
enum Link {
    /// After W opened and wrote: the capture finds it.
    MadeAfterOpen,
    /// Before W opened, and removed once the newer generation wrote through it: only W's full
    /// check at its first write transaction saw it.
    GoneBeforeTheCapture,
}

fn lost_and_captured(link: &Path, path: &Path, when: Link) {
    if when == Link::GoneBeforeTheCapture {
        drop(open_stock(path));
        std::fs::hard_link(path, link).unwrap();
    }
    let w = open_guarded(path);
    w.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..3 {
        insert(&w, &format!("kept {i}")).unwrap();
    }
    if when == Link::MadeAfterOpen {
        std::fs::hard_link(path, link).unwrap();
    }
    lose_sidecars(path, false);
    assert_eq!(write_second_generation(link, "stock", 2), 2);
    if when == Link::GoneBeforeTheCapture {
        std::fs::remove_file(link).unwrap();
    }
    assert!(is_refusal(&insert(&w, "refused").unwrap_err()));
    hermes_guard::close(w).map_err(|(_, e)| e).unwrap();

    let [capture] = &artifacts(path.parent().unwrap())[..] else {
        panic!("one capture");
    };
    let base = &manifest(capture)["base"];
    assert_eq!(base["verdict"], "unknown", "{base}");
    assert!(
        base["evidence"]
            .as_str()
            .unwrap()
            .contains("has had 2 names (hard links)"),
        "{base}"
    );
    let log = apply_every_listed_recovery(path);
    let live = open_stock(path);
    assert!(integrity_ok(&live), "{log}");
    for row in ["kept 0", "kept 1", "kept 2"] {
        assert_eq!(count_like(&live, row), 1, "{row}\n{log}");
    }
    assert_eq!(
        count_like(&live, "second generation %"),
        2,
        "the newer generation's rows\n{log}"
    );
}

#[test]
fn a_newer_generation_writing_through_a_link_in_the_same_directory_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    lost_while_written_through(&dir.path().join("link.db"), &dir.path().join("state.db"));
}

#[test]
fn a_newer_generation_writing_through_a_link_in_another_directory_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    lost_while_written_through(
        &elsewhere.path().join("state.db"),
        &dir.path().join("state.db"),
    );
}

/// The link was there when W opened and is gone when W's generation is captured: the file had
/// two names while W had it open, which W's first write transaction saw, so the base is still
/// not taken as W's own.
#[test]
fn a_link_gone_before_the_capture_still_keeps_the_newer_generations_rows() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    lost_and_captured(
        &elsewhere.path().join("state.db"),
        &dir.path().join("state.db"),
        Link::GoneBeforeTheCapture,
    );
}
