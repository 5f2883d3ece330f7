//! No false alarm: ordinary life never trips the guard. Every test runs many transactions through
//! `hermes-guard` doing one thing SQLite users do every day, then asserts that no write was refused,
//! that nothing was retired or captured, and that every committed row is there afterwards.

use crate::common;
use hermes_guard::GuardExt;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{artifacts, insert, integrity_ok, open_guarded, sidecar};
use hermes_guard::{GuardError, GuardStatus};
use rusqlite::{Connection, OpenFlags};

/// Enough to cross every periodic boundary the tests provoke (checkpoints, WAL resets, mode
/// switches) many times over.
const TRANSACTIONS: usize = 200;

/// A row large enough that a few hundred of them span many pages and several WAL resets.
fn row(i: usize) -> String {
    format!("row {i:06} {}", "m".repeat(400))
}

fn open_with(path: &Path, flags: OpenFlags) -> Connection {
    hermes_guard::register().unwrap();
    let conn = Connection::open_with_flags_and_vfs(path, flags, hermes_guard::VFS_NAME).unwrap();
    conn.pragma_update(None, "busy_timeout", 30_000).unwrap();
    conn
}

fn count(conn: &Connection) -> usize {
    conn.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get::<_, i64>(0))
        .unwrap() as usize
}

/// The guard status of the schema `schema` ("main", or an attached database's name).
fn status_of(conn: &Connection, schema: &str) -> GuardStatus {
    let json: String = conn
        .query_row(&format!("PRAGMA {schema}.hermes_guard_status"), [], |r| {
            r.get(0)
        })
        .unwrap_or_else(|e| panic!("{schema} is not guarded: {e}"));
    serde_json::from_str(&json).unwrap()
}

/// The guard of `schema` saw nothing: no refusal, no retirement, no capture, no capture error.
fn assert_quiet_schema(conn: &Connection, schema: &str) {
    let status = status_of(conn, schema);
    assert_eq!(status.refusals, 0, "false alarm on {schema}: {status:?}");
    assert!(!status.retired, "false alarm on {schema}: {status:?}");
    assert_eq!(status.capture, None, "false alarm on {schema}: {status:?}");
    assert_eq!(status.capture_error, None, "{schema}: {status:?}");
}

fn assert_quiet(conn: &Connection) {
    let status = conn.guard_status().unwrap();
    assert_eq!(status.refusals, 0, "false alarm: {status:?}");
    assert!(!status.retired, "false alarm: {status:?}");
    assert_eq!(status.capture, None, "false alarm: {status:?}");
    assert_eq!(status.capture_error, None, "{status:?}");
}

fn assert_no_artifacts(dir: &Path) {
    assert_eq!(
        artifacts(dir),
        Vec::<PathBuf>::new(),
        "a capture was written"
    );
}

/// Closes through the guard's own close, which refuses to close a retired, uncaptured generation.
fn close(conn: Connection) {
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
}

/// A fresh connection through the stock unix VFS, the independent judge of what is on disk, finds
/// exactly `expected` rows and a sound database.
fn assert_all_rows(path: &Path, expected: usize) {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE).unwrap();
    assert_eq!(count(&conn), expected, "committed rows are missing");
    assert!(integrity_ok(&conn), "integrity_check failed");
    conn.close().unwrap();
}

/// A guarded WAL-mode `state.db` in a fresh temp dir.
fn fresh() -> (tempfile::TempDir, PathBuf, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    (dir, path, conn)
}

/// Runs a checkpoint; returns its row: (busy, frames in the WAL, frames checkpointed). Busy is
/// no error, just "not everything this time".
fn checkpoint(conn: &Connection, mode: &str) -> (i64, i64, i64) {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
    .unwrap()
}

