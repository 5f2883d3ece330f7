//! The guard's WARN and ERROR lines during a schedule: a logger (installed once per process)
//! that keeps the lines `hermes_guard` logs at WARN or above between [`start`] and [`take`], and
//! that a child process (`process.rs`) writes to its stderr as `log <LEVEL> <line>` for its
//! parent to collect. A schedule without any loss must log none (`check.rs`, invariant 7): a
//! WARN or ERROR line with nothing taken away is a false alarm a user would be woken for.

use std::sync::{Once, OnceLock};

use parking_lot::Mutex;

/// The prefix of a logged line on a child's stderr.
pub const CHILD_PREFIX: &str = "log ";

struct Keep {
    /// `true` in a child process: lines go to stderr rather than into `LINES`.
    child: bool,
}

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static LOGGER: OnceLock<Keep> = OnceLock::new();
static INSTALL: Once = Once::new();

impl log::Log for Keep {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn && m.target().starts_with("hermes_guard")
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = format!("{} {}", r.level(), r.args()).replace('\n', " ");
        if self.child {
            eprintln!("{CHILD_PREFIX}{line}");
        } else {
            LINES.lock().push(line);
        }
    }

    fn flush(&self) {}
}

fn install(child: bool) {
    INSTALL.call_once(|| {
        let keep = LOGGER.get_or_init(|| Keep { child });
        // Another logger already installed (a test harness's) leaves the lines unseen: the
        // invariant then checks nothing, which the scenario tests would show (they count lines).
        if log::set_logger(keep).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
        }
    });
}

/// Starts keeping the lines of a schedule (installs the logger the first time).
pub fn start() {
    install(false);
    LINES.lock().clear();
}

/// The lines kept since [`start`].
pub fn take() -> Vec<String> {
    std::mem::take(&mut *LINES.lock())
}

/// In a child process: the guard's lines go to stderr, prefixed.
pub fn to_stderr() {
    install(true);
}
