//! A capture that cannot be written beside the database loses nothing stock would keep. A writer
//! running as an unprivileged user (`nobody`) in a directory it cannot write: its `-wal` is
//! unlinked (by root's cleanup), its next write is refused and the capture beside the database
//! fails with `EACCES`. With a fallback capture directory it lands there, and `captures`/`recover`
//! find it from the database's path; with none writable, the close heals the lone loss into the
//! live file, as stock SQLite's close does.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;

const NOBODY: u32 = 65534;

/// Rows the gateway leaves: 20 of history, checkpointed, and 5 only in its WAL.
const LIVE_BEFORE: i64 = 20;
const IN_WAL: i64 = 5;

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A gateway writer running as `nobody` on `db` (in a directory it can write at first), with
/// `env` added to its environment.
fn gateway_as_nobody(db: &Path, env: &[(&str, &Path)]) -> Gateway {
    gateway_as_nobody_logging(db, env, Stdio::inherit())
}

fn gateway_as_nobody_logging(db: &Path, env: &[(&str, &Path)], stderr: Stdio) -> Gateway {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hermes-guard"));
    cmd.args([
        "writer",
        "--role",
        "gateway",
        "--vfs",
        "guard",
        "--wal-rows",
    ])
    .arg(IN_WAL.to_string())
    .arg("--db")
    .arg(db)
    .env("HOME", "/nonexistent")
    .env_remove("XDG_STATE_HOME")
    .uid(NOBODY)
    .gid(NOBODY)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(stderr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut gw = Gateway::spawn(cmd);
    gw.next_event("ready");
    gw
}

/// The loss: the directory made unwritable for `nobody`, the `-wal` unlinked, a write refused,
/// the close and the exit.
fn lose_in_unwritable_dir(mut gw: Gateway, dir: &Path, db: &Path) {
    chmod(dir, 0o755);
    fs::remove_file(sidecar(db, "-wal")).unwrap();
    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true, "{refused}");
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn setup() -> Option<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf)> {
    if !is_root() {
        skip_unless_ci("switching to the user nobody needs root");
        return None;
    }
    let top = tempfile::tempdir().unwrap();
    chmod(top.path(), 0o755);
    let dir = top.path().join("data");
    fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o777);
    let db = dir.join("state.db");
    Some((top, dir, db))
}

#[test]
fn with_no_writable_capture_directory_the_lone_loss_is_healed_as_stock_would() {
    let Some((_top, dir, db)) = setup() else {
        return;
    };
    let gw = gateway_as_nobody(&db, &[]);
    lose_in_unwritable_dir(gw, &dir, &db);
    assert!(artifacts(&dir).is_empty(), "no capture could be written");
    let live = open_stock(&db);
    assert!(integrity_ok(&live));
    assert_eq!(
        count_like(&live, "%"),
        LIVE_BEFORE + IN_WAL,
        "every row, as stock"
    );
}

#[test]
fn with_a_fallback_directory_the_capture_lands_there_and_recover_finds_it_from_the_database() {
    let Some((top, dir, db)) = setup() else {
        return;
    };
    let fallback = top.path().join("fallback");
    fs::create_dir(&fallback).unwrap();
    chmod(&fallback, 0o777);
    let gw = gateway_as_nobody(&db, &[("HERMES_GUARD_ORPHAN_CAPTURE_DIR", &fallback)]);
    lose_in_unwritable_dir(gw, &dir, &db);
    assert!(artifacts(&dir).is_empty(), "nothing beside the database");
    let [capture] = artifacts(&fallback).try_into().unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args(["captures", "--json"])
        .arg(&db)
        .env("HERMES_GUARD_ORPHAN_CAPTURE_DIR", &fallback)
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(
        listed[0]["capture"].as_str().unwrap(),
        capture.to_str().unwrap()
    );

    let (code, out, err) = hermes_guard_cli(&[
        "recover".as_ref(),
        capture.as_os_str(),
        "--into".as_ref(),
        db.as_os_str(),
        "--apply".as_ref(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let live = open_stock(&db);
    assert!(integrity_ok(&live));
    assert_eq!(
        count_like(&live, "%"),
        LIVE_BEFORE + IN_WAL,
        "every row, exactly once"
    );
}

#[test]
fn a_generation_still_held_at_exit_gets_a_last_attempt_and_a_plain_error_when_it_fails() {
    let Some((top, dir, db)) = setup() else {
        return;
    };
    let log = top.path().join("stderr.log");
    let stderr = Stdio::from(fs::File::create(&log).unwrap());
    let env = [("RUST_LOG", Path::new("error"))];
    let mut gw = gateway_as_nobody_logging(&db, &env, stderr);
    // A newer generation open at the close: no heal, so the generation stays held to the exit.
    chmod(&dir, 0o755);
    fs::remove_file(sidecar(&db, "-wal")).unwrap();
    gw.send("write");
    assert_eq!(gw.next_event("write")["refused"], true);
    let newer = NewerGenerationOpen::start(&db);
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());
    drop(newer);
    let said = fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("closed with its retired generation uncaptured"),
        "{said}"
    );
    assert!(
        said.contains("is exiting with the retired generation") && said.contains("LOST"),
        "the last word at exit: {said}"
    );
}

#[test]
fn the_status_names_a_fallback_capture_where_it_was_written() {
    let Some((top, dir, db)) = setup() else {
        return;
    };
    let fallback = top.path().join("fallback");
    fs::create_dir(&fallback).unwrap();
    chmod(&fallback, 0o777);
    let mut gw = gateway_as_nobody(&db, &[("HERMES_GUARD_ORPHAN_CAPTURE_DIR", &fallback)]);
    chmod(&dir, 0o755);
    fs::remove_file(sidecar(&db, "-wal")).unwrap();
    gw.send("write");
    let refused = gw.next_event("write");
    assert_eq!(refused["refused"], true, "{refused}");
    // The write event carries the connection's `guard_status().capture`.
    let named = Path::new(refused["artifact"].as_str().unwrap()).to_path_buf();
    let [capture] = artifacts(&fallback).try_into().unwrap();
    assert_eq!(named, capture);
    assert!(named.join("manifest.json").is_file(), "{}", named.display());
    gw.send("close");
    gw.next_event("closed");
    assert!(gw.quit().success());
}
