//! The `sqlite3_vfs` methods: `xOpen` wraps the file, `xDelete` refuses to delete a WAL that is
//! no longer the one its connection pinned, everything else is handed to the wrapped VFS. And the
//! guard's other calls of SQLite's API: its registration, the SQL functions' registration and
//! calls (their bodies are `sql_functions.rs`'s), and the calls on a raw connection handle
//! (public as [`crate::raw`], whose module says what they ask of the handle).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::ptr;

use rusqlite::ffi;

use super::boundary::{cstr_path, ffi_guard, VFS_NAME_C};
use super::file;
use super::state::may_delete;
use rusqlite::Connection;

use crate::error::GuardError;
use crate::{ErrorClass, GuardExt, GuardStatus};

/// The registered VFS. Leaked on purpose: SQLite keeps pointers to it for the process's life.
pub(super) struct Registered(*mut ffi::sqlite3_vfs);

// SAFETY: the pointer is to a leaked, never-mutated-after-registration sqlite3_vfs; SQLite itself
// shares it between threads.
unsafe impl Send for Registered {}

impl Registered {
    /// Registers the guard's VFS over the current default one: the exit hook installed first
    /// (a last capture attempt for what is still held when the process exits normally).
    pub(super) fn new() -> Result<Registered, GuardError> {
        // SAFETY: `at_exit` is a plain `extern "C" fn()` that never unwinds (it catches panics).
        unsafe { libc::atexit(super::held::at_exit) };
        // SAFETY: a NULL name asks for the default VFS; SQLite initialises itself if needed.
        let sub = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
        if sub.is_null() {
            return Err(GuardError::Register("SQLite has no default VFS".into()));
        }
        // SAFETY: `sub` is a registered VFS, valid for the life of the process.
        let sub_name = unsafe { CStr::from_ptr((*sub).zName) };
        if sub_name == VFS_NAME_C {
            return Err(GuardError::Register(
                "the default VFS is already a hermes-guard from another copy of the library".into(),
            ));
        }
        let vfs = Box::into_raw(Box::new(guard_vfs(sub)));
        // SAFETY: `vfs` is a complete sqlite3_vfs that lives forever (leaked).
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
        if rc != ffi::SQLITE_OK {
            // SAFETY: SQLite refused it, so it holds no pointer to `vfs`.
            drop(unsafe { Box::from_raw(vfs) });
            return Err(GuardError::Register(format!(
                "sqlite3_vfs_register returned {rc}"
            )));
        }
        Ok(Registered(vfs))
    }

    /// Makes it the default VFS of the process.
    pub(super) fn make_default(&self) -> Result<(), GuardError> {
        // SAFETY: re-registering a registered VFS with makeDflt=1 only relinks it at the head.
        let rc = unsafe { ffi::sqlite3_vfs_register(self.0, 1) };
        if rc != ffi::SQLITE_OK {
            return Err(GuardError::Register(format!(
                "sqlite3_vfs_register(makeDflt) returned {rc}"
            )));
        }
        Ok(())
    }
}

