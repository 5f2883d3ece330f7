//! hermes-guard-store: the session store, an application of the hermes-guard VFS.
//!
//! [`SessionDb`]: sessions, messages and full-text search on a guarded database; the shared
//! [`registry`] of open generations built on it; and its self-healing ([`heal`]), which merges
//! the retired generation of a lost `-wal`/`-shm` back through the library's general merge
//! ([`hermes_guard::recover::merge_in_transaction`]).
//!
//! Every connection is opened through the `hermes-guard` VFS, so a write that would land in a
//! retired generation (the `-wal`/`-shm` taken away, or the file at the path replaced) is refused
//! before any byte of it reaches a file. The store turns that refusal into
//! [`StoreError::WalLost`] or [`StoreError::MainReplaced`], from every public
//! write method, every time; and its `close()` refuses to settle until a retired generation is
//! captured. `docs/store.md` has the whole story.

mod error;
pub mod heal;
mod messages;
mod meta;
mod model;
mod schema;
mod search;
mod sessions;
mod upkeep;

pub mod registry;

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, Row};
use sha2::{Digest, Sha256};

use hermes_guard::{ErrorClass, FileId, GuardError, GuardExt, GuardStatus, RetireReason};

pub use error::{HeldBack, StoreError};
pub use heal::{Healed, HEALED_MARK_PREFIX};
pub use model::{Checkpoint, Message, NewMessage, NewSession, SearchHit, Session};
pub use registry::{Registry, RegistryStats, SharedSessionDb};
pub use schema::SCHEMA_VERSION;
pub use upkeep::Closed;

/// How a [`SessionDb`] is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long SQLite itself waits on a lock before reporting `SQLITE_BUSY`.
    pub busy_timeout: Duration,
    /// How many times a write tries `BEGIN IMMEDIATE` (with a short random pause between tries)
    /// before giving up with [`StoreError::Busy`].
    pub write_attempts: u32,
    /// `PRAGMA wal_autocheckpoint`, when set (`Some(0)` turns automatic checkpoints off).
    pub wal_autocheckpoint: Option<u32>,
    /// Merge the retired generation of a lost `-wal`/`-shm` (captured beside the database) back
    /// at open: see [`SessionDb::healed`]. On by default.
    pub self_heal: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            busy_timeout: Duration::from_secs(1),
            write_attempts: 15,
            wal_autocheckpoint: None,
            self_heal: true,
        }
    }
}

/// What can go wrong inside a write transaction, before it is mapped to a [`StoreError`].
enum TxError {
    Sqlite(rusqlite::Error),
    UnknownSession(String),
    Json(serde_json::Error),
}

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        TxError::Sqlite(e)
    }
}

impl From<serde_json::Error> for TxError {
    fn from(e: serde_json::Error) -> Self {
        TxError::Json(e)
    }
}

/// The session store on one guarded connection.
///
/// `Send + Sync`: threads may share one `SessionDb` (calls are serialised on its connection), or
/// each open their own. For one shared handle per database generation, use the
/// [`registry`].
pub struct SessionDb {
    path: PathBuf,
    options: StoreOptions,
    conn: Mutex<Option<Connection>>,
    /// The main file's identity when this handle opened it: its generation.
    generation: Option<FileId>,
    /// The last capture of this handle's retired generation the guard reported, kept after close.
    capture: Mutex<Option<PathBuf>>,
    /// A write was refused or the guard reported this generation retired.
    retired_seen: AtomicBool,
    /// What the self-healing merged at open.
    healed: Vec<Healed>,
}

