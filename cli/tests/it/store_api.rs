//! The session store's API on a healthy database: round trips, upsert semantics, counters,
//! full-text search, unicode and large content, meta, schema migration.

use hermes_guard_store::{NewMessage, NewSession, Registry, SessionDb, StoreError, SCHEMA_VERSION};
use rusqlite::Connection;
use serde_json::json;

fn open(dir: &tempfile::TempDir) -> SessionDb {
    SessionDb::open(dir.path().join("state.db")).unwrap()
}

#[test]
fn open_creates_a_wal_database_through_the_guard_with_the_current_schema() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    let status = db.guard_status().expect("opened through hermes-guard");
    assert!(!status.retired);
    assert_eq!(status.main, db.generation());

    let raw = Connection::open(db.path()).unwrap();
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let version: i64 = raw
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    for table in [
        "sessions",
        "messages",
        "system_prompts",
        "state_meta",
        "messages_fts",
    ] {
        let n: i64 = raw
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = ?1",
                [table],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 1, "missing table {table}");
    }
}

#[test]
fn reopening_keeps_the_data_and_does_not_migrate_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    db.close().unwrap();
    let again = open(&dir);
    assert!(again.get_session("s1").unwrap().is_some());
    let raw = Connection::open(again.path()).unwrap();
    let rows: i64 = raw
        .query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1);
}

#[test]
fn session_round_trips_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("parent", "cli").unwrap();
    let config = json!({"temperature": 0.2, "tools": ["search", "shell"]});
    db.create_session(
        &NewSession::new("s1", "telegram")
            .user_id("u-7")
            .model("model-x")
            .model_config(config.clone())
            .system_prompt("You are terse.")
            .parent_session_id("parent"),
    )
    .unwrap();

    let s = db.get_session("s1").unwrap().expect("created");
    assert_eq!(s.id, "s1");
    assert_eq!(s.source, "telegram");
    assert_eq!(s.user_id.as_deref(), Some("u-7"));
    assert_eq!(s.model.as_deref(), Some("model-x"));
    assert_eq!(s.model_config, Some(config));
    assert_eq!(s.system_prompt.as_deref(), Some("You are terse."));
    assert_eq!(s.system_prompt_hash.as_ref().map(String::len), Some(64));
    assert_eq!(s.parent_session_id.as_deref(), Some("parent"));
    assert!(s.started_at > 1.6e9);
    assert_eq!(s.ended_at, None);
    assert_eq!((s.message_count, s.tool_call_count), (0, 0));
    assert_eq!((s.input_tokens, s.output_tokens), (0, 0));
    assert!(db.get_session("nope").unwrap().is_none());
}

#[test]
fn create_session_is_an_upsert_that_keeps_existing_values_and_fills_missing_ones() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.create_session(&NewSession::new("s1", "cli").model("first"))
        .unwrap();
    let started = db.get_session("s1").unwrap().unwrap().started_at;
    db.create_session(
        &NewSession::new("s1", "gateway")
            .model("second")
            .user_id("late-user")
            .model_config(json!({"k": 1})),
    )
    .unwrap();

    let s = db.get_session("s1").unwrap().unwrap();
    assert_eq!(s.source, "cli", "existing source kept");
    assert_eq!(s.model.as_deref(), Some("first"), "existing model kept");
    assert_eq!(
        s.user_id.as_deref(),
        Some("late-user"),
        "missing value filled"
    );
    assert_eq!(s.model_config, Some(json!({"k": 1})));
    assert_eq!(s.started_at, started, "start time kept");
}

#[test]
fn identical_system_prompts_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    let prompt = "A long system prompt ".repeat(200);
    for id in ["a", "b", "c"] {
        db.create_session(&NewSession::new(id, "cli").system_prompt(prompt.clone()))
            .unwrap();
    }
    db.create_session(&NewSession::new("d", "cli").system_prompt("other"))
        .unwrap();
    let raw = Connection::open(db.path()).unwrap();
    let stored: i64 = raw
        .query_row("SELECT COUNT(*) FROM system_prompts", [], |r| r.get(0))
        .unwrap();
    assert_eq!(stored, 2);
    assert_eq!(
        db.get_session("c").unwrap().unwrap().system_prompt,
        Some(prompt)
    );
}

