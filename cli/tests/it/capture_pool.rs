//! One loss under a pool of connections in one process is captured once: every connection that
//! retired the generation references the same capture.

use crate::common;

use std::sync::{Arc, Barrier};

use common::*;

const POOL: usize = 24;

#[test]
fn a_pool_of_24_connections_takes_one_capture_of_one_lost_generation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let first = open_guarded(&path);
    let sentinel = wal_only_sentinel(&first);
    let mut pool = vec![first];
    for _ in 1..POOL {
        let conn = open_guarded(&path);
        assert_eq!(count_like(&conn, &sentinel), 1);
        pool.push(conn);
    }
    lose_sidecars(&path, false);

    // Every connection writes at once, on its own thread: each is refused.
    let start = Arc::new(Barrier::new(POOL));
    let threads: Vec<_> = pool
        .into_iter()
        .enumerate()
        .map(|(i, conn)| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let err = insert(&conn, &format!("after the loss {i}")).unwrap_err();
                assert!(
                    is_refusal(&err),
                    "connection {i}: expected a refusal, got {err}"
                );
                conn
            })
        })
        .collect();
    let pool: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    let captures = artifacts(dir.path());
    assert_eq!(
        captures.len(),
        1,
        "one capture, not one per connection: {captures:?}"
    );
    for conn in pool {
        let status = conn.guard_status().unwrap();
        assert!(status.retired);
        assert_eq!(status.capture.as_ref(), Some(&captures[0]));
        hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    }
    assert_eq!(
        artifacts(dir.path()),
        captures,
        "no capture at close either"
    );
    let recovered = recover(&captures[0], "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, &sentinel), 1);
}

#[test]
fn connections_that_retire_one_generation_in_turn_share_its_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = open_guarded(&path);
    wal_only_sentinel(&a);
    let b = open_guarded(&path);
    lose_sidecars(&path, true);

    assert!(is_refusal(&insert(&a, "a after the loss").unwrap_err()));
    let first = a.guard_status().unwrap().capture.expect("captured");
    assert!(is_refusal(&insert(&b, "b after the loss").unwrap_err()));
    assert_eq!(b.guard_status().unwrap().capture, Some(first.clone()));
    hermes_guard::close(b).map_err(|(_, e)| e).unwrap();
    hermes_guard::close(a).map_err(|(_, e)| e).unwrap();
    assert_eq!(artifacts(dir.path()), vec![first]);
}

#[test]
fn two_databases_lost_at_once_get_a_capture_each() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.db");
    let two = dir.path().join("two.db");
    let a = open_guarded(&one);
    let b = open_guarded(&two);
    wal_only_sentinel(&a);
    wal_only_sentinel(&b);
    lose_sidecars(&one, false);
    lose_sidecars(&two, false);
    assert!(is_refusal(&insert(&a, "after").unwrap_err()));
    assert!(is_refusal(&insert(&b, "after").unwrap_err()));
    let ca = a.guard_status().unwrap().capture.expect("one captured");
    let cb = b.guard_status().unwrap().capture.expect("two captured");
    assert_ne!(ca, cb);
    assert_eq!(artifacts(dir.path()).len(), 2);
}

#[test]
fn a_second_process_retiring_the_same_generation_reuses_the_first_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&path, "guard");
    let here = open_guarded(&path);
    assert_eq!(count_like(&here, "uncheckpointed %"), 4);
    lose_sidecars(&path, false);

    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true);
    let first = std::path::PathBuf::from(refused["artifact"].as_str().expect("captured"));

    let err = insert(&here, "here after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    let status = here.guard_status().unwrap();
    assert_eq!(
        status.capture.as_ref(),
        Some(&first),
        "the same bytes are not captured twice"
    );
    assert_eq!(artifacts(dir.path()), vec![first.clone()]);

    hermes_guard::close(here).map_err(|(_, e)| e).unwrap();
    gw.send("close");
    assert_eq!(gw.next_event("closed")["error"], serde_json::Value::Null);
    assert!(gw.quit().success());
    assert_eq!(artifacts(dir.path()), vec![first]);
}

#[test]
fn a_second_process_whose_retired_wal_grew_since_captures_it_again() {
    // The first capture holds fewer bytes than the WAL the second process retires with: that is
    // not the same capture, and the second one writes its own, with the later commit in it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&path, "guard");
    let here = open_guarded(&path);
    let stock = open_stock(&path);
    lose_sidecars(&path, false);

    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true);
    let first = std::path::PathBuf::from(refused["artifact"].as_str().expect("captured"));
    // Unguarded, the stock connection commits into the retired WAL after that capture.
    insert(&stock, "stock after the first capture").unwrap();

    assert!(is_refusal(
        &insert(&here, "here after the loss").unwrap_err()
    ));
    let second = here.guard_status().unwrap().capture.expect("captured");
    assert_ne!(second, first);
    let recovered = recover(&second, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, "stock after the first capture"), 1);

    drop(stock);
    hermes_guard::close(here).map_err(|(_, e)| e).unwrap();
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());
}

#[test]
fn a_retired_wal_rewritten_in_place_at_the_same_size_is_captured_again() {
    // A peer still attached to the retired generation checkpoints it, restarts the WAL and
    // commits again: the WAL keeps its size but holds other bytes. The first capture is not a
    // capture of those bytes, so the next connection to retire the generation writes its own.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = open_guarded(&path);
    wal_only_sentinel(&a);
    let b = open_guarded(&path);
    let stock = open_stock(&path);
    lose_sidecars(&path, false);

    assert!(is_refusal(&insert(&a, "a after the loss").unwrap_err()));
    let first = a.guard_status().unwrap().capture.expect("captured");
    let wal = descriptor_of_retired_wal(&a);
    let size_at_first = std::fs::metadata(&wal).unwrap().len();

    stock
        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .unwrap();
    insert(&stock, "stock after the restart").unwrap();
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        size_at_first,
        "the restarted WAL is rewritten in place, at the same size"
    );

    assert!(is_refusal(&insert(&b, "b after the loss").unwrap_err()));
    let second = b.guard_status().unwrap().capture.expect("captured");
    assert_ne!(second, first, "other bytes, another capture");
    let recovered = recover(&second, "state.db", &dir.path().join("recovered"));
    assert_eq!(count_like(&recovered, "stock after the restart"), 1);
    drop(stock);
    hermes_guard::close(b).map_err(|(_, e)| e).unwrap();
    hermes_guard::close(a).map_err(|(_, e)| e).unwrap();
}

/// `/proc/self/fd/N` of the retired WAL `conn` pinned, to read its size after its name is gone.
fn descriptor_of_retired_wal(conn: &rusqlite::Connection) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let id = conn.guard_status().unwrap().wal.expect("a pinned WAL");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.dev() == id.dev && m.ino() == id.ino))
        .expect("a descriptor of the retired WAL")
}
