//! Where the guard's events go in a host process: every host's user sees each
//! event, once.
//!
//! - **One route per event, at one level.** [`LOG_ENV`] (`HERMES_GUARD_LOG`) sets the level for
//!   whichever route is in use: `off` (no route at all), `error` (or `quiet`), `warn` (the
//!   default), `info` (or `verbose`), `debug`. An event at that level or above goes to
//!   - **stderr**, one line per event — a capture, a heal, a stale WAL set aside, a retired
//!     generation — because a host rarely listens to SQLite's log and these must not pass
//!     unseen; or, while a host routes them ([`hermes_guard_events_route`]: the Python package
//!     does when the application configured `logging`),
//!   - **a queue the host drains** instead (at most [`QUEUE_MAX`]; an event pushed out of a full
//!     queue is written to stderr and counted) through [`hermes_guard_events_next`], which a host
//!     thread calls with its own lock released (Python's ctypes releases the GIL around a foreign
//!     call). The guard itself never waits on the host: pushing is a short mutex and a condvar
//!     signal. A host that stops routing (at its exit) gets stderr again for what follows.
//! - **SQLite's own error log** (`sqlite3_log`: `SQLITE_CONFIG_LOG`, the shell's `.log`, apsw's
//!   log hook): WARN and ERROR, as before, whatever the route.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, CString};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rusqlite::ffi;

/// The environment variable that sets what reaches stderr.
pub const LOG_ENV: &str = "HERMES_GUARD_LOG";

/// Events a queue holds before the oldest is dropped.
pub const QUEUE_MAX: usize = 1000;

/// The level of the route in use: 0 off, 1 error, 2 warn, 3 info, 4 debug.
static LEVEL: AtomicU8 = AtomicU8::new(2);
/// A host drains the queue ([`hermes_guard_events_attach`]).
static ATTACHED: AtomicBool = AtomicBool::new(false);
/// The host takes the events instead of stderr ([`hermes_guard_events_route`]).
static ROUTED: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static QUEUE: Mutex<VecDeque<(log::Level, String)>> = Mutex::new(VecDeque::new());
static READY: Condvar = Condvar::new();

/// `HERMES_GUARD_LOG`'s value as a level (0 off … 4 debug); an unknown value is an error that
/// names the variable.
pub fn level_from_env(value: Option<std::ffi::OsString>) -> Result<u8, String> {
    match value.as_deref().map(|v| v.to_str()) {
        None | Some(Some("")) => Ok(2),
        Some(Some("off" | "none")) => Ok(0),
        Some(Some("error" | "quiet")) => Ok(1),
        Some(Some("warn" | "warning")) => Ok(2),
        Some(Some("info" | "verbose")) => Ok(3),
        Some(Some("debug")) => Ok(4),
        Some(other) => Err(format!(
            "hermes-guard: {LOG_ENV} must be one of off, error (quiet), warn, info (verbose), \
             debug, not {:?}",
            other.unwrap_or("<not UTF-8>")
        )),
    }
}

fn rank(level: log::Level) -> u8 {
    match level {
        log::Level::Error => 1,
        log::Level::Warn => 2,
        log::Level::Info => 3,
        log::Level::Debug | log::Level::Trace => 4,
    }
}

struct HostLog;

impl log::Log for HostLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        rank(metadata.level()) <= LEVEL.load(Ordering::Relaxed).max(2)
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // One line per event, whatever the message holds.
        let message = record.args().to_string().replace('\n', " ");
        let level = record.level();
        if rank(level) <= LEVEL.load(Ordering::Relaxed) {
            if ATTACHED.load(Ordering::Acquire) && ROUTED.load(Ordering::Acquire) {
                if let Some(pushed_out) = push(level, &message) {
                    let _ = writeln!(std::io::stderr(), "{pushed_out}");
                }
            } else {
                let _ = writeln!(std::io::stderr(), "{message}");
            }
        }
        if rank(level) <= 2 {
            let code = if level == log::Level::Error {
                ffi::SQLITE_ERROR
            } else {
                ffi::SQLITE_WARNING
            };
            if let Ok(text) = CString::new(message.replace('\0', "\\0")) {
                // SAFETY: the API table is initialised before the logger is installed; "%s"
                // takes the one NUL-terminated string passed.
                unsafe { ffi::sqlite3_log(code, c"%s".as_ptr(), text.as_ptr()) };
            }
        }
    }

    fn flush(&self) {}
}

