//! The `state_meta` key-value table.

use rusqlite::{params, OptionalExtension};

use super::{SessionDb, StoreError};

impl SessionDb {
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
}