/// One connection writes, another checkpoints in `mode` after every commit.
fn checkpoints_interleaved_with_writes(mode: &str) {
    let (dir, path, writer) = fresh();
    let checkpointer = open_guarded(&path);
    for i in 0..TRANSACTIONS {
        insert(&writer, &row(i)).unwrap();
        let (busy, frames, done) = checkpoint(&checkpointer, mode);
        // Nobody reads meanwhile, so every checkpoint runs to the end.
        assert_eq!(busy, 0, "{mode} checkpoint {i} was busy");
        assert_eq!(frames, done, "{mode} checkpoint {i} stopped short");
        if i % 10 == 0 {
            // The writer checkpoints too, so both connections run the checkpoint path.
            checkpoint(&writer, mode);
        }
    }
    if mode == "TRUNCATE" {
        // The mode really ran: the WAL is empty right after one on a quiet database.
        assert_eq!(std::fs::metadata(sidecar(&path, "-wal")).unwrap().len(), 0);
    }
    assert_quiet(&writer);
    assert_quiet(&checkpointer);
    close(checkpointer);
    close(writer);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn passive_checkpoints_interleaved_with_writes_never_trip_the_guard() {
    checkpoints_interleaved_with_writes("PASSIVE");
}

#[test]
fn full_checkpoints_interleaved_with_writes_never_trip_the_guard() {
    checkpoints_interleaved_with_writes("FULL");
}

#[test]
fn restart_checkpoints_interleaved_with_writes_never_trip_the_guard() {
    checkpoints_interleaved_with_writes("RESTART");
}

#[test]
fn truncate_checkpoints_interleaved_with_writes_never_trip_the_guard() {
    checkpoints_interleaved_with_writes("TRUNCATE");
}

#[test]
fn a_small_wal_autocheckpoint_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    conn.pragma_update(None, "wal_autocheckpoint", 2).unwrap();
    for i in 0..TRANSACTIONS {
        insert(&conn, &row(i)).unwrap();
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn journal_size_limit_truncating_the_wal_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    conn.pragma_update(None, "wal_autocheckpoint", 4).unwrap();
    conn.pragma_update(None, "journal_size_limit", 8192)
        .unwrap();
    let wal = sidecar(&path, "-wal");
    let mut shrank = 0;
    let mut last = 0;
    for i in 0..TRANSACTIONS {
        // Several pages per transaction, so the WAL outgrows the limit between resets.
        conn.execute_batch("BEGIN").unwrap();
        for j in 0..4 {
            insert(&conn, &format!("{} {j}", row(i))).unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
        let size = std::fs::metadata(&wal).unwrap().len();
        if size < last {
            shrank += 1;
        }
        last = size;
    }
    assert!(shrank > 0, "journal_size_limit never truncated the WAL");
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS * 4);
}

fn journal_mode(conn: &Connection, mode: &str) {
    let now: String = conn
        .query_row(&format!("PRAGMA journal_mode={mode}"), [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("journal_mode={mode}: {e}: {:?}", conn.guard_status()));
    assert_eq!(now, mode.to_lowercase());
}

#[test]
fn switching_journal_mode_between_wal_and_delete_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    let mut written = 0;
    for cycle in 0..10 {
        for mode in ["DELETE", "WAL"] {
            journal_mode(&conn, mode);
            for _ in 0..10 {
                insert(&conn, &row(written)).unwrap();
                written += 1;
            }
            if mode == "DELETE" {
                assert!(!sidecar(&path, "-wal").exists(), "cycle {cycle}: WAL left");
            }
        }
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, written);
}

#[test]
fn switching_journal_mode_through_every_rollback_mode_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    let mut written = 0;
    for _ in 0..4 {
        for mode in [
            "TRUNCATE", "WAL", "PERSIST", "WAL", "MEMORY", "WAL", "DELETE", "WAL",
        ] {
            journal_mode(&conn, mode);
            for _ in 0..8 {
                insert(&conn, &row(written)).unwrap();
                written += 1;
            }
        }
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, written);
}