/// Builds the guard's `sqlite3_vfs` over `sub`.
fn guard_vfs(sub: *mut ffi::sqlite3_vfs) -> ffi::sqlite3_vfs {
    // SAFETY: `sub` is a registered VFS, valid for the life of the process.
    let s = unsafe { &*sub };
    ffi::sqlite3_vfs {
        iVersion: s.iVersion.min(3),
        // The unix VFS's file object lives in SQLite's buffer, any other on the heap (file.rs).
        szOsFile: file::os_file_size(s),
        mxPathname: s.mxPathname,
        pNext: ptr::null_mut(),
        zName: VFS_NAME_C.as_ptr(),
        pAppData: sub as *mut c_void,
        // Every slot the wrapped VFS leaves NULL stays NULL (SQLite reads some as "not
        // supported"); xOpen and xDelete are the guard's own.
        xOpen: Some(x_open),
        xDelete: Some(x_delete),
        xAccess: s.xAccess.map(|_| x_access as _),
        xFullPathname: s.xFullPathname.map(|_| x_full_pathname as _),
        xDlOpen: s.xDlOpen.map(|_| x_dl_open as _),
        xDlError: s.xDlError.map(|_| x_dl_error as _),
        xDlSym: s.xDlSym.map(|_| x_dl_sym as _),
        xDlClose: s.xDlClose.map(|_| x_dl_close as _),
        xRandomness: s.xRandomness.map(|_| x_randomness as _),
        xSleep: s.xSleep.map(|_| x_sleep as _),
        xCurrentTime: s.xCurrentTime.map(|_| x_current_time as _),
        xGetLastError: s.xGetLastError.map(|_| x_get_last_error as _),
        xCurrentTimeInt64: s.xCurrentTimeInt64.map(|_| x_current_time_int64 as _),
        xSetSystemCall: s.xSetSystemCall.map(|_| x_set_system_call as _),
        xGetSystemCall: s.xGetSystemCall.map(|_| x_get_system_call as _),
        xNextSystemCall: s.xNextSystemCall.map(|_| x_next_system_call as _),
    }
}

/// # Safety
/// `vfs` is the guard's registered VFS.
unsafe fn wrapped(vfs: *mut ffi::sqlite3_vfs) -> &'static ffi::sqlite3_vfs {
    // SAFETY: pAppData was set to the wrapped VFS at registration and never changes.
    unsafe { &*((*vfs).pAppData as *const ffi::sqlite3_vfs) }
}

/// # Safety
/// `vfs` is the guard's registered VFS.
unsafe fn wrapped_ptr(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: as in `wrapped`.
    unsafe { (*vfs).pAppData as *mut ffi::sqlite3_vfs }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: ffi::sqlite3_filename,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    ffi_guard(ffi::SQLITE_CANTOPEN, || {
        // SAFETY: SQLite passes the VFS it registered, a file buffer of szOsFile bytes and a
        // filename that is NULL or valid until the file is closed.
        unsafe { file::open(wrapped_ptr(vfs), z_name, f, flags, out_flags) }
    })
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_DELETE, || {
        // SAFETY: SQLite passes NULL or a NUL-terminated pathname.
        if let Some(path) = unsafe { cstr_path(z_name) } {
            if !may_delete(&path) {
                return ffi::SQLITE_OK;
            }
        }
        // SAFETY: pass-through to the wrapped VFS with SQLite's own arguments.
        unsafe {
            match wrapped(vfs).xDelete {
                Some(x) => x(wrapped_ptr(vfs), z_name, sync_dir),
                None => ffi::SQLITE_IOERR_DELETE,
            }
        }
    })
}

macro_rules! vfs_pass_through {
    ($name:ident, $slot:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty, $missing:expr) => {
        unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs, $($arg: $ty),*) -> $ret {
            // SAFETY: pass-through to the wrapped VFS with SQLite's own arguments.
            unsafe {
                match wrapped(vfs).$slot {
                    Some(x) => x(wrapped_ptr(vfs), $($arg),*),
                    None => $missing,
                }
            }
        }
    };
}

