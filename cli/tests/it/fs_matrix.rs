//! The core scenarios on the filesystem the tests run on — the temporary directory, or
//! `HERMES_GUARD_MATRIX_DIR`, which `tests/fs-matrix.sh` points at each filesystem it mounts (ext4,
//! xfs, btrfs at its top and in a subvolume, tmpfs, overlayfs). The guard must know files by the
//! descriptors it holds and ask the kernel who uses them: on btrfs `/proc/self/maps` numbers a file
//! by the superblock's device where `stat` gives the subvolume's, and every connection used to
//! retire.
//!
//! Real processes throughout: the CLI's `writer` is the long-lived application.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{
    self, artifacts, count_like, insert, integrity_ok, open_guarded, sidecar, Gateway,
    SENTINEL_PREFIX,
};
use crate::stale_wal::{count, killed_writer, seed_with_backup, RESTORED};
use hermes_guard::{GuardExt, StaleWalAction};

/// Where the scenarios' directories are made: the filesystem under test.
pub const MATRIX_DIR_ENV: &str = "HERMES_GUARD_MATRIX_DIR";

/// A fresh directory on the filesystem under test, traversable by every user (an unprivileged
/// process's database lives below it).
pub fn scratch() -> tempfile::TempDir {
    let dir = match std::env::var_os(MATRIX_DIR_ENV) {
        Some(base) => tempfile::tempdir_in(base).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Log lines of the guard at WARN or above, in this process.
static ALARMS: AtomicUsize = AtomicUsize::new(0);

fn count_alarms(record: &log::Record<'_>) {
    if record.level() <= log::Level::Warn && record.target().starts_with("hermes_guard") {
        eprintln!("alarm: {}", record.args());
        ALARMS.fetch_add(1, Ordering::SeqCst);
    }
}

/// A guarded gateway's status line: the rows it sees and the guard's status.
fn gateway_status(gw: &mut Gateway) -> serde_json::Value {
    gw.send("status");
    gw.next_event("status")
}

test_alone! {
    /// A lone writer, then 1,000 open + write + read + close cycles beside a guarded writer in
    /// another process that checkpoints every 100: nobody retires, nothing is captured, and the
    /// guard says nothing at WARN.
    fn healthy_writers_raise_no_alarm() {
        common::record_logs_into(count_alarms);
        let dir = scratch();
        let db = dir.path().join("state.db");
        let lone = open_guarded(&db);
        for i in 0..50 {
            insert(&lone, &format!("lone {i}")).unwrap();
            if i % 10 == 9 {
                lone.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())).unwrap();
            }
        }
        let status = lone.guard_status().unwrap();
        assert!(!status.retired, "a lone writer retired: {:?}", status.reason);
        eprintln!("filesystem: {:?}", status.filesystem);
        assert!(status.filesystem.is_some());
        assert_eq!(status.wal_safe, Some(true), "a local filesystem is WAL-safe");
        hermes_guard::close(lone).map_err(|(_, e)| e).unwrap();

        let (mut gw, _) = Gateway::start(&db, "guard");
        for i in 0..1000 {
            let conn = open_guarded(&db);
            insert(&conn, &format!("cycle {i}")).unwrap();
            assert!(count(&conn) > i);
            let status = conn.guard_status().unwrap();
            assert!(!status.retired, "cycle {i} retired: {:?}", status.reason);
            hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
            if i % 100 == 99 {
                gw.send("passive");
                assert!(gw.next_event("passive")["error"].is_null());
            }
        }
        let status = gateway_status(&mut gw);
        assert_eq!(status["guard"]["retired"], false, "{status}");
        gw.quit();
        assert_eq!(artifacts(dir.path()), Vec::<PathBuf>::new(), "no capture");
        assert_eq!(ALARMS.load(Ordering::SeqCst), 0, "alarms at WARN (see stderr)");
    }
}

#[test]
fn a_lone_writers_lost_wal_is_healed_at_close() {
    let dir = scratch();
    let db = dir.path().join("state.db");
    let conn = common::lone_loss(&db, 21, &["-wal", "-shm"]);
    hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
    let after = open_guarded(&db);
    assert_eq!(count_like(&after, &format!("{SENTINEL_PREFIX}%")), 21);
    assert!(integrity_ok(&after));
}

