//! Messages: append (with the session's counters in the same transaction) and read back.

use rusqlite::params;

use super::{message_row, model, Message, NewMessage, SessionDb, StoreError, TxError};

impl SessionDb {
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
}