impl std::fmt::Debug for SessionDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionDb")
            .field("path", &self.path)
            .field("generation", &self.generation)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl SessionDb {
    /// Opens (creating if needed) the store at `path` through `hermes-guard`, in WAL mode with
    /// foreign keys on, and brings its schema to [`SCHEMA_VERSION`].
    pub fn open(path: impl AsRef<Path>) -> Result<SessionDb, StoreError> {
        SessionDb::open_with(path, StoreOptions::default())
    }

    /// [`SessionDb::open`] with options.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: StoreOptions,
    ) -> Result<SessionDb, StoreError> {
        let path = path.as_ref().to_path_buf();
        hermes_guard::register().map_err(|source| StoreError::Guard {
            database: path.clone(),
            source,
        })?;
        let conn = Connection::open_with_flags_and_vfs(
            &path,
            OpenFlags::default(),
            hermes_guard::VFS_NAME,
        )
        .map_err(|source| StoreError::Sqlite {
            database: path.clone(),
            operation: "open",
            source,
        })?;
        let mut db = SessionDb {
            path,
            options,
            conn: Mutex::new(Some(conn)),
            generation: None,
            capture: Mutex::new(None),
            retired_seen: AtomicBool::new(false),
            healed: Vec::new(),
        };
        // The first statements of a connection can meet SQLITE_BUSY without SQLite's busy
        // handler ever running: while the last connection of another handle closes, it holds the
        // -shm's dead-man-switch lock to delete the WAL, and mapping the -shm fails at once.
        // Retried like a write.
        let mut attempt = 0;
        let mode = loop {
            attempt += 1;
            let configured = db.read("open: configure", |conn| {
                hermes_guard::set_busy_timeout(conn, db.options.busy_timeout)?;
                let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
                conn.pragma_update(None, "foreign_keys", true)?;
                if let Some(pages) = db.options.wal_autocheckpoint {
                    conn.pragma_update(None, "wal_autocheckpoint", pages)?;
                }
                Ok(mode)
            });
            match configured {
                Err(StoreError::Sqlite { source, .. })
                    if is_busy(&source) && attempt < db.options.write_attempts =>
                {
                    log::debug!(
                        "{}: open: database locked, retrying ({attempt})",
                        db.path.display()
                    );
                    std::thread::sleep(jitter());
                }
                other => break other?,
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::NotWal {
                database: db.path.clone(),
                mode,
            });
        }
        let status = db.guard_status()?;
        if let Some(reason) = status.reason {
            // Born retired: in this process the path's inode is still open elsewhere with its
            // sidecars lost (SQLite shares the -shm mapping per inode), or it was replaced
            // while opening. A handle that can never write is no use to anyone.
            return Err(db.retired_error(reason, status.capture, status.capture_error));
        }
        db.generation = status.main;
        db.migrate()?;
        if db.options.self_heal {
            if let Some(conn) = db.conn.get_mut().as_ref() {
                db.healed = heal::heal_store(conn, &db.path);
            }
        }
        Ok(db)
    }

    fn migrate(&self) -> Result<(), StoreError> {
        let found = self.read("open: schema version", schema::current_version)?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                database: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        if found == SCHEMA_VERSION {
            return Ok(());
        }
        let found = self.write("open: migrate", |conn| Ok(schema::migrate(conn)?))?;
        if found > SCHEMA_VERSION {
            // Another process with a newer build migrated between our read and our write lock.
            return Err(StoreError::SchemaTooNew {
                database: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(())
    }

    /// What the self-healing merged when this handle opened: one entry per capture of a lost
    /// `-wal`/`-shm` merged back (its sessions and messages, counters recomputed). Empty when
    /// nothing was lost, or with [`StoreOptions::self_heal`] off.
    pub fn healed(&self) -> &[Healed] {
        &self.healed
    }

    /// The path this store was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The identity of the main file this handle opened: its generation.
    pub fn generation(&self) -> Option<FileId> {
        self.generation
    }

    /// Whether the handle is closed.
    pub fn is_closed(&self) -> bool {
        self.conn.lock().is_none()
    }

    /// The guard's status of this handle's connection (runs the retirement check now).
    pub fn guard_status(&self) -> Result<GuardStatus, StoreError> {
        let slot = self.conn.lock();
        let conn = slot.as_ref().ok_or_else(|| self.closed())?;
        let status = conn
            .guard_status()
            .map_err(|source| self.guard_error(source))?;
        self.remember_capture(status.capture.as_ref());
        if status.retired {
            self.retired_seen.store(true, Ordering::Release);
        }
        Ok(status)
    }

    /// Where this handle's retired generation was captured, if it was; still known after close.
    pub fn retired_generation_capture(&self) -> Option<PathBuf> {
        if let Some(conn) = self.conn.lock().as_ref() {
            if let Ok(status) = conn.guard_status() {
                self.remember_capture(status.capture.as_ref());
            }
        }
        self.capture.lock().clone()
    }

    // ── plumbing ────────────────────────────────────────────────────────────────────────────

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction, retrying a bounded number of times while the
    /// database is locked by another writer.
    fn write<T>(
        &self,
        operation: &'static str,
        mut f: impl FnMut(&Connection) -> Result<T, TxError>,
    ) -> Result<T, StoreError> {
        let slot = self.conn.lock();
        let conn = slot.as_ref().ok_or_else(|| self.closed())?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(TxError::from)
                .and_then(|()| f(conn))
                .and_then(|value| {
                    conn.execute_batch("COMMIT")?;
                    Ok(value)
                });
            let err = match result {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            if !conn.is_autocommit() {
                if let Err(e) = conn.execute_batch("ROLLBACK") {
                    log::debug!("{}: {operation}: rollback: {e}", self.path.display());
                }
            }
            match err {
                TxError::Sqlite(e) if is_busy(&e) => {
                    if attempt >= self.options.write_attempts {
                        return Err(StoreError::Busy {
                            database: self.path.clone(),
                            operation,
                            attempts: attempt,
                        });
                    }
                    log::debug!(
                        "{}: {operation}: database locked, retrying ({attempt})",
                        self.path.display()
                    );
                    std::thread::sleep(jitter());
                }
                TxError::Sqlite(e) => return Err(self.map_sqlite(conn, operation, e)),
                TxError::UnknownSession(session_id) => {
                    return Err(StoreError::UnknownSession {
                        database: self.path.clone(),
                        session_id,
                    })
                }
                TxError::Json(source) => return Err(self.json_error(operation, source)),
            }
        }
    }

    /// Runs a read on the connection.
    fn read<T>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let slot = self.conn.lock();
        let conn = slot.as_ref().ok_or_else(|| self.closed())?;
        f(conn).map_err(|e| self.map_sqlite(conn, operation, e))
    }

    /// Reads the guard's verdict on `err`: a refusal becomes the typed error of its reason.
    fn map_sqlite(
        &self,
        conn: &Connection,
        operation: &'static str,
        err: rusqlite::Error,
    ) -> StoreError {
        let Ok(status) = conn.guard_status() else {
            return self.sqlite_error(operation, err);
        };
        // Classifies a refusal, and an I/O-level failure of a connection whose generation is gone
        // (e.g. a read through a -shm mapping that was unlinked), by the retirement reason.
        match (ErrorClass::from_parts(&err, status.reason), status.reason) {
            (ErrorClass::WalLost | ErrorClass::MainReplaced, Some(reason)) => {
                self.retired_error(reason, status.capture, status.capture_error)
            }
            _ => self.sqlite_error(operation, err),
        }
    }

    /// The typed error for a retired generation: a lost sidecar is
    /// [`StoreError::WalLost`], a replaced main file [`StoreError::MainReplaced`].
    fn retired_error(
        &self,
        reason: RetireReason,
        capture: Option<PathBuf>,
        capture_error: Option<String>,
    ) -> StoreError {
        self.retired_seen.store(true, Ordering::Release);
        self.remember_capture(capture.as_ref());
        match reason {
            RetireReason::WalLost | RetireReason::ShmLost => StoreError::WalLost {
                database: self.path.clone(),
                capture,
                capture_error,
                reason: Some(reason),
            },
            // MainReplaced, StaleWal, and any reason a later guard adds (`RetireReason` is
            // non-exhaustive): the handle's file is not the one at the path; reopen.
            _ => StoreError::MainReplaced {
                database: self.path.clone(),
                reason: Some(reason),
            },
        }
    }

    fn sqlite_error(&self, operation: &'static str, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            database: self.path.clone(),
            operation,
            source,
        }
    }

    fn capture_error(&self, err: GuardError) -> StoreError {
        match err {
            GuardError::Capture(e) => StoreError::CaptureFailed {
                database: self.path.clone(),
                message: e.to_string(),
                held_back: HeldBack::Close,
                source: Some(e),
            },
            GuardError::CaptureRefused { message, .. } => StoreError::CaptureFailed {
                database: self.path.clone(),
                message,
                held_back: HeldBack::Close,
                source: None,
            },
            source => self.guard_error(source),
        }
    }

    fn guard_error(&self, source: GuardError) -> StoreError {
        StoreError::Guard {
            database: self.path.clone(),
            source,
        }
    }

    fn json_error(&self, operation: &'static str, source: serde_json::Error) -> StoreError {
        StoreError::Json {
            database: self.path.clone(),
            operation,
            source,
        }
    }

    fn closed(&self) -> StoreError {
        StoreError::Closed {
            database: self.path.clone(),
        }
    }

    fn remember_capture(&self, capture: Option<&PathBuf>) {
        if let Some(dir) = capture {
            *self.capture.lock() = Some(dir.clone());
        }
    }
}

