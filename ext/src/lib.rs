//! hermes-guard as a SQLite loadable extension: `libhermes_guard.so`, for the sqlite3 shell,
//! Python (the standard library's `sqlite3` or apsw) and every other host that links SQLite 3.34.0
//! or newer and can load extensions.
//!
//! Loading it registers the `hermes-guard` VFS over the host's default VFS, for the life of the
//! process, and adds three SQL functions to every connection opened afterwards (and to the one
//! that loaded it):
//!
//! - `hermes_guard_status([schema])`: the guard's status of `schema` (default `main`) as JSON;
//! - `hermes_guard_capture([schema])`: makes sure a retired generation is captured, then the
//!   status; fails when the capture cannot be written;
//! - `hermes_guard_retry_pending()`: retries the captures of closed, still uncaptured generations
//!   and returns how many remain.
//!
//! Entry points: `sqlite3_hermesguard_init` (the one SQLite derives from the file name) makes the
//! guard the default VFS only when `HERMES_GUARD_DEFAULT=1`; `sqlite3_hermesguard_default_init`
//! always does.
//!
//! This crate has no shim of its own: it depends on the library (`hermes-guard`, without `bundled`)
//! and chooses rusqlite's `loadable_extension`, which sends every `ffi::sqlite3_*` call — the
//! library's included — through the host's `sqlite3_api_routines`. It uses the library's public
//! API only (`register`, `register_as_default`, `sql_functions::install`): the functions are the
//! library's, which its registration installs on every connection opened afterwards.

mod events;
mod host_api;
mod version;

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use rusqlite::{ffi, Connection};

pub use version::{check_host_version, MIN_SQLITE_VERSION_NUMBER};

/// Set to `1` to make `hermes-guard` the default VFS when the extension is loaded through
/// `sqlite3_hermesguard_init`, for hosts that cannot name another entry point.
pub const DEFAULT_ENV: &str = "HERMES_GUARD_DEFAULT";

/// Entry point SQLite derives from `libhermes_guard.so`. Registers the VFS (the default one too
/// when `HERMES_GUARD_DEFAULT=1`) and the SQL functions; the extension stays loaded.
///
/// # Safety
/// Called by SQLite's `sqlite3_load_extension` with its own arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sqlite3_hermesguard_init(
    db: *mut ffi::sqlite3,
    pz_err_msg: *mut *mut c_char,
    p_api: *mut ffi::sqlite3_api_routines,
) -> c_int {
    // SAFETY: SQLite's own arguments, passed on unchanged.
    unsafe { entry(db, pz_err_msg, p_api, None) }
}

/// Entry point that also makes `hermes-guard` the default VFS of the process, so connections
/// opened afterwards without naming a VFS are guarded. Load it by name, e.g.
/// `.load ./libhermes_guard sqlite3_hermesguard_default_init`.
///
/// # Safety
/// Called by SQLite's `sqlite3_load_extension` with its own arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sqlite3_hermesguard_default_init(
    db: *mut ffi::sqlite3,
    pz_err_msg: *mut *mut c_char,
    p_api: *mut ffi::sqlite3_api_routines,
) -> c_int {
    // SAFETY: SQLite's own arguments, passed on unchanged.
    unsafe { entry(db, pz_err_msg, p_api, Some(true)) }
}

/// # Safety
/// `db`, `pz_err_msg` and `p_api` as SQLite passes them to an extension's entry point.
unsafe fn entry(
    db: *mut ffi::sqlite3,
    pz_err_msg: *mut *mut c_char,
    p_api: *mut ffi::sqlite3_api_routines,
    make_default: Option<bool>,
) -> c_int {
    if p_api.is_null() {
        // Only a statically linked build passes no API table, and this crate is not one.
        return ffi::SQLITE_ERROR;
    }
    // SAFETY: `p_api` is the host's API table, valid for this call.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe {
        init(db, p_api, make_default)
    }));
    let message = match outcome {
        Ok(Ok(())) => return ffi::SQLITE_OK_LOAD_PERMANENTLY,
        Ok(Err(message)) => message,
        Err(_) => "hermes-guard: internal panic while loading the extension".to_owned(),
    };
    // SAFETY: as for `init`; `pz_err_msg` is NULL or where SQLite takes the message from.
    unsafe { set_error(p_api, pz_err_msg, &message) };
    ffi::SQLITE_ERROR
}

/// # Safety
/// `p_api` is the host's API table; `db` the connection loading the extension.
unsafe fn init(
    db: *mut ffi::sqlite3,
    p_api: *mut ffi::sqlite3_api_routines,
    make_default: Option<bool>,
) -> Result<(), String> {
    // An older host's API table is shorter than the one rusqlite's bindings describe: its
    // version must be known before rusqlite reads the table, from a slot every host has had.
    // SAFETY: `libversion_number` is among the first slots of every version of the table.
    let host_version = match unsafe { (*p_api).libversion_number } {
        // SAFETY: the host's own sqlite3_libversion_number.
        Some(libversion_number) => unsafe { libversion_number() },
        None => {
            return Err("hermes-guard: the host SQLite gave no sqlite3_libversion_number".into())
        }
    };
    check_host_version(host_version)?;
    // rusqlite reads every slot of its 3.45.3 table: an older host's shorter table is handed
    // over as a padded copy (see host_api), which must outlive the call that copies it.
    // SAFETY: a table of `Option<fn>` slots: all-zero bytes are all `None`.
    let mut copy: ffi::sqlite3_api_routines = unsafe { std::mem::zeroed() };
    // SAFETY: `p_api` is the host's table of SQLite `host_version`.
    let table = unsafe { host_api::table_for_rusqlite(p_api, host_version, &mut copy) };
    // SAFETY: `table` is the host's table or a full-size copy of it.
    let missing = host_api::missing_routines(unsafe { &*table });
    if !missing.is_empty() {
        return Err(format!(
            "hermes-guard: the host SQLite {} was built without {}, which the extension calls",
            version::dotted(host_version),
            missing.join(", ")
        ));
    }
    claim_host(p_api)?;
    // SAFETY: as above; every slot rusqlite copies is within `table`.
    unsafe { ffi::rusqlite_extension_init2(table) }
        .map_err(|e| format!("hermes-guard: cannot use the host's SQLite API: {e}"))?;
    events::install()?;

    let make_default = match make_default {
        Some(forced) => forced,
        None => default_from_env(std::env::var_os(DEFAULT_ENV))?,
    };
    let registered = if make_default {
        guard::register_as_default()
    } else {
        guard::register()
    };
    registered.map_err(|e| e.to_string())?;
    if in_python() {
        guard::set_python_host();
    }

    // SAFETY: `db` is the connection loading us, open for this call; the Connection made from it
    // does not own it and is dropped before we return.
    let conn = unsafe { Connection::from_handle(db) }.map_err(|e| e.to_string())?;
    // Connections opened from now on get the functions from the library's registration (an
    // auto-extension); this one was open before it.
    guard::sql_functions::install(&conn).map_err(|e| format!("hermes-guard: {e}"))?;
    Ok(())
}