#[test]
fn ensure_session_creates_once_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.create_session(&NewSession::new("s1", "cli").model("m"))
        .unwrap();
    assert!(!db.ensure_session("s1", "other").unwrap());
    assert_eq!(db.get_session("s1").unwrap().unwrap().source, "cli");
    assert!(db.ensure_session("s2", "cron").unwrap());
    assert_eq!(db.get_session("s2").unwrap().unwrap().source, "cron");
}

#[test]
fn end_session_records_the_first_end_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    assert!(db.end_session("s1", "user_exit").unwrap());
    assert!(!db.end_session("s1", "timeout").unwrap());
    let s = db.get_session("s1").unwrap().unwrap();
    assert_eq!(s.end_reason.as_deref(), Some("user_exit"));
    assert!(s.ended_at.unwrap() >= s.started_at);
}

#[test]
fn append_message_returns_the_row_id_and_bumps_the_counters_in_the_same_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    let first = db
        .append_message("s1", &NewMessage::new("user", "hello"))
        .unwrap();
    let calls = json!([{"id": "c1", "name": "search"}, {"id": "c2", "name": "shell"}]);
    let second = db
        .append_message(
            "s1",
            &NewMessage {
                role: "assistant".into(),
                tool_calls: Some(calls.clone()),
                finish_reason: Some("tool_calls".into()),
                reasoning: Some("two tools".into()),
                token_count: Some(42),
                ..NewMessage::default()
            },
        )
        .unwrap();
    let third = db
        .append_message(
            "s1",
            &NewMessage {
                role: "tool".into(),
                content: Some("result".into()),
                tool_call_id: Some("c1".into()),
                tool_name: Some("search".into()),
                ..NewMessage::default()
            },
        )
        .unwrap();
    assert!(first < second && second < third);

    let s = db.get_session("s1").unwrap().unwrap();
    assert_eq!(s.message_count, 3);
    assert_eq!(s.tool_call_count, 2);

    let messages = db.get_messages("s1").unwrap();
    assert_eq!(
        messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        [first, second, third]
    );
    assert_eq!(messages[0].content.as_deref(), Some("hello"));
    assert_eq!(messages[1].tool_calls, Some(calls));
    assert_eq!(messages[1].content, None);
    assert_eq!(messages[1].finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(messages[1].reasoning.as_deref(), Some("two tools"));
    assert_eq!(messages[1].token_count, Some(42));
    assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(messages[2].tool_name.as_deref(), Some("search"));
}

#[test]
fn get_messages_orders_by_timestamp_then_id() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    let late = db
        .append_message("s1", &NewMessage::new("user", "late").timestamp(2000.0))
        .unwrap();
    let early = db
        .append_message("s1", &NewMessage::new("user", "early").timestamp(1000.0))
        .unwrap();
    let ids: Vec<i64> = db
        .get_messages("s1")
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, [early, late]);
    assert!(db.get_messages("other").unwrap().is_empty());
}

#[test]
fn a_message_for_an_unknown_session_is_a_typed_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    let err = db
        .append_message("ghost", &NewMessage::new("user", "boo"))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::UnknownSession { session_id, .. } if session_id == "ghost"),
        "{err}"
    );
    assert!(db.get_messages("ghost").unwrap().is_empty());
    assert!(matches!(
        db.end_session("ghost", "x"),
        Err(StoreError::UnknownSession { .. })
    ));
    assert!(matches!(
        db.update_token_counts("ghost", 1, 1),
        Err(StoreError::UnknownSession { .. })
    ));
    assert!(matches!(
        db.create_session(&NewSession::new("child", "cli").parent_session_id("ghost")),
        Err(StoreError::UnknownSession { .. })
    ));
    assert!(db.get_session("child").unwrap().is_none());
}

#[test]
fn token_counts_accumulate_and_titles_are_set() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    db.update_token_counts("s1", 100, 20).unwrap();
    db.update_token_counts("s1", 5, 1).unwrap();
    db.set_session_title("s1", "Planning the move").unwrap();
    let s = db.get_session("s1").unwrap().unwrap();
    assert_eq!((s.input_tokens, s.output_tokens), (105, 21));
    assert_eq!(s.title.as_deref(), Some("Planning the move"));
}

