//! What participants do and what they leave behind: the ledger of acknowledged rows, refusals
//! and losses, the connection helpers (a busy handler that yields), and the file actors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags};

use crate::sched::{note, step_number, yield_now, Kind};
use crate::vfs;

/// Busy-handler calls before a statement gives up with `SQLITE_BUSY` (each one a blocked yield).
pub const BUSY_TRIES: i32 = 40;

/// What a schedule did, as the participants saw it.
#[derive(Default)]
pub struct Ledger {
    /// Rows whose commit was acknowledged (their `v`), with the step it came back at.
    pub acked: Vec<(String, usize)>,
    /// A restore under running connections (scenario `restore-running`): the rows of the backup.
    /// A row acknowledged before the restore and not in the backup is what the restore throws
    /// away on purpose: it must not come back (the restore undone), and is not counted lost.
    pub backup_rows: Option<Vec<String>>,
    /// Rows acknowledged before a restore and only in the WAL it makes stale.
    pub stale_rows: Vec<String>,
    /// Rows whose deletion was acknowledged (scenario `newer-changes`): (row, participant,
    /// step). None of them may be live at the end (after recovery).
    pub deleted: Vec<(String, String, usize)>,
    /// Rows whose update was acknowledged: (row, the version it wrote, participant, step). The
    /// row must be live at the end in that version only (none of its old versions).
    pub updated: Vec<(String, String, String, usize)>,
    /// Writes refused with `SQLITE_READONLY_DBMOVED`: (participant, step).
    pub refusals: Vec<(String, usize)>,
    /// Losses the actors caused: (what, step).
    pub losses: Vec<(String, usize)>,
    /// The guard's WARN and ERROR lines during the schedule, this process's and its children's
    /// (`guard_log.rs`).
    pub warnings: Vec<String>,
    /// Other errors the scripts saw (not violations by themselves): the replay shows them.
    pub errors: Vec<String>,
    /// What a scenario's own script found wrong as it ran (invariant 9: `two-generations`'
    /// newer connection refused, or its lost one's write after the loss not refused): each one
    /// a violation.
    pub violations: Vec<String>,
    /// Connections abandoned without a close (a killed process's): open until the schedule
    /// ends, dropped (closed through the guard) before the checks.
    pub abandoned: Vec<Connection>,
}

pub type Shared = Arc<Mutex<Ledger>>;

/// The busy handler of every participant: a blocked yield instead of a sleep. Installed with
/// `sqlite3_busy_handler` itself: rusqlite's `busy_handler` keeps its closure with
/// `sqlite3_set_clientdata` (SQLite 3.44+), which the 3.40 system library the
/// `--no-default-features` build links against lacks.
unsafe extern "C" fn busy(_: *mut std::ffi::c_void, n: std::ffi::c_int) -> std::ffi::c_int {
    yield_now(Kind::Blocked, || format!("busy {n}"));
    std::ffi::c_int::from(n < BUSY_TRIES)
}

/// Opens `db` through the scheduling VFS (guarded or stock), in WAL mode, with the yielding
/// busy handler.
pub fn open(db: &Path, guarded: bool) -> rusqlite::Result<Connection> {
    let name = if guarded { vfs::GUARDED } else { vfs::STOCK };
    let conn = Connection::open_with_flags_and_vfs(db, OpenFlags::default(), name)?;
    // SAFETY: the handle is open; the handler is a plain function with no data.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_busy_handler(conn.handle(), Some(busy), std::ptr::null_mut())
    };
    if rc != rusqlite::ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rc),
            None,
        ));
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    Ok(conn)
}

/// Opens `db` outside any schedule, through the guard itself (setup and checks).
pub fn open_direct(db: &Path) -> rusqlite::Result<Connection> {
    let conn =
        Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME)?;
    hermes_guard::set_busy_timeout(&conn, std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// Whether `e` is the guard's refusal (`SQLITE_READONLY_DBMOVED`, 1032).
pub fn is_refusal(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == 1032)
}

/// A participant's view: its name and the ledger.
#[derive(Clone)]
pub struct Who {
    pub name: String,
    pub ledger: Shared,
}

impl Who {
    pub fn new(name: &str, ledger: &Shared) -> Who {
        Who {
            name: name.into(),
            ledger: Arc::clone(ledger),
        }
    }

