//! The program a crash-point test runs through the power-loss filesystem, in a child process so
//! that the power cut also ends it: `crash-workload <scenario> <db> <acks>`. It appends the id of
//! every row whose commit returned OK to `<acks>` (outside the mount) before going on. Under a
//! frozen filesystem its calls fail with EIO and it stops; nothing after the crash point counts.
//!
//! Scenarios (the database exists, in WAL mode, with `t(id INTEGER PRIMARY KEY, v)`):
//! - `commits-full`, `commits-normal`: 24 commits through `hermes-guard` with
//!   `synchronous=FULL`/`NORMAL`, automatic checkpoints every 4 pages and a
//!   `wal_checkpoint(TRUNCATE)` after the 12th, then close (the last checkpoint, the WAL unlinked).
//! - `lost-wal`: 6 commits through `hermes-guard` (`synchronous=FULL`, no automatic checkpoint),
//!   then the `-wal` unlinked under the connection (a cleanup); the next write is refused and the
//!   retired generation captured (staging directory, files, manifest, rename), then the close
//!   heals it back (the heal at close: staging WAL, `healed.json`, rename, checkpoint, unlink).
//! - `write-and-die`: rows 11 to 15 committed through `hermes-guard` (`synchronous=FULL`, no
//!   checkpoint), then SIGKILL to itself: the WAL stays beside the database (to make a stale WAL).
//! - `lose-to-newer`: rows 1 to 6 committed through `hermes-guard`, the `-wal` and `-shm` unlinked, a second
//!   process (`newer`) commits row 50 (a newer generation), the first connection's write is refused and
//!   its generation captured; the heal at close declines (something newer is at the path).
//! - `apply`: `recover --apply`'s merge (`hermes_guard::recover::apply`) of the one capture
//!   beside the database; acknowledges 0 when it returned OK.
//! - `store-lose`: the session store (`hermes-guard-store`) appends 5 messages to session `s`
//!   (acknowledged 1 to 5), its `-wal` and `-shm` are unlinked, the next append is refused and
//!   captured, another process (`store-newer`) appends message 50 with the self-heal off, then the
//!   store closes (the heal at close declines: the main file changed).
//! - `store-open`: opens the store (its self-heal merges the capture back), acknowledges 0, closes.
//! - `store-lose-then-open`: `store-lose`, then `store-open` in another process, through the same
//!   mount (the self-heal merges only a capture of the very main file: same device and inode).
//! - `open-stale`: opens through `hermes-guard` (which sets a stale WAL aside), commits row 100
//!   with `synchronous=FULL`, closes.
//! - `main-replaced`: rows 1 to 6 committed through `hermes-guard` and checkpointed (TRUNCATE),
//!   then `restored.db` (beside the database) renamed over it (a restore); the next write is
//!   refused (`MainReplaced`) and the retired generation captured: acknowledges -1 when the status
//!   names the capture; then the close.
//! - `orphan`: the database is `<root>/d/state.db`; with the orphan capture directory set to
//!   `<root>/orphans`, rows 1 to 6 committed, `<root>/d` deleted whole, then the close lets the
//!   generation go into the orphan directory; acknowledges -1 when the close returned OK.
//! - `reopen-and-recover`: the next open after a cut (its heal or set-aside), row 100 committed
//!   through `hermes-guard` (`synchronous=FULL`, acknowledged) and the close, then
//!   `recover --apply` of every complete capture beside the database but a stale WAL's;
//!   acknowledges 0 when every merge returned OK.
//! - `rebuild`: `recover --rebuild --apply` (`hermes_guard::recover::rebuild_torn`) of the live
//!   database from the one capture beside it; acknowledges 0 when it returned OK.

use std::fs::OpenOptions;
use std::io::Write;
use std::process::ExitCode;

use hermes_guard::GuardExt;
use rusqlite::{Connection, OpenFlags};

