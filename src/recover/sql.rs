//! SQL text shared by every part of recovery.

/// `"name"`, with inner quotes doubled: an SQL identifier, whatever its characters.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
