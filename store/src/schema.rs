//! The store's schema and its migrations.
//!
//! Each migration runs once, in order, inside the write transaction that records its version, so
//! two processes opening the same fresh database cannot both apply one: the second finds the
//! version already bumped once it gets the write lock.

use rusqlite::{Connection, OptionalExtension};

/// The newest schema version this build writes.
pub const SCHEMA_VERSION: i64 = 3;

/// `(version, SQL)`, applied in order to bring a database from `version - 1` to `version`.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE sessions (
             id TEXT PRIMARY KEY,
             source TEXT NOT NULL,
             user_id TEXT,
             model TEXT,
             model_config TEXT,
             parent_session_id TEXT REFERENCES sessions(id),
             started_at REAL NOT NULL,
             ended_at REAL,
             end_reason TEXT,
             message_count INTEGER NOT NULL DEFAULT 0,
             tool_call_count INTEGER NOT NULL DEFAULT 0,
             input_tokens INTEGER NOT NULL DEFAULT 0,
             output_tokens INTEGER NOT NULL DEFAULT 0,
             title TEXT
         );
         CREATE TABLE messages (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             session_id TEXT NOT NULL REFERENCES sessions(id),
             role TEXT NOT NULL,
             content TEXT,
             tool_call_id TEXT,
             tool_calls TEXT,
             tool_name TEXT,
             timestamp REAL NOT NULL,
             token_count INTEGER,
             finish_reason TEXT,
             reasoning TEXT
         );
         CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
         CREATE INDEX idx_sessions_parent ON sessions(parent_session_id);
         CREATE INDEX idx_sessions_started ON sessions(started_at);
         CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT);",
    ),
    (
        // Long system prompts repeat across sessions: store each once, by content hash.
        2,
        "CREATE TABLE system_prompts (hash TEXT PRIMARY KEY, prompt TEXT NOT NULL);
         ALTER TABLE sessions ADD COLUMN system_prompt_hash TEXT REFERENCES system_prompts(hash);",
    ),
    (
        // External-content FTS5 over messages.content, kept in step by triggers; the rebuild
        // indexes the messages written before this version.
        3,
        "CREATE VIRTUAL TABLE messages_fts USING fts5(
             content, content='messages', content_rowid='id'
         );
         CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
             INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
         END;
         CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
             INSERT INTO messages_fts(messages_fts, rowid, content)
                 VALUES ('delete', old.id, old.content);
         END;
         CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
             INSERT INTO messages_fts(messages_fts, rowid, content)
                 VALUES ('delete', old.id, old.content);
             INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
         END;
         INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');",
    ),
];

/// The version recorded in the database; 0 for a database the store never touched.
pub(crate) fn current_version(conn: &Connection) -> rusqlite::Result<i64> {
    let has_table: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version')",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(0);
    }
    let version: Option<i64> = conn
        .query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))
        .optional()?
        .flatten();
    Ok(version.unwrap_or(0))
}

/// Applies every migration above the recorded version. Runs inside the caller's write
/// transaction; returns the version found before migrating.
pub(crate) fn migrate(conn: &Connection) -> rusqlite::Result<i64> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let found = current_version(conn)?;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        conn.execute_batch(sql)?;
        conn.execute("DELETE FROM schema_version", [])?;
        conn.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [version],
        )?;
        log::debug!("session store schema migrated to version {version}");
    }
    Ok(found)
}