/// Rows a commit scenario writes.
const COMMITS: i64 = 24;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, scenario, db, acks] = &args[..] else {
        eprintln!("usage: crash-workload <scenario> <db> <acks>");
        return ExitCode::from(2);
    };
    let result = match scenario.as_str() {
        "commits-full" => commits(db, acks, "FULL"),
        "commits-normal" => commits(db, acks, "NORMAL"),
        "lost-wal" => lost_wal(db, acks),
        "write-and-die" => write_and_die(db, acks),
        "open-stale" => open_stale(db, acks),
        "lose-to-newer" => lose_to_newer(db, acks),
        "apply" => apply(db, acks),
        "newer" => newer(db, acks),
        "store-lose" => store_lose(db, acks),
        "store-newer" => store_newer(db, acks),
        "store-open" => store_open(db, acks),
        "store-lose-then-open" => store_lose(db, acks).and_then(|()| store_reopen(db, acks)),
        "main-replaced" => main_replaced(db, acks),
        "orphan" => orphan(db, acks),
        "rebuild" => rebuild(db, acks),
        "reopen-and-recover" => reopen_and_recover(db, acks),
        other => Err(format!("unknown scenario {other}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crash-workload {scenario}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Records `id` as acknowledged.
fn ack(acks: &str, id: i64) -> Result<(), String> {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(acks)
        .map_err(|e| e.to_string())?;
    writeln!(f, "{id}").map_err(|e| e.to_string())
}

fn open(db: &str) -> Result<Connection, String> {
    hermes_guard::register().map_err(|e| e.to_string())?;
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), hermes_guard::VFS_NAME)
        .map_err(|e| e.to_string())
}

fn commits(db: &str, acks: &str, synchronous: &str) -> Result<(), String> {
    let conn = open(db)?;
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous}; PRAGMA wal_autocheckpoint=4;"
    ))
    .map_err(err)?;
    for id in 1..=COMMITS {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, printf('%01500d', ?1))",
            [id],
        )
        .map_err(err)?;
        ack(acks, id)?;
        if id == COMMITS / 2 {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
                .map_err(err)?;
        }
    }
    conn.close().map_err(|(_, e)| e.to_string())
}

/// Rows committed before the WAL is lost.
const BEFORE_LOSS: i64 = 6;

fn lost_wal(db: &str, acks: &str) -> Result<(), String> {
    let conn = open(db)?;
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;",
    )
    .map_err(err)?;
    for id in 1..=BEFORE_LOSS {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, printf('%01500d', ?1))",
            [id],
        )
        .map_err(err)?;
        ack(acks, id)?;
    }
    std::fs::remove_file(format!("{db}-wal")).map_err(|e| e.to_string())?;
    match conn.execute(
        "INSERT INTO t(id, v) VALUES (?1, 'after the loss')",
        [BEFORE_LOSS + 1],
    ) {
        Err(e) if conn.classify(&e) == hermes_guard::ErrorClass::WalLost => {}
        other => {
            return Err(format!(
                "the write after the loss was not refused: {other:?}"
            ))
        }
    }
    hermes_guard::close(conn).map_err(|(_, e)| e.to_string())
}

fn write_and_die(db: &str, acks: &str) -> Result<(), String> {
    let conn = open(db)?;
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;")
        .map_err(err)?;
    for id in 11..=15 {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, printf('%01500d', ?1))",
            [id],
        )
        .map_err(err)?;
        ack(acks, id)?;
    }
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
        .map_err(|e| e.to_string())?;
    unreachable!("SIGKILL")
}

fn open_stale(db: &str, acks: &str) -> Result<(), String> {
    let conn = open(db)?;
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch("PRAGMA synchronous=FULL;")
        .map_err(err)?;
    conn.execute("INSERT INTO t(id, v) VALUES (100, 'after the restore')", [])
        .map_err(err)?;
    ack(acks, 100)?;
    hermes_guard::close(conn).map_err(|(_, e)| e.to_string())
}