#[test]
fn a_lost_wal_with_a_live_peer_is_refused_and_captured() {
    let dir = scratch();
    let db = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&db, "guard");
    common::lose_sidecars(&db, false);
    gw.send("write");
    let write = gw.next_event("write");
    assert_eq!(write["refused"], true, "{write}");
    let artifact = PathBuf::from(write["artifact"].as_str().expect("captured"));
    // The peer: a newer generation at the path while the gateway still runs.
    common::write_second_generation(&db, "stock", 400);
    gw.send("write");
    assert_eq!(gw.next_event("write")["refused"], true);
    gw.quit();
    let work = dir.path().join("work");
    fs::create_dir(&work).unwrap();
    let recovered = common::recover(&artifact, "state.db", &work);
    // The gateway's 20 rows of history and its 4 rows only in the lost WAL.
    assert_eq!(count(&recovered), 24);
    let live = open_guarded(&db);
    assert!(integrity_ok(&live));
    assert_eq!(count_like(&live, "second generation%"), 400);
}

#[test]
fn a_restore_over_a_dead_writers_wal_is_set_aside() {
    let dir = scratch();
    let db = dir.path().join("state.db");
    let backup = dir.path().join("backup.db");
    seed_with_backup(&db, &backup);
    killed_writer(&db, "guard", 0);
    let wal = fs::read(sidecar(&db, "-wal")).unwrap();
    fs::rename(&backup, &db).unwrap();
    crate::stale_wal::assert_set_aside(&db, &wal, RESTORED);
}

/// A backup renamed over the file while a guarded application keeps the old one open, its WAL
/// started on the old file since the backup (whose pages are exactly the generation's base, so
/// the pages alone cannot tell): the next guarded opener keeps the restore and sets the old
/// generation aside; the application is refused; nothing is corrupted.
#[test]
fn a_restore_under_a_running_app_is_kept_and_the_app_refused() {
    let dir = scratch();
    let db = dir.path().join("state.db");
    let (mut gw, _) = Gateway::start(&db, "guard");
    gw.send("rows 50");
    gw.next_event("rows");
    gw.send("passive");
    gw.next_event("passive");
    // Fully checkpointed and idle: the main file alone is the backup.
    let backup = dir.path().join("backup.db");
    fs::copy(&db, &backup).unwrap();
    let at_backup = count(&common::open_stock(&backup));
    gw.send("rows 30");
    gw.next_event("rows");
    fs::rename(&backup, &db).unwrap();

    let opener = open_guarded(&db);
    assert_eq!(count(&opener), at_backup, "the restore is kept");
    assert!(integrity_ok(&opener));
    let status = opener.guard_status().unwrap();
    let stale = status.stale_wal.expect("the old generation is set aside");
    assert_eq!(stale.action, StaleWalAction::SetAside);
    assert!(!status.retired);

    gw.send("write");
    let write = gw.next_event("write");
    assert_eq!(
        write["refused"], true,
        "the application is refused: {write}"
    );
    gw.quit();
    insert(&opener, "after the restore").unwrap();
    assert!(integrity_ok(&opener));
    assert_eq!(count(&opener), at_backup + 1);
    drop(opener);
    let reopened = open_guarded(&db);
    assert!(integrity_ok(&reopened));
    assert_eq!(count(&reopened), at_backup + 1);
}

/// What the ground-truth scenarios with a namespace or another user need: root, and the tools.
pub fn can_run_as_root(tool: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    let found = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !root || !found {
        common::skip_unless_ci(&format!("needs root and {tool} (root: {root})"));
        return false;
    }
    true
}

/// The CLI's writer, as a gateway on `db`, started through `wrapper` (a namespace, another
/// user), with `env` set.
pub fn gateway_through(
    wrapper: &[&str],
    db: &Path,
    vfs: &str,
    wal_rows: u32,
    env: &[(&str, &Path)],
) -> Gateway {
    use std::process::{Command, Stdio};
    let (program, args) = wrapper.split_first().unwrap();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .arg(env!("CARGO_BIN_EXE_hermes-guard"))
        .args(["writer", "--role", "gateway", "--vfs", vfs])
        .args(["--wal-rows", &wal_rows.to_string(), "--db"])
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut gw = Gateway::spawn(cmd);
    gw.next_event("ready");
    gw
}