#[test]
fn vacuum_between_writes_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    let mut kept = 0;
    for round in 0..10 {
        for i in 0..20 {
            insert(&conn, &row(round * 100 + i)).unwrap();
        }
        // Free pages, so every VACUUM really rebuilds the file.
        conn.execute(
            "DELETE FROM messages WHERE id IN (SELECT id FROM messages ORDER BY id DESC LIMIT 10)",
            [],
        )
        .unwrap();
        kept += 10;
        conn.execute_batch("VACUUM").unwrap();
    }
    assert_eq!(count(&conn), kept);
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, kept);
}

#[test]
fn vacuum_into_a_new_file_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    let mut copies = Vec::new();
    for i in 0..TRANSACTIONS {
        insert(&conn, &row(i)).unwrap();
        if i % 20 == 19 {
            let copy = dir.path().join(format!("copy-{i}.db"));
            conn.execute("VACUUM INTO ?1", [copy.to_str().unwrap()])
                .unwrap();
            copies.push((copy, i + 1));
        }
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
    for (copy, rows) in copies {
        let copy_conn = open_with(&copy, OpenFlags::SQLITE_OPEN_READ_WRITE);
        assert_eq!(count(&copy_conn), rows);
        assert!(integrity_ok(&copy_conn));
        insert(&copy_conn, "the copy is writable").unwrap();
        assert_quiet(&copy_conn);
        close(copy_conn);
        assert_all_rows(&copy, rows + 1);
    }
}

#[test]
fn the_backup_api_between_guarded_databases_never_trips_the_guard() {
    let (dir, path, source) = fresh();
    let copy = dir.path().join("backup.db");
    // The destination stays open in WAL mode, so every backup lands in its WAL.
    let mut destination = open_guarded(&copy);
    for i in 0..TRANSACTIONS {
        insert(&source, &row(i)).unwrap();
        if i % 20 == 19 {
            let backup = rusqlite::backup::Backup::new(&source, &mut destination).unwrap();
            // Small steps, so a backup spans many of the destination's write transactions.
            backup.run_to_completion(5, Duration::ZERO, None).unwrap();
            drop(backup);
            assert_eq!(count(&destination), i + 1);
        }
    }
    // And back: restore the copy over the source through the same API.
    insert(&destination, "only in the backup").unwrap();
    let mut source = source;
    rusqlite::backup::Backup::new(&destination, &mut source)
        .unwrap()
        .run_to_completion(5, Duration::ZERO, None)
        .unwrap();
    assert_eq!(count(&source), TRANSACTIONS + 1);
    assert_quiet(&source);
    assert_quiet(&destination);
    close(destination);
    close(source);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS + 1);
    assert_all_rows(&copy, TRANSACTIONS + 1);
}

#[test]
fn attach_of_a_second_guarded_database_with_writes_across_both_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    let other = dir.path().join("other.db");
    // No vfs= in the name: an attached database inherits the connection's VFS.
    conn.execute("ATTACH ?1 AS other", [other.to_str().unwrap()])
        .unwrap();
    journal_mode_of(&conn, "other", "WAL");
    conn.execute_batch("CREATE TABLE other.messages (id INTEGER PRIMARY KEY, content TEXT)")
        .unwrap();
    for i in 0..TRANSACTIONS {
        let tx = conn.unchecked_transaction().unwrap();
        tx.execute("INSERT INTO main.messages (content) VALUES (?1)", [row(i)])
            .unwrap();
        tx.execute("INSERT INTO other.messages (content) VALUES (?1)", [row(i)])
            .unwrap();
        tx.commit().unwrap();
        if i % 25 == 0 {
            checkpoint(&conn, "TRUNCATE");
        }
    }
    assert_quiet_schema(&conn, "main");
    assert_quiet_schema(&conn, "other");
    conn.execute_batch("DETACH other").unwrap();
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
    assert_all_rows(&other, TRANSACTIONS);
}

