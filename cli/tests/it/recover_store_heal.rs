//! The session store heals itself: the retired generation of a lost -wal/-shm is merged back at
//! the next open (threads, processes), once; a restore's capture is not; the option turns it off.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};

use common::*;
use hermes_guard_store::{NewMessage, NewSession, SessionDb, StoreError, StoreOptions};

fn no_heal() -> StoreOptions {
    StoreOptions {
        self_heal: false,
        ..StoreOptions::default()
    }
}

/// History checkpointed; then, only in the WAL: 3 messages of gw-0, a new session with 2
/// messages (one with tool calls). The sidecars are lost; the next write is refused and
/// captured. Then a newer generation (not healing) appends 5 messages to gw-0, reusing rowids.
fn lose_a_generation(path: &Path) -> PathBuf {
    let db = store_with_checkpointed_history(path);
    for i in 0..3 {
        db.append_message("gw-0", &NewMessage::new("user", format!("retired {i}")))
            .unwrap();
    }
    db.create_session(&NewSession::new("wal-only", "gateway"))
        .unwrap();
    db.append_message(
        "wal-only",
        &NewMessage::new("user", "a platypus in the retired WAL"),
    )
    .unwrap();
    let mut with_tools = NewMessage::new("assistant", "calling");
    with_tools.tool_calls = Some(serde_json::json!([{"name": "a"}, {"name": "b"}]));
    db.append_message("wal-only", &with_tools).unwrap();
    lose_sidecars(path, false);
    let err = db
        .append_message("gw-0", &NewMessage::new("user", "refused"))
        .unwrap_err();
    let StoreError::WalLost {
        capture: Some(capture),
        ..
    } = err
    else {
        panic!("{err:?}")
    };
    // The restarted application is up before the old store closes: no heal at close.
    let restarted = NewerGenerationOpen::start(path);
    db.close().unwrap();
    drop(restarted);

    let newer = SessionDb::open_with(path, no_heal()).unwrap();
    assert!(newer.healed().is_empty());
    for i in 0..5 {
        newer
            .append_message("gw-0", &NewMessage::new("user", format!("newer {i}")))
            .unwrap();
    }
    newer.close().unwrap();
    capture
}

fn assert_whole(path: &Path) {
    let db = SessionDb::open(path).unwrap();
    assert!(db.healed().is_empty(), "healed once, not again");
    let gw = db.get_messages("gw-0").unwrap();
    assert_eq!(gw.len(), 20 + 3 + 5);
    assert_eq!(db.get_session("gw-0").unwrap().unwrap().message_count, 28);
    let wal_only = db.get_session("wal-only").unwrap().unwrap();
    assert_eq!(wal_only.message_count, 2);
    assert_eq!(wal_only.tool_call_count, 2);
    assert_eq!(db.get_messages("wal-only").unwrap().len(), 2);
    let hits = db.search_messages("platypus", 10).unwrap();
    assert_eq!(hits.len(), 1, "full-text search finds the merged message");
    assert_eq!(hits[0].session_id, "wal-only");
    db.close().unwrap();
    assert!(integrity_ok(&rusqlite::Connection::open(path).unwrap()));
}

#[test]
fn threads_opening_at_once_merge_the_lost_generation_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let capture = lose_a_generation(&path);

    const THREADS: usize = 6;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let db = SessionDb::open(&path).unwrap();
                let healed = db.healed().to_vec();
                db.close().unwrap();
                healed
            })
        })
        .collect();
    let healed: Vec<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(healed.len(), 1, "one thread merged it: {healed:?}");
    assert_eq!(healed[0].capture, capture);
    assert_eq!(healed[0].sessions, 1);
    assert_eq!(healed[0].messages, 5);
    assert_eq!(healed[0].left_over, 0);
    assert_whole(&path);
}

