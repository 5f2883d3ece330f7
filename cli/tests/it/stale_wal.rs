//! A restored database is never rewritten by a stale WAL. A guarded writer process is killed
//! (SIGKILL) with committed frames in its WAL; the database file is then restored in each shape
//! operators use, and the next open through the guard must give exactly the restored rows, pass
//! `integrity_check`, and hold the stale WAL's bytes intact in a capture (reason `stale-wal`) that
//! `verify` accepts and `recover --main` merges.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::{self, artifacts, insert, integrity_ok, open_guarded, sidecar, Gateway};
use hermes_guard::{GuardExt, StaleWalAction};
use rusqlite::Connection;

/// Rows the restored copy holds.
pub const RESTORED: i64 = 5;

pub fn count(conn: &Connection) -> i64 {
    conn.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap()
}

/// A database at `db` with `RESTORED` rows, closed cleanly (no WAL left), and its copy at
/// `backup` (what the operator restores later).
pub fn seed_with_backup(db: &Path, backup: &Path) {
    let conn = open_guarded(db);
    for i in 0..RESTORED {
        insert(&conn, &format!("restored {i}")).unwrap();
    }
    drop(conn);
    assert!(!sidecar(db, "-wal").exists());
    fs::copy(db, backup).unwrap();
}

/// A writer (`vfs`) at `db`: its history (20 rows, checkpointed), 4 rows and `bulk` rows of 400
/// bytes only in the WAL, then SIGKILL. Returns the rows it had committed.
pub fn killed_writer(db: &Path, vfs: &str, bulk: u32) -> i64 {
    let (mut gw, _) = Gateway::start(db, vfs);
    if bulk > 0 {
        gw.send(&format!("bulk {bulk}"));
        gw.next_event("bulk");
    }
    gw.kill();
    RESTORED + 20 + 4 + i64::from(bulk)
}

/// Asserts the open through the guard set the stale WAL aside: exactly `rows` rows,
/// integrity ok, the capture holds `wal` byte for byte with reason `stale-wal`; returns the
/// capture.
#[track_caller]
pub fn assert_set_aside(db: &Path, wal: &[u8], rows: i64) -> PathBuf {
    let conn = open_guarded(db);
    assert_eq!(count(&conn), rows, "exactly the restored rows");
    assert!(integrity_ok(&conn));
    let status = conn.guard_status().unwrap();
    let stale = status
        .stale_wal
        .expect("the status says a stale WAL was set aside");
    assert_eq!(stale.action, StaleWalAction::SetAside);
    let capture = stale.capture_path().unwrap();
    assert!(!status.retired, "the restored database is live");
    drop(conn);
    let m = common::manifest(&capture);
    assert_eq!(m["reason"], "stale-wal");
    assert_eq!(m["trigger"], "open");
    assert_eq!(m["main"]["mode"], "absent");
    assert!(m["stale_wal"]["detail"].as_str().unwrap().contains("page "));
    let name = db.file_name().unwrap().to_str().unwrap();
    common::assert_same_bytes(
        &fs::read(capture.join(format!("{name}-wal"))).unwrap(),
        wal,
        "the stale WAL in the capture",
    );
    assert_eq!(artifacts(db.parent().unwrap()), vec![capture.clone()]);
    capture
}

/// `hermes-guard verify` accepts the capture, `recover` without `--main` and with the restored
/// file as `--main` refuse, and `recover --main <the pre-restore file>` brings the dead
/// generation's rows back into the live database.
#[track_caller]
fn assert_verified_and_recovered(capture: &Path, db: &Path, pre_restore: &Path, rows: i64) {
    let (code, out, err) = common::hermes_guard_cli(&["verify".as_ref(), capture.as_os_str()]);
    assert_eq!(code, 0, "verify: {out}{err}");
    let (code, out, err) =
        common::hermes_guard_cli(&["captures".as_ref(), db.as_os_str(), "--json".as_ref()]);
    assert_eq!(code, 0, "captures: {out}{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = &listed.as_array().unwrap()[0];
    assert_eq!(row["reason"], "stale-wal", "{row}");
    assert_eq!(row["trigger"], "open", "{row}");
    assert_eq!(row["verified"], true, "{row}");
    let (code, _, err) = common::hermes_guard_cli(&[
        "recover".as_ref(),
        capture.as_os_str(),
        "--into".as_ref(),
        db.as_os_str(),
    ]);
    assert_eq!(code, 2, "recover without --main: {err}");
    assert!(err.contains("--main"), "{err}");
    let (code, _, err) = common::hermes_guard_cli(&[
        "recover".as_ref(),
        capture.as_os_str(),
        "--main".as_ref(),
        db.as_os_str(),
        "--into".as_ref(),
        db.as_os_str(),
    ]);
    assert_eq!(code, 2, "recover with the restored file as --main: {err}");
    assert!(err.contains("not the database file"), "{err}");
    let (code, out, err) = common::hermes_guard_cli(&[
        "recover".as_ref(),
        capture.as_os_str(),
        "--main".as_ref(),
        pre_restore.as_os_str(),
        "--into".as_ref(),
        db.as_os_str(),
        "--apply".as_ref(),
    ]);
    assert_eq!(code, 0, "recover: {out}{err}");
    let conn = open_guarded(db);
    assert_eq!(count(&conn), rows, "the dead generation's rows merged back");
    assert!(integrity_ok(&conn));
}

fn setup(name: &str, page_size: u32) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(name);
    common::made_with_page_size(&db, page_size);
    let backup = dir.path().join("backups").join(name);
    fs::create_dir(backup.parent().unwrap()).unwrap();
    seed_with_backup(&db, &backup);
    (dir, db, backup)
}

