//! A service user's directory. A daemon runs as `nobody` with
//! `HOME=/nonexistent` and keeps its database in a directory owned by root that it may create
//! files in but not list (mode 0773). Its `-wal` is unlinked; its next write is refused. Stock
//! SQLite keeps every row (its close checkpoints the WAL it holds); the guard used to lose them
//! all: it opened the directory read-only for the capture (`EACCES`), had no fallback directory
//! (`HOME` cannot be written), and its heal at close needed that same directory descriptor.
//!
//! Now the directory is held `O_PATH` (creating names needs search and write permission, not
//! read) and synced through `syncfs` on the capture's own descriptor; with no capture possible
//! anywhere the lone connection's generation is healed in place with an ERROR line. Every one of
//! the 20 rows must be live or in a capture.
//!
//! Real processes: the CLI's `writer` started through `setpriv` (needs root: skipped with the
//! reason outside CI, a failure under `CI`). On the filesystem under test (`fs_matrix.rs`):
//! `tests/fs-matrix.sh` runs it on each filesystem it mounts.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{self, artifacts, integrity_ok, sidecar, Gateway};
use crate::fs_matrix::{can_run_as_root, scratch};

/// Rows committed only in the WAL when it is unlinked.
const IN_WAL: u32 = 20;

/// How the daemon runs: `nobody`, no supplementary groups, a `HOME` that does not exist and no
/// other capture directory, as a systemd service or an init script starts one.
const SERVICE_USER: &[&str] = &[
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "env",
    "-u",
    "XDG_STATE_HOME",
    "-u",
    "HERMES_GUARD_ORPHAN_CAPTURE_DIR",
    "HOME=/nonexistent",
    "RUST_LOG=warn",
];

/// The CLI's guarded `writer` as the service user, a gateway on `db` with `wal_rows` rows only
/// in its WAL, its stderr into `log` (inherited without), once it is ready.
fn service_user(db: &Path, wal_rows: u32, log: Option<&Path>) -> Gateway {
    let (program, args) = SERVICE_USER.split_first().unwrap();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .arg(env!("CARGO_BIN_EXE_hermes-guard"))
        .args(["writer", "--role", "gateway", "--vfs", "guard"])
        .args(["--wal-rows", &wal_rows.to_string(), "--db"])
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(log) = log {
        cmd.stderr(fs::File::create(log).unwrap());
    }
    let mut gw = Gateway::spawn(cmd);
    gw.next_event("ready");
    gw
}

/// What one run left: the directory, the database, and the daemon's stderr.
struct Run {
    _scratch: tempfile::TempDir,
    dir: PathBuf,
    db: PathBuf,
    stderr: String,
    /// The capture the daemon's status named after the refused write.
    reported: Option<PathBuf>,
}

/// The daemon writes `IN_WAL` rows into its WAL in a root-owned 0773 directory; the directory's
/// mode becomes `mode_at_loss`, the `-wal` is unlinked (by root, as a cleanup job would), a write
/// is refused, the connection closes and the process exits. `None` without root and `setpriv`.
fn lose_as_service_user(mode_at_loss: u32) -> Option<Run> {
    if !can_run_as_root("setpriv") {
        return None;
    }
    let scratch = scratch();
    let dir = scratch.path().join("service");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o773)).unwrap();
    let db = dir.join("state.db");
    let log = scratch.path().join("stderr.log");

    let mut gw = service_user(&db, IN_WAL, Some(&log));

    fs::set_permissions(&dir, fs::Permissions::from_mode(mode_at_loss)).unwrap();
    fs::remove_file(sidecar(&db, "-wal")).unwrap();
    gw.send("write");
    let write = gw.next_event("write");
    assert_eq!(write["refused"], true, "{write}");
    let reported = write["artifact"].as_str().map(PathBuf::from);
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());
    let stderr = fs::read_to_string(&log).unwrap();
    eprintln!("the daemon's stderr:\n{stderr}");
    Some(Run {
        _scratch: scratch,
        dir,
        db,
        stderr,
        reported,
    })
}