fn journal_mode_of(conn: &Connection, schema: &str, mode: &str) {
    let now: String = conn
        .query_row(&format!("PRAGMA {schema}.journal_mode={mode}"), [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(now, mode.to_lowercase());
}

#[test]
fn read_only_connections_reading_while_a_writer_writes_never_trip_the_guard() {
    let (dir, path, setup) = fresh();
    insert(&setup, &row(0)).unwrap();
    close(setup);
    // The readers come first, onto a WAL database whose last close removed its -wal and -shm.
    let readers: Vec<Connection> = (0..2)
        .map(|_| open_with(&path, OpenFlags::SQLITE_OPEN_READ_ONLY))
        .collect();
    for reader in &readers {
        assert_eq!(count(reader), 1);
    }
    let writer = open_guarded(&path);
    for i in 1..TRANSACTIONS {
        insert(&writer, &row(i)).unwrap();
        for reader in &readers {
            assert_eq!(count(reader), i + 1);
        }
        if i % 50 == 0 {
            checkpoint(&writer, "TRUNCATE");
        }
    }
    for reader in &readers {
        // A read-only connection says no with plain SQLITE_READONLY, which is not a refusal.
        let err = insert(reader, "not from a reader").unwrap_err();
        assert_eq!(
            err.sqlite_error().map(|e| e.extended_code),
            Some(rusqlite::ffi::SQLITE_READONLY),
            "{err}"
        );
        assert_quiet(reader);
    }
    assert_quiet(&writer);
    // The writer goes first: a read-only connection is the last to close.
    close(writer);
    for reader in readers {
        assert_eq!(count(&reader), TRANSACTIONS);
        close(reader);
    }
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn immutable_opens_reading_while_a_writer_writes_never_trip_the_guard() {
    let (dir, path, writer) = fresh();
    let uri = format!(
        "file:{}?vfs={}&immutable=1",
        path.to_str().unwrap(),
        hermes_guard::VFS_NAME
    );
    for i in 0..TRANSACTIONS {
        insert(&writer, &row(i)).unwrap();
        if i % 20 == 19 {
            // An immutable open trusts the file not to change, so it sees what the main file
            // holds: open it right after a checkpoint, read, and close it again.
            checkpoint(&writer, "TRUNCATE");
            let reader = Connection::open_with_flags(
                &uri,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
            )
            .unwrap();
            assert_eq!(count(&reader), i + 1);
            assert_quiet(&reader);
            close(reader);
        }
    }
    assert_quiet(&writer);
    close(writer);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn temp_tables_in_temp_files_never_trip_the_guard() {
    let (dir, path, conn) = fresh();
    // temp_store=FILE and a tiny cache, so the TEMP database really goes to a temp file.
    conn.execute_batch(
        "PRAGMA temp_store=FILE; PRAGMA temp.cache_size=10;
         CREATE TEMP TABLE scratch (id INTEGER PRIMARY KEY, content TEXT);",
    )
    .unwrap();
    for i in 0..TRANSACTIONS {
        let tx = conn.unchecked_transaction().unwrap();
        tx.execute("INSERT INTO temp.scratch (content) VALUES (?1)", [row(i)])
            .unwrap();
        tx.execute(
            "INSERT INTO main.messages (content) SELECT content FROM temp.scratch WHERE id = ?1",
            [i as i64 + 1],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    // A sort, whose scratch space is the temp store too.
    let distinct: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM (SELECT DISTINCT content FROM temp.scratch ORDER BY content)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(distinct as usize, TRANSACTIONS);
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn in_memory_databases_through_the_guard_vfs_work_and_are_not_guarded() {
    hermes_guard::register().unwrap();
    for name in [
        ":memory:".to_string(),
        format!(
            "file:nfa-memdb?mode=memory&cache=shared&vfs={}",
            hermes_guard::VFS_NAME
        ),
    ] {
        let conn = Connection::open_with_flags_and_vfs(
            &name,
            OpenFlags::default(),
            hermes_guard::VFS_NAME,
        )
        .unwrap();
        conn.execute_batch(
            "CREATE TABLE messages (id INTEGER PRIMARY KEY, session TEXT, content TEXT)",
        )
        .unwrap();
        for i in 0..TRANSACTIONS {
            insert(&conn, &row(i)).unwrap();
        }
        assert_eq!(count(&conn), TRANSACTIONS);
        assert!(integrity_ok(&conn));
        // There is no file to lose, so there is no guard to ask, and nothing it could refuse.
        assert!(
            matches!(conn.guard_status(), Err(GuardError::NotGuarded { .. })),
            "{name}"
        );
        close(conn);
    }
    assert!(
        !Path::new("nfa-memdb").exists(),
        "an in-memory name became a file"
    );
}

/// Writes through `alias` (a name that is not the database's resolved path) and through the real
/// path, interleaved, on two connections.
fn writes_through_an_alias_and_the_real_path(dir: &Path, alias: &Path, real: &Path) {
    let through_alias = open_guarded(alias);
    let direct = open_guarded(real);
    let resolved = real.canonicalize().unwrap();
    for conn in [&through_alias, &direct] {
        assert_eq!(
            conn.guard_status().unwrap().database,
            resolved,
            "both connections guard the resolved files"
        );
    }
    for i in 0..TRANSACTIONS {
        let conn = if i % 2 == 0 { &through_alias } else { &direct };
        insert(conn, &row(i)).unwrap();
        if i % 40 == 0 {
            checkpoint(conn, "TRUNCATE");
        }
    }
    assert_quiet(&through_alias);
    assert_quiet(&direct);
    close(direct);
    // The last connection is the aliased one: its close deletes the WAL at the real location.
    close(through_alias);
    assert!(!sidecar(real, "-wal").exists());
    assert!(!sidecar(alias, "-wal").exists());
    assert_no_artifacts(dir);
    assert_all_rows(real, TRANSACTIONS);
}

#[test]
fn a_database_opened_through_a_symlinked_directory_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let real_dir = dir.path().join("real");
    std::fs::create_dir(&real_dir).unwrap();
    let link_dir = dir.path().join("link");
    std::os::unix::fs::symlink(&real_dir, &link_dir).unwrap();
    writes_through_an_alias_and_the_real_path(
        &real_dir,
        &link_dir.join("state.db"),
        &real_dir.join("state.db"),
    );
    assert_no_artifacts(dir.path());
}

#[test]
fn a_database_opened_through_a_symlink_to_the_file_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("state.db");
    // Create the database first: the link must point at an existing file.
    close(open_guarded(&real));
    let link = dir.path().join("alias.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    writes_through_an_alias_and_the_real_path(dir.path(), &link, &real);
    assert!(link.is_symlink(), "the link itself is left alone");
}

/// `target` relative to the current directory (which this process never changes: tests run on
/// parallel threads and the current directory is process-wide).
fn relative_to_current_dir(target: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
    let target = target.canonicalize().unwrap();
    let common = cwd
        .components()
        .zip(target.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut relative = PathBuf::new();
    for _ in cwd.components().skip(common) {
        relative.push("..");
    }
    for part in target.components().skip(common) {
        relative.push(part);
    }
    relative
}

#[test]
fn a_database_opened_by_a_relative_path_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("state.db");
    let relative = relative_to_current_dir(dir.path()).join("state.db");
    assert!(relative.is_relative(), "{}", relative.display());
    writes_through_an_alias_and_the_real_path(dir.path(), &relative, &real);
}

#[test]
fn many_connections_writing_concurrently_from_threads_never_trip_the_guard() {
    const THREADS: usize = 4;
    const EACH: usize = 60;
    let (dir, path, keeper) = fresh();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let path = &path;
            s.spawn(move || {
                let conn = open_guarded(path);
                for i in 0..EACH {
                    insert(&conn, &format!("thread {t} {}", row(i))).unwrap();
                    if i % 15 == 0 {
                        checkpoint(&conn, "PASSIVE");
                    }
                }
                assert_quiet(&conn);
                close(conn);
            });
        }
    });
    assert_eq!(count(&keeper), THREADS * EACH);
    assert_quiet(&keeper);
    close(keeper);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, THREADS * EACH);
}

// Multi-process tests re-execute this very test binary (`std::env::current_exe()`) as
// `<binary> --exact no_false_alarm::<child test> --nocapture --test-threads=1` with an environment variable that
// carries the child's role (database path, writer number). The child "test" is not a test of its
// own: in an ordinary `cargo test` run its variable is absent and it returns at once. A failed
// assertion in a child makes it exit non-zero, which the parent reports with the child's output.

/// `<writer number>:<database path>` for `child_process_writer`.
const WRITER_ENV: &str = "HERMES_GUARD_NO_FALSE_ALARM_WRITER";
/// `<database path>` for `child_process_exiting_without_close`.
const EXITING_ENV: &str = "HERMES_GUARD_NO_FALSE_ALARM_EXITING";
const CHILD_SESSIONS: usize = 10;
const CHILD_TRANSACTIONS_PER_SESSION: usize = 10;

fn spawn_child(test: &str, var: &str, value: String) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(var, value)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_child(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "a child process failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Writes in sessions that open, write and close, so connections come and go while the others
/// write, and a close that finds itself the last deletes the WAL and -shm, which the next
/// connection to open creates afresh.
fn write_in_sessions(path: &Path, writer: &str) {
    for session in 0..CHILD_SESSIONS {
        let conn = open_guarded(path);
        for i in 0..CHILD_TRANSACTIONS_PER_SESSION {
            insert(&conn, &format!("{writer} session {session} {}", row(i))).unwrap();
        }
        assert_quiet(&conn);
        close(conn);
    }
}

/// Child process of `many_processes_writing_concurrently_never_trip_the_guard` (see above).
#[test]
#[ignore = "child process body of many_processes_writing_concurrently_never_trip_the_guard"]
fn child_process_writer() {
    let Ok(spec) = std::env::var(WRITER_ENV) else {
        return;
    };
    let (writer, path) = spec.split_once(':').expect("<writer>:<path>");
    write_in_sessions(Path::new(path), &format!("process {writer}"));
}

#[test]
fn many_processes_writing_concurrently_never_trip_the_guard() {
    const PROCESSES: usize = 3;
    let (dir, path, setup) = fresh();
    close(setup);
    let children: Vec<_> = (0..PROCESSES)
        .map(|n| {
            spawn_child(
                "no_false_alarm::child_process_writer",
                WRITER_ENV,
                format!("{n}:{}", path.display()),
            )
        })
        .collect();
    // This process is a fourth writer, with no connection held between its sessions.
    write_in_sessions(&path, "parent");
    for child in children {
        // `--exact` with a wrong name would run nothing and still succeed.
        assert!(
            wait_child(child).contains("1 passed"),
            "a child ran no writer"
        );
    }
    let expected = (PROCESSES + 1) * CHILD_SESSIONS * CHILD_TRANSACTIONS_PER_SESSION;
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, expected);
}

/// Child process of `a_wal_left_by_a_process_that_exited_without_closing_never_trips_the_guard`:
/// commits, then exits without closing, as a crashed or killed writer would.
#[test]
#[ignore = "child process body of a_wal_left_by_a_process_that_exited_without_closing_never_trips_the_guard"]
fn child_process_exiting_without_close() {
    let Ok(path) = std::env::var(EXITING_ENV) else {
        return;
    };
    let conn = open_guarded(Path::new(&path));
    conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    for i in 0..TRANSACTIONS {
        insert(&conn, &row(i)).unwrap();
    }
    assert_quiet(&conn);
    // No destructor runs: the connection is never closed, its WAL never checkpointed.
    std::process::exit(0);
}

#[test]
fn a_wal_left_by_a_process_that_exited_without_closing_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    close(open_guarded(&path));
    wait_child(spawn_child(
        "no_false_alarm::child_process_exiting_without_close",
        EXITING_ENV,
        path.display().to_string(),
    ));
    let left = std::fs::metadata(sidecar(&path, "-wal")).map_or(0, |m| m.len());
    assert!(left > 0, "the exiting writer left no WAL behind");
    // The next connection recovers the WAL and carries on writing.
    let conn = open_guarded(&path);
    assert_eq!(count(&conn), TRANSACTIONS);
    for i in 0..TRANSACTIONS {
        insert(&conn, &row(TRANSACTIONS + i)).unwrap();
    }
    checkpoint(&conn, "TRUNCATE");
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, 2 * TRANSACTIONS);
}

