//! The C boundary's small helpers every callback of the shim uses: `ffi_guard` (a panic becomes
//! an SQLite error code, never an unwind into C), strings from and to SQLite (a path byte for
//! byte, text for people, an answer SQLite frees), the running SQLite's version, SQLite's
//! arguments of the io methods made safe to use, the unix VFS's mutex. The bottom of
//! the house: it imports nothing of the shim.

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::marker::PhantomData;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::ptr;

use rusqlite::ffi;

/// [`crate::VFS_NAME`] as SQLite is given it.
pub(super) const VFS_NAME_C: &CStr = c"hermes-guard";

/// Runs `f`, turning a panic into `on_panic`: unwinding across the FFI boundary would abort.
pub(super) fn ffi_guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            log::error!("hermes-guard: internal panic caught at the FFI boundary: {what}");
            on_panic
        }
    }
}

/// The version of the SQLite the guard runs in, as the library reports it at run time: in an
/// extension host, the host's (the `SQLITE_VERSION` constant is the one this crate was compiled
/// against, which is not what a message about the host's structures must name).
pub(super) fn running_sqlite_version() -> String {
    // SAFETY: sqlite3_libversion returns a pointer to a static NUL-terminated string (NULL is
    // handled by cstr_text).
    unsafe { cstr_text(ffi::sqlite3_libversion()) }.unwrap_or_else(|| "?".into())
}

/// Copies `s` into memory from `sqlite3_malloc`, as SQLite expects of file-control answers.
pub(super) fn sqlite_string(s: &str) -> *mut c_char {
    let bytes = s.as_bytes();
    // SAFETY: plain allocation; checked for NULL below.
    let p = unsafe { ffi::sqlite3_malloc64(bytes.len() as u64 + 1) } as *mut u8;
    if p.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: `p` has room for len + 1 bytes and does not overlap `bytes`.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        *p.add(bytes.len()) = 0;
    }
    p as *mut c_char
}

/// Text for people (a VFS name), never a path: invalid UTF-8 becomes U+FFFD.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(super) unsafe fn cstr_text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A pathname from SQLite, byte for byte: a Unix path is bytes, and a lossy conversion would
/// name another file (or none).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(super) unsafe fn cstr_path(p: *const c_char) -> Option<PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Some(PathBuf::from(OsStr::from_bytes(bytes)))
}

/// SQLite's buffer of an `xRead`: `amt` writable bytes for the call.
#[repr(C)]
pub(in crate::vfs) struct ReadBuf<'a> {
    buf: *mut c_void,
    amt: c_int,
    bytes: PhantomData<&'a mut [u8]>,
}

impl ReadBuf<'_> {
    /// The pointer and length, as SQLite passed them.
    #[inline(always)]
    pub(in crate::vfs) fn raw(&self) -> (*mut c_void, c_int) {
        (self.buf, self.amt)
    }

    /// # Safety
    /// `buf` holds `amt` writable bytes for the call (SQLite's arguments of `xRead`).
    #[inline(always)]
    pub(in crate::vfs) unsafe fn new(buf: *mut c_void, amt: c_int) -> Self {
        ReadBuf {
            buf,
            amt,
            bytes: PhantomData,
        }
    }

    #[inline(always)]
    pub(in crate::vfs) fn amt(&self) -> c_int {
        self.amt
    }
}

/// SQLite's buffer of an `xWrite`: `amt` readable bytes for the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub(in crate::vfs) struct WriteBuf<'a> {
    buf: *const c_void,
    amt: c_int,
    bytes: PhantomData<&'a [u8]>,
}

impl<'a> WriteBuf<'a> {
    /// The pointer and length, as SQLite passed them.
    #[inline(always)]
    pub(in crate::vfs) fn raw(self) -> (*const c_void, c_int) {
        (self.buf, self.amt)
    }

    /// # Safety
    /// `buf` holds `amt` readable bytes for the call (SQLite's arguments of `xWrite`).
    #[inline(always)]
    pub(in crate::vfs) unsafe fn new(buf: *const c_void, amt: c_int) -> Self {
        WriteBuf {
            buf,
            amt,
            bytes: PhantomData,
        }
    }

    #[inline(always)]
    pub(in crate::vfs) fn amt(self) -> c_int {
        self.amt
    }

