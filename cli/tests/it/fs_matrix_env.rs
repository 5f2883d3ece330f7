//! The filesystem matrix's environments: a peer in a sibling pid namespace (a second container on
//! the same volume), an unprivileged process in a directory it may create in but not list, and a
//! loss while the process is out of descriptors. On the filesystem under test, as `fs_matrix.rs`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{
    self, checkpointed_history, count_like, insert, integrity_ok, is_refusal, open_guarded,
    sidecar, SENTINEL_PREFIX,
};
use crate::fs_matrix::{can_run_as_root, gateway_through, scratch};
use crate::stale_wal::count;
use hermes_guard::GuardExt;

static ALARMS: AtomicUsize = AtomicUsize::new(0);

fn count_alarms(record: &log::Record<'_>) {
    if record.level() <= log::Level::Warn && record.target().starts_with("hermes_guard") {
        eprintln!("alarm: {}", record.args());
        ALARMS.fetch_add(1, Ordering::SeqCst);
    }
}

/// A stock holder (through `wrapper`) keeps the database open; a guarded connection here starts
/// a WAL generation (its record) and leaves; the holder checkpoints, which changes the file's
/// first pages while the WAL stays. A new guarded opener here must open (not "database is
/// locked") and say nothing at WARN: the WAL in use continues the file.
fn opener_beside_a_checkpointing_stock_holder(wrapper: &[&str]) {
    common::record_logs_into(count_alarms);
    let dir = scratch();
    let db = dir.path().join("state.db");
    let mut holder = gateway_through(wrapper, &db, "stock", 4, &[]);
    let first = open_guarded(&db);
    for i in 0..10 {
        insert(&first, &format!("guarded {i}")).unwrap();
    }
    hermes_guard::close(first).map_err(|(_, e)| e).unwrap();
    holder.send("passive");
    assert!(holder.next_event("passive")["error"].is_null());
    for i in 0..4 {
        let opener = open_guarded(&db);
        assert_eq!(count(&opener), 20 + 4 + 10 + i);
        assert!(!opener.guard_status().unwrap().retired);
        insert(&opener, "the opener writes").unwrap();
        hermes_guard::close(opener).map_err(|(_, e)| e).unwrap();
    }
    holder.quit();
    assert_eq!(
        ALARMS.load(Ordering::SeqCst),
        0,
        "alarms at WARN (see stderr)"
    );
}

test_alone! {
    fn an_opener_beside_a_checkpointing_holder_opens_without_a_warning() {
        opener_beside_a_checkpointing_stock_holder(&["env"]);
    }
}

test_alone! {
    /// The holder in a sibling pid namespace: `/proc/locks` here does not show its locks; the
    /// kernel's lock answer does.
    fn an_opener_beside_a_holder_in_another_pid_namespace_opens() {
        if !can_run_as_root("unshare") {
            return;
        }
        opener_beside_a_checkpointing_stock_holder(&["unshare", "--pid", "--fork", "--mount-proc"]);
    }
}

/// An unprivileged application in a directory it may create in but not list (mode 0773) loses
/// its WAL: the directory cannot be opened, which is not a deletion; the generation is captured
/// (the fallback capture directory) or healed, never let go. Every committed row is kept.
#[test]
fn a_loss_in_a_directory_the_process_cannot_list_keeps_every_row() {
    if !can_run_as_root("setpriv") {
        return;
    }
    let dir = scratch();
    let boxed = dir.path().join("box");
    fs::create_dir(&boxed).unwrap();
    fs::set_permissions(&boxed, fs::Permissions::from_mode(0o773)).unwrap();
    let home = dir.path().join("home");
    fs::create_dir(&home).unwrap();
    rustix::fs::chown(&home, Some(nobody_uid()), Some(nobody_gid())).unwrap();
    let db = boxed.join("state.db");
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let mut gw = gateway_through(&nobody, &db, "guard", 21, &[("HOME", &home)]);
    fs::remove_file(sidecar(&db, "-wal")).unwrap();
    fs::remove_file(sidecar(&db, "-shm")).unwrap();
    gw.send("write");
    let write = gw.next_event("write");
    assert_eq!(write["refused"], true, "{write}");
    gw.send("close");
    let closed = gw.next_event("closed");
    assert!(closed["error"].is_null(), "{closed}");
    gw.quit();
    // Healed back into the file, or captured: either way every row is there to have.
    let live = count_like(&common::open_stock(&db), "uncheckpointed %");
    let captures = find_captures(&home);
    let captured: i64 = captures
        .iter()
        .map(|c| {
            let work = tempfile::tempdir().unwrap();
            count_like(
                &common::recover(c, "state.db", work.path()),
                "uncheckpointed %",
            )
        })
        .max()
        .unwrap_or(0);
    assert_eq!(live.max(captured), 21, "live {live}, captures {captures:?}");
}

fn nobody_uid() -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(65534)
}

fn nobody_gid() -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(65534)
}

/// The capture directories anywhere under `dir`.
fn find_captures(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.to_string_lossy().contains(".retired-wal-")
                    && !path.to_string_lossy().ends_with(".partial")
                {
                    found.push(path);
                } else {
                    stack.push(path);
                }
            }
        }
    }
    found
}

test_alone! {
    /// The WAL is lost while the process is out of descriptors: the directory cannot be opened
    /// (`EMFILE`), which is not a deletion. The generation stays held, and once descriptors are
    /// free again the close heals or captures it: every row kept.
    fn a_loss_while_out_of_descriptors_is_kept_not_let_go() {
        let dir = scratch();
        let tenant = dir.path().join("tenant");
        fs::create_dir(&tenant).unwrap();
        let db = tenant.join("state.db");
        let conn = open_guarded(&db);
        checkpointed_history(&conn);
        for i in 0..21 {
            insert(&conn, &format!("{SENTINEL_PREFIX}{i}")).unwrap();
        }
        fs::remove_file(sidecar(&db, "-wal")).unwrap();
        fs::remove_file(sidecar(&db, "-shm")).unwrap();
        let mut hog = Vec::new();
        loop {
            match fs::File::open("/dev/null") {
                Ok(f) => hog.push(f),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let refused = insert(&conn, "refused").unwrap_err();
        let status = conn.guard_status().unwrap();
        drop(hog);
        assert!(is_refusal(&refused), "{refused}");
        assert!(status.let_go.is_none(), "let go out of descriptors: {status:?}");
        let status = conn.guard_status().unwrap();
        assert!(status.let_go.is_none(), "{status:?}");
        let capture = status.capture.clone();
        hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
        let live = open_guarded(&db);
        assert!(integrity_ok(&live));
        let healed = count_like(&live, &format!("{SENTINEL_PREFIX}%"));
        let captured = capture.map_or(0, |c| {
            let work = tempfile::tempdir().unwrap();
            count_like(&common::recover(&c, "state.db", work.path()), &format!("{SENTINEL_PREFIX}%"))
        });
        assert_eq!(healed.max(captured), 21, "healed {healed}, captured {captured}");
    }
}