#[test]
fn connections_opening_and_closing_on_many_threads_never_trip_the_guard() {
    const THREADS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    close(open_guarded(&path));
    // No connection is held throughout: whichever closes last deletes the WAL and -shm while
    // other threads may be opening theirs.
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let path = &path;
            s.spawn(move || write_in_sessions(path, &format!("thread {t}")));
        }
    });
    assert_no_artifacts(dir.path());
    assert_all_rows(
        &path,
        THREADS * CHILD_SESSIONS * CHILD_TRANSACTIONS_PER_SESSION,
    );
}

#[test]
fn the_last_connection_deletes_its_own_wal_and_shm() {
    let (dir, path, first) = fresh();
    let second = open_guarded(&path);
    for i in 0..TRANSACTIONS {
        insert(if i % 2 == 0 { &first } else { &second }, &row(i)).unwrap();
    }
    assert_quiet(&first);
    close(first);
    // Not the last one: the sidecars stay for the second connection.
    assert!(sidecar(&path, "-wal").exists());
    assert_quiet(&second);
    close(second);
    assert!(
        !sidecar(&path, "-wal").exists(),
        "the last close kept its WAL"
    );
    assert!(
        !sidecar(&path, "-shm").exists(),
        "the last close kept its -shm"
    );
    assert_no_artifacts(dir.path());
    let reopened = open_guarded(&path);
    assert_eq!(count(&reopened), TRANSACTIONS);
    assert_quiet(&reopened);
    close(reopened);
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn reopening_after_each_last_close_deleted_the_wal_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    for session in 0..20 {
        let conn = open_guarded(&path);
        for i in 0..10 {
            insert(&conn, &row(session * 10 + i)).unwrap();
        }
        assert_quiet(&conn);
        close(conn);
        assert!(!sidecar(&path, "-wal").exists());
        assert!(!sidecar(&path, "-shm").exists());
    }
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, 200);
}

