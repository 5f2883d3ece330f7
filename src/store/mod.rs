//! SessionDb: sessions, messages and full-text search on a guarded database.
//!
//! Every connection is opened through the `hermes-guard` VFS, so a write that would land in a
//! retired generation (the `-wal`/`-shm` taken away, or the file at the path replaced) is refused
//! before any byte of it reaches a file. The store turns that refusal into
//! [`StoreError::DeletedWalGeneration`] or [`StoreError::StateDbReplaced`], from every public
//! write method, every time; and its `close()` refuses to settle until a retired generation is
//! captured. `docs/store.md` has the whole story.

mod error;
mod model;
mod schema;
mod search;

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use sha2::{Digest, Sha256};

use crate::error::GuardError;
use crate::identity::FileId;
use crate::status::{ErrorClass, GuardStatus, RetireReason};

pub use error::{HeldBack, StoreError};
pub use model::{Checkpoint, Message, NewMessage, NewSession, SearchHit, Session};
pub use schema::SCHEMA_VERSION;

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
/// [registry](crate::registry).
pub struct SessionDb {
    path: PathBuf,
    options: StoreOptions,
    conn: Mutex<Option<Connection>>,
    /// The main file's identity when this handle opened it: its generation.
    generation: Option<FileId>,
    /// The last capture of this handle's retired generation the guard reported, kept after close.
    capture: Mutex<Option<PathBuf>>,
    /// Lent by the registry: `close()` must go through the handle so others are not closed under.
    shared: AtomicBool,
    /// A write was refused or the guard reported this generation retired.
    retired_seen: AtomicBool,
    /// What the self-healing merged at open.
    healed: Vec<crate::recover::Healed>,
}