/// At every page size of `PAGE_SIZES` (as the next three).
#[test]
fn a_copy_over_in_place_is_opened_as_restored_and_the_stale_wal_set_aside() {
    for page_size in common::PAGE_SIZES {
        eprintln!("page size {page_size}");
        copy_over_in_place_is_set_aside(page_size);
    }
}

fn copy_over_in_place_is_set_aside(page_size: u32) {
    let (dir, db, backup) = setup("state.db", page_size);
    let at_death = killed_writer(&db, "guard", 30);
    let wal = fs::read(sidecar(&db, "-wal")).unwrap();
    let pre_restore = dir.path().join("backups").join("pre-restore.db");
    fs::copy(&db, &pre_restore).unwrap();
    let inode = common::identity(&db);
    fs::copy(&backup, &db).unwrap();
    assert_eq!(
        common::identity(&db),
        inode,
        "cp over in place keeps the inode"
    );
    let capture = assert_set_aside(&db, &wal, RESTORED);
    // The dead generation's own changes (its WAL against the file it was written on: 4 + 30
    // rows) come back on top of the restore; the history checkpointed before it does not (the
    // restore removed it on purpose).
    assert_verified_and_recovered(&capture, &db, &pre_restore, at_death - 20);
}

#[test]
fn a_rename_over_is_opened_as_restored_and_the_stale_wal_set_aside() {
    for page_size in common::PAGE_SIZES {
        eprintln!("page size {page_size}");
        rename_over_is_set_aside(page_size);
    }
}

fn rename_over_is_set_aside(page_size: u32) {
    let (_dir, db, backup) = setup("state.db", page_size);
    killed_writer(&db, "guard", 30);
    let wal = fs::read(sidecar(&db, "-wal")).unwrap();
    let staged = sidecar(&db, ".restore-tmp");
    fs::copy(&backup, &staged).unwrap();
    fs::rename(&staged, &db).unwrap();
    assert_set_aside(&db, &wal, RESTORED);
}

#[test]
fn a_raw_copy_taken_while_the_wal_was_live_restored_later_is_not_replayed_onto() {
    for page_size in common::PAGE_SIZES {
        eprintln!("page size {page_size}");
        raw_copy_restored_later_is_not_replayed_onto(page_size);
    }
}

fn raw_copy_restored_later_is_not_replayed_onto(page_size: u32) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    common::made_with_page_size(&db, page_size);
    let conn = open_guarded(&db);
    for i in 0..RESTORED {
        insert(&conn, &format!("restored {i}")).unwrap();
    }
    drop(conn);
    let (mut gw, _) = Gateway::start(&db, "guard");
    // The main file copied raw while the WAL is live: history checkpointed, 4 rows in the WAL.
    let snapshot = dir.path().join("snapshot.db");
    fs::copy(&db, &snapshot).unwrap();
    gw.send("bulk 30");
    gw.next_event("bulk");
    gw.send("checkpoint");
    gw.next_event("checkpoint");
    gw.send("bulk 10");
    gw.next_event("bulk");
    gw.kill();
    let wal = fs::read(sidecar(&db, "-wal")).unwrap();
    fs::copy(&snapshot, &db).unwrap();
    assert_set_aside(&db, &wal, RESTORED + 20);
}

#[test]
fn another_databases_wal_left_beside_this_one_is_not_replayed() {
    for page_size in common::PAGE_SIZES {
        eprintln!("page size {page_size}");
        another_databases_wal_is_not_replayed(page_size);
    }
}