#[test]
fn exclusive_locking_mode_with_writes_and_checkpoints_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_with(&path, OpenFlags::default());
    // EXCLUSIVE before WAL: no -shm at all, only the WAL writes show a transaction.
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
        .unwrap();
    journal_mode(&conn, "WAL");
    conn.execute_batch(
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, session TEXT, content TEXT)",
    )
    .unwrap();
    let modes = ["PASSIVE", "FULL", "RESTART", "TRUNCATE"];
    for i in 0..TRANSACTIONS {
        insert(&conn, &row(i)).unwrap();
        if i % 10 == 9 {
            checkpoint(&conn, modes[(i / 10) % modes.len()]);
        }
    }
    assert!(
        !sidecar(&path, "-shm").exists(),
        "EXCLUSIVE mode needs no -shm"
    );
    assert_quiet(&conn);
    close(conn);
    assert!(!sidecar(&path, "-wal").exists());
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn entering_exclusive_locking_mode_on_an_open_wal_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    for i in 0..TRANSACTIONS / 2 {
        insert(&conn, &row(i)).unwrap();
    }
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
        .unwrap();
    for i in TRANSACTIONS / 2..TRANSACTIONS {
        insert(&conn, &row(i)).unwrap();
        if i % 10 == 0 {
            checkpoint(&conn, "TRUNCATE");
        }
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn leaving_exclusive_locking_mode_lets_other_connections_in_without_tripping_the_guard() {
    let (dir, path, conn) = fresh();
    let mut written = 0;
    for _ in 0..10 {
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .unwrap();
        for _ in 0..10 {
            insert(&conn, &row(written)).unwrap();
            written += 1;
        }
        conn.pragma_update(None, "locking_mode", "NORMAL").unwrap();
        // The exclusive lock goes with the next transaction; then another connection writes.
        assert_eq!(count(&conn), written);
        let other = open_guarded(&path);
        for _ in 0..10 {
            insert(&other, &row(written)).unwrap();
            written += 1;
        }
        assert_quiet(&other);
        close(other);
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, written);
}

fn writes_with_synchronous(level: &str) {
    let (dir, path, conn) = fresh();
    conn.pragma_update(None, "synchronous", level).unwrap();
    for i in 0..TRANSACTIONS {
        insert(&conn, &row(i)).unwrap();
        if i % 25 == 24 {
            checkpoint(&conn, "PASSIVE");
        }
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, TRANSACTIONS);
}

#[test]
fn synchronous_full_never_trips_the_guard() {
    writes_with_synchronous("FULL");
}

#[test]
fn synchronous_off_never_trips_the_guard() {
    writes_with_synchronous("OFF");
}

#[test]
fn a_transaction_that_spills_the_page_cache_never_trips_the_guard() {
    let (dir, path, conn) = fresh();
    conn.pragma_update(None, "cache_size", 10).unwrap();
    let big = "b".repeat(4000);
    let wal = sidecar(&path, "-wal");
    let mut written = 0;
    for _ in 0..3 {
        // ~4 MB in one transaction through a 10-page cache: pages spill to the WAL mid-way.
        checkpoint(&conn, "TRUNCATE");
        let tx = conn.unchecked_transaction().unwrap();
        for _ in 0..1000 {
            insert(&tx, &format!("{written} {big}")).unwrap();
            written += 1;
        }
        let spilled = std::fs::metadata(&wal).unwrap().len();
        assert!(
            spilled > 1 << 20,
            "nothing spilled before the commit ({spilled} bytes)"
        );
        tx.commit().unwrap();
    }
    for i in 0..100 {
        insert(&conn, &row(i)).unwrap();
        written += 1;
    }
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, written);
}

