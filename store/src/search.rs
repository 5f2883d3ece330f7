//! Full-text search over message content (FTS5).

use rusqlite::params;

use super::{SearchHit, SessionDb, StoreError};

impl SessionDb {
    /// Messages whose content matches the FTS5 `query`, best first, at most `limit`, each with a
    /// snippet of the matching text (terms wrapped in `>>>`/`<<<`, elisions as `...`).
    ///
    /// `query` is FTS5 query syntax (`word`, `"a phrase"`, `a AND b`, `pre*`, ...). A query FTS5
    /// cannot parse is [`StoreError::InvalidSearchQuery`], carrying FTS5's own message.
    pub fn search_messages(&self, query: &str, limit: usize) -> Result<Vec<SearchHit>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let result = self.read("search_messages", |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT m.id, m.session_id, s.source, m.role,
                        snippet(messages_fts, 0, '>>>', '<<<', '...', 40), m.timestamp
                 FROM messages_fts
                 JOIN messages m ON m.id = messages_fts.rowid
                 JOIN sessions s ON s.id = m.session_id
                 WHERE messages_fts MATCH ?1
                 ORDER BY rank
                 LIMIT ?2",
            )?;
            let hits = stmt.query_map(params![query, limit], |r| {
                Ok(SearchHit {
                    message_id: r.get(0)?,
                    session_id: r.get(1)?,
                    source: r.get(2)?,
                    role: r.get(3)?,
                    snippet: r.get(4)?,
                    timestamp: r.get(5)?,
                })
            })?;
            hits.collect::<rusqlite::Result<Vec<_>>>()
        });
        match result {
            // The statement itself is fixed and known to be valid, so a plain SQLITE_ERROR here
            // is FTS5 rejecting the query ("fts5: syntax error near ...", "no such column").
            Err(StoreError::Sqlite {
                source: rusqlite::Error::SqliteFailure(e, message),
                ..
            }) if e.code == rusqlite::ErrorCode::Unknown => Err(StoreError::InvalidSearchQuery {
                database: self.path().to_path_buf(),
                query: query.to_owned(),
                message: message.unwrap_or_else(|| e.to_string()),
            }),
            other => other,
        }
    }
}