/// The contents of the rows `uncheckpointed %` in `conn`.
fn in_wal_rows(conn: &rusqlite::Connection) -> BTreeSet<String> {
    let mut stmt = conn
        .prepare("SELECT content FROM messages WHERE content LIKE 'uncheckpointed %'")
        .unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

/// The rows live in the database (checked whole), and those in each capture beside it.
fn live_and_captured(run: &Run) -> (BTreeSet<String>, Vec<(PathBuf, BTreeSet<String>)>) {
    let live = common::open_stock(&run.db);
    assert!(integrity_ok(&live), "the live database is not intact");
    let captured = artifacts(&run.dir)
        .into_iter()
        .map(|capture| {
            assert!(
                !capture.to_string_lossy().ends_with(".partial"),
                "a staging directory was left: {}",
                capture.display()
            );
            let work = tempfile::tempdir().unwrap();
            let copy = common::recover(&capture, "state.db", work.path());
            let rows = in_wal_rows(&copy);
            (capture, rows)
        })
        .collect();
    (in_wal_rows(&live), captured)
}

/// Asserts that each of the `IN_WAL` rows is live or in a capture.
fn every_row_kept(live: &BTreeSet<String>, captured: &[(PathBuf, BTreeSet<String>)]) {
    let missing: Vec<String> = (0..IN_WAL)
        .map(|i| format!("uncheckpointed {i}"))
        .filter(|row| !live.contains(row) && !captured.iter().any(|(_, c)| c.contains(row)))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {IN_WAL} rows neither live nor in a capture ({} live, captures {:?}): {missing:?}",
        missing.len(),
        live.len(),
        captured
            .iter()
            .map(|(c, rows)| (c.display().to_string(), rows.len()))
            .collect::<Vec<_>>()
    );
}

/// The directory stays 0773: the capture is written beside the database through a descriptor
/// that needs no read permission, and the lone connection's close heals it back (the capture
/// stays as a copy).
#[test]
fn a_loss_in_a_directory_the_service_user_cannot_list_is_captured_beside_it_and_healed() {
    let Some(run) = lose_as_service_user(0o773) else {
        return;
    };
    let (live, captured) = live_and_captured(&run);
    every_row_kept(&live, &captured);
    let [(capture, rows)] = captured.as_slice() else {
        panic!("one capture beside the database, not {captured:?}");
    };
    assert_eq!(rows.len(), IN_WAL as usize, "the capture holds every row");
    assert_eq!(
        run.reported.as_deref().map(Path::file_name),
        Some(capture.file_name()),
        "the status names the capture"
    );
    assert_eq!(live.len(), IN_WAL as usize, "healed at close, as stock");
    assert!(
        run.stderr.contains("healed") && !run.stderr.contains("LOST"),
        "{}",
        run.stderr
    );
}

/// At the loss the directory becomes 0311 (search only: no listing, no new name): no capture
/// can be written anywhere, so the lone connection's close heals the generation straight into
/// the main file, as stock SQLite's close does, and says so at ERROR.
#[test]
fn a_loss_with_no_capture_possible_anywhere_is_healed_as_stock_with_an_error_line() {
    let Some(run) = lose_as_service_user(0o311) else {
        return;
    };
    let (live, captured) = live_and_captured(&run);
    every_row_kept(&live, &captured);
    assert!(captured.is_empty(), "no capture could be written");
    assert_eq!(live.len(), IN_WAL as usize, "every row live, as stock");
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("WITHOUT a copy")),
        "the heal without a copy is said at ERROR: {}",
        run.stderr
    );
}

/// The same directory after a restore: the service user's WAL was written on the database file
/// the operator has since copied a backup over (in place), so the next open sets the stale WAL
/// aside into a capture beside the database — through the same descriptor that needs no read
/// permission. It used to fail (`EACCES`) and refuse the open ("unable to open database file").
#[test]
fn a_stale_wal_in_a_directory_the_service_user_cannot_list_is_set_aside() {
    if !can_run_as_root("setpriv") {
        return;
    }
    let scratch = scratch();
    let dir = scratch.path().join("service");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o773)).unwrap();
    let db = dir.join("state.db");
    // The backup: 20 rows, closed cleanly.
    let mut seed = service_user(&db, 0, None);
    seed.send("close");
    seed.next_event("closed");
    assert!(seed.quit().success());
    let backup = fs::read(&db).unwrap();
    // 20 more rows checkpointed and 4 only in the WAL, then the process is killed.
    service_user(&db, 4, None).kill();
    assert!(sidecar(&db, "-wal").exists());
    fs::write(&db, &backup).unwrap(); // the restore, in place

    let mut opener = service_user(&db, 0, None);
    opener.send("status");
    let status = opener.next_event("status");
    assert!(opener.quit().success());
    let stale = &status["guard"]["stale_wal"];
    assert_eq!(stale["action"], "set-aside", "{status}");
    let capture = PathBuf::from(stale["capture"].as_str().unwrap());
    assert_eq!(
        artifacts(&dir),
        vec![capture.clone()],
        "beside the database"
    );
    assert!(capture.join("manifest.json").is_file());
}