vfs_pass_through!(x_access, xAccess, (z: *const c_char, flags: c_int, out: *mut c_int) -> c_int, ffi::SQLITE_IOERR_ACCESS);
vfs_pass_through!(x_full_pathname, xFullPathname, (z: *const c_char, n: c_int, out: *mut c_char) -> c_int, ffi::SQLITE_CANTOPEN);
vfs_pass_through!(x_dl_open, xDlOpen, (z: *const c_char) -> *mut c_void, ptr::null_mut());
vfs_pass_through!(x_dl_error, xDlError, (n: c_int, out: *mut c_char) -> (), ());
vfs_pass_through!(x_dl_sym, xDlSym, (h: *mut c_void, z: *const c_char) -> Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>, None);
vfs_pass_through!(x_dl_close, xDlClose, (h: *mut c_void) -> (), ());
vfs_pass_through!(x_randomness, xRandomness, (n: c_int, out: *mut c_char) -> c_int, 0);
vfs_pass_through!(x_sleep, xSleep, (us: c_int) -> c_int, 0);
vfs_pass_through!(x_current_time, xCurrentTime, (out: *mut f64) -> c_int, ffi::SQLITE_ERROR);
vfs_pass_through!(x_get_last_error, xGetLastError, (n: c_int, out: *mut c_char) -> c_int, 0);
vfs_pass_through!(x_current_time_int64, xCurrentTimeInt64, (out: *mut ffi::sqlite3_int64) -> c_int, ffi::SQLITE_ERROR);
vfs_pass_through!(x_set_system_call, xSetSystemCall, (z: *const c_char, p: ffi::sqlite3_syscall_ptr) -> c_int, ffi::SQLITE_NOTFOUND);
vfs_pass_through!(x_get_system_call, xGetSystemCall, (z: *const c_char) -> ffi::sqlite3_syscall_ptr, None);
vfs_pass_through!(x_next_system_call, xNextSystemCall, (z: *const c_char) -> *const c_char, ptr::null());

/// `SQLITE_DIRECTONLY` (SQLite 3.30): not from a schema's triggers or views. A literal: the
/// prebuilt bindings of the range's oldest libsqlite3-sys predate the constant.
const DIRECTONLY: c_int = 0x0008_0000;

