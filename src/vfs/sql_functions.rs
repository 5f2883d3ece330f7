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

use std::ffi::{c_char, c_int, CStr};
use std::ptr;

use rusqlite::{ffi, Connection};

use super::boundary::ffi_guard;

/// `SQLITE_DIRECTONLY` (SQLite 3.30): not from a schema's triggers or views. A literal: the
/// prebuilt bindings of the range's oldest libsqlite3-sys predate the constant.
const DIRECTONLY: c_int = 0x0008_0000;

/// The functions: name, number of arguments (-1: any, checked in the function), body.
type Body = unsafe extern "C" fn(*mut ffi::sqlite3_context, c_int, *mut *mut ffi::sqlite3_value);
const FUNCTIONS: [(&CStr, c_int, Body); 3] = [
    (c"hermes_guard_status", -1, status_fn),
    (c"hermes_guard_capture", -1, capture_fn),
    (c"hermes_guard_retry_pending", 0, retry_pending_fn),
];

/// Registers the functions on `conn` (the auto-extension does it for every connection opened
/// after [`crate::register`]; this is for one opened before, or in a host that loaded the
/// extension into it).
pub fn install(conn: &Connection) -> rusqlite::Result<()> {
    // SAFETY: `conn`'s handle is open and borrowed for the call.
    let rc = unsafe { install_on(conn.handle()) };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    Ok(())
}

/// Registers the functions on `db`: three `sqlite3_create_function_v2` calls with static
/// functions, no allocation of the guard's (every open pays it).
///
/// # Safety
/// `db` is an open connection handle.
unsafe fn install_on(db: *mut ffi::sqlite3) -> c_int {
    for (name, n_arg, body) in FUNCTIONS {
        // SAFETY: `db` is open; the name is NUL-terminated and static; the body is a plain
        // function with no user data, so no destructor.
        let rc = unsafe {
            ffi::sqlite3_create_function_v2(
                db,
                name.as_ptr(),
                n_arg,
                ffi::SQLITE_UTF8 | DIRECTONLY,
                ptr::null_mut(),
                Some(body),
                None,
                None,
                None,
            )
        };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    ffi::SQLITE_OK
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
    // SAFETY: `db` is the connection being opened, valid for this call.
    let rc = unsafe { install_on(db) };
    if rc != ffi::SQLITE_OK {
        log::warn!("hermes-guard: SQL functions not registered on a connection: {rc}");
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn status_fn(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: SQLite's own arguments, passed on.
    unsafe { pragma_fn(ctx, argc, argv, "hermes_guard_status") }
}

unsafe extern "C" fn capture_fn(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: SQLite's own arguments, passed on.
    unsafe { pragma_fn(ctx, argc, argv, "hermes_guard_capture") }
}

unsafe extern "C" fn retry_pending_fn(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    _argv: *mut *mut ffi::sqlite3_value,
) {
    let remaining = ffi_guard(-1, || crate::retry_pending_captures() as i64);
    // SAFETY: `ctx` is the call's context.
    unsafe {
        if remaining < 0 {
            result_error(ctx, "hermes_guard_retry_pending: internal panic");
        } else {
            ffi::sqlite3_result_int64(ctx, remaining);
        }
    }
}

/// `hermes_guard_status([schema])` / `hermes_guard_capture([schema])`: the guard's pragma on the
/// calling connection's schema (default `main`), its JSON the result.
///
/// # Safety
/// SQLite's arguments to a scalar function.
unsafe fn pragma_fn(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
    pragma: &str,
) {
    let schema = match argc {
        0 => Some("main".to_owned()),
        // SAFETY: argc is 1, so argv[0] is a valid value; its text lives until the next call on
        // it, and is copied at once.
        1 => unsafe {
            let text = ffi::sqlite3_value_text(*argv);
            (!text.is_null()).then(|| {
                String::from_utf8_lossy(CStr::from_ptr(text as *const c_char).to_bytes())
                    .into_owned()
            })
        },
        _ => None,
    };
    let Some(schema) = schema else {
        // SAFETY: `ctx` is the call's context.
        unsafe {
            result_error(
                ctx,
                &format!("{pragma}: takes one argument at most, a schema name"),
            )
        };
        return;
    };
    let reply = ffi_guard(Err(format!("{pragma}: internal panic")), || {
        // SAFETY: the connection running this function, used only for nested queries inside
        // the call, as SQLite allows; the Connection made from it does not own it.
        let conn = unsafe { Connection::from_handle(ffi::sqlite3_context_db_handle(ctx)) }
            .map_err(|e| format!("{pragma}: {e}"))?;
        guard_pragma(&conn, &schema, pragma)
    });
    // SAFETY: `ctx` is the call's context; the text is copied (SQLITE_TRANSIENT).
    unsafe {
        match reply {
            Ok(json) => match c_int::try_from(json.len()) {
                Ok(n) => ffi::sqlite3_result_text(
                    ctx,
                    json.as_ptr() as *const c_char,
                    n,
                    ffi::SQLITE_TRANSIENT(),
                ),
                Err(_) => ffi::sqlite3_result_error_toobig(ctx),
            },
            Err(message) => result_error(ctx, &message),
        }
    }
}

/// Sets `message` as the call's error.
///
/// # Safety
/// `ctx` is a scalar function call's context.
unsafe fn result_error(ctx: *mut ffi::sqlite3_context, message: &str) {
    let n = c_int::try_from(message.len()).unwrap_or(c_int::MAX);
    // SAFETY: as the caller promises; SQLite copies the message.
    unsafe { ffi::sqlite3_result_error(ctx, message.as_ptr() as *const c_char, n) };
}

/// Runs the guard's pragma on `schema` of `conn`; its JSON, or the error to give.
fn guard_pragma(conn: &Connection, schema: &str, pragma: &str) -> Result<String, String> {
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
                    [schema],
                    |r| r.get(0),
                )
                .unwrap_or_default();
            let file = if file.is_empty() {
                "in memory or temporary".to_owned()
            } else {
                file
            };
            Err(format!(
                "{pragma}: schema {schema:?} ({file}) is not opened through the hermes-guard VFS; \
                 open it as file:<path>?vfs=hermes-guard once the guard is registered"
            ))
        }
        Err(rusqlite::Error::SqliteFailure(_, Some(message))) => {
            Err(format!("{pragma}: {message}"))
        }
        Err(e) => Err(format!("{pragma}: {e}")),
    }
}
