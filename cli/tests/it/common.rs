//! Shared harness for the integration tests: real databases in temp dirs, real unlinks and
//! renames, descriptors found through /proc like the Python seeds do.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use hermes_guard::FileId;
pub use hermes_guard::GuardExt;
use rusqlite::{Connection, OpenFlags};

pub const SENTINEL_PREFIX: &str = "committed only in the retired WAL ";

pub use hermes_guard::paths::sidecar;

/// The page sizes every test of a judgement that reads the main file's pages runs at (the
/// overwrite judgement, the kept reads, the stale-WAL judgement): the smallest, the default, a
/// large one and the largest, whose header field reads `00 01`.
pub const PAGE_SIZES: [u32; 4] = [512, 4096, 32768, 65536];

/// Makes `db` (absent) an empty WAL database of `page_size`-byte pages, closed.
pub fn made_with_page_size(db: &Path, page_size: u32) {
    let made = Connection::open(db).unwrap();
    made.execute_batch(&format!(
        "PRAGMA page_size={page_size}; PRAGMA journal_mode=WAL; VACUUM"
    ))
    .unwrap();
    let got: u32 = made
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(got, page_size);
}

/// A connection through hermes-guard, in WAL mode, with the `messages` table.
pub fn open_guarded(path: &Path) -> Connection {
    hermes_guard::register().unwrap();
    let conn =
        Connection::open_with_flags_and_vfs(path, OpenFlags::default(), hermes_guard::VFS_NAME)
            .unwrap();
    prepare(&conn);
    conn
}

/// [`open_guarded`] with the WAL's device not promising powersafe overwrite (`psow=0`) and
/// `synchronous=FULL`: SQLite then pads each commit to a sector boundary, and may sync between
/// a padding frame's header and its page.
pub fn open_guarded_without_psow(path: &Path) -> Connection {
    hermes_guard::register().unwrap();
    let uri = format!(
        "file:{}?psow=0",
        path.to_str().expect("a UTF-8 temporary path")
    );
    let conn = Connection::open_with_flags_and_vfs(
        uri,
        OpenFlags::default() | OpenFlags::SQLITE_OPEN_URI,
        hermes_guard::VFS_NAME,
    )
    .unwrap();
    prepare(&conn);
    conn.execute_batch("PRAGMA synchronous=FULL").unwrap();
    conn
}

/// The same, through the stock unix VFS.
pub fn open_stock(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    prepare(&conn);
    conn
}

fn prepare(conn: &Connection) {
    // The PRAGMA, not rusqlite's busy_timeout, which needs SQLite 3.44: tests/system-sqlite.sh
    // runs these tests on the system SQLite.
    conn.pragma_update(None, "busy_timeout", 10_000).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, session TEXT, content TEXT)",
    )
    .unwrap();
}

