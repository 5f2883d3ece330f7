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
//!
//! Their C side (the registration, the calls' context and arguments) is `methods.rs`'s.

use rusqlite::{ffi, Connection};

use super::boundary::ffi_guard;
use super::methods::{install_functions, SqlCall, SqlFunction, SqlFunctions};

/// The functions, as the auto-extension registers them.
pub(super) struct Guard;

impl SqlFunctions for Guard {
    const LIST: &'static [SqlFunction] = &[
        SqlFunction {
            name: c"hermes_guard_status",
            n_arg: -1,
            body: |call| pragma_fn(call, "hermes_guard_status"),
        },
        SqlFunction {
            name: c"hermes_guard_capture",
            n_arg: -1,
            body: |call| pragma_fn(call, "hermes_guard_capture"),
        },
        SqlFunction {
            name: c"hermes_guard_retry_pending",
            n_arg: 0,
            body: retry_pending,
        },
    ];
}

/// Makes every connection opened from now on get the functions (once per process: see
/// `methods::install_for_every_connection`).
pub(super) fn install_for_every_connection() {
    super::methods::install_for_every_connection::<Guard>();
}

/// Registers the functions on `conn` (the auto-extension does it for every connection opened
/// after [`crate::register`]; this is for one opened before, or in a host that loaded the
/// extension into it).
pub fn install(conn: &Connection) -> rusqlite::Result<()> {
    let rc = install_functions(conn, Guard::LIST);
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    Ok(())
}

/// `hermes_guard_retry_pending()`: how many closed generations are still uncaptured after the
/// retry.
fn retry_pending(call: &SqlCall<'_>) {
    let remaining = ffi_guard(-1, || crate::retry_pending_captures() as i64);
    if remaining < 0 {
        call.result_error("hermes_guard_retry_pending: internal panic");
    } else {
        call.result_int64(remaining);
    }
}

/// `hermes_guard_status([schema])` / `hermes_guard_capture([schema])`: the guard's pragma on the
/// calling connection's schema (default `main`), its JSON the result.
fn pragma_fn(call: &SqlCall<'_>, pragma: &'static str) {
    let schema = match call.argc() {
        0 => Some("main".to_owned()),
        1 => call.text_arg(0),
        _ => None,
    };
    let Some(schema) = schema else {
        call.result_error(&format!(
            "{pragma}: takes one argument at most, a schema name"
        ));
        return;
    };
    let reply = ffi_guard(Err(PragmaFnError::Panic { pragma }), || {
        call.with_connection(|conn| match conn {
            Ok(conn) => guard_pragma(conn, &schema, pragma),
            Err(source) => Err(PragmaFnError::Query { pragma, source }),
        })
    });
    match reply {
        Ok(json) => call.result_text(&json),
        Err(e) => call.result_error(&e.to_string()),
    }
}

/// Why a pragma function gives no JSON: its error's text, as the caller's SQL sees it.
#[derive(Debug, thiserror::Error)]
enum PragmaFnError {
    /// The schema exists but was not opened through the guard.
    #[error(
        "{pragma}: schema {schema:?} ({file}) is not opened through the hermes-guard VFS; open it \
         as file:<path>?vfs=hermes-guard once the guard is registered"
    )]
    NotGuarded {
        pragma: &'static str,
        schema: String,
        /// The schema's file, or "in memory or temporary".
        file: String,
    },
    /// The pragma failed with SQLite's message.
    #[error("{pragma}: {message}")]
    Sqlite {
        pragma: &'static str,
        message: String,
    },
    /// The pragma (or the connection's handle) failed otherwise.
    #[error("{pragma}: {source}")]
    Query {
        pragma: &'static str,
        source: rusqlite::Error,
    },
    /// A panic inside the guard, caught.
    #[error("{pragma}: internal panic")]
    Panic { pragma: &'static str },
}

/// Runs the guard's pragma on `schema` of `conn`; its JSON, or the error to give.
fn guard_pragma(
    conn: &Connection,
    schema: &str,
    pragma: &'static str,
) -> Result<String, PragmaFnError> {
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
            Err(PragmaFnError::NotGuarded {
                pragma,
                schema: schema.to_owned(),
                file,
            })
        }
        Err(rusqlite::Error::SqliteFailure(_, Some(message))) => {
            Err(PragmaFnError::Sqlite { pragma, message })
        }
        Err(source) => Err(PragmaFnError::Query { pragma, source }),
    }
}