    /// The bytes (`None` for a negative `amt`).
    #[inline(always)]
    pub(in crate::vfs) fn bytes(self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.amt).ok()?;
        // SAFETY: `buf` holds `amt` readable bytes (`new`'s contract).
        Some(unsafe { std::slice::from_raw_parts(self.buf as *const u8, len) })
    }
}

/// SQLite's out-pointer of an `xShmMap`, where the region's address goes.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(in crate::vfs) struct ShmOut<'a>(*mut *mut c_void, PhantomData<&'a mut *mut c_void>);

impl ShmOut<'_> {
    /// The pointer, as SQLite passed it.
    #[inline(always)]
    pub(in crate::vfs) fn raw(self) -> *mut *mut c_void {
        self.0
    }

    /// # Safety
    /// `pp` is valid for reads and writes of one pointer for the call, and holds one (SQLite's
    /// argument of `xShmMap`: a slot of its array of region addresses, zeroed when made).
    #[inline(always)]
    pub(in crate::vfs) unsafe fn new(pp: *mut *mut c_void) -> Self {
        ShmOut(pp, PhantomData)
    }

    pub(in crate::vfs) fn set(self, addr: usize) {
        // SAFETY: writable for the call (`new`'s contract).
        unsafe { *self.0 = addr as *mut c_void };
    }

    pub(in crate::vfs) fn get(self) -> *const u8 {
        // SAFETY: readable for the call, and holds a pointer (`new`'s contract).
        unsafe { *self.0 as *const u8 }
    }
}

/// SQLite's arguments of an `xFileControl`: the operation and its argument, whose type the
/// operation decides.
#[repr(C)]
pub(in crate::vfs) struct Fcntl<'a> {
    op: c_int,
    arg: *mut c_void,
    call: PhantomData<&'a mut c_void>,
}

impl<'a> Fcntl<'a> {
    /// # Safety
    /// `op` and `arg` are SQLite's arguments of an `xFileControl`: `arg` is what `op` takes,
    /// valid for the call.
    #[inline(always)]
    pub(in crate::vfs) unsafe fn new(op: c_int, arg: *mut c_void) -> Self {
        Fcntl {
            op,
            arg,
            call: PhantomData,
        }
    }

    #[inline(always)]
    pub(in crate::vfs) fn op(&self) -> c_int {
        self.op
    }

    /// The argument as SQLite passed it, for the wrapped file's `xFileControl`.
    #[inline(always)]
    pub(in crate::vfs) fn raw(&self) -> *mut c_void {
        self.arg
    }

    /// The `int` a control that takes an `int *` answers in (`HAS_MOVED`,
    /// `EXTERNAL_READER`); `None` for any other control.
    pub(in crate::vfs) fn int_out(self) -> Option<&'a mut c_int> {
        match self.op {
            ffi::SQLITE_FCNTL_HAS_MOVED | ffi::SQLITE_FCNTL_EXTERNAL_READER => {
                // SAFETY: for these controls `arg` is an `int *`, valid for the call (`new`).
                unsafe { (self.arg as *mut c_int).as_mut() }
            }
            _ => None,
        }
    }

    /// For `VFSNAME`, after the wrapped file answered `rc`: `<name>/<its answer>`, the convention
    /// of shims such as cksumvfs (its string freed, ours from `sqlite3_malloc`); `None` for any
    /// other control.
    pub(in crate::vfs) fn chain_vfs_name(self, name: &str, rc: c_int) -> Option<c_int> {
        if self.op != ffi::SQLITE_FCNTL_VFSNAME {
            return None;
        }
        let out = self.arg as *mut *mut c_char;
        // SAFETY: for VFSNAME, `arg` is a `char **` owned by the caller (`new`); a string in it
        // came from sqlite3_malloc.
        unsafe {
            let below = if rc == ffi::SQLITE_OK {
                cstr_text(*out)
            } else {
                None
            };
            if rc == ffi::SQLITE_OK && !(*out).is_null() {
                ffi::sqlite3_free(*out as *mut c_void);
            }
            let name = match below {
                Some(b) => format!("{name}/{b}"),
                None => name.to_string(),
            };
            *out = sqlite_string(&name);
        }
        Some(ffi::SQLITE_OK)
    }

    /// For `PRAGMA`, SQLite's `char *azArg[3]`; `None` for any other control.
    pub(in crate::vfs) fn pragma(&self) -> Option<PragmaArgs<'a>> {
        (self.op == ffi::SQLITE_FCNTL_PRAGMA).then_some(PragmaArgs {
            az: self.arg as *mut *mut c_char,
            call: PhantomData,
        })
    }
}

