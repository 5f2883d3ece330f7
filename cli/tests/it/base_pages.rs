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

/// The freelist of a database file's bytes: every trunk and leaf page it lists.
fn freelist(file: &[u8]) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let be = |at: usize| u32::from_be_bytes(file[at..at + 4].try_into().unwrap());
    let page_size = match u16::from_be_bytes([file[16], file[17]]) {
        1 => 65536,
        n => n as usize,
    };
    let (mut trunks, mut leaves) = (BTreeSet::new(), BTreeSet::new());
    let mut trunk = be(32);
    while trunk != 0 {
        trunks.insert(trunk);
        let at = (trunk as usize - 1) * page_size;
        for k in 0..be(at + 4) as usize {
            leaves.insert(be(at + 8 + 4 * k));
        }
        trunk = be(at);
    }
    (trunks, leaves)
}

/// W deletes most of a large table in one transaction: SQLite puts the emptied leaves on the
/// freelist without writing them, so the WAL never carries them. The capture keeps each such
/// page's base, flagged freed: the rows W deleted are there and nowhere else.
#[test]
fn the_pages_a_generation_freed_without_writing_them_are_kept_flagged_freed() {
    freed_pages_kept(false);
}

/// The same where the file had a freelist when the generation began: the first trunk then
/// listed pages freed before it, which are not the generation's; only the pages it added are
/// kept.
#[test]
fn pages_freed_before_the_generation_are_not_taken_for_its_own() {
    freed_pages_kept(true);
}

fn freed_pages_kept(freelist_before: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let w = open_guarded(&path);
    w.execute_batch("PRAGMA secure_delete=OFF; PRAGMA wal_autocheckpoint=0")
        .unwrap();
    let tx = w.unchecked_transaction().unwrap();
    for i in 0..2000 {
        insert(&tx, &format!("history {i} {}", "x".repeat(200))).unwrap();
    }
    tx.commit().unwrap();
    if freelist_before {
        w.execute("DELETE FROM messages WHERE id BETWEEN 1750 AND 1990", [])
            .unwrap();
    }
    w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    let (_, leaves_before) = freelist(&before);
    assert_eq!(leaves_before.is_empty(), !freelist_before);
    w.execute("DELETE FROM messages WHERE id BETWEEN 300 AND 1700", [])
        .unwrap();
    lose_sidecars(&path, false);
    assert!(is_refusal(&insert(&w, "refused").unwrap_err()));
    hermes_guard::close(w).map_err(|(_, e)| e).unwrap();

    let [capture] = &artifacts(dir.path())[..] else {
        panic!("one capture");
    };
    let m = manifest(capture);
    let wal = std::fs::read(capture.join(m["wal"]["file"].as_str().unwrap())).unwrap();
    let carried = carried_pages(&wal);
    // The generation's end: the capture's image with its WAL, checkpointed in a copy.
    let end = dir.path().join("end");
    std::fs::create_dir(&end).unwrap();
    std::fs::copy(
        capture.join(m["main"]["file"].as_str().unwrap()),
        end.join("e.db"),
    )
    .unwrap();
    std::fs::write(end.join("e.db-wal"), &wal).unwrap();
    let e = rusqlite::Connection::open(end.join("e.db")).unwrap();
    e.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(e);
    let (_, leaves) = freelist(&std::fs::read(end.join("e.db")).unwrap());
    let expected: BTreeSet<u32> = leaves
        .difference(&carried)
        .filter(|p| !leaves_before.contains(p))
        .copied()
        .collect();
    assert!(expected.len() > 10, "the delete freed leaves: {expected:?}");

    let base = read_base_pages(
        &std::fs::read(capture.join(m["base_pages"]["file"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    assert_eq!(base.freed, expected);
    let page_size = base.page_size as usize;
    for pgno in &base.freed {
        let at = (*pgno as usize - 1) * page_size;
        assert!(
            base.pages[pgno][..] == before[at..at + page_size],
            "page {pgno}"
        );
    }
}

/// Another guarded process of the same generation captured it first, without the base of a page
/// this process wrote first: this process does not take that capture for its own (recovery would
/// lose the page's base) but writes its own. Between them the captures hold the base of every
/// page either process wrote first, each the file's page before the generation.
#[test]
fn a_capture_without_this_processs_base_pages_is_not_taken_for_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let here = open_guarded(&path);
    here.execute_batch("CREATE TABLE other (x); INSERT INTO other VALUES ('first')")
        .unwrap();
    checkpointed_history(&here);
    let (mut child, _) = Gateway::start(&path, "guard");
    let before = std::fs::read(&path).unwrap();
    here.execute("UPDATE other SET x = 'from here'", [])
        .unwrap();
    lose_sidecars(&path, false);
    child.send("write");
    assert_eq!(child.next_event("write")["refused"], true);
    assert!(is_refusal(&insert(&here, "refused").unwrap_err()));
    hermes_guard::close(here).map_err(|(_, e)| e).unwrap();
    assert!(child.quit().success());

    let captures = artifacts(dir.path());
    assert_eq!(captures.len(), 2, "{captures:?}");
    let mut kept = BTreeSet::new();
    for capture in &captures {
        let m = manifest(capture);
        let file = m["base_pages"]["file"].as_str().unwrap();
        let base = read_base_pages(&std::fs::read(capture.join(file)).unwrap()).unwrap();
        let page_size = base.page_size as usize;
        for (pgno, page) in &base.pages {
            let at = (*pgno as usize - 1) * page_size;
            assert!(page[..] == before[at..at + page_size], "page {pgno}");
            kept.insert(*pgno);
        }
    }
    let m = manifest(&captures[0]);
    let wal = std::fs::read(captures[0].join(m["wal"]["file"].as_str().unwrap())).unwrap();
    let page_size = u32::from_be_bytes(wal[8..12].try_into().unwrap()) as usize;
    let expected: BTreeSet<u32> = carried_pages(&wal)
        .into_iter()
        .filter(|&p| (p as usize) <= before.len() / page_size)
        .collect();
    assert_eq!(kept, expected);
}