fn lose_to_newer(db: &str, acks: &str) -> Result<(), String> {
    let conn = open(db)?;
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;")
        .map_err(err)?;
    for id in 1..=BEFORE_LOSS {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, printf('%01500d', ?1))",
            [id],
        )
        .map_err(err)?;
        ack(acks, id)?;
    }
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(format!("{db}{suffix}")).map_err(|e| e.to_string())?;
    }
    // The newer generation from another process (in this one it would share the unix VFS's
    // mapping of the old -shm).
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(exe)
        .args(["newer", db, acks])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the newer writer failed: {status}"));
    }
    match conn.execute("INSERT INTO t(id, v) VALUES (51, 'refused')", []) {
        Err(e) if conn.classify(&e) == hermes_guard::ErrorClass::WalLost => {}
        other => {
            return Err(format!(
                "the write after the loss was not refused: {other:?}"
            ))
        }
    }
    hermes_guard::close(conn).map_err(|(_, e)| e.to_string())
}

fn newer(db: &str, acks: &str) -> Result<(), String> {
    let conn = open(db)?;
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch("PRAGMA synchronous=FULL;")
        .map_err(err)?;
    conn.execute("INSERT INTO t(id, v) VALUES (50, 'newer generation')", [])
        .map_err(err)?;
    ack(acks, 50)?;
    hermes_guard::close(conn).map_err(|(_, e)| e.to_string())
}

/// The one complete capture beside `db`.
fn capture_beside(db: &std::path::Path) -> Result<hermes_guard::recover::Capture, String> {
    let parent = db.parent().ok_or("no parent")?;
    let capture = std::fs::read_dir(parent)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.contains(".retired-wal-") && !name.ends_with(".partial")
        })
        .ok_or("no capture beside the database")?;
    hermes_guard::recover::Capture::open(&capture).map_err(|e| e.to_string())
}

fn apply(db: &str, acks: &str) -> Result<(), String> {
    hermes_guard::register().map_err(|e| e.to_string())?;
    let db = std::path::Path::new(db);
    let capture = capture_beside(db)?;
    let options = hermes_guard::recover::MergeOptions::default();
    hermes_guard::recover::apply(&capture, db, &options, &mut |_| {}).map_err(|e| e.to_string())?;
    ack(acks, 0)
}

fn store_lose(db: &str, acks: &str) -> Result<(), String> {
    use hermes_guard_store::{NewMessage, NewSession, SessionDb};
    let err = |e: hermes_guard_store::StoreError| e.to_string();
    // The session checkpointed by a first store's close; its messages only in the WAL.
    let first = SessionDb::open(db).map_err(err)?;
    first
        .create_session(&NewSession::new("s", "gateway"))
        .map_err(err)?;
    first.close().map(drop).map_err(|(_, e)| e.to_string())?;
    let store = SessionDb::open(db).map_err(err)?;
    for id in 1..=5 {
        store
            .append_message("s", &NewMessage::new("user", format!("message {id}")))
            .map_err(err)?;
        ack(acks, id)?;
    }
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(format!("{db}{suffix}")).map_err(|e| e.to_string())?;
    }
    if store
        .append_message("s", &NewMessage::new("user", "refused"))
        .is_ok()
    {
        return Err("the append after the loss was not refused".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(exe)
        .args(["store-newer", db, acks])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the newer store failed: {status}"));
    }
    store.close().map(drop).map_err(|(_, e)| e.to_string())
}

fn store_newer(db: &str, acks: &str) -> Result<(), String> {
    use hermes_guard_store::{NewMessage, SessionDb, StoreOptions};
    let err = |e: hermes_guard_store::StoreError| e.to_string();
    let options = StoreOptions {
        self_heal: false,
        ..StoreOptions::default()
    };
    let store = SessionDb::open_with(db, options).map_err(err)?;
    store
        .append_message("s", &NewMessage::new("user", "message 50"))
        .map_err(err)?;
    ack(acks, 50)?;
    store.close().map(drop).map_err(|(_, e)| e.to_string())
}

