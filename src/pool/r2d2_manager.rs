//! The pool checks on r2d2 (cargo feature `r2d2`): [`GuardedManager`], the wrapper of any
//! manager whose connection is a `rusqlite::Connection`, and [`FileManager`], a plain one.

use std::borrow::Borrow;
use std::path::{Path, PathBuf};

use rusqlite::{ffi, Connection, OpenFlags};

use super::{check_new, check_out};
use crate::{GuardError, GuardExt};

/// An r2d2 manager that sees the guard's retirement (see the [module](crate::pool)): wraps `M`, whose
/// connections are opened through the guard (`vfs=hermes-guard`, or
/// [`crate::register_as_default`]).
///
/// [`GuardedManager`] wraps any [`r2d2::ManageConnection`] whose connection is a
/// [`rusqlite::Connection`] (r2d2_sqlite's `SqliteConnectionManager`, or this module's
/// [`FileManager`]) and adds the guard to each of r2d2's three hooks:
///
/// - `has_broken`, at every return of a connection to the pool: [`GuardExt::is_retired`], the
///   flag the guard's write path refuses by — an atomic read, no SQL and no system call (r2d2's
///   rule for this hook). A connection whose write was just refused leaves the pool there.
/// - `is_valid`, at every checkout (r2d2's `test_on_check_out`, on by default): the wrapped
///   manager's own test, then the guard's check, [`GuardExt::guard_status`] (the `stat` of each
///   pinned file and the status pragma). An idle connection whose generation was lost while it
///   sat in the pool is retired there and dropped by r2d2 (its close captures what it holds),
///   never handed out.
/// - `connect`: the wrapped manager's connection, then [`check_new`] once: one read (which maps
///   the `-shm`) and the status. The guard maps each `-shm` file itself, so a new connection
///   opened after a loss maps the new one and passes at once, however many connections of the
///   lost generation are still open (checked out by other threads, or idle in the pool). It
///   fails only when the loss lands between the open and the check; the refusal then goes to
///   r2d2, which connects again on its own schedule.
///
/// Nothing else: r2d2's default settings, and no rule about returning a connection before asking
/// for the next. The application retries a refused write once, on a fresh checkout (the refused
/// connection, dropped, goes back to the pool, which closes it):
///
/// ```no_run
/// use hermes_guard::pool::{r2d2, FileManager, GuardedManager};
/// use hermes_guard::{ErrorClass, GuardExt};
///
/// let manager = GuardedManager::new(FileManager::new("state.db").with_init(|conn| {
///     conn.pragma_update(None, "journal_mode", "WAL")
/// }));
/// let pool = r2d2::Pool::builder().max_size(8).build(manager)?;
/// let insert = |conn: &rusqlite::Connection| conn.execute("INSERT INTO t VALUES (1)", []);
/// let conn = pool.get()?;
/// if let Err(e) = insert(&conn) {
///     if !matches!(conn.classify(&e), ErrorClass::WalLost | ErrorClass::MainReplaced) {
///         return Err(e.into());
///     }
///     drop(conn); // retired: the pool closes it (its close captures the lost generation)
///     insert(&*pool.get()?)?; // lands on a healthy connection
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
///
/// `M::Error` must be able to carry a [`rusqlite::Error`]: a retired connection is reported as
/// the refusal a write gets (`SQLITE_READONLY_DBMOVED`, 1032).
pub struct GuardedManager<M> {
    inner: M,
}

impl<M> GuardedManager<M> {
    /// Wraps `inner`.
    pub fn new(inner: M) -> GuardedManager<M> {
        GuardedManager { inner }
    }

    /// The wrapped manager.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

impl GuardedManager<FileManager> {
    /// A manager of connections to `path` through the guard: [`FileManager::new`], wrapped.
    pub fn file(path: impl AsRef<Path>) -> GuardedManager<FileManager> {
        GuardedManager::new(FileManager::new(path))
    }
}

impl<M: std::fmt::Debug> std::fmt::Debug for GuardedManager<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedManager")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<M> r2d2::ManageConnection for GuardedManager<M>
where
    M: r2d2::ManageConnection,
    M::Connection: Borrow<Connection>,
    M::Error: From<rusqlite::Error>,
{
    type Connection = M::Connection;
    type Error = M::Error;

    fn connect(&self) -> Result<M::Connection, M::Error> {
        let conn = self.inner.connect()?;
        check_new(connection(&conn))?;
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut M::Connection) -> Result<(), M::Error> {
        self.inner.is_valid(conn)?;
        check_out(connection(conn)).map_err(Into::into)
    }

    fn has_broken(&self, conn: &mut M::Connection) -> bool {
        connection(conn).is_retired() || self.inner.has_broken(conn)
    }
}

/// The rusqlite connection of a pooled one.
fn connection<C: Borrow<Connection>>(conn: &C) -> &Connection {
    conn.borrow()
}

type Init = dyn Fn(&mut Connection) -> rusqlite::Result<()> + Send + Sync;

/// A plain r2d2 manager of connections to one database file, opened through the guard's VFS
/// (registered at the first `connect`, [`crate::register`]); wrap it in [`GuardedManager`]
/// ([`GuardedManager::file`]). Tests a connection at checkout with an empty batch, as
/// r2d2_sqlite does.
pub struct FileManager {
    path: PathBuf,
    flags: OpenFlags,
    init: Option<Box<Init>>,
}

impl FileManager {
    /// Connections to `path`, opened with `OpenFlags::default()`.
    pub fn new(path: impl AsRef<Path>) -> FileManager {
        FileManager {
            path: path.as_ref().to_path_buf(),
            flags: OpenFlags::default(),
            init: None,
        }
    }

    /// Opens with `flags` instead.
    pub fn with_flags(mut self, flags: OpenFlags) -> FileManager {
        self.flags = flags;
        self
    }

    /// Runs `init` on every new connection (`PRAGMA journal_mode = WAL`, a busy timeout:
    /// [`crate::set_busy_timeout`]).
    pub fn with_init(
        mut self,
        init: impl Fn(&mut Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
    ) -> FileManager {
        self.init = Some(Box::new(init));
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::fmt::Debug for FileManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileManager")
            .field("path", &self.path)
            .field("flags", &self.flags)
            .field("init", &self.init.is_some())
            .finish()
    }
}

impl r2d2::ManageConnection for FileManager {
    type Connection = Connection;
    type Error = rusqlite::Error;

    fn connect(&self) -> rusqlite::Result<Connection> {
        crate::register().map_err(|e| match e {
            GuardError::Sqlite(e) => e,
            e => rusqlite::Error::SqliteFailure(
                ffi::Error::new(ffi::SQLITE_ERROR),
                Some(e.to_string()),
            ),
        })?;
        let mut conn =
            Connection::open_with_flags_and_vfs(&self.path, self.flags, crate::VFS_NAME)?;
        if let Some(init) = &self.init {
            init(&mut conn)?;
        }
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut Connection) -> rusqlite::Result<()> {
        conn.execute_batch("")
    }

    fn has_broken(&self, _conn: &mut Connection) -> bool {
        false
    }
}