/// A scalar SQL function of the guard's: its name, its number of arguments (-1: any, checked in
/// the body), its body.
pub(super) struct SqlFunction {
    pub(super) name: &'static CStr,
    pub(super) n_arg: c_int,
    pub(super) body: fn(&SqlCall<'_>),
}

/// The functions the auto-extension registers on every connection.
pub(super) trait SqlFunctions {
    const LIST: &'static [SqlFunction];
}

/// Registers `list` on `conn` ([`install_on`]).
pub(super) fn install_functions(
    conn: &rusqlite::Connection,
    list: &'static [SqlFunction],
) -> c_int {
    // SAFETY: `conn`'s handle is open and borrowed for the call.
    unsafe { install_on(conn.handle(), list) }
}

/// Registers `list` on `db`: one `sqlite3_create_function_v2` call each, with a static function
/// and the static description as its user data, no allocation of the guard's (every open pays
/// it).
///
/// # Safety
/// `db` is an open connection handle.
unsafe fn install_on(db: *mut ffi::sqlite3, list: &'static [SqlFunction]) -> c_int {
    for function in list {
        // SAFETY: `db` is open; the name is NUL-terminated and static; the user data is static,
        // so no destructor.
        let rc = unsafe {
            ffi::sqlite3_create_function_v2(
                db,
                function.name.as_ptr(),
                function.n_arg,
                ffi::SQLITE_UTF8 | DIRECTONLY,
                function as *const SqlFunction as *mut c_void,
                Some(sql_entry),
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
pub(super) fn install_for_every_connection<F: SqlFunctions>() {
    let entry: unsafe extern "C" fn(
        *mut ffi::sqlite3,
        *mut *mut c_char,
        *const ffi::sqlite3_api_routines,
    ) -> c_int = auto_install::<F>;
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
unsafe extern "C" fn auto_install<F: SqlFunctions>(
    db: *mut ffi::sqlite3,
    _pz_err_msg: *mut *mut c_char,
    _p_api: *const ffi::sqlite3_api_routines,
) -> c_int {
    // SAFETY: `db` is the connection being opened, valid for this call.
    let rc = unsafe { install_on(db, F::LIST) };
    if rc != ffi::SQLITE_OK {
        log::warn!("hermes-guard: SQL functions not registered on a connection: {rc}");
    }
    ffi::SQLITE_OK
}

/// Every SQL function's C entry point: its description (the user data) and its body.
unsafe extern "C" fn sql_entry(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: SQLite's own arguments to a scalar function; its user data is the static
    // `SqlFunction` it was registered with (`install_on`).
    let (call, function) = unsafe {
        let function = &*(ffi::sqlite3_user_data(ctx) as *const SqlFunction);
        (SqlCall::new(ctx, argc, argv), function)
    };
    (function.body)(&call)
}

/// One call of a scalar SQL function: SQLite's context and arguments, valid for the call.
pub(super) struct SqlCall<'a> {
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
    call: PhantomData<&'a ()>,
}

impl SqlCall<'_> {
    /// # Safety
    /// SQLite's arguments to a scalar function, for the call: `argv` holds `argc` values.
    unsafe fn new(
        ctx: *mut ffi::sqlite3_context,
        argc: c_int,
        argv: *mut *mut ffi::sqlite3_value,
    ) -> Self {
        SqlCall {
            ctx,
            argc,
            argv,
            call: PhantomData,
        }
    }

    pub(super) fn argc(&self) -> c_int {
        self.argc
    }

    /// Argument `i`'s text (invalid UTF-8 as U+FFFD), copied; `None` for NULL or past the last.
    pub(super) fn text_arg(&self, i: usize) -> Option<String> {
        if i >= usize::try_from(self.argc).unwrap_or(0) {
            return None;
        }
        // SAFETY: `argv[i]` is a valid value (`i < argc`); its text lives until the next call on
        // it, and is copied at once.
        unsafe {
            let text = ffi::sqlite3_value_text(*self.argv.add(i));
            (!text.is_null()).then(|| {
                String::from_utf8_lossy(CStr::from_ptr(text as *const c_char).to_bytes())
                    .into_owned()
            })
        }
    }

    /// Runs `f` with the connection running this function (`Err`: it cannot be had), used only
    /// for nested queries inside the call, as SQLite allows.
    pub(super) fn with_connection<R>(
        &self,
        f: impl FnOnce(rusqlite::Result<&rusqlite::Connection>) -> R,
    ) -> R {
        // SAFETY: the connection running this call, open for it; the Connection made from it
        // does not own it, and does not outlive `f`.
        let conn =
            unsafe { rusqlite::Connection::from_handle(ffi::sqlite3_context_db_handle(self.ctx)) };
        match conn {
            Ok(conn) => f(Ok(&conn)),
            Err(e) => f(Err(e)),
        }
    }

    pub(super) fn result_int64(&self, value: i64) {
        // SAFETY: `ctx` is the call's context.
        unsafe { ffi::sqlite3_result_int64(self.ctx, value) };
    }

    /// The text as the result (copied: `SQLITE_TRANSIENT`), or "too big".
    pub(super) fn result_text(&self, text: &str) {
        // SAFETY: `ctx` is the call's context; the text is copied (SQLITE_TRANSIENT).
        unsafe {
            match c_int::try_from(text.len()) {
                Ok(n) => ffi::sqlite3_result_text(
                    self.ctx,
                    text.as_ptr() as *const c_char,
                    n,
                    ffi::SQLITE_TRANSIENT(),
                ),
                Err(_) => ffi::sqlite3_result_error_toobig(self.ctx),
            }
        }
    }

    /// Sets `message` as the call's error.
    pub(super) fn result_error(&self, message: &str) {
        let n = c_int::try_from(message.len()).unwrap_or(c_int::MAX);
        // SAFETY: `ctx` is the call's context; SQLite copies the message.
        unsafe { ffi::sqlite3_result_error(self.ctx, message.as_ptr() as *const c_char, n) };
    }
}

// The raw-handle calls, public as `crate::raw` (see there).

/// Borrows `db` as a `rusqlite::Connection` that does not own it (its drop closes nothing).
///
/// # Safety
/// As [`crate::raw`] says: an open handle of this SQLite library, not used elsewhere meanwhile.
unsafe fn borrowed(db: *mut ffi::sqlite3) -> rusqlite::Result<Connection> {
    // SAFETY: as the caller promises; `from_handle` does not take ownership.
    unsafe { Connection::from_handle(db) }
}

/// The guard's status of the handle's `main` database, after the retirement check
/// ([`GuardExt::guard_status`]). [`GuardError::NotGuarded`] when it was not opened through the
/// guard.
///
/// # Safety
/// `db` is an open connection handle of the SQLite library this crate links, not used by another
/// thread during the call.
pub unsafe fn status(db: *mut ffi::sqlite3) -> Result<GuardStatus, GuardError> {
    // SAFETY: as the caller promises.
    unsafe { borrowed(db) }?.guard_status()
}

/// Makes sure a retired generation of the handle's `main` database is captured; the status
/// ([`GuardExt::ensure_captured`]). Call it before closing the handle where the host's close
/// cannot be kept from running ([`crate::close`]'s promise, by hand): on an error the
/// generation is not captured yet, and the handle should stay open for a retry.
///
/// # Safety
/// As for [`status`].
pub unsafe fn ensure_captured(db: *mut ffi::sqlite3) -> Result<GuardStatus, GuardError> {
    // SAFETY: as the caller promises.
    unsafe { borrowed(db) }?.ensure_captured()
}

/// Whether the guard has retired the handle's `main` database, as far as it knows now
/// ([`GuardExt::is_retired`]): an atomic load, no system call, no SQL — cheap enough for a
/// pool's check at every checkout. `false` for a handle not opened through the guard.
///
/// # Safety
/// As for [`status`].
pub unsafe fn is_retired(db: *mut ffi::sqlite3) -> bool {
    // SAFETY: as the caller promises; the handle does not outlive the call.
    unsafe { file::retired_flag(db) }.unwrap_or(false)
}

/// [`is_retired`] of a connection borrowed here, `None` when it is not a file of the guard's.
pub(crate) fn retired_flag_of(conn: &Connection) -> Option<bool> {
    // SAFETY: `conn` is open, and borrowed here, so no other thread uses it (a rusqlite
    // Connection is not Sync) until the call returns; the handle does not outlive the call.
    unsafe { file::retired_flag(conn.handle()) }
}

/// `SQLITE_FCNTL_RESERVE_BYTES` on `conn`'s `main` database: sets the reserved bytes per page
/// to `*n` when it is 0..=255, and writes the former value into `*n`; SQLite's return code.
#[cfg(test)]
pub(crate) fn reserve_bytes(conn: &Connection, n: &mut c_int) -> c_int {
    // SAFETY: the handle is the open connection's and is used on this thread only, while `conn`
    // is borrowed; "main" is a NUL-terminated name; SQLITE_FCNTL_RESERVE_BYTES reads and writes
    // one `int` through the pointer, which points at `n`, alive for the call.
    unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_RESERVE_BYTES,
            (n as *mut c_int).cast::<std::ffi::c_void>(),
        )
    }
}

/// What an error with SQLite's `extended_code`, returned on this handle, means for the
/// application ([`GuardExt::classify`]): for hosts whose error type keeps only the code
/// (`SQLITE_READONLY_DBMOVED` is 1032).
///
/// # Safety
/// As for [`status`].
pub unsafe fn classify(db: *mut ffi::sqlite3, extended_code: c_int) -> ErrorClass {
    let err = rusqlite::Error::SqliteFailure(ffi::Error::new(extended_code), None);
    // SAFETY: as the caller promises.
    match unsafe { borrowed(db) } {
        Ok(conn) => conn.classify(&err),
        Err(_) => ErrorClass::from_parts(&err, None),
    }
}

/// A new connection's test for a pool's hook ([`crate::pool::check_new`]): one read, then the
/// guard's check; `Err` (the refusal, 1032) when the handle attached to a lost generation.
///
/// # Safety
/// As for [`status`].
pub unsafe fn check_new(db: *mut ffi::sqlite3) -> rusqlite::Result<()> {
    // SAFETY: as the caller promises.
    crate::pool::check_new(&unsafe { borrowed(db) }?)
}

/// The checkout test for a pool's hook ([`crate::pool::check_out`]): `Err` (the refusal, 1032)
/// when the handle's generation is retired.
///
/// # Safety
/// As for [`status`].
pub unsafe fn check_out(db: *mut ffi::sqlite3) -> rusqlite::Result<()> {
    // SAFETY: as the caller promises.
    crate::pool::check_out(&unsafe { borrowed(db) }?)
}