fn store_open(db: &str, acks: &str) -> Result<(), String> {
    let err = |e: hermes_guard_store::StoreError| e.to_string();
    let store = hermes_guard_store::SessionDb::open(db).map_err(err)?;
    ack(acks, 0)?;
    store.close().map(drop).map_err(|(_, e)| e.to_string())
}

/// `store-open` in a process of its own.
fn store_reopen(db: &str, acks: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(exe)
        .args(["store-open", db, acks])
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("store-open failed: {status}"))
    }
}

/// Rows 1 to 6 committed with `synchronous=FULL` and no automatic checkpoint.
fn six_rows(conn: &Connection, acks: &str) -> Result<(), String> {
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;",
    )
    .map_err(err)?;
    for id in 1..=BEFORE_LOSS {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, printf('%01500d', ?1))",
            [id],
        )
        .map_err(err)?;
        ack(acks, id)?;
    }
    Ok(())
}

fn main_replaced(db: &str, acks: &str) -> Result<(), String> {
    let conn = open(db)?;
    six_rows(&conn, acks)?;
    // An empty WAL, as a restore tool leaves it (cli/tests/it/main_replaced.rs).
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(|e| e.to_string())?;
    let restored = std::path::Path::new(db).with_file_name("restored.db");
    std::fs::rename(restored, db).map_err(|e| e.to_string())?;
    match conn.execute("INSERT INTO t(id, v) VALUES (51, 'into the old inode')", []) {
        Err(e) if conn.classify(&e) == hermes_guard::ErrorClass::MainReplaced => {}
        other => {
            return Err(format!(
                "the write after the restore was not refused: {other:?}"
            ))
        }
    }
    let status = conn.guard_status().map_err(|e| e.to_string())?;
    if status.capture.is_some() {
        ack(acks, -1)?;
    }
    hermes_guard::close(conn).map_err(|(_, e)| e.to_string())
}

fn orphan(db: &str, acks: &str) -> Result<(), String> {
    let dir = std::path::Path::new(db).parent().ok_or("no parent")?;
    let root = dir.parent().ok_or("no root")?;
    hermes_guard::set_orphan_capture_dir(Some(root.join("orphans")));
    let conn = open(db)?;
    six_rows(&conn, acks)?;
    std::fs::remove_dir_all(dir).map_err(|e| e.to_string())?;
    hermes_guard::close(conn).map_err(|(_, e)| e.to_string())?;
    ack(acks, -1)
}

fn rebuild(db: &str, acks: &str) -> Result<(), String> {
    hermes_guard::register().map_err(|e| e.to_string())?;
    let db = std::path::Path::new(db);
    let capture = capture_beside(db)?;
    let options = hermes_guard::recover::MergeOptions::default();
    hermes_guard::recover::rebuild_torn(&capture, db, &options).map_err(|e| e.to_string())?;
    ack(acks, 0)
}

fn reopen_and_recover(db: &str, acks: &str) -> Result<(), String> {
    let conn = open(db)?;
    let err = |e: rusqlite::Error| e.to_string();
    conn.execute_batch("PRAGMA synchronous=FULL;")
        .map_err(err)?;
    conn.execute("INSERT INTO t(id, v) VALUES (100, 'after the cut')", [])
        .map_err(err)?;
    ack(acks, 100)?;
    hermes_guard::close(conn).map_err(|(_, e)| e.to_string())?;
    let db = std::path::Path::new(db);
    let parent = db.parent().ok_or("no parent")?;
    let mut captures: Vec<_> = std::fs::read_dir(parent)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.contains(".retired-wal-") && !name.ends_with(".partial")
        })
        .collect();
    captures.sort();
    for dir in captures {
        let capture = hermes_guard::recover::Capture::open(&dir).map_err(|e| e.to_string())?;
        if capture.manifest().reason == Some(hermes_guard::RetireReason::StaleWal) {
            continue; // its rows need the main file it was written on (`--main`)
        }
        let options = hermes_guard::recover::MergeOptions::default();
        hermes_guard::recover::apply(&capture, db, &options, &mut |_| {})
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    ack(acks, 0)
}