#[test]
fn search_finds_messages_with_snippets_around_the_match() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    db.ensure_session("s2", "telegram").unwrap();
    let hit = db
        .append_message(
            "s1",
            &NewMessage::new(
                "user",
                "please remind me to water the ficus on tuesday morning",
            ),
        )
        .unwrap();
    db.append_message("s2", &NewMessage::new("assistant", "nothing relevant here"))
        .unwrap();
    db.append_message(
        "s2",
        &NewMessage {
            role: "assistant".into(),
            tool_calls: Some(json!([{"name": "noop"}])),
            ..NewMessage::default()
        },
    )
    .unwrap();

    let hits = db.search_messages("ficus", 10).unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].message_id, hit);
    assert_eq!(hits[0].session_id, "s1");
    assert_eq!(hits[0].source, "cli");
    assert_eq!(hits[0].role, "user");
    assert!(
        hits[0].snippet.contains(">>>ficus<<<"),
        "{}",
        hits[0].snippet
    );

    assert_eq!(db.search_messages("\"water the\"", 10).unwrap().len(), 1);
    assert_eq!(db.search_messages("tues*", 10).unwrap().len(), 1);
    assert!(db.search_messages("cactus", 10).unwrap().is_empty());
}

#[test]
fn search_limit_and_ranking() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    for i in 0..5 {
        db.append_message("s1", &NewMessage::new("user", format!("deploy number {i}")))
            .unwrap();
    }
    let dense = db
        .append_message("s1", &NewMessage::new("user", "deploy deploy deploy"))
        .unwrap();
    let hits = db.search_messages("deploy", 3).unwrap();
    assert_eq!(hits.len(), 3);
    assert_eq!(hits[0].message_id, dense, "best match first");
}

#[test]
fn a_malformed_search_query_is_a_clear_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.ensure_session("s1", "cli").unwrap();
    db.append_message("s1", &NewMessage::new("user", "text"))
        .unwrap();
    for bad in ["\"unterminated", "AND OR", "nosuchcolumn:word", "(("] {
        let err = db.search_messages(bad, 10).unwrap_err();
        match &err {
            StoreError::InvalidSearchQuery { query, message, .. } => {
                assert_eq!(query, bad);
                assert!(!message.is_empty());
            }
            other => panic!("{bad:?}: expected InvalidSearchQuery, got {other:?}"),
        }
        assert!(err.to_string().contains("invalid search query"));
    }
    // The handle is fine afterwards.
    assert_eq!(db.search_messages("text", 10).unwrap().len(), 1);
}

#[test]
fn unicode_and_large_content_round_trip_and_are_searchable() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    db.create_session(
        &NewSession::new("sess-ü", "cli").model_config(json!({"greeting": "こんにちは 👋"})),
    )
    .unwrap();
    let unicode = "Grüße aus Köln — naïve café, emoji 🦀🔥, RTL שלום, CJK 日本語テキスト";
    let large = format!("start {} finish", "ünïcödé ".repeat(200_000 / 8));
    db.append_message("sess-ü", &NewMessage::new("user", unicode))
        .unwrap();
    db.append_message("sess-ü", &NewMessage::new("assistant", large.clone()))
        .unwrap();

    let messages = db.get_messages("sess-ü").unwrap();
    assert_eq!(messages[0].content.as_deref(), Some(unicode));
    assert_eq!(messages[1].content.as_deref(), Some(large.as_str()));
    assert_eq!(
        db.get_session("sess-ü").unwrap().unwrap().model_config,
        Some(json!({"greeting": "こんにちは 👋"}))
    );

    let hits = db.search_messages("café", 10).unwrap();
    assert_eq!(hits.len(), 1);
    assert!(
        hits[0].snippet.contains(">>>café<<<"),
        "{}",
        hits[0].snippet
    );
    assert_eq!(
        db.search_messages("köln", 10).unwrap().len(),
        1,
        "case folded"
    );
    let hits = db.search_messages("finish", 10).unwrap();
    assert_eq!(hits.len(), 1);
    assert!(
        hits[0].snippet.len() < 2000,
        "a snippet, not the whole text"
    );
}