/// Turns automatic checkpoints off, commits 20 rows of history and checkpoints them all
/// (TRUNCATE): whatever is committed next lives only in the WAL.
pub fn checkpointed_history(conn: &Connection) {
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..20 {
        insert(conn, &format!("history {i}")).unwrap();
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

/// The newer generation: a stock connection commits `rows` rows (`newer 0`, `newer 1`, ...) at
/// `path` and closes.
pub fn newer_generation(path: &Path, rows: usize) {
    let newer = open_stock(path);
    for i in 0..rows {
        insert(&newer, &format!("newer {i}")).unwrap();
    }
}

/// Seeds and checkpoints history, then commits one row that lives only in the WAL.
pub fn wal_only_sentinel(conn: &Connection) -> String {
    checkpointed_history(conn);
    let sentinel = format!("{SENTINEL_PREFIX}{}", "x".repeat(3000));
    insert(conn, &sentinel).unwrap();
    sentinel
}

pub fn insert(conn: &Connection, content: &str) -> rusqlite::Result<usize> {
    conn.execute(
        "INSERT INTO messages (session, content) VALUES ('gw-0', ?1)",
        [content],
    )
}

pub fn count_like(conn: &Connection, pattern: &str) -> i64 {
    conn.query_row(
        "SELECT COUNT(*) FROM messages WHERE content LIKE ?1",
        [pattern],
        |r| r.get(0),
    )
    .unwrap()
}

pub fn integrity_ok(conn: &Connection) -> bool {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .unwrap()
        == "ok"
}

/// Takes the sidecars away as a cleanup script (unlink) or a restore (rename) would.
pub fn lose_sidecars(path: &Path, rename: bool) {
    for suffix in ["-wal", "-shm"] {
        let side = sidecar(path, suffix);
        if rename {
            fs::rename(&side, sidecar(path, &format!("{suffix}.moved-away"))).unwrap();
        } else {
            fs::remove_file(&side).unwrap();
        }
    }
}

/// Replaces the main file with a copy: new inode, same logical database (snapshot restore).
pub fn replace_main_file(path: &Path) {
    let tmp = path.with_extension("replacement.tmp");
    fs::copy(path, &tmp).unwrap();
    fs::remove_file(path).unwrap();
    fs::rename(&tmp, path).unwrap();
}

pub fn identity(path: &Path) -> FileId {
    hermes_guard::test_hooks::identity_of_path(path)
        .unwrap()
        .unwrap()
}

/// The bytes of the inode `id`, read through whichever descriptor of this process holds it.
pub fn descriptor_contents(id: FileId) -> Vec<u8> {
    for entry in fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let link = entry.path();
        let Ok(meta) = fs::metadata(&link) else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        if meta.dev() == id.dev && meta.ino() == id.ino {
            let mut bytes = Vec::new();
            fs::File::open(&link)
                .unwrap()
                .read_to_end(&mut bytes)
                .unwrap();
            return bytes;
        }
    }
    panic!("no descriptor of this process holds {id}");
}

pub fn manifest(artifact: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(artifact.join(hermes_guard::Manifest::FILE_NAME)).unwrap())
        .unwrap()
}

/// Opens the captured image + WAL as a fresh database, nothing else from the original path.
pub fn recover(artifact: &Path, name: &str, workdir: &Path) -> Connection {
    fs::create_dir_all(workdir).unwrap();
    fs::copy(artifact.join(name), workdir.join(name)).unwrap();
    fs::copy(
        artifact.join(format!("{name}-wal")),
        workdir.join(format!("{name}-wal")),
    )
    .unwrap();
    Connection::open(workdir.join(name)).unwrap()
}

/// Asserts two byte strings are equal without printing megabytes when they are not.
#[track_caller]
pub fn assert_same_bytes(a: &[u8], b: &[u8], what: &str) {
    if a != b {
        let first = a.iter().zip(b).position(|(x, y)| x != y);
        panic!(
            "{what}: {} bytes vs {} bytes, first difference at {first:?}",
            a.len(),
            b.len()
        );
    }
}

/// The write after a loss: refused, not a byte of it in the retired WAL (`wal_id`, whose bytes
/// were `before`), the refusal captured. Closes the connection and returns the capture recovered
/// under `workdir`.
#[track_caller]
pub fn refused_and_recovered(
    conn: Connection,
    wal_id: FileId,
    before: &[u8],
    workdir: &Path,
) -> Connection {
    let err = insert(&conn, "after the loss").unwrap_err();
    assert!(
        is_refusal(&err),
        "expected SQLITE_READONLY_DBMOVED, got {err}"
    );
    assert_same_bytes(&descriptor_contents(wal_id), before, "retired WAL");
    let artifact = conn
        .guard_status()
        .unwrap()
        .capture
        .expect("captured at the refusal");
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let recovered = recover(&artifact, "state.db", workdir);
    assert_eq!(count_like(&recovered, "after the loss"), 0);
    recovered
}

pub fn is_refusal(err: &rusqlite::Error) -> bool {
    matches!(err.sqlite_error(), Some(e) if e.extended_code == rusqlite::ffi::SQLITE_READONLY_DBMOVED)
}

