//! Found by tests/explore: one WAL generation captured twice — by a peer refused at a write
//! (`halt`) and by the writer that held it, whose close healed it back into the live file
//! (`healed.json` in its own capture only) — is merged zero times: `recover --apply` of the peer's
//! capture finds the other capture's heal, merges nothing and says so, in either order, and
//! `captures` counts nothing missing. A capture that reaches further than the heal merges only what
//! its later commits did.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;
use hermes_guard::manifest::{heal_state, HealState, HEALED_NAME};

fn rows(db: &Path) -> i64 {
    let live = open_guarded(db);
    assert!(integrity_ok(&live));
    live.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap()
}

fn distinct(db: &Path) -> i64 {
    let live = open_guarded(db);
    live.query_row(
        "SELECT COUNT(*) FROM (SELECT DISTINCT session, content FROM messages)",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

fn apply_json(capture: &Path, db: &Path) -> serde_json::Value {
    let (code, out, err) = hermes_guard_cli(&[
        "recover".as_ref(),
        capture.as_os_str(),
        "--into".as_ref(),
        db.as_os_str(),
        "--apply".as_ref(),
        "--json".as_ref(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

/// A gateway process commits 20 rows of checkpointed history and 4 rows only in its WAL; this
/// process opens the database as its peer; the gateway begins a transaction (the WAL write lock
/// taken); the `-wal` is renamed away; the peer's write is refused and captures the generation
/// (`halt`: 4 commits), and the peer closes; the gateway commits — refused at its frame, not
/// acknowledged: its lock was taken before the loss, its frame after it — and closes, alone,
/// and heals the generation into the live file. Its close finds the peer's capture of the same
/// bytes, which lacks the base of the pages the gateway wrote first (the peer wrote nothing:
/// `<file>-base`), so it writes its own, and heals: two captures of one generation, the heal
/// record in the gateway's. Returns the peer's.
fn peer_capture_and_healed_close(db: &Path) -> PathBuf {
    let (mut gateway, _) = Gateway::start(db, "guard");
    let peer = open_guarded(db);
    let seen: i64 = peer
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 24, "the peer reads the gateway's WAL");
    gateway.send("begin");
    let begun = gateway.next_event("begin");
    assert!(begun["error"].is_null(), "{begun}");
    fs::rename(sidecar(db, "-wal"), sidecar(db, "-wal.moved")).unwrap();
    assert!(is_refusal(&insert(&peer, "refused").unwrap_err()));
    let halt = peer
        .guard_status()
        .unwrap()
        .capture
        .expect("captured at the refusal");
    hermes_guard::close(peer).map_err(|(_, e)| e).unwrap();
    gateway.send("commit");
    let committed = gateway.next_event("commit");
    assert!(
        committed["error"]
            .as_str()
            .is_some_and(|e| e.contains("readonly")),
        "a commit whose -wal was renamed away is refused at its frame: {committed}"
    );
    gateway.send("close");
    let closed = gateway.next_event("closed");
    assert!(closed["error"].is_null(), "{closed}");
    assert!(gateway.quit().success());
    let found = artifacts(db.parent().unwrap());
    assert_eq!(found.len(), 2, "the peer's and the gateway's: {found:?}");
    assert!(found.contains(&halt), "{found:?}");
    let gateways = found.iter().find(|f| **f != halt).unwrap();
    assert!(
        heal_state(gateways, db).unwrap().is_healed(),
        "healed at close, recorded in the gateway's capture"
    );
    assert_eq!(rows(db), 24, "every acknowledged row live after the heal");
    halt
}

#[test]
fn a_peers_capture_healed_at_the_gateways_close_merges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let capture = peer_capture_and_healed_close(&db);
    let (code, out, err) =
        hermes_guard_cli(&["captures".as_ref(), db.as_os_str(), "--json".as_ref()]);
    assert_eq!(code, 0, "nothing missing: {out}{err}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert!(listed.iter().all(|c| c["missing"] == 0), "{out}");
    let report = apply_json(&capture, &db);
    assert_eq!(report["inserted"], 0, "{report}");
    assert_eq!(rows(&db), 24, "each row once");
    assert_eq!(distinct(&db), 24);
}

/// The other way round: the healed capture holds fewer frames than the peer's. Made from real
/// files: a capture whose close was not healed (another process had the database open) holds 6
/// commits; a copy of it cut at its 2nd commit, recorded as healed into the live file, stands
/// for the heal, and the 2 rows it put back are made live under their own rowids. `recover
/// --apply` of the full capture merges the 4 later rows only, once.
#[test]
fn a_capture_reaching_further_than_the_heal_merges_only_the_later_commits() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let conn = lone_loss(&db, 6, &["-wal", "-shm"]);
    let newer = NewerGenerationOpen::start(&db);
    drop(conn);
    drop(newer);
    let found = artifacts(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    let full = found[0].clone();
    assert_eq!(heal_state(&full, &db).unwrap(), HealState::NotHealed);
    assert_eq!(
        count_like(&open_guarded(&db), &format!("{SENTINEL_PREFIX}%")),
        0
    );

    // The "healed" copy: the same generation cut after its 2nd commit (one frame per commit).
    let m = manifest(&full);
    let page = m["wal"]["header"]["page_size"].as_u64().unwrap();
    let cut = dir
        .path()
        .join(format!("{}-1", full.file_name().unwrap().to_string_lossy()));
    fs::create_dir(&cut).unwrap();
    fs::copy(full.join("state.db"), cut.join("state.db")).unwrap();
    let wal = fs::read(full.join("state.db-wal")).unwrap();
    let cut_wal = &wal[..(32 + 2 * (24 + page)) as usize];
    fs::write(cut.join("state.db-wal"), cut_wal).unwrap();
    let mut cut_manifest = m.clone();
    {
        use sha2::Digest;
        let w = &mut cut_manifest["wal"];
        w["bytes"] = cut_wal.len().into();
        w["sha256"] = sha2::Sha256::digest(cut_wal)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into();
        (w["frames"], w["commits"], w["last_commit_frame"]) = (2.into(), 2.into(), 2.into());
    }
    fs::write(cut.join("manifest.json"), cut_manifest.to_string()).unwrap();
    let live_id = identity(&db);
    let record = serde_json::json!({
        "v": 1, "phase": "done", "at": "2026-12-03T00:00:00Z", "pid": 1,
        "main": [live_id.dev, live_id.ino], "frames": 2, "commits": 2, "put_back": null,
    });
    fs::write(cut.join(HEALED_NAME), record.to_string()).unwrap();
    assert!(heal_state(&cut, &db).unwrap().is_healed());
    // What that heal put back: the first 2 rows under their own rowids.
    let work = dir.path().join("cut-open");
    let copy = recover(&cut, "state.db", &work);
    let two: Vec<(i64, String)> = copy
        .prepare("SELECT id, content FROM messages WHERE content LIKE ?1 ORDER BY id")
        .unwrap()
        .query_map([format!("{SENTINEL_PREFIX}%")], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(two.len(), 2);
    let live = open_guarded(&db);
    for (id, content) in &two {
        live.execute(
            "INSERT INTO messages (id, session, content) VALUES (?1, NULL, ?2)",
            rusqlite::params![id, content],
        )
        .unwrap();
    }
    drop(live);

    let report = apply_json(&full, &db);
    assert_eq!(report["inserted"], 4, "{report}");
    assert_eq!(report["delta_from_frame"], 2, "{report}");
    assert_eq!(report["healed_by"].as_str(), Some(&*cut.to_string_lossy()));
    let report = apply_json(&full, &db);
    assert_eq!(report["inserted"], 0, "the ledger: once ({report})");
    let report = apply_json(&cut, &db);
    assert_eq!(report["inserted"], 0, "{report}");
    let live = open_guarded(&db);
    assert_eq!(count_like(&live, &format!("{SENTINEL_PREFIX}%")), 6);
    let distinct: i64 = live
        .query_row(
            "SELECT COUNT(DISTINCT content) FROM messages WHERE content LIKE ?1",
            [format!("{SENTINEL_PREFIX}%")],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(distinct, 6);
}