/// The API table of the SQLite library the extension serves (0 until the first load). rusqlite
/// keeps the host's routines in process globals, so the extension can serve one SQLite library
/// per process: loading it into a second copy (a Python process with the stdlib's libsqlite3 and
/// an apsw wheel's own SQLite) would point the first host's calls at the second's routines.
static HOST_API: AtomicUsize = AtomicUsize::new(0);

/// Records `p_api` as the host's table, or refuses a table of another SQLite library. A library
/// hands every load the same table (`sqlite3Apis`, a static), so reloading into it is fine.
fn claim_host(p_api: *mut ffi::sqlite3_api_routines) -> Result<(), String> {
    match HOST_API.compare_exchange(0, p_api as usize, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(()),
        Err(served) if served == p_api as usize => Ok(()),
        Err(_) => Err(
            "hermes-guard: already loaded into another copy of the SQLite library in \
             this process; the extension serves one SQLite library per process (e.g. \
             Python's sqlite3 or apsw, not both)"
                .into(),
        ),
    }
}

/// Whether this process is a Python interpreter: its C API is in the process's symbol table
/// (CPython exports it for its extension modules). The guard's messages then name the
/// `hermes_guard` package's calls.
fn in_python() -> bool {
    // SAFETY: a lookup in the process's global symbol table by a NUL-terminated name; nothing is
    // called through the result.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"Py_IsInitialized".as_ptr()) }.is_null()
}

/// Whether the environment asks for the guard to be the default VFS.
fn default_from_env(value: Option<std::ffi::OsString>) -> Result<bool, String> {
    match value.as_deref().map(|v| v.to_str()) {
        None => Ok(false),
        Some(Some("" | "0")) => Ok(false),
        Some(Some("1")) => Ok(true),
        Some(other) => Err(format!(
            "hermes-guard: {DEFAULT_ENV} must be 0 or 1, not {:?}",
            other.unwrap_or("<not UTF-8>")
        )),
    }
}

/// Hands `message` to SQLite as the load error, in memory from the host's allocator.
///
/// # Safety
/// `p_api` is the host's API table; `pz_err_msg` is NULL or writable.
unsafe fn set_error(
    p_api: *mut ffi::sqlite3_api_routines,
    pz_err_msg: *mut *mut c_char,
    message: &str,
) {
    if pz_err_msg.is_null() {
        return;
    }
    // rusqlite's malloc may not be initialised yet (the version check runs first): use the
    // host's, from a slot every version of the table has.
    // SAFETY: `p_api` is the host's API table.
    let Some(malloc) = (unsafe { (*p_api).malloc }) else {
        return;
    };
    let bytes = message.as_bytes();
    let Ok(size) = c_int::try_from(bytes.len() + 1) else {
        return;
    };
    // SAFETY: the host's sqlite3_malloc; SQLite frees *pzErrMsg with sqlite3_free.
    let p = unsafe { malloc(size) } as *mut u8;
    if p.is_null() {
        return;
    }
    // SAFETY: `p` has room for len + 1 bytes and does not overlap `bytes`; `pz_err_msg` is
    // writable.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        *p.add(bytes.len()) = 0;
        *pz_err_msg = p as *mut c_char;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sqlite_library_per_process() {
        let first = 0x1000 as *mut ffi::sqlite3_api_routines;
        let second = 0x2000 as *mut ffi::sqlite3_api_routines;
        assert_eq!(claim_host(first), Ok(()));
        assert_eq!(claim_host(first), Ok(()), "a reload into the same library");
        let err = claim_host(second).unwrap_err();
        assert!(err.contains("another copy of the SQLite library"), "{err}");
        assert_eq!(claim_host(first), Ok(()), "the first host is still served");
    }

    #[test]
    fn default_is_off_unless_asked_for() {
        assert_eq!(default_from_env(None), Ok(false));
        assert_eq!(default_from_env(Some("".into())), Ok(false));
        assert_eq!(default_from_env(Some("0".into())), Ok(false));
        assert_eq!(default_from_env(Some("1".into())), Ok(true));
    }

    #[test]
    fn a_default_setting_that_is_neither_0_nor_1_is_an_error_that_names_the_variable() {
        let err = default_from_env(Some("yes".into())).unwrap_err();
        assert!(err.contains("HERMES_GUARD_DEFAULT must be 0 or 1"), "{err}");
        assert!(err.contains("\"yes\""), "{err}");
    }
}