#[test]
fn the_mark_is_not_needed_for_idempotency() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    lose_a_generation(&path);
    let db = SessionDb::open(&path).unwrap();
    assert_eq!(db.healed().len(), 1);
    db.close().unwrap();
    // Remove the mark: the next open merges again, and adds nothing.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "DELETE FROM state_meta WHERE key LIKE ?1",
            [format!("{}%", hermes_guard_store::HEALED_MARK_PREFIX)],
        )
        .unwrap();
    let db = SessionDb::open(&path).unwrap();
    assert_eq!(db.healed().len(), 1);
    assert_eq!(db.healed()[0].rows, 0);
    db.close().unwrap();
    assert_whole(&path);
}

#[test]
#[ignore = "child process body of two_processes_opening_at_once_merge_the_lost_generation_once"]
fn heal_child() {
    // Run by the two-process test below, never on its own.
    let Ok(path) = std::env::var("HERMES_GUARD_HEAL_CHILD_DB") else {
        return;
    };
    let db = SessionDb::open(&path).unwrap();
    let rows: u64 = db.healed().iter().map(|h| h.rows).sum();
    println!("HEALED_ROWS={rows}");
    db.close().unwrap();
}

#[test]
fn two_processes_opening_at_once_merge_the_lost_generation_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    lose_a_generation(&path);
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "recover_store_heal::heal_child",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("HERMES_GUARD_HEAL_CHILD_DB", &path)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut rows = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let n: u64 = text
            .split("HEALED_ROWS=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("{text}"))
            .parse()
            .unwrap();
        rows.push(n);
    }
    rows.sort();
    assert_eq!(
        rows,
        vec![0, 6],
        "one process merged 1 session + 5 messages"
    );
    assert_whole(&path);
}

#[test]
fn a_restore_is_never_healed_but_recover_merges_it_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let db = store_with_checkpointed_history(&path);
    db.append_message("gw-0", &NewMessage::new("user", "before the restore"))
        .unwrap();
    db.try_wal_checkpoint().unwrap();
    replace_main_file(&path);
    let err = db
        .append_message("gw-0", &NewMessage::new("user", "refused"))
        .unwrap_err();
    assert!(matches!(err, StoreError::MainReplaced { .. }), "{err:?}");
    let capture = db
        .close()
        .map_err(|(_, e)| e)
        .unwrap()
        .capture
        .expect("a restore is captured");
    // The "restored" file lost a message: write something so the capture has rows it lacks.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "DELETE FROM messages WHERE content = 'before the restore'",
        [],
    )
    .unwrap();
    drop(raw);

    let db = SessionDb::open(&path).unwrap();
    assert!(
        db.healed().is_empty(),
        "a restore is an operator's decision"
    );
    assert_eq!(db.get_messages("gw-0").unwrap().len(), 20);
    db.close().unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .arg("recover")
        .arg(&capture)
        .arg("--into")
        .arg(&path)
        .arg("--apply")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("merged 1 row(s)"), "{text}");
    let db = SessionDb::open(&path).unwrap();
    assert_eq!(db.get_messages("gw-0").unwrap().len(), 21);
    db.close().unwrap();
}

#[test]
fn self_healing_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    lose_a_generation(&path);
    let db = SessionDb::open_with(&path, no_heal()).unwrap();
    assert!(db.healed().is_empty());
    assert!(db.get_session("wal-only").unwrap().is_none());
    db.close().unwrap();
    let db = SessionDb::open(&path).unwrap();
    assert_eq!(db.healed().len(), 1);
    db.close().unwrap();
    assert_whole(&path);
}

#[test]
fn the_registry_heals_at_acquire() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    lose_a_generation(&path);
    let registry = hermes_guard_store::Registry::new();
    let db = registry.acquire(&path).unwrap();
    assert_eq!(db.healed().len(), 1);
    assert_eq!(db.get_messages("wal-only").unwrap().len(), 2);
    drop(db);
    registry.close_all();
    assert_whole(&path);
}
