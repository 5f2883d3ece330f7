//! The base of the pages a captured generation carries (`<file>-base`, src/vfs/state/base_pages.rs):
//! each page the generation's WAL carries that the main file held when the generation began is
//! in the capture as the main file held it then — read at the generation's first frame of it,
//! by whichever connection of the process wrote that frame.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::*;
use hermes_guard::test_hooks::read_base_pages;

/// The pages a WAL's frames carry (those with the header's salts, up to the first that is not).
fn carried_pages(wal: &[u8]) -> BTreeSet<u32> {
    let page_size = u32::from_be_bytes(wal[8..12].try_into().unwrap()) as usize;
    let salts = &wal[16..24];
    wal[32..]
        .chunks_exact(24 + page_size)
        .take_while(|frame| &frame[8..16] == salts)
        .map(|frame| u32::from_be_bytes(frame[0..4].try_into().unwrap()))
        .collect()
}

/// The capture's base pages, checked against `before` (the main file when the generation
/// began): every kept page is that file's page, and the kept pages are exactly the carried pages
/// that file held.
fn assert_base_is(capture: &Path, before: &[u8]) {
    let entry = &manifest(capture)["base_pages"];
    let file = entry["file"]
        .as_str()
        .unwrap_or_else(|| panic!("no base_pages: {entry}"));
    let base = read_base_pages(&std::fs::read(capture.join(file)).unwrap()).unwrap();
    let page_size = base.page_size as usize;
    assert_eq!(base.pages_at_start as usize, before.len() / page_size);
    let wal_file = manifest(capture)["wal"]["file"]
        .as_str()
        .unwrap()
        .to_owned();
    let carried = carried_pages(&std::fs::read(capture.join(wal_file)).unwrap());
    let expected: BTreeSet<u32> = carried
        .into_iter()
        .filter(|&p| p <= base.pages_at_start)
        .collect();
    assert!(
        !expected.is_empty(),
        "the generation rewrote pages the file held"
    );
    assert_eq!(
        base.pages.keys().copied().collect::<BTreeSet<_>>(),
        expected
    );
    for (pgno, page) in &base.pages {
        let at = (*pgno as usize - 1) * page_size;
        assert!(
            page[..] == before[at..at + page_size],
            "page {pgno} is not the main file's page before the generation"
        );
    }
    assert_eq!(entry["kept"], expected.len() as u64);
    assert_eq!(entry["over_cap"], 0);
}

/// W updates and inserts rows after a full checkpoint, a large row among them (new pages): the
/// capture holds the page each frame rewrote, as the file held it before.
#[test]
fn a_capture_holds_each_carried_page_as_the_file_held_it_when_the_generation_began() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let w = open_guarded(&path);
    checkpointed_history(&w);
    let before = std::fs::read(&path).unwrap();
    w.execute(
        "UPDATE messages SET content = 'changed' WHERE content = 'history 3'",
        [],
    )
    .unwrap();
    insert(&w, &"large ".repeat(3000)).unwrap();
    insert(&w, "after").unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&w, "refused").unwrap_err()));
    hermes_guard::close(w).map_err(|(_, e)| e).unwrap();

    let [capture] = &artifacts(dir.path())[..] else {
        panic!("one capture");
    };
    assert_base_is(capture, &before);
    let (code, out, err) = hermes_guard_cli(&["verify".as_ref(), capture.as_os_str()]);
    assert_eq!(code, 0, "{out}{err}");
}

/// Two connections of this process write the same generation, each a page of its own first:
/// the one capture of the generation holds both pages' bases.
#[test]
fn the_pages_each_connection_of_the_process_wrote_first_are_in_the_one_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = open_guarded(&path);
    a.execute_batch("CREATE TABLE other (x)").unwrap();
    a.execute("INSERT INTO other VALUES ('first')", []).unwrap();
    checkpointed_history(&a);
    let before = std::fs::read(&path).unwrap();
    let b = open_guarded(&path);
    insert(&a, "from a").unwrap();
    b.execute("UPDATE other SET x = 'from b'", []).unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&a, "refused").unwrap_err()));
    assert!(is_refusal(&insert(&b, "refused").unwrap_err()));
    hermes_guard::close(a).map_err(|(_, e)| e).unwrap();
    hermes_guard::close(b).map_err(|(_, e)| e).unwrap();

    let [capture] = &artifacts(dir.path())[..] else {
        panic!("one capture");
    };
    assert_base_is(capture, &before);
}

/// A base file whose bytes were changed after the capture fails `verify`.
#[test]
fn a_changed_base_file_fails_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let w = open_guarded(&path);
    checkpointed_history(&w);
    insert(&w, "in the WAL").unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&w, "refused").unwrap_err()));
    hermes_guard::close(w).map_err(|(_, e)| e).unwrap();
    let [capture] = &artifacts(dir.path())[..] else {
        panic!("one capture");
    };
    let file = capture.join(manifest(capture)["base_pages"]["file"].as_str().unwrap());
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    let (code, out, err) = hermes_guard_cli(&["verify".as_ref(), capture.as_os_str()]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(out.contains("-base") || err.contains("-base"), "{out}{err}");
}
