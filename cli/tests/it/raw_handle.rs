//! The guard without rusqlite's types: the SQL functions every connection opened after `register()`
//! answers, read by column name as an ORM reads them, and the `raw` calls on a `*mut sqlite3` (what
//! sqlx's `as_raw_handle`, diesel's `with_raw_connection` and any rusqlite's `handle()` give),
//! through a real loss.

use hermes_guard::{raw, ErrorClass, GuardStatus, RetireReason};

use crate::common::*;

/// `SELECT hermes_guard_status() AS status`: the JSON by its column's name.
fn status_by_name(conn: &rusqlite::Connection) -> GuardStatus {
    let mut stmt = conn
        .prepare("SELECT hermes_guard_status() AS status")
        .unwrap();
    assert_eq!(stmt.column_name(0).unwrap(), "status");
    let json: String = stmt.query_row([], |r| r.get("status")).unwrap();
    serde_json::from_str(&json).unwrap()
}

#[test]
fn a_connection_opened_after_register_answers_the_status_function_by_column_name() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open_guarded(&dir.path().join("state.db"));
    let status = status_by_name(&conn);
    assert!(!status.retired);
    assert_eq!(status.reason, None);
    let pending: i64 = conn
        .query_row("SELECT hermes_guard_retry_pending()", [], |r| r.get(0))
        .unwrap();
    assert_eq!(pending, 0);
}

#[test]
fn the_status_function_on_a_database_not_opened_through_the_guard_says_how_to_open_it() {
    let dir = tempfile::tempdir().unwrap();
    hermes_guard::register().unwrap();
    let conn = open_stock(&dir.path().join("state.db"));
    let err = conn
        .query_row("SELECT hermes_guard_status()", [], |r| {
            r.get::<_, String>(0)
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not opened through the hermes-guard VFS"),
        "{err}"
    );
    assert!(err.contains("vfs=hermes-guard"), "{err}");
}

#[test]
fn the_functions_are_refused_inside_a_schemas_view() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open_guarded(&dir.path().join("state.db"));
    conn.execute_batch("CREATE VIEW v AS SELECT hermes_guard_capture() AS c")
        .unwrap();
    let err = conn
        .query_row("SELECT c FROM v", [], |r| r.get::<_, String>(0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unsafe use of hermes_guard_capture"), "{err}");
}

#[test]
fn the_raw_calls_on_a_handle_see_the_loss_classify_its_code_and_capture_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    let sentinel = wal_only_sentinel(&conn);
    // SAFETY: the handle is used on this thread only, while `conn` lives, and never closed here.
    let db = unsafe { conn.handle() };
    // SAFETY: `db` is `conn`'s open handle, used on this thread only, while `conn` lives.
    unsafe {
        assert!(!raw::is_retired(db));
        assert!(!raw::status(db).unwrap().retired);
    }
    lose_sidecars(&path, false);
    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&err), "{err}");
    // SAFETY: as above.
    unsafe {
        assert!(raw::is_retired(db), "the refusal set the flag");
        assert_eq!(raw::classify(db, 1032), ErrorClass::WalLost);
        assert_eq!(
            raw::classify(db, 19),
            ErrorClass::Other,
            "a constraint error is the app's"
        );
        let status = raw::ensure_captured(db).unwrap();
        assert_eq!(status.reason, Some(RetireReason::WalLost));
        let capture = status.capture.expect("captured");
        let recovered = recover(&capture, "state.db", &dir.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
    }
    assert_eq!(status_by_name(&conn).reason, Some(RetireReason::WalLost));
    drop(conn);
}

#[test]
fn the_raw_calls_on_a_stock_handle_say_it_is_not_guarded() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open_stock(&dir.path().join("state.db"));
    // SAFETY: the handle is used on this thread only, while `conn` lives, and never closed here.
    let db = unsafe { conn.handle() };
    // SAFETY: `db` is `conn`'s open handle, used on this thread only, while `conn` lives.
    unsafe {
        assert!(!raw::is_retired(db));
        assert!(matches!(
            raw::status(db),
            Err(hermes_guard::GuardError::NotGuarded { .. })
        ));
        assert_eq!(raw::classify(db, 1032), ErrorClass::MainReplaced);
    }
}