/// A `PRAGMA` file control's `char *azArg[3]`: the answer's slot, the pragma's name, its argument.
#[derive(Clone, Copy)]
pub(in crate::vfs) struct PragmaArgs<'a> {
    az: *mut *mut c_char,
    call: PhantomData<&'a mut c_void>,
}

impl<'a> PragmaArgs<'a> {
    /// The pragma's name (`azArg[1]`).
    pub(in crate::vfs) fn name(self) -> &'a [u8] {
        // SAFETY: azArg[1] is the pragma's name, NUL-terminated, for the call.
        unsafe { CStr::from_ptr(*self.az.add(1)) }.to_bytes()
    }

    /// The pragma's argument (`azArg[2]`), if it has one.
    pub(in crate::vfs) fn arg(self) -> Option<&'a [u8]> {
        // SAFETY: azArg[2] is the pragma's argument, NULL or NUL-terminated, for the call.
        unsafe {
            (*self.az.add(2))
                .as_ref()
                .map(|p| CStr::from_ptr(p).to_bytes())
        }
    }

    /// Puts `text` where SQLite takes the result (or error) string from, and frees it
    /// (`azArg[0]`).
    pub(in crate::vfs) fn answer(self, text: &str) {
        // SAFETY: azArg[0] is that slot, writable for the call.
        unsafe { *self.az = sqlite_string(text) };
    }
}

/// Whether the running SQLite was compiled with the option `name` (`sqlite3_compileoption_used`).
pub(in crate::vfs) fn compile_option_used(name: &CStr) -> bool {
    // SAFETY: `name` is NUL-terminated; the call only compares it with constant strings.
    unsafe { ffi::sqlite3_compileoption_used(name.as_ptr()) != 0 }
}

/// Whether the SQLite the guard runs in has no mutexes at all (`SQLITE_THREADSAFE=0`).
pub(in crate::vfs) fn single_threaded_sqlite() -> bool {
    // SAFETY: sqlite3_threadsafe only returns a compile-time constant.
    unsafe { ffi::sqlite3_threadsafe() == 0 }
}

/// SQLite's unix VFS mutex (`unixBigLock`), held while alive: no connection of this process
/// opens a `-shm` (and takes its dead-man-switch lock) meanwhile. Not recursive: never taken
/// inside a call into the unix VFS (the guard asks before or after each wrapped call).
pub(in crate::vfs) struct UnixVfsMutex(*mut rusqlite::ffi::sqlite3_mutex);

impl UnixVfsMutex {
    /// The mutex: static, allocated by SQLite once and never freed (NULL in a build without
    /// mutexes, which every mutex call accepts).
    fn get() -> *mut rusqlite::ffi::sqlite3_mutex {
        // SAFETY: asking for a static mutex has no precondition.
        unsafe { rusqlite::ffi::sqlite3_mutex_alloc(rusqlite::ffi::SQLITE_MUTEX_STATIC_VFS1) }
    }

    pub(in crate::vfs) fn enter() -> UnixVfsMutex {
        let m = UnixVfsMutex::get();
        // SAFETY: `m` is that mutex or NULL; this thread does not hold it (see the type's docs).
        unsafe { rusqlite::ffi::sqlite3_mutex_enter(m) };
        UnixVfsMutex(m)
    }

    /// [`UnixVfsMutex::enter`] if no other thread holds it now.
    pub(in crate::vfs) fn try_enter() -> Option<UnixVfsMutex> {
        let m = UnixVfsMutex::get();
        // SAFETY: `m` is that mutex or NULL (then SQLITE_OK: no mutexes in this build).
        let rc = unsafe { rusqlite::ffi::sqlite3_mutex_try(m) };
        (rc == rusqlite::ffi::SQLITE_OK).then_some(UnixVfsMutex(m))
    }
}

impl Drop for UnixVfsMutex {
    fn drop(&mut self) {
        // SAFETY: entered by this thread in `enter`.
        unsafe { rusqlite::ffi::sqlite3_mutex_leave(self.0) };
    }
}