#[test]
fn rolled_back_write_transactions_never_trip_the_guard() {
    let (dir, path, conn) = fresh();
    // A small cache, so some rolled-back transactions have already written frames to the WAL.
    conn.pragma_update(None, "cache_size", 10).unwrap();
    let mut committed = 0;
    for i in 0..TRANSACTIONS {
        let tx = conn.unchecked_transaction().unwrap();
        let rows = if i % 10 == 0 { 200 } else { 3 };
        for j in 0..rows {
            insert(&tx, &format!("{} {j}", row(i))).unwrap();
        }
        if i % 2 == 0 {
            tx.rollback().unwrap();
        } else {
            tx.commit().unwrap();
            committed += rows;
        }
    }
    assert_eq!(count(&conn), committed);
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, committed);
}

#[test]
fn savepoints_released_and_rolled_back_never_trip_the_guard() {
    let (dir, path, conn) = fresh();
    let mut committed = 0;
    for i in 0..TRANSACTIONS {
        conn.execute_batch("SAVEPOINT outer_sp").unwrap();
        insert(&conn, &format!("kept {}", row(i))).unwrap();
        conn.execute_batch("SAVEPOINT inner_sp").unwrap();
        insert(&conn, &format!("undone {}", row(i))).unwrap();
        conn.execute_batch("ROLLBACK TO inner_sp").unwrap();
        conn.execute_batch("SAVEPOINT kept_sp").unwrap();
        insert(&conn, &format!("also kept {}", row(i))).unwrap();
        conn.execute_batch("RELEASE kept_sp").unwrap();
        if i % 5 == 0 {
            // Rolling back the outermost savepoint undoes the whole transaction.
            conn.execute_batch("ROLLBACK TO outer_sp; RELEASE outer_sp")
                .unwrap();
        } else {
            conn.execute_batch("RELEASE outer_sp").unwrap();
            committed += 2;
        }
    }
    assert_eq!(count(&conn), committed);
    let undone: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM messages WHERE content LIKE 'undone %'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(undone, 0);
    assert_quiet(&conn);
    close(conn);
    assert_no_artifacts(dir.path());
    assert_all_rows(&path, committed);
}
