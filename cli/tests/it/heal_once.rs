//! A generation healed into the live file at close is never merged a second time (its capture says
//! so in `healed.json`, which `recover`, `captures`, `verify` and the store read), the lone `-wal`
//! loss is healed too, and a heal killed at any point leaves a file that opens with
//! `integrity_check` ok and every acknowledged row exactly once — live, or back after
//! `hermes-guard recover … --apply`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;
use hermes_guard::manifest::{heal_state, HealPhase, HealRecord, HealState, HEALED_NAME};
use hermes_guard::FileId;

fn sentinels(path: &Path) -> i64 {
    let live = open_guarded(path);
    assert!(integrity_ok(&live));
    count_like(&live, &format!("{SENTINEL_PREFIX}%"))
}

fn only_capture(dir: &Path) -> PathBuf {
    let found = artifacts(dir);
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

fn cli(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    hermes_guard_cli(args)
}

fn recover_apply(capture: &Path, db: &Path, json: bool) -> (i32, String, String) {
    let mut args = vec![
        "recover".as_ref(),
        capture.as_os_str(),
        "--into".as_ref(),
        db.as_os_str(),
        "--apply".as_ref(),
    ];
    if json {
        args.push("--json".as_ref());
    }
    cli(&args)
}

#[test]
fn a_healed_capture_says_so_and_recover_merges_nothing_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    drop(lone_loss(&db, 50, &["-wal", "-shm"]));
    assert_eq!(sentinels(&db), 50, "healed at close");
    let capture = only_capture(dir.path());
    let state = heal_state(&capture, &db).unwrap();
    assert!(
        matches!(&state, HealState::Healed { record, interrupted: false } if record.phase == HealPhase::Done),
        "{state:?}"
    );

    let (code, out, err) = recover_apply(&capture, &db, false);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("healed into the live file at close"), "{out}");
    assert_eq!(sentinels(&db), 50, "50 rows stay 50");
    let (code, out, err) = recover_apply(&capture, &db, true);
    assert_eq!(code, 0, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["inserted"], 0, "{report}");
    assert!(report["healed_at_close"].is_string(), "{report}");
    assert_eq!(sentinels(&db), 50);
}

#[test]
fn captures_and_verify_report_a_healed_capture() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    drop(lone_loss(&db, 10, &["-wal", "-shm"]));
    let capture = only_capture(dir.path());
    let (code, out, err) = cli(&["captures".as_ref(), db.as_os_str(), "--json".as_ref()]);
    assert_eq!(code, 0, "{out}{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["healed"], true, "{rows}");
    assert_eq!(rows[0]["missing"], 0, "{rows}");
    let (code, out, err) = cli(&["verify".as_ref(), capture.as_os_str(), "--json".as_ref()]);
    assert_eq!(code, 0, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["healed"], true, "{doc}");
}

#[test]
fn the_lone_wal_only_loss_is_healed_at_close_and_captured() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let conn = lone_loss(&db, 25, &["-wal"]);
    assert!(
        sidecar(&db, "-shm").exists(),
        "the connection's own -shm stays"
    );
    drop(conn);
    assert_eq!(
        sentinels(&db),
        25,
        "every committed row live after the close"
    );
    let capture = only_capture(dir.path());
    assert!(heal_state(&capture, &db).unwrap().is_healed());
}

/// The staged bytes of [`started_record`]'s heal.
const STAGED: &[u8] = b"the committed prefix, never renamed into place, header and all";