impl Drop for SessionDb {
    fn drop(&mut self) {
        // Dropping without close() still goes through the guarded close, so a retired generation
        // is captured; if that fails the guard keeps the retired bytes and
        // `hermes_guard::retry_pending_captures()` retries.
        if let Err(e) = self.close_in_place() {
            log::error!(
                "{}: dropped without a clean close: {e}",
                self.path.display()
            );
        }
    }
}

fn session_exists(conn: &Connection, id: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1)",
        [id],
        |r| r.get(0),
    )
}

fn message_row(r: &Row<'_>) -> rusqlite::Result<(Message, Option<String>)> {
    Ok((
        Message {
            id: r.get(0)?,
            session_id: r.get(1)?,
            role: r.get(2)?,
            content: r.get(3)?,
            tool_call_id: r.get(4)?,
            tool_calls: None,
            tool_name: r.get(6)?,
            timestamp: r.get(7)?,
            token_count: r.get(8)?,
            finish_reason: r.get(9)?,
            reasoning: r.get(10)?,
        },
        r.get(5)?,
    ))
}

fn passive_checkpoint(conn: &Connection, path: &Path) -> Option<Checkpoint> {
    let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok(Checkpoint {
            busy: r.get::<_, i64>(0)? != 0,
            log_frames: r.get(1)?,
            checkpointed_frames: r.get(2)?,
        })
    });
    match result {
        Ok(checkpoint) => Some(checkpoint),
        Err(e) => {
            log::debug!("{}: passive checkpoint: {e}", path.display());
            None
        }
    }
}

fn is_busy(err: &rusqlite::Error) -> bool {
    err.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
}

/// 20–150 ms, so writers that collided do not collide again in lockstep.
fn jitter() -> Duration {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_millis(20 + random % 131)
}

/// SHA-256 of the prompt, hex: the key that stores each distinct prompt once.
fn prompt_hash(prompt: &str) -> String {
    format!("{:x}", Sha256::digest(prompt.as_bytes()))
}