impl std::fmt::Debug for SessionDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionDb")
            .field("path", &self.path)
            .field("generation", &self.generation)
            .field("closed", &self.is_closed())
            .field("shared", &self.shared.load(Ordering::Relaxed))
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
        crate::register().map_err(|source| StoreError::Guard {
            database: path.clone(),
            source,
        })?;
        let conn =
            Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), crate::VFS_NAME)
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
            shared: AtomicBool::new(false),
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
                conn.busy_timeout(db.options.busy_timeout)?;
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
                db.healed = crate::recover::heal_store(conn, &db.path);
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
    pub fn healed(&self) -> &[crate::recover::Healed] {
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
        let status = crate::status(conn).map_err(|source| self.guard_error(source))?;
        self.remember_capture(status.capture.as_ref());
        if status.retired {
            self.retired_seen.store(true, Ordering::Release);
        }
        Ok(status)
    }

    /// Where this handle's retired generation was captured, if it was; still known after close.
    pub fn retired_generation_capture(&self) -> Option<PathBuf> {
        if let Some(conn) = self.conn.lock().as_ref() {
            if let Ok(status) = crate::status(conn) {
                self.remember_capture(status.capture.as_ref());
            }
        }
        self.capture.lock().clone()
    }

    // ── sessions ────────────────────────────────────────────────────────────────────────────

    /// Creates a session; if it exists already, keeps every value it has and only fills in the
    /// ones it lacks (an upsert that never overwrites).
    pub fn create_session(&self, session: &NewSession) -> Result<(), StoreError> {
        let model_config = session
            .model_config
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|source| self.json_error("create_session", source))?;
        let prompt_hash = session.system_prompt.as_deref().map(prompt_hash);
        self.write("create_session", |conn| {
            if let Some(parent) = &session.parent_session_id {
                if parent != &session.id && !session_exists(conn, parent)? {
                    return Err(TxError::UnknownSession(parent.clone()));
                }
            }
            if let (Some(hash), Some(prompt)) = (&prompt_hash, &session.system_prompt) {
                conn.execute(
                    "INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?1, ?2)",
                    params![hash, prompt],
                )?;
            }
            conn.execute(
                "INSERT INTO sessions (id, source, user_id, model, model_config,
                     system_prompt_hash, parent_session_id, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(id) DO UPDATE SET
                     user_id = COALESCE(sessions.user_id, excluded.user_id),
                     model = COALESCE(sessions.model, excluded.model),
                     model_config = COALESCE(sessions.model_config, excluded.model_config),
                     system_prompt_hash =
                         COALESCE(sessions.system_prompt_hash, excluded.system_prompt_hash),
                     parent_session_id =
                         COALESCE(sessions.parent_session_id, excluded.parent_session_id)",
                params![
                    session.id,
                    session.source,
                    session.user_id,
                    session.model,
                    model_config,
                    prompt_hash,
                    session.parent_session_id,
                    model::now(),
                ],
            )?;
            Ok(())
        })
    }

    /// Creates the session `id` with only its source if it does not exist; true if it created it.
    pub fn ensure_session(&self, id: &str, source: &str) -> Result<bool, StoreError> {
        self.write("ensure_session", |conn| {
            Ok(conn.execute(
                "INSERT OR IGNORE INTO sessions (id, source, started_at) VALUES (?1, ?2, ?3)",
                params![id, source, model::now()],
            )? == 1)
        })
    }

    /// The session `id`, with its system prompt, or `None`.
    pub fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let row = self.read("get_session", |conn| {
            conn.query_row(
                "SELECT s.id, s.source, s.user_id, s.model, s.model_config, s.system_prompt_hash,
                        p.prompt, s.parent_session_id, s.started_at, s.ended_at, s.end_reason,
                        s.message_count, s.tool_call_count, s.input_tokens, s.output_tokens,
                        s.title
                 FROM sessions s LEFT JOIN system_prompts p ON p.hash = s.system_prompt_hash
                 WHERE s.id = ?1",
                [id],
                |r| {
                    Ok((
                        Session {
                            id: r.get(0)?,
                            source: r.get(1)?,
                            user_id: r.get(2)?,
                            model: r.get(3)?,
                            model_config: None,
                            system_prompt_hash: r.get(5)?,
                            system_prompt: r.get(6)?,
                            parent_session_id: r.get(7)?,
                            started_at: r.get(8)?,
                            ended_at: r.get(9)?,
                            end_reason: r.get(10)?,
                            message_count: r.get(11)?,
                            tool_call_count: r.get(12)?,
                            input_tokens: r.get(13)?,
                            output_tokens: r.get(14)?,
                            title: r.get(15)?,
                        },
                        r.get::<_, Option<String>>(4)?,
                    ))
                },
            )
            .optional()
        })?;
        let Some((mut session, config)) = row else {
            return Ok(None);
        };
        session.model_config = config
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|source| self.json_error("get_session", source))?;
        Ok(Some(session))
    }

    /// Ends the session `id` with `reason`. The first end is kept: ending an ended session
    /// changes nothing and returns false.
    pub fn end_session(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        self.write("end_session", |conn| {
            if !session_exists(conn, id)? {
                return Err(TxError::UnknownSession(id.to_owned()));
            }
            Ok(conn.execute(
                "UPDATE sessions SET ended_at = ?2, end_reason = ?3
                 WHERE id = ?1 AND ended_at IS NULL",
                params![id, model::now(), reason],
            )? == 1)
        })
    }

    /// Adds to the session's input and output token counts.
    pub fn update_token_counts(
        &self,
        id: &str,
        input_tokens: i64,
        output_tokens: i64,
    ) -> Result<(), StoreError> {
        self.write("update_token_counts", |conn| {
            let n = conn.execute(
                "UPDATE sessions SET input_tokens = input_tokens + ?2,
                                     output_tokens = output_tokens + ?3
                 WHERE id = ?1",
                params![id, input_tokens, output_tokens],
            )?;
            if n == 0 {
                return Err(TxError::UnknownSession(id.to_owned()));
            }
            Ok(())
        })
    }

    /// Sets the session's title.
    pub fn set_session_title(&self, id: &str, title: &str) -> Result<(), StoreError> {
        self.write("set_session_title", |conn| {
            let n = conn.execute(
                "UPDATE sessions SET title = ?2 WHERE id = ?1",
                params![id, title],
            )?;
            if n == 0 {
                return Err(TxError::UnknownSession(id.to_owned()));
            }
            Ok(())
        })
    }

    // ── messages ────────────────────────────────────────────────────────────────────────────

    /// Appends a message to the session `session_id` and, in the same transaction, bumps the
    /// session's message and tool-call counters. Returns the message's row id.
    pub fn append_message(
        &self,
        session_id: &str,
        message: &NewMessage,
    ) -> Result<i64, StoreError> {
        let tool_calls = message
            .tool_calls
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|source| self.json_error("append_message", source))?;
        let timestamp = message.timestamp.unwrap_or_else(model::now);
        self.write("append_message", |conn| {
            let bumped = conn.execute(
                "UPDATE sessions SET message_count = message_count + 1,
                                     tool_call_count = tool_call_count + ?2
                 WHERE id = ?1",
                params![session_id, message.tool_call_count()],
            )?;
            if bumped == 0 {
                return Err(TxError::UnknownSession(session_id.to_owned()));
            }
            conn.execute(
                "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls,
                     tool_name, timestamp, token_count, finish_reason, reasoning)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    session_id,
                    message.role,
                    message.content,
                    message.tool_call_id,
                    tool_calls,
                    message.tool_name,
                    timestamp,
                    message.token_count,
                    message.finish_reason,
                    message.reasoning,
                ],
            )?;
            Ok(conn.last_insert_rowid())
        })
    }

    /// The messages of `session_id`, oldest first.
    pub fn get_messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        let rows = self.read("get_messages", |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, session_id, role, content, tool_call_id, tool_calls, tool_name,
                        timestamp, token_count, finish_reason, reasoning
                 FROM messages WHERE session_id = ?1 ORDER BY timestamp, id",
            )?;
            let rows = stmt.query_map([session_id], message_row)?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        rows.into_iter()
            .map(|(mut message, tool_calls)| {
                message.tool_calls = tool_calls
                    .map(|text| serde_json::from_str(&text))
                    .transpose()
                    .map_err(|source| self.json_error("get_messages", source))?;
                Ok(message)
            })
            .collect()
    }

    // ── meta ────────────────────────────────────────────────────────────────────────────────

    /// The value stored under `key`.
    pub fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.read("get_meta", |conn| {
            conn.query_row("SELECT value FROM state_meta WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()
            .map(Option::flatten)
        })
    }

    /// Stores `value` under `key`, replacing what was there.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.write("set_meta", |conn| {
            conn.execute(
                "INSERT INTO state_meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )?;
            Ok(())
        })
    }

    // ── upkeep ──────────────────────────────────────────────────────────────────────────────

    /// Runs a PASSIVE checkpoint, which never waits for readers or writers. Never fails loudly:
    /// any error is logged at DEBUG and `None` returned. Does nothing on a closed handle or a
    /// retired generation (which the guard would refuse anyway: it is never checkpointed).
    pub fn try_wal_checkpoint(&self) -> Option<Checkpoint> {
        let slot = self.conn.lock();
        let conn = slot.as_ref()?;
        match crate::status(conn) {
            Ok(status) if status.retired => {
                log::debug!(
                    "{}: not checkpointing a retired generation",
                    self.path.display()
                );
                return None;
            }
            Ok(_) => {}
            Err(e) => log::debug!(
                "{}: guard status before checkpoint: {e}",
                self.path.display()
            ),
        }
        passive_checkpoint(conn, &self.path)
    }

    /// If this handle's generation is retired, makes sure its capture exists (trigger `close`
    /// when the loss is first seen here) and returns where it is; `Ok(None)` when the generation
    /// is live or its lost WAL held no complete frame. On failure returns
    /// [`StoreError::RetiredGenerationCapture`]; the handle is untouched and a later call retries.
    pub fn ensure_captured(&self) -> Result<Option<PathBuf>, StoreError> {
        let slot = self.conn.lock();
        let conn = slot.as_ref().ok_or_else(|| self.closed())?;
        let status = crate::ensure_captured(conn).map_err(|e| self.capture_error(e))?;
        self.remember_capture(status.capture.as_ref());
        if status.retired {
            self.retired_seen.store(true, Ordering::Release);
        }
        Ok(status.capture)
    }

    /// Closes the handle. If its generation was retired, first makes sure the retired generation
    /// is captured (trigger `close` when the loss is first seen here); if that fails, returns
    /// [`StoreError::RetiredGenerationCapture`] and stays open, usable, so a later `close()` can
    /// retry. A live handle gets a PASSIVE checkpoint first; a retired one is never checkpointed.
    /// Closing a closed handle does nothing.
    ///
    /// A `SessionDb` lent by the registry is closed through its
    /// [`SharedSessionDb`](crate::registry::SharedSessionDb) handle; here it returns
    /// [`StoreError::Shared`] and closes nothing.
    pub fn close(&self) -> Result<(), StoreError> {
        if self.shared.load(Ordering::Acquire) {
            return Err(StoreError::Shared {
                database: self.path.clone(),
            });
        }
        self.close_unshared()
    }

    /// The close itself, whoever owns the handle.
    pub(crate) fn close_unshared(&self) -> Result<(), StoreError> {
        let mut slot = self.conn.lock();
        let Some(conn) = slot.take() else {
            return Ok(());
        };
        match crate::ensure_captured(&conn) {
            Ok(status) => {
                self.remember_capture(status.capture.as_ref());
                if !status.retired {
                    // Keeps the WAL short for the connections that stay; best effort.
                    passive_checkpoint(&conn, &self.path);
                }
            }
            Err(e) => {
                *slot = Some(conn);
                return Err(self.capture_error(e));
            }
        }
        match crate::close(conn) {
            Ok(()) => {
                // The guard may have captured at close (the loss first seen there): read it back.
                log::debug!("{}: closed", self.path.display());
                Ok(())
            }
            Err((conn, e)) => {
                if let Ok(status) = crate::status(&conn) {
                    self.remember_capture(status.capture.as_ref());
                }
                *slot = Some(conn);
                Err(self.capture_error(e))
            }
        }
    }

    /// Whether this handle has seen its generation retired (a refused write, or a status that
    /// said so). Runs no check: [`guard_status`](SessionDb::guard_status) does. Only a replaced
    /// main file stops the registry lending a generation; one whose `-wal`/`-shm` was lost is
    /// lent until its last holder releases it.
    pub fn has_seen_retirement(&self) -> bool {
        self.retired_seen.load(Ordering::Acquire)
    }

    pub(crate) fn mark_shared(&self) {
        self.shared.store(true, Ordering::Release);
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
        let Ok(status) = crate::status(conn) else {
            return self.sqlite_error(operation, err);
        };
        // Classifies a refusal, and an I/O-level failure of a connection whose generation is gone
        // (e.g. a read through a -shm mapping that was unlinked), by the retirement reason.
        match (ErrorClass::from_parts(&err, status.reason), status.reason) {
            (ErrorClass::WalGenerationLost | ErrorClass::DatabaseReplaced, Some(reason)) => {
                self.retired_error(reason, status.capture, status.capture_error)
            }
            _ => self.sqlite_error(operation, err),
        }
    }

    /// The typed error for a retired generation: a lost sidecar is
    /// [`StoreError::DeletedWalGeneration`], a replaced main file [`StoreError::StateDbReplaced`].
    fn retired_error(
        &self,
        reason: RetireReason,
        capture: Option<PathBuf>,
        capture_error: Option<String>,
    ) -> StoreError {
        self.retired_seen.store(true, Ordering::Release);
        self.remember_capture(capture.as_ref());
        match reason {
            RetireReason::WalLost | RetireReason::ShmLost => StoreError::DeletedWalGeneration {
                database: self.path.clone(),
                capture,
                capture_error,
                reason: Some(reason),
            },
            RetireReason::MainReplaced => StoreError::StateDbReplaced {
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
            GuardError::CaptureFailed { message, .. } => StoreError::RetiredGenerationCapture {
                database: self.path.clone(),
                message,
                held_back: HeldBack::Close,
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
        if let Err(e) = self.close_unshared() {
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