/// A `started` record as the heal writes it before its commit point, for `capture` of `db`,
/// naming `staging` (a file beside the database) as the WAL to be put back, of [`STAGED`]'s
/// length and sha256.
fn started_record(capture: &Path, staging: FileId) -> HealRecord {
    use sha2::Digest;
    let sha: String = sha2::Sha256::digest(STAGED)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let json = serde_json::json!({
        "v": 1, "phase": "started", "at": "2026-12-02T00:00:00Z", "pid": 1, "main": null,
        "frames": 1, "commits": 1,
        "put_back": {"suffix": ".hermes-guard-heal-1", "identity": [staging.dev, staging.ino],
                     "bytes": STAGED.len(), "sha256": sha},
    });
    fs::write(
        capture.join(HEALED_NAME),
        serde_json::to_vec_pretty(&json).unwrap(),
    )
    .unwrap();
    serde_json::from_value(json).unwrap()
}

/// A lone loss whose heal at close is declined (another connection keeps the database open), so
/// its rows are in the capture only.
fn unhealed_loss(db: &Path, rows: usize) -> PathBuf {
    let conn = lone_loss(db, rows, &["-wal", "-shm"]);
    let newer = NewerGenerationOpen::start(db);
    drop(conn);
    drop(newer);
    assert_eq!(sentinels(db), 0, "not healed: a newer generation was open");
    only_capture(db.parent().unwrap())
}

#[test]
fn a_heal_stopped_before_its_commit_point_reads_rolled_back_and_is_merged_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let capture = unhealed_loss(&db, 30);
    let staging = sidecar(&db, "-wal.hermes-guard-heal-1");
    fs::write(&staging, STAGED).unwrap();
    started_record(&capture, identity(&staging));
    assert!(matches!(
        heal_state(&capture, &db).unwrap(),
        HealState::RolledBack { .. }
    ));
    let (code, out, err) = recover_apply(&capture, &db, false);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        sentinels(&db),
        30,
        "merged: the heal never reached the live file"
    );
    let (code, out, err) = recover_apply(&capture, &db, false);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(sentinels(&db), 30, "and only once");
}

#[test]
fn a_heal_stopped_after_its_commit_point_reads_healed_from_the_wal_it_put_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let capture = unhealed_loss(&db, 30);
    // The staging file is gone: it was renamed to <db>-wal (the bytes the record names), which
    // SQLite replays at the next open.
    started_record(&capture, FileId { dev: 1, ino: 1 });
    fs::write(sidecar(&db, "-wal"), STAGED).unwrap();
    let state = heal_state(&capture, &db).unwrap();
    fs::remove_file(sidecar(&db, "-wal")).unwrap();
    assert!(
        matches!(
            state,
            HealState::Healed {
                interrupted: true,
                ..
            }
        ),
        "{state:?}"
    );
}

/// The staging file of a heal stopped before its commit point removed by hand (the
/// runbook no longer calls it harmless): nothing shows the heal reached the live file, so it
/// reads rolled back and `recover` merges the rows, once.
#[test]
fn a_removed_staging_file_reads_rolled_back_and_recover_merges_the_rows_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let capture = unhealed_loss(&db, 50);
    let staging = sidecar(&db, "-wal.hermes-guard-heal-1");
    fs::write(&staging, STAGED).unwrap();
    started_record(&capture, identity(&staging));
    fs::remove_file(&staging).unwrap();
    let state = heal_state(&capture, &db).unwrap();
    assert!(matches!(state, HealState::Undetermined { .. }), "{state:?}");
    for _ in 0..2 {
        let (code, out, err) = recover_apply(&capture, &db, false);
        assert_eq!(code, 0, "{out}{err}");
        assert_eq!(sentinels(&db), 50, "merged, once: {out}");
    }
}

/// A heal whose `done` record was lost after it checkpointed (the record still `started`, the
/// WAL it put back gone from the path): the main file shows every page of its frames.
#[test]
fn a_started_heal_whose_frames_the_main_file_holds_reads_healed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    drop(lone_loss(&db, 40, &["-wal", "-shm"]));
    assert_eq!(sentinels(&db), 40, "healed at close");
    let capture = only_capture(dir.path());
    let path = capture.join(HEALED_NAME);
    let mut record: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    record["phase"] = "started".into();
    fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
    assert!(!sidecar(&db, "-wal").exists());
    let state = heal_state(&capture, &db).unwrap();
    assert!(state.is_healed(), "{state:?}");
    let (code, out, err) = recover_apply(&capture, &db, false);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(sentinels(&db), 40, "nothing merged twice");
}

