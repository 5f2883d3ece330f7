//! The values the store takes and gives back.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// A session to create (see [`SessionDb::create_session`](super::SessionDb::create_session)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewSession {
    /// The session's id.
    pub id: String,
    /// Where it comes from (`cli`, `telegram`, ...).
    pub source: String,
    /// The user, when known.
    pub user_id: Option<String>,
    /// The model's name.
    pub model: Option<String>,
    /// The model's configuration, stored as JSON text.
    pub model_config: Option<Value>,
    /// The system prompt, stored once per distinct content.
    pub system_prompt: Option<String>,
    /// The session this one was forked or continued from.
    pub parent_session_id: Option<String>,
}

impl NewSession {
    /// A session with only its id and source set.
    pub fn new(id: impl Into<String>, source: impl Into<String>) -> NewSession {
        NewSession {
            id: id.into(),
            source: source.into(),
            ..NewSession::default()
        }
    }

    /// Sets the user.
    pub fn user_id(mut self, user_id: impl Into<String>) -> Self {
        self.user_id = Some(user_id.into());
        self
    }

    /// Sets the model.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sets the model's configuration.
    pub fn model_config(mut self, config: Value) -> Self {
        self.model_config = Some(config);
        self
    }

    /// Sets the system prompt.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// Sets the parent session.
    pub fn parent_session_id(mut self, parent: impl Into<String>) -> Self {
        self.parent_session_id = Some(parent.into());
        self
    }
}

/// A stored session.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// The session's id.
    pub id: String,
    /// Where it comes from.
    pub source: String,
    /// The user, when known.
    pub user_id: Option<String>,
    /// The model's name.
    pub model: Option<String>,
    /// The model's configuration.
    pub model_config: Option<Value>,
    /// The content hash (SHA-256, hex) of the system prompt.
    pub system_prompt_hash: Option<String>,
    /// The system prompt.
    pub system_prompt: Option<String>,
    /// The parent session.
    pub parent_session_id: Option<String>,
    /// When it started, in seconds since the Unix epoch.
    pub started_at: f64,
    /// When it ended, in seconds since the Unix epoch.
    pub ended_at: Option<f64>,
    /// Why it ended.
    pub end_reason: Option<String>,
    /// Messages appended so far.
    pub message_count: i64,
    /// Tool calls carried by those messages.
    pub tool_call_count: i64,
    /// Input tokens counted so far.
    pub input_tokens: i64,
    /// Output tokens counted so far.
    pub output_tokens: i64,
    /// The session's title.
    pub title: Option<String>,
}

/// A message to append (see [`SessionDb::append_message`](super::SessionDb::append_message)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewMessage {
    /// `user`, `assistant`, `tool`, `system`.
    pub role: String,
    /// The text, when there is one.
    pub content: Option<String>,
    /// The tool call this message answers.
    pub tool_call_id: Option<String>,
    /// The tool calls this message makes, as JSON (an array counts one call per element).
    pub tool_calls: Option<Value>,
    /// The tool's name.
    pub tool_name: Option<String>,
    /// When it was written, in seconds since the Unix epoch; now when `None`.
    pub timestamp: Option<f64>,
    /// Its size in tokens.
    pub token_count: Option<i64>,
    /// Why generation stopped.
    pub finish_reason: Option<String>,
    /// The model's reasoning text.
    pub reasoning: Option<String>,
}

impl NewMessage {
    /// A message with a role and text content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> NewMessage {
        NewMessage {
            role: role.into(),
            content: Some(content.into()),
            ..NewMessage::default()
        }
    }

    /// Sets the tool calls.
    pub fn tool_calls(mut self, calls: Value) -> Self {
        self.tool_calls = Some(calls);
        self
    }

    /// Sets the timestamp.
    pub fn timestamp(mut self, timestamp: f64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// How many tool calls the message carries.
    pub(crate) fn tool_call_count(&self) -> i64 {
        match &self.tool_calls {
            None | Some(Value::Null) => 0,
            Some(Value::Array(calls)) => calls.len() as i64,
            Some(_) => 1,
        }
    }
}

/// A stored message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The row id.
    pub id: i64,
    /// The session it belongs to.
    pub session_id: String,
    /// Its role.
    pub role: String,
    /// Its text.
    pub content: Option<String>,
    /// The tool call it answers.
    pub tool_call_id: Option<String>,
    /// The tool calls it makes.
    pub tool_calls: Option<Value>,
    /// The tool's name.
    pub tool_name: Option<String>,
    /// When it was written, in seconds since the Unix epoch.
    pub timestamp: f64,
    /// Its size in tokens.
    pub token_count: Option<i64>,
    /// Why generation stopped.
    pub finish_reason: Option<String>,
    /// The model's reasoning text.
    pub reasoning: Option<String>,
}

/// One full-text match (see [`SessionDb::search_messages`](super::SessionDb::search_messages)).
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// The message's row id.
    pub message_id: i64,
    /// Its session.
    pub session_id: String,
    /// The session's source.
    pub source: String,
    /// The message's role.
    pub role: String,
    /// The matching text around the match, terms wrapped in `>>>` and `<<<`, elisions as `...`.
    pub snippet: String,
    /// When the message was written.
    pub timestamp: f64,
}

/// What a PASSIVE checkpoint did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Whether a writer or reader kept it from finishing.
    pub busy: bool,
    /// Frames in the WAL.
    pub log_frames: i64,
    /// Frames copied into the database file.
    pub checkpointed_frames: i64,
}

pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
