//! The session store's self-heal through the power-loss filesystem: a store loses its `-wal`
//! (captured, the heal at close declined for a newer generation), and the next open merges the
//! capture back. Cut at every durable step of all of it: `integrity_check` passes, no message is
//! there twice, every acknowledged message is live or in a complete capture the store has not
//! marked healed, and `recover --apply` of the captures then leaves each exactly once.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hermes_guard::recover::{verify_capture, Capture, MergeOptions};
use hermes_guard_lazyfs::harness::{Enumeration, Point};
use rusqlite::{Connection, OpenFlags};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_crash-workload");

fn guarded(db: &Path) -> Connection {
    hermes_guard::register().unwrap();
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME).unwrap()
}

/// The messages' contents of `conn` (none before the schema exists).
fn contents(conn: &Connection) -> Vec<String> {
    let Ok(mut stmt) = conn.prepare("SELECT content FROM messages ORDER BY content") else {
        return Vec::new();
    };
    let rows = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

fn captures(image: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(image)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.contains(".retired-wal-") && !name.ends_with(".partial") && p.is_dir()
        })
        .collect();
    found.sort();
    found
}

/// Whether the store marked the capture `dir` healed (its `state_meta` mark).
fn marked_healed(conn: &Connection, dir: &Path) -> bool {
    let key = format!(
        "hermes-guard.healed:{}",
        dir.file_name().unwrap().to_string_lossy()
    );
    conn.query_row("SELECT 1 FROM state_meta WHERE key = ?1", [key], |_| Ok(()))
        .is_ok()
}

fn check(point: &Point<'_>) {
    let what = format!("{} ({:?}, {:?})", point.label, point.names, point.data);
    let db = point.image.join("state.db");
    let conn = guarded(&db);
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok", "{what}");
    let live = contents(&conn);
    let unique: BTreeSet<&String> = live.iter().collect();
    assert_eq!(
        unique.len(),
        live.len(),
        "{what}: a message twice: {live:?}"
    );
    let mut recoverable: BTreeSet<String> = live.iter().cloned().collect();
    for dir in captures(point.image) {
        let verified = verify_capture(&dir).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            verified.verified(),
            "{what}: {} lies: {:?}",
            dir.display(),
            verified.problems
        );
        let capture = Capture::open(&dir).unwrap();
        let healed = matches!(
            capture.heal(),
            hermes_guard::manifest::HealState::Healed { .. }
        );
        if !healed && !marked_healed(&conn, &dir) {
            recoverable.extend(contents(capture.connection()));
        }
    }
    // Once the cleanup's unlink of the -wal is durable (at once under journaled metadata, or in a
    // reordered state), until the capture's rename is, the messages are in an unlinked file only,
    // which a power cut takes as a kill -9 would (crash_point_guard.rs has the same window).
    if point.durable(|s| s == "unlink state.db-wal")
        && !point.durable(|s| s.starts_with("rename ") && s.contains(".partial -> "))
    {
        return;
    }
    let acked: Vec<String> = point
        .acked
        .iter()
        .filter(|&&id| id > 0)
        .map(|id| format!("message {id}"))
        .collect();
    for message in &acked {
        assert!(
            recoverable.contains(message),
            "{what}: {message} is neither live nor recoverable: {live:?}"
        );
    }
    drop(conn);
    // recover --apply of every capture, to the end: each acknowledged message exactly once.
    for dir in captures(point.image) {
        let capture = Capture::open(&dir).unwrap();
        hermes_guard::recover::apply(&capture, &db, &MergeOptions::default(), &mut |_| {})
            .unwrap_or_else(|e| panic!("{what}: recover --apply {}: {e}", dir.display()));
    }
    let after = contents(&guarded(&db));
    for message in &acked {
        assert_eq!(
            after.iter().filter(|m| *m == message).count(),
            1,
            "{what}: {message} after recover: {after:?}"
        );
    }
}

#[test]
fn crash_point_store_self_heal_keeps_every_message_once() {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    std::fs::create_dir(&template_dir).unwrap();
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &["store-lose-then-open"],
        "state.db",
    )
    .with_faults()
    .with_reboot();
    let counts = runs.each_point(check).unwrap();
    counts.print("store-lose-then-open");
    assert!(counts.points >= 48, "{counts:?}");
}

/// The messages recoverable from an image: live, or in a capture neither healed nor marked.
fn recoverable(point: &Point<'_>) -> Vec<String> {
    let conn = guarded(&point.image.join("state.db"));
    let mut all = contents(&conn);
    for dir in captures(point.image) {
        let capture = Capture::open(&dir).unwrap();
        if !capture.heal().is_healed() && !marked_healed(&conn, &dir) {
            all.extend(contents(capture.connection()));
        }
    }
    all.sort();
    all.dedup();
    all
}

/// The store's self-heal after a cut in the loss's capture, itself cut: the next open
/// (`store-open`, whose self-heal merges the capture) with the power cut before each of its
/// durable steps. Then a second recovery (the store opened again, `recover --apply` of every
/// capture) leaves every message the first cut left recoverable exactly once.
#[test]
fn crash_point_during_the_self_heal_a_second_cut_keeps_every_message_once() {
    let scratch = tempfile::tempdir().unwrap();
    let template_dir = scratch.path().join("template");
    std::fs::create_dir(&template_dir).unwrap();
    let mut runs = Enumeration::new(
        &template_dir,
        scratch.path(),
        Path::new(WORKLOAD),
        &["store-lose"],
        "state.db",
    );
    let states = runs
        .during_recovery(
            "store-open",
            ".partial -> ",
            4,
            recoverable,
            |required, point| {
                let what = point.what();
                let db = point.image.join("state.db");
                drop(
                    hermes_guard_store::SessionDb::open(&db)
                        .unwrap_or_else(|e| panic!("{what}: {e}")),
                );
                for dir in captures(point.image) {
                    let capture = Capture::open(&dir).unwrap();
                    hermes_guard::recover::apply(
                        &capture,
                        &db,
                        &MergeOptions::default(),
                        &mut |_| {},
                    )
                    .unwrap_or_else(|e| panic!("{what}: recover --apply {}: {e}", dir.display()));
                }
                let after = contents(&guarded(&db));
                for message in required {
                    assert_eq!(
                        after.iter().filter(|m| *m == message).count(),
                        1,
                        "{what}: {message} after the second recovery: {after:?}"
                    );
                }
            },
        )
        .unwrap();
    println!("store-lose then store-open: {states} crash states (during recovery)");
    assert!(states >= 20, "{states}");
}