/// The store's self-heal at open after a heal at close: no message twice.
#[test]
fn the_store_self_heal_after_a_healed_close_duplicates_nothing() {
    use hermes_guard_store::NewMessage;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let store = store_with_checkpointed_history(&db);
    for i in 0..12 {
        store
            .append_message(
                "gw-0",
                &NewMessage::new("user", format!("only in the wal {i}")),
            )
            .unwrap();
    }
    let before = store.get_messages("gw-0").unwrap().len();
    fs::remove_file(sidecar(&db, "-wal")).unwrap();
    fs::remove_file(sidecar(&db, "-shm")).unwrap();
    assert!(store
        .append_message("gw-0", &NewMessage::new("user", "refused"))
        .is_err());
    let _ = store.close();
    assert_eq!(artifacts(dir.path()).len(), 1);
    let store = hermes_guard_store::SessionDb::open(&db).unwrap();
    assert_eq!(
        store.get_messages("gw-0").unwrap().len(),
        before,
        "healed once"
    );
    drop(store);
    let store = hermes_guard_store::SessionDb::open(&db).unwrap();
    assert_eq!(store.get_messages("gw-0").unwrap().len(), before);
}

/// Rows the victim commits into its WAL before the loss.
const VICTIM_ROWS: u32 = 100_000;

/// A gateway at `db` with the victim's rows in its WAL, both sidecars unlinked and the
/// generation captured at the refused write: its close heals.
fn victim(db: &Path) -> Gateway {
    let (mut gw, _) = Gateway::start(db, "guard");
    gw.send(&format!("rows {VICTIM_ROWS}"));
    gw.next_event("rows");
    for suffix in ["-wal", "-shm"] {
        fs::remove_file(sidecar(db, suffix)).unwrap();
    }
    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true, "{refused}");
    assert!(refused["artifact"].is_string(), "captured: {refused}");
    gw
}

#[test]
fn a_heal_killed_at_any_point_leaves_every_row_exactly_once() {
    // How long a close (the heal) takes here, to spread the kills over it and a little past it.
    let span = {
        let dir = tempfile::tempdir().unwrap();
        let mut gw = victim(&dir.path().join("state.db"));
        let started = std::time::Instant::now();
        gw.send("close");
        gw.next_event("closed");
        let span = started.elapsed() * 5 / 4;
        gw.kill();
        span
    };
    let cycles = 50;
    let mut live_after_kill = 0;
    for cycle in 0..cycles {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let mut gw = victim(&db);
        gw.send("close");
        std::thread::sleep(span * cycle / cycles);
        gw.kill();
        // The gateway's 20 rows of history are checkpointed; its 4 rows and the victim's are
        // the lost generation.
        let expected = 20 + 4 + i64::from(VICTIM_ROWS);
        let conn = open_guarded(&db);
        assert!(integrity_ok(&conn), "cycle {cycle}");
        let rows = count_like(&conn, "%");
        drop(conn);
        assert!(
            rows == expected || rows == 20,
            "cycle {cycle}: {rows} rows: all of the generation or none of it"
        );
        live_after_kill += i64::from(rows == expected);
        let capture = only_capture(dir.path());
        let (code, out, err) = recover_apply(&capture, &db, false);
        assert_eq!(code, 0, "cycle {cycle}: {out}{err}");
        let conn = open_guarded(&db);
        assert!(integrity_ok(&conn), "cycle {cycle}");
        assert_eq!(
            count_like(&conn, "%"),
            expected,
            "cycle {cycle}: exactly once"
        );
    }
    eprintln!(
        "{cycles} kills over {span:?}: {live_after_kill} left the rows live, the rest were merged \
         by recover"
    );
}