fn another_databases_wal_is_not_replayed(page_size: u32) {
    let (dir, db, _backup) = setup("state.db", page_size);
    let other_dir = dir.path().join("other");
    fs::create_dir(&other_dir).unwrap();
    let other = other_dir.join("state.db");
    killed_writer(&other, "guard", 30);
    let wal = fs::read(sidecar(&other, "-wal")).unwrap();
    fs::rename(sidecar(&other, "-wal"), sidecar(&db, "-wal")).unwrap();
    assert_set_aside(&db, &wal, RESTORED);
}

/// The same restore on the stock VFS: the restore is undone (what the guard prevents).
#[test]
fn on_the_stock_vfs_the_same_restore_is_silently_undone() {
    let (_dir, db, backup) = setup("state.db", 4096);
    let at_death = killed_writer(&db, "guard", 30);
    fs::copy(&backup, &db).unwrap();
    let conn = common::open_stock(&db);
    assert_ne!(count(&conn), RESTORED, "stock SQLite replays the stale WAL");
    assert!(count(&conn) >= at_death - 30);
}

test_alone! {
    fn strict_mode_refuses_the_open_and_moves_nothing() {
        hermes_guard::set_stale_wal_policy(hermes_guard::StaleWalPolicy::Refuse);
        let (_dir, db, backup) = setup("state.db", 4096);
        killed_writer(&db, "guard", 30);
        let wal = fs::read(sidecar(&db, "-wal")).unwrap();
        let shm = fs::read(sidecar(&db, "-shm")).unwrap();
        fs::copy(&backup, &db).unwrap();
        hermes_guard::register().unwrap();
        let conn = Connection::open_with_flags_and_vfs(
            &db,
            rusqlite::OpenFlags::default(),
            hermes_guard::VFS_NAME,
        )
        .unwrap();
        let err = conn
            .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get::<_, i64>(0))
            .unwrap_err();
        assert_eq!(
            err.sqlite_error().map(|e| e.extended_code),
            Some(rusqlite::ffi::SQLITE_CANTOPEN_DIRTYWAL),
            "{err}"
        );
        assert_eq!(conn.classify(&err), hermes_guard::ErrorClass::StaleWal);
        let status = conn.guard_status().unwrap();
        assert_eq!(status.stale_wal.unwrap().action, StaleWalAction::Refused);
        drop(conn);
        assert_eq!(fs::read(sidecar(&db, "-wal")).unwrap(), wal, "nothing moved");
        assert_eq!(fs::read(sidecar(&db, "-shm")).unwrap(), shm, "nothing moved");
        assert!(artifacts(db.parent().unwrap()).is_empty());
    }
}

/// The session store: a store process killed with messages in its WAL, an older copy of the
/// store restored over the file; the next `SessionDb::open` opens it as restored and reports the
/// stale WAL in its status; it does not self-heal from that capture (a restore is the operator's
/// decision).
#[test]
fn the_store_opens_a_restored_database_as_restored_and_reports_it() {
    use hermes_guard_store::{NewMessage, NewSession};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    {
        let store = hermes_guard_store::SessionDb::open(&db).unwrap();
        store
            .create_session(&NewSession::new("st-0", "before"))
            .unwrap();
        for i in 0..5 {
            store
                .append_message("st-0", &NewMessage::new("user", format!("restored {i}")))
                .unwrap();
        }
        assert!(store.close().is_ok());
    }
    let backup = dir.path().join("backup.db");
    fs::copy(&db, &backup).unwrap();
    // Life goes on after the backup (checkpointed at the close), then a writer dies.
    {
        let store = hermes_guard_store::SessionDb::open(&db).unwrap();
        for i in 0..20 {
            store
                .append_message("st-0", &NewMessage::new("user", format!("later {i}")))
                .unwrap();
        }
        assert!(store.close().is_ok());
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args([
            "writer",
            "--role",
            "store",
            "--vfs",
            "guard",
            "--wal-rows",
            "200",
            "--db",
        ])
        .arg(&db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.contains("ready"), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();
    let wal = fs::read(sidecar(&db, "-wal")).unwrap();
    fs::copy(&backup, &db).unwrap();

    let store = hermes_guard_store::SessionDb::open(&db).unwrap();
    assert_eq!(store.get_messages("st-0").unwrap().len(), 5);
    let stale = store.guard_status().unwrap().stale_wal.expect("reported");
    assert_eq!(stale.action, StaleWalAction::SetAside);
    assert!(store.healed().is_empty(), "no self-heal from a stale WAL");
    let capture = stale.capture_path().unwrap();
    assert!(store.close().is_ok());
    common::assert_same_bytes(
        &fs::read(capture.join("state.db-wal")).unwrap(),
        &wal,
        "the store's stale WAL in the capture",
    );
}