    /// Records an error the script saw; a refusal goes to the refusals.
    pub fn saw(&self, what: &str, e: &rusqlite::Error) {
        let step = step_number();
        let mut l = self.ledger.lock();
        if is_refusal(e) {
            l.refusals.push((self.name.clone(), step));
        }
        l.errors
            .push(format!("{} {what} at step {step}: {e}", self.name));
    }

    /// Opens (recording a failure); `None` when the open failed.
    pub fn open(&self, db: &Path, guarded: bool) -> Option<Connection> {
        note(|| format!("open {}", if guarded { "guarded" } else { "stock" }));
        open(db, guarded).map_err(|e| self.saw("open", &e)).ok()
    }

    /// Inserts the row `v` in its own transaction; acknowledged rows go to the ledger.
    pub fn insert(&self, conn: &Connection, v: &str) -> bool {
        note(|| format!("insert {v}"));
        match conn.execute("INSERT INTO t(v) VALUES (?1)", [v]) {
            Ok(_) => {
                let step = step_number();
                self.ledger.lock().acked.push((v.to_string(), step));
                true
            }
            Err(e) => {
                self.saw(&format!("insert {v}"), &e);
                false
            }
        }
    }

    /// Counts the rows (a read transaction).
    pub fn count(&self, conn: &Connection) {
        note(|| "count".into());
        if let Err(e) = conn.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0)) {
            self.saw("count", &e);
        }
    }

    /// Runs `PRAGMA wal_checkpoint(mode)`.
    pub fn checkpoint(&self, conn: &Connection, mode: &str) {
        note(|| format!("checkpoint {mode}"));
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        if let Err(e) = conn.query_row(&sql, [], |r| r.get::<_, i64>(0)) {
            self.saw("checkpoint", &e);
        }
    }

    /// Closes: through `hermes_guard::close` when guarded (a failure is recorded and the
    /// connection dropped).
    pub fn close(&self, conn: Connection, guarded: bool) {
        note(|| "close".into());
        if guarded {
            if let Err((conn, e)) = hermes_guard::close(conn) {
                self.ledger
                    .lock()
                    .errors
                    .push(format!("{} close: {e}", self.name));
                drop(conn);
            }
        } else if let Err((_, e)) = conn.close() {
            self.saw("close", &e);
        }
    }

    /// Leaves the connection open and stops (a killed process's connection).
    pub fn abandon(&self, conn: Connection) {
        note(|| "abandoned (killed)".into());
        self.ledger.lock().abandoned.push(conn);
    }
}

/// What an actor does to the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    UnlinkWal,
    RenameWal,
    UnlinkShm,
    /// The backup copied over the main file in place (`cp backup state.db`).
    CopyBackupOver,
    /// The backup renamed over the main file (`mv backup state.db`: a new inode).
    RenameBackupOver,
}

impl Act {
    pub fn name(self) -> &'static str {
        match self {
            Act::UnlinkWal => "rm state.db-wal",
            Act::RenameWal => "mv state.db-wal state.db-wal.old",
            Act::UnlinkShm => "rm state.db-shm",
            Act::CopyBackupOver => "cp backup.db state.db",
            Act::RenameBackupOver => "mv backup.db state.db",
        }
    }
}

/// `db`'s sidecar: `db` + suffix.
pub fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// An actor's step: yields, then does `act` on `db`'s files; a loss when the file was there.
pub fn act(db: &Path, act: Act, ledger: &Shared) {
    yield_now(Kind::Release, || format!("act: {}", act.name()));
    let backup = db.with_file_name("backup.db");
    let done = match act {
        Act::UnlinkWal => std::fs::remove_file(sidecar(db, "-wal")),
        Act::RenameWal => std::fs::rename(sidecar(db, "-wal"), sidecar(db, "-wal.old")),
        Act::UnlinkShm => std::fs::remove_file(sidecar(db, "-shm")),
        Act::CopyBackupOver => std::fs::copy(&backup, db).map(|_| ()),
        Act::RenameBackupOver => std::fs::rename(&backup, db),
    };
    let step = step_number();
    let mut l = ledger.lock();
    match done {
        Ok(()) => l.losses.push((act.name().to_string(), step)),
        Err(e) => l
            .errors
            .push(format!("actor {} at step {step}: {e}", act.name())),
    }
}
