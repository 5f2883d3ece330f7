//! The guard's calls on a raw connection handle (`*mut sqlite3`), for hosts that do not hand out
//! a `rusqlite::Connection`: sqlx (`conn.lock_handle().await?.as_raw_handle().as_ptr()`), diesel
//! (`SqliteConnection::with_raw_connection`), any rusqlite's `Connection::handle()`, or a C
//! host's handle. Each is [`GuardExt`](crate::GuardExt)'s call of the same name, or
//! [`crate::pool`]'s check, on the handle's `main` database, with the same answers and errors;
//! none closes the handle.
//!
//! The handle must come from the SQLite library this crate links (in a Cargo graph there is one:
//! Cargo allows one `links = "sqlite3"` package), be open, and not be used by another thread
//! during the call.

//!
//! Their bodies, with the rest of the guard's calls of SQLite's API, are `methods.rs`'s.

#[cfg(test)]
pub(crate) use super::methods::reserve_bytes;
pub(crate) use super::methods::retired_flag_of;
pub use super::methods::{check_new, check_out, classify, ensure_captured, is_retired, status};
