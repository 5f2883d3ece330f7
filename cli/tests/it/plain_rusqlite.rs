//! A plain rusqlite program, no store code: turn the guard on with a URI and get a refusal and a
//! capture instead of a silent loss.

use hermes_guard::GuardExt;
use rusqlite::{Connection, OpenFlags};

#[test]
fn a_uri_opened_connection_is_guarded_end_to_end() {
    hermes_guard::register().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let uri = format!("file:{}?vfs=hermes-guard", db.display());
    let conn = Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch(
        "PRAGMA wal_autocheckpoint=0;
         CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT);
         INSERT INTO kv VALUES ('answer', '42');",
    )
    .unwrap();
    assert!(!conn.guard_status().unwrap().retired);

    std::fs::remove_file(dir.path().join("app.db-wal")).unwrap();
    let err = conn
        .execute("INSERT INTO kv VALUES ('lost', 'never')", [])
        .unwrap_err();
    assert_eq!(
        err.sqlite_error().map(|e| e.extended_code),
        Some(rusqlite::ffi::SQLITE_READONLY_DBMOVED)
    );
    assert_eq!(conn.classify(&err), hermes_guard::ErrorClass::WalLost);
    // Reads of what the connection already sees go on working.
    let v: String = conn
        .query_row("SELECT v FROM kv WHERE k = 'answer'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, "42");

    let artifact = conn.guard_status().unwrap().capture.unwrap();
    drop(conn);
    let work = dir.path().join("recovered");
    std::fs::create_dir(&work).unwrap();
    std::fs::copy(artifact.join("app.db"), work.join("app.db")).unwrap();
    std::fs::copy(artifact.join("app.db-wal"), work.join("app.db-wal")).unwrap();
    let recovered = Connection::open(work.join("app.db")).unwrap();
    let v: String = recovered
        .query_row("SELECT v FROM kv WHERE k = 'answer'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, "42");
}

#[test]
fn status_of_an_unguarded_connection_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open(dir.path().join("plain.db")).unwrap();
    let err = conn.guard_status().unwrap_err();
    assert!(
        matches!(err, hermes_guard::GuardError::NotGuarded { .. }),
        "{err}"
    );
    assert!(err
        .to_string()
        .contains("not opened through the hermes-guard VFS"));
}

#[test]
fn register_is_idempotent_and_thread_safe() {
    let threads: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(hermes_guard::register))
        .collect();
    for t in threads {
        t.join().unwrap().unwrap();
    }
    hermes_guard::register().unwrap();
}

/// The SQLite this test binary runs on (shown with `--nocapture`). tests/system-sqlite.sh sets
/// `HERMES_GUARD_EXPECT_SQLITE` for its build without `bundled`, which must not quietly test the
/// bundled SQLite.
#[test]
fn runs_on_the_expected_sqlite() {
    let version = rusqlite::version();
    println!("SQLite {version}");
    if let Ok(expected) = std::env::var("HERMES_GUARD_EXPECT_SQLITE") {
        assert_eq!(version, expected, "this run was meant for another SQLite");
    }
}