#[test]
fn meta_round_trips_and_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir);
    assert_eq!(db.get_meta("k").unwrap(), None);
    db.set_meta("k", "v1").unwrap();
    db.set_meta("k", "v2").unwrap();
    db.set_meta("other", "x").unwrap();
    assert_eq!(db.get_meta("k").unwrap().as_deref(), Some("v2"));
    assert_eq!(db.get_meta("other").unwrap().as_deref(), Some("x"));
}

#[test]
fn try_wal_checkpoint_copies_the_wal_into_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open_with(
        dir.path().join("state.db"),
        hermes_guard_store::StoreOptions {
            wal_autocheckpoint: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    db.ensure_session("s1", "cli").unwrap();
    let checkpoint = db.try_wal_checkpoint().expect("ran");
    assert!(!checkpoint.busy);
    assert!(checkpoint.log_frames > 0);
    assert_eq!(checkpoint.checkpointed_frames, checkpoint.log_frames);
}

#[test]
fn a_closed_handle_gives_a_closed_error_and_closing_again_is_harmless() {
    // An owned `SessionDb` is consumed by its close; a closed handle is one the registry's
    // `close_all` closed under its holder.
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new();
    let db = registry.acquire(dir.path().join("state.db")).unwrap();
    assert_eq!(registry.close_all(), 0);
    assert!(db.is_closed());
    for err in [
        db.ensure_session("s", "cli").unwrap_err(),
        db.get_session("s").unwrap_err(),
        db.search_messages("x", 1).unwrap_err(),
        db.set_meta("k", "v").unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::Closed { .. }), "{err}");
        assert!(!err.is_retired());
    }
    assert!(db.try_wal_checkpoint().is_none());
    db.close().unwrap();
}

#[test]
fn a_version_1_database_is_migrated_and_its_old_messages_become_searchable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        // What the first version of the store wrote.
        let raw = Connection::open(&path).unwrap();
        raw.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE schema_version (version INTEGER NOT NULL);
             INSERT INTO schema_version VALUES (1);
             CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT,
                 model TEXT, model_config TEXT, parent_session_id TEXT REFERENCES sessions(id),
                 started_at REAL NOT NULL, ended_at REAL, end_reason TEXT,
                 message_count INTEGER NOT NULL DEFAULT 0,
                 tool_call_count INTEGER NOT NULL DEFAULT 0,
                 input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
                 title TEXT);
             CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
                 session_id TEXT NOT NULL REFERENCES sessions(id), role TEXT NOT NULL,
                 content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
                 timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT,
                 reasoning TEXT);
             CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
             CREATE INDEX idx_sessions_parent ON sessions(parent_session_id);
             CREATE INDEX idx_sessions_started ON sessions(started_at);
             CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT);
             INSERT INTO sessions (id, source, started_at, message_count) VALUES ('old', 'cli', 1, 1);
             INSERT INTO messages (session_id, role, content, timestamp)
                 VALUES ('old', 'user', 'an archaeological message', 1);",
        )
        .unwrap();
    }
    let db = SessionDb::open(&path).unwrap();
    let hits = db.search_messages("archaeological", 10).unwrap();
    assert_eq!(hits.len(), 1, "messages from before FTS are indexed");
    db.create_session(&NewSession::new("new", "cli").system_prompt("p"))
        .unwrap();
    assert_eq!(
        db.get_session("new")
            .unwrap()
            .unwrap()
            .system_prompt
            .as_deref(),
        Some("p")
    );
    assert_eq!(db.get_session("old").unwrap().unwrap().message_count, 1);
}

#[test]
fn a_schema_newer_than_this_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    SessionDb::open(&path).unwrap().close().unwrap();
    let raw = Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE schema_version SET version = ?1",
        [SCHEMA_VERSION + 1],
    )
    .unwrap();
    drop(raw);
    match SessionDb::open(&path) {
        Err(StoreError::SchemaTooNew {
            found, supported, ..
        }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}