/// Queues an event; returns the oldest one's text when the queue was full (it goes to stderr).
fn push(level: log::Level, message: &str) -> Option<String> {
    let mut queue = QUEUE.lock();
    let mut pushed_out = None;
    if queue.len() >= QUEUE_MAX {
        pushed_out = queue.pop_front().map(|(_, text)| text);
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    queue.push_back((level, message.to_owned()));
    drop(queue);
    READY.notify_one();
    pushed_out
}

static LOGGER: HostLog = HostLog;

/// Installs the logger with the level `HERMES_GUARD_LOG` asks for (an unknown value fails the
/// load, naming the variable).
pub fn install() -> Result<(), String> {
    let level = level_from_env(std::env::var_os(LOG_ENV))?;
    LEVEL.store(level, Ordering::Relaxed);
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(match level.max(2) {
            2 => log::LevelFilter::Warn,
            3 => log::LevelFilter::Info,
            _ => log::LevelFilter::Debug,
        });
    }
    Ok(())
}

/// A host starts draining the events (see the module's doc). Idempotent.
#[unsafe(no_mangle)]
pub extern "C" fn hermes_guard_events_attach() {
    ATTACHED.store(true, Ordering::Release);
}

/// While `on` is non-zero, the events go to the host's queue instead of stderr (the host
/// configured its own log); 0 gives them back to stderr (the host's log is not configured, or the
/// host is exiting). Events queued before are still the host's to deliver.
#[unsafe(no_mangle)]
pub extern "C" fn hermes_guard_events_route(on: c_int) {
    ROUTED.store(on != 0, Ordering::Release);
}

/// The next queued event, waiting up to `timeout_ms` (0: not at all): its level (1 error, 2
/// warn, 3 info, 4 debug) in `*level` and its text, NUL-terminated and cut to `cap - 1` bytes,
/// in `buf`. Returns the text's full length in bytes, 0 when no event came, -1 on a bad
/// argument. Events dropped because nobody drained them are announced as one WARN event first.
///
/// # Safety
/// `level` is writable; `buf` is writable for `cap` bytes (`cap` ≥ 1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hermes_guard_events_next(
    level: *mut c_int,
    buf: *mut c_char,
    cap: usize,
    timeout_ms: c_int,
) -> c_int {
    if level.is_null() || buf.is_null() || cap == 0 {
        return -1;
    }
    let event = std::panic::catch_unwind(|| next(timeout_ms)).ok().flatten();
    let Some((l, text)) = event else {
        return 0;
    };
    let bytes = text.as_bytes();
    let n = bytes.len().min(cap - 1);
    // SAFETY: the caller promises `level` writable and `buf` writable for `cap` bytes; `n + 1`
    // ≤ `cap`, and `bytes` is our own buffer, not overlapping `buf`.
    unsafe {
        *level = c_int::from(rank(l));
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    c_int::try_from(bytes.len()).unwrap_or(c_int::MAX)
}

fn next(timeout_ms: c_int) -> Option<(log::Level, String)> {
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        return Some((
            log::Level::Warn,
            format!(
                "hermes-guard: {dropped} event(s) were not delivered to this host's log (more \
                 than {QUEUE_MAX} waited); they went to stderr"
            ),
        ));
    }
    let mut queue = QUEUE.lock();
    if queue.is_empty() && timeout_ms > 0 {
        let wait = Duration::from_millis(timeout_ms as u64);
        READY.wait_for(&mut queue, wait);
    }
    queue.pop_front()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_setting_takes_its_names_and_the_default_is_warn() {
        assert_eq!(level_from_env(None), Ok(2));
        assert_eq!(level_from_env(Some("quiet".into())), Ok(1));
        assert_eq!(level_from_env(Some("verbose".into())), Ok(3));
        assert_eq!(level_from_env(Some("off".into())), Ok(0));
    }

    #[test]
    fn an_unknown_log_setting_is_an_error_that_names_the_variable() {
        let err = level_from_env(Some("loud".into())).unwrap_err();
        assert!(err.contains("HERMES_GUARD_LOG"), "{err}");
        assert!(err.contains("\"loud\""), "{err}");
    }

    #[test]
    fn a_drained_queue_gives_events_in_order_and_says_what_it_dropped() {
        for i in 0..QUEUE_MAX + 2 {
            let _ = push(log::Level::Warn, &format!("event {i}"));
        }
        let (level, first) = next(0).unwrap();
        assert_eq!(level, log::Level::Warn);
        assert!(first.contains("2 event(s) were not delivered"), "{first}");
        assert_eq!(next(0).unwrap().1, "event 2");
        while next(0).is_some() {}
        assert!(next(0).is_none());
    }
}
