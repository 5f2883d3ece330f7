//! Sessions: create, ensure, read, end, count tokens, title.

use rusqlite::{params, OptionalExtension};

use super::{
    model, prompt_hash, session_exists, NewSession, Session, SessionDb, StoreError, TxError,
};

impl SessionDb {
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
}
