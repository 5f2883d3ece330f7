//! The guard's SQL functions, for every host that reaches SQLite through SQL rather than through
//! rusqlite's types (sqlx, diesel, the loadable extension's hosts): registered on every
//! connection opened after [`crate::register`] (an auto-extension), and on a connection already
//! open with [`install`].
//!
//! - `hermes_guard_status([schema])`: the guard's status of `schema` (default `main`) as JSON,
//!   after the retirement check (`GuardExt::guard_status`'s);
//! - `hermes_guard_capture([schema])`: makes sure a retired generation is captured, then the
//!   status; fails when the capture cannot be written (`GuardExt::ensure_captured`'s);
//! - `hermes_guard_retry_pending()`: retries the captures of closed, still uncaptured generations
//!   and returns how many remain.
//!
//! They stat and write files: callable from top-level SQL only (`SQLITE_DIRECTONLY`), never from
//! a schema's triggers or views. A schema not opened through the guard is an error that says
//! how to open it.

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::{ffi, Connection};

/// Registers the functions on `conn` (the auto-extension does it for every connection opened
/// after [`crate::register`]; this is for one opened before, or in a host that loaded the
/// extension into it).
pub fn install(conn: &Connection) -> rusqlite::Result<()> {
    // A function, not a value: `FunctionFlags` is not `Copy` in the older rusqlite of the range.
    let flags = || FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DIRECTONLY;
    for n_arg in [0, 1] {
        conn.create_scalar_function("hermes_guard_status", n_arg, flags(), |ctx| {
            guard_pragma(ctx, "hermes_guard_status")
        })?;
        conn.create_scalar_function("hermes_guard_capture", n_arg, flags(), |ctx| {
            guard_pragma(ctx, "hermes_guard_capture")
        })?;
    }
    conn.create_scalar_function("hermes_guard_retry_pending", 0, flags(), |_| {
        Ok(crate::retry_pending_captures() as i64)
    })?;
    Ok(())
}

/// Makes SQLite call [`auto_install`] at every connection's open from now on (once per process:
/// [`crate::register`] calls it under its lock). A failure is logged: the guard works without
/// its functions, which then say "no such function".
pub(super) fn install_for_every_connection() {
    let entry: unsafe extern "C" fn(
        *mut ffi::sqlite3,
        *mut *mut c_char,
        *const ffi::sqlite3_api_routines,
    ) -> c_int = auto_install;
    // The binding's parameter type differs (the entry point's signature in a plain build,
    // `fn()` in rusqlite's `loadable_extension` and some older libsqlite3-sys): the target type
    // is inferred from it.
    #[allow(clippy::missing_transmute_annotations, clippy::useless_transmute)]
    // SAFETY: SQLite calls auto-extensions with the entry-point signature `entry` has; a
    // function pointer to a pointer-sized function pointer type; it lives as long as the
    // program.
    let rc = unsafe { ffi::sqlite3_auto_extension(Some(std::mem::transmute(entry))) };
    if rc != ffi::SQLITE_OK {
        log::warn!(
            "hermes-guard: sqlite3_auto_extension returned {rc}: the SQL functions \
             (hermes_guard_status, ...) are not registered on new connections"
        );
    }
}

/// The auto-extension: the functions on the connection being opened. Never fails the open (the
/// database may not even be guarded): a missing function says so when it is asked for.
unsafe extern "C" fn auto_install(
    db: *mut ffi::sqlite3,
    _pz_err_msg: *mut *mut c_char,
    _p_api: *const ffi::sqlite3_api_routines,
) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `db` is the connection being opened, valid for this call; the Connection made
        // from it does not own it (no close at its drop).
        let conn = unsafe { Connection::from_handle(db) }?;
        install(&conn)
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::warn!("hermes-guard: SQL functions not registered on a connection: {e}"),
        Err(_) => log::error!("hermes-guard: internal panic registering the SQL functions"),
    }
    ffi::SQLITE_OK
}

/// Runs the guard's pragma on the calling connection's schema (argument 0, default `main`).
fn guard_pragma(ctx: &Context<'_>, pragma: &str) -> rusqlite::Result<String> {
    let schema: String = if ctx.is_empty() {
        "main".to_owned()
    } else {
        ctx.get(0)?
    };
    // SAFETY: the connection running this function, used only for nested queries inside the
    // call, as SQLite allows.
    let conn = unsafe { ctx.get_connection() }?;
    let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
    let reply = conn.query_row(&format!("PRAGMA {quoted}.{pragma}"), [], |r| {
        r.get::<_, String>(0)
    });
    match reply {
        Ok(json) => Ok(json),
        Err(rusqlite::Error::QueryReturnedNoRows) => {
            // An unknown schema fails the PRAGMA itself; this one exists but is not guarded.
            let file: String = conn
                .query_row(
                    "SELECT file FROM pragma_database_list WHERE name = ?1",
                    [&schema],
                    |r| r.get(0),
                )
                .unwrap_or_default();
            let file = if file.is_empty() {
                "in memory or temporary".to_owned()
            } else {
                file
            };
            Err(user_error(format!(
                "{pragma}: schema {schema:?} ({file}) is not opened through the hermes-guard VFS; \
                 open it as file:<path>?vfs=hermes-guard once the guard is registered"
            )))
        }
        Err(rusqlite::Error::SqliteFailure(_, Some(message))) => {
            Err(user_error(format!("{pragma}: {message}")))
        }
        Err(e) => Err(e),
    }
}

fn user_error(message: String) -> rusqlite::Error {
    rusqlite::Error::UserFunctionError(message.into())
}