pub fn artifacts(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(".retired-wal-"))
        .collect();
    found.sort();
    found
}

/// The `hermes-guard writer` child process, driven over its stdin/stdout like the seeds'
/// gateway writer.
pub struct Gateway {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Gateway {
    /// Starts a gateway on `db` (`vfs` is `guard` or `stock`) and waits for it to be ready.
    pub fn start(db: &Path, vfs: &str) -> (Gateway, serde_json::Value) {
        use std::process::{Command, Stdio};
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hermes-guard"));
        cmd.args(["writer", "--role", "gateway", "--vfs", vfs, "--db"])
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut gw = Gateway::spawn(cmd);
        let ready = gw.next_event("ready");
        (gw, ready)
    }

    /// A gateway from a command the caller built (piped stdin and stdout), before its `ready`.
    pub fn spawn(mut cmd: std::process::Command) -> Gateway {
        use std::io::BufRead;
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Gateway {
            child,
            stdin,
            lines,
        }
    }

    pub fn next_event(&mut self, event: &str) -> serde_json::Value {
        let line = self
            .lines
            .next()
            .unwrap_or_else(|| panic!("the gateway exited before {event:?}"))
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["event"], event, "unexpected event {line}");
        value
    }

    pub fn send(&mut self, command: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Kills the child with SIGKILL (a crash: its WAL and `-shm` stay as they were) and reaps it.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends `quit` and waits for a normal exit.
    pub fn quit(mut self) -> std::process::ExitStatus {
        self.send("quit");
        drop(self.stdin);
        self.child.wait().unwrap()
    }
}

/// Another process commits `rows` rows at `db` and checkpoints; returns the row count it saw.
pub fn write_second_generation(db: &Path, vfs: &str, rows: u32) -> i64 {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args(["writer", "--role", "second", "--vfs", vfs, "--rows"])
        .arg(rows.to_string())
        .arg("--db")
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "second writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let done: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    done["rows"].as_i64().unwrap()
}

/// A session store whose 20 messages of history are fully checkpointed, with automatic
/// checkpoints off, so whatever is appended next lives only in the WAL.
pub fn store_with_checkpointed_history(path: &Path) -> hermes_guard_store::SessionDb {
    use hermes_guard_store::{NewMessage, NewSession};
    let db = hermes_guard_store::SessionDb::open_with(
        path,
        hermes_guard_store::StoreOptions {
            wal_autocheckpoint: Some(0),
            ..hermes_guard_store::StoreOptions::default()
        },
    )
    .unwrap();
    db.create_session(&NewSession::new("gw-0", "gateway").model("m"))
        .unwrap();
    for i in 0..20 {
        db.append_message("gw-0", &NewMessage::new("user", format!("history {i}")))
            .unwrap();
    }
    let checkpoint = db.try_wal_checkpoint().expect("checkpoint ran");
    assert_eq!(checkpoint.checkpointed_frames, checkpoint.log_frames);
    db
}

/// `base` joined with a name given as raw bytes (which need not be UTF-8).
pub fn join_bytes(base: &Path, name: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    base.join(std::ffi::OsStr::from_bytes(name))
}

/// The exact bytes of `path` in lowercase hex, as the manifest records a non-UTF-8 path.
pub fn hex_of(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Opens the captured image + WAL as a fresh database, by the file names its manifest records.
pub fn recover_by_manifest(artifact: &Path, workdir: &Path) -> Connection {
    let manifest = manifest(artifact);
    let main = manifest["main"]["file"].as_str().unwrap();
    let wal = manifest["wal"]["file"].as_str().unwrap();
    assert_eq!(wal, format!("{main}-wal"), "the WAL sits beside its image");
    recover(artifact, main, workdir)
}

/// Every name inside `artifact`, and the artifact's own, fits NAME_MAX.
#[track_caller]
pub fn assert_names_fit(artifact: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let own = artifact.file_name().unwrap().as_bytes().len();
    assert!(own <= 255, "artifact name is {own} bytes");
    for entry in fs::read_dir(artifact).unwrap().flatten() {
        let len = entry.file_name().as_bytes().len();
        assert!(len <= 255, "{:?} is {len} bytes", entry.file_name());
    }
}

/// Set in a process that runs one test alone (see `test_alone!` in `main.rs`).
pub const ALONE_ENV: &str = "HERMES_GUARD_TEST_ALONE";

/// Whether this process was started to run one test alone.
pub fn is_alone() -> bool {
    std::env::var_os(ALONE_ENV).is_some()
}

/// The test path of `module` (a `module_path!()`) inside this binary: without the crate's name.
pub fn test_path(module: &str) -> &str {
    module.split_once("::").map_or("", |(_, path)| path)
}

/// Runs the test `<module>::<name>::alone` in a new process of this binary, with one test thread,
/// and asserts that it ran and passed.
#[track_caller]
pub fn run_alone(module: &str, name: &str) {
    run_alone_in(module, name, &[]);
}

/// [`run_alone`] under valgrind's memcheck (`--error-exitcode`: any invalid access fails it) when
/// valgrind runs here; plainly, with a note on stderr, when it does not.
#[track_caller]
pub fn run_alone_under_memcheck(module: &str, name: &str) {
    let valgrind = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if valgrind {
        run_alone_in(module, name, &["valgrind", "-q", "--error-exitcode=97"]);
    } else {
        eprintln!("{name}: valgrind is not installed; run without memcheck");
        run_alone_in(module, name, &[]);
    }
}

#[track_caller]
fn run_alone_in(module: &str, name: &str, wrapper: &[&str]) {
    let test = format!("{}::{name}::alone", test_path(module));
    let exe = std::env::current_exe().unwrap();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let out = command
        .args([
            "--exact",
            &test,
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(ALONE_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} failed or did not run in its own process ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The log records of this process go to every sink registered here: `log` takes one logger per
/// process, and the tests of several modules want to read what was logged.
static LOG_SINKS: parking_lot::Mutex<Vec<fn(&log::Record<'_>)>> =
    parking_lot::Mutex::new(Vec::new());

struct LogDispatch;

impl log::Log for LogDispatch {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        for sink in LOG_SINKS.lock().iter() {
            sink(record);
        }
    }
    fn flush(&self) {}
}

/// Sends every log record of this process (from DEBUG up) to `sink` too.
pub fn record_logs_into(sink: fn(&log::Record<'_>)) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&LogDispatch).unwrap();
        log::set_max_level(log::LevelFilter::Debug);
    });
    let mut sinks = LOG_SINKS.lock();
    if !sinks.contains(&sink) {
        sinks.push(sink);
    }
}

/// Runs the `hermes-guard` binary with `args`: its exit code, stdout and stderr.
pub fn hermes_guard_cli(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Makes `capture` what a capture taken before captures held their base pages is: its
/// `<file>-base` removed and its manifest without the `base_pages` entry (recovery then falls
/// back to the rules that read image + WAL).
pub fn without_base_file(capture: &Path) {
    let mut m = manifest(capture);
    let base = m["base_pages"]["file"]
        .as_str()
        .expect("the capture has a base file")
        .to_owned();
    std::fs::remove_file(capture.join(base)).unwrap();
    m.as_object_mut().unwrap().remove("base_pages");
    std::fs::write(
        capture.join("manifest.json"),
        serde_json::to_vec_pretty(&m).unwrap(),
    )
    .unwrap();
}

/// The operator's runbook on `database`: `hermes-guard captures --json`, then every `recover`
/// command it lists, with `--apply`. Returns what they printed, for a failing test's message.
pub fn apply_every_listed_recovery(database: &Path) -> String {
    let (code, out, err) =
        hermes_guard_cli(&["captures".as_ref(), database.as_ref(), "--json".as_ref()]);
    assert!(
        code == 0 || code == 3,
        "captures exited {code}:\n{out}\n{err}"
    );
    let listing: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}\n{err}"));
    let mut log = format!("captures: {listing:#}\n");
    for row in listing.as_array().unwrap() {
        let Some(words) = row["recover"].as_array() else {
            continue;
        };
        let mut words: Vec<String> = words
            .iter()
            .map(|w| w.as_str().unwrap().to_owned())
            .collect();
        words.push("--apply".to_owned());
        let args: Vec<&std::ffi::OsStr> = words.iter().map(|w| w.as_ref()).collect();
        let (code, out, err) = hermes_guard_cli(&args);
        log.push_str(&format!("$ recover (exit {code})\n{out}{err}\n"));
    }
    log
}

/// A test that cannot run here (no root to mount, no system Python): says why on stderr, which
/// the harness shows, and passes — except in CI (`CI` set), where the machine has what the suite
/// needs and a test that silently tested nothing would hide a regression: there it fails.
#[track_caller]
pub fn skip_unless_ci(reason: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("cannot run in CI: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// Another process holding `path` open through the stock VFS (a restarted application that
/// is up before the old connection closes): its open made a newer generation's `-wal` and
/// `-shm`. Closed when dropped. (Another process is what a restart is: its own locks on the
/// main file, and a stock connection, which the guard's per-`-shm` mapping does not reach.)
pub struct NewerGenerationOpen {
    child: std::process::Child,
    /// Kept open: the child's test harness writes after the line read here.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl NewerGenerationOpen {
    pub fn start(path: &Path) -> NewerGenerationOpen {
        use std::io::BufRead;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "common::hold_open_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("HERMES_GUARD_HOLD_DB", path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).unwrap_or(0) > 0 && !line.contains("HELD_OPEN") {
            line.clear();
        }
        assert!(
            line.contains("HELD_OPEN"),
            "the newer generation's process did not open {}",
            path.display()
        );
        NewerGenerationOpen {
            child,
            _stdout: out,
        }
    }
}

impl Drop for NewerGenerationOpen {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "child process body of NewerGenerationOpen"]
fn hold_open_child() {
    let Some(path) = std::env::var_os("HERMES_GUARD_HOLD_DB") else {
        return;
    };
    let conn = Connection::open(PathBuf::from(path)).unwrap();
    conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap();
    println!("HELD_OPEN");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(conn);
}

/// Closes a retired connection while a restarted application holds `path` open in another process,
/// as after a real restart: something newer exists, so the close captures and does not heal — the
/// rows stay in the capture for `recover`.
pub fn close_while_restarted(conn: Connection, path: &Path) {
    let restarted = NewerGenerationOpen::start(path);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    drop(restarted);
}

/// A guarded connection with checkpointed history (20 rows) and `rows` rows only in its WAL,
/// whose sidecars (`suffixes`) are then unlinked, and whose next write is refused (captured).
pub fn lone_loss(path: &Path, rows: usize, suffixes: &[&str]) -> Connection {
    let conn = open_guarded(path);
    checkpointed_history(&conn);
    for i in 0..rows {
        insert(&conn, &format!("{SENTINEL_PREFIX}{i}")).unwrap();
    }
    for suffix in suffixes {
        fs::remove_file(sidecar(path, suffix)).unwrap();
    }
    assert!(is_refusal(&insert(&conn, "refused").unwrap_err()));
    assert!(conn.guard_status().unwrap().capture.is_some());
    conn
}

/// Commits `n` rows of history, then holds a reader at that snapshot, commits `n` more, and runs
/// a PASSIVE checkpoint that the reader holds back to the first half. Returns the reader (still
/// in its read transaction) and the checkpoint's (log frames, checkpointed frames).
pub fn partly_checkpointed(
    conn: &Connection,
    path: &std::path::Path,
    n: usize,
) -> (Connection, (i64, i64)) {
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..n {
        insert(conn, &format!("before the reader {i}")).unwrap();
    }
    let reader = open_stock(path);
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    for i in 0..n {
        insert(conn, &format!("after the reader {i}")).unwrap();
    }
    let (log, done): (i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap();
    (reader, (log, done))
}
