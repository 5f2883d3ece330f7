//! A forked child never touches its parent's watcher or locks, however the fork was made and
//! whatever the kernel does with `MADV_WIPEONFORK`; the lock shield's locks leave with the
//! process that took them.
//!
//! Each test runs alone, in a process of its own with one test thread (`test_alone!`), and forks
//! for real (see fork.rs).

use crate::common;
use crate::fork::{a_loss_before_a_childs_open_is_refused, fork_child, wait};

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use common::*;
use rusqlite::{Connection, OpenFlags};

/// Turns every `madvise` of this process (and its children) into a no-op that returns 0, as
/// qemu-user does: the advice is accepted and never applied.
fn madvise_accepted_but_ignored() {
    let filter = [
        // The system call's number (`seccomp_data.nr`, offset 0).
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_madvise as u32,
        },
        // "Fails" with errno 0: not executed, returns 0.
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with the documented arguments; the program outlives the call (the kernel
    // copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
        // The filter is in force: an advice that does not exist "succeeds".
        let mut byte = 0u8;
        let page = (&mut byte as *mut u8 as usize) & !4095;
        assert_eq!(libc::madvise(page as *mut libc::c_void, 4096, -1), 0);
    }
}

/// A child made by the raw `clone` system call: no `pthread_atfork` handler runs in it. It runs
/// `work` and exits with its code.
fn raw_clone_child(work: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: clone(SIGCHLD) with no new stack is fork without the C library's handlers; this
    // process has one thread inside the guard (tests here run alone), and the child only runs
    // `work` and then `_exit`s.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) } as libc::pid_t;
    assert!(pid >= 0, "clone failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or(99);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    pid
}

test_alone! {
    /// Measured on cc1ba9f with the same filter: the child drained the parent's inotify queue
    /// and the parent's next writes went into the deleted WAL, with no capture.
    fn a_fork_where_madvise_is_ignored_leaves_the_parents_events_alone() {
        madvise_accepted_but_ignored();
        a_loss_before_a_childs_open_is_refused(fork_child);
    }
}

test_alone! {
    /// No atfork handler and no wipe: the pid alone tells the child.
    fn a_raw_clone_where_madvise_is_ignored_leaves_the_parents_events_alone() {
        madvise_accepted_but_ignored();
        a_loss_before_a_childs_open_is_refused(raw_clone_child);
    }
}

test_alone! {
    fn a_raw_clone_leaves_the_parents_events_alone() {
        a_loss_before_a_childs_open_is_refused(raw_clone_child);
    }
}

/// The OFD read locks on `path`'s inode, as `/proc/locks` lists them: `(start, end)`.
fn ofd_read_locks(path: &Path) -> Vec<(String, String)> {
    let ino = std::fs::metadata(path).unwrap().ino();
    let suffix = format!(":{ino}");
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "1: OFDLCK ADVISORY READ -1 00:2d:1234 1073741826 1073742335"
            (fields.len() >= 8
                && fields[1] == "OFDLCK"
                && fields[3] == "READ"
                && fields[5].ends_with(&suffix))
            .then(|| (fields[6].to_string(), fields[7].to_string()))
        })
        .collect()
}

/// The shield's two locks: the main file's SHARED range and the `-shm` dead-man-switch byte.
#[track_caller]
fn assert_shield_locks(path: &Path, held: bool) {
    let shared_range = ("1073741826".to_string(), "1073742335".to_string());
    let dms = ("128".to_string(), "128".to_string());
    let (main, shm) = (
        ofd_read_locks_seen(path),
        ofd_read_locks_seen(&sidecar(path, "-shm")),
    );
    assert_eq!(main.contains(&shared_range), held, "main file: {main:?}");
    assert_eq!(shm.contains(&dms), held, "-shm: {shm:?}");
}

/// The OFD read locks of `path` over five reads of `/proc/locks`: the kernel writes that file a
/// page per `read`, and an entry can be skipped when other processes' locks come and go between
/// two of them (a machine running other tests); a lock held throughout is in every read.
fn ofd_read_locks_seen(path: &Path) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for _ in 0..5 {
        for lock in ofd_read_locks(path) {
            if !seen.contains(&lock) {
                seen.push(lock);
            }
        }
    }
    seen
}

test_alone! {
    /// Measured on cc1ba9f: the child's close sent F_UNLCK on the description it shares with the
    /// parent; both locks were gone from /proc/locks while the parent's status still said
    /// `shield_active`.
    fn a_child_closing_its_inherited_connection_leaves_the_parents_shield_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut inherited = Some(open_guarded(&path));
        insert(inherited.as_ref().unwrap(), "before the fork").unwrap();
        assert_shield_locks(&path, true);

        let child = fork_child(|| {
            let conn = inherited.take().unwrap();
            // The child's view: the shield is its parent's, not held here.
            let status = conn.guard_status().unwrap();
            if status.shield_active || status.shield_shm_active {
                return 2;
            }
            drop(conn);
            0
        });
        assert_eq!(wait(child), 0);

        assert_shield_locks(&path, true);
        let conn = inherited.take().unwrap();
        let status = conn.guard_status().unwrap();
        assert!(status.shield_active && status.shield_shm_active, "{status:?}");
        insert(&conn, "after the child").unwrap();
    }
}

/// A writer process that commits `rows` rows through the guard, forks a worker that never
/// touches the database and lives until `release` is written to, and then exits without
/// closing its connection. Returns the worker's pid (the writer is reaped).
fn writer_exits_while_its_worker_lives(path: &Path, rows: usize) -> (libc::pid_t, UnixStream) {
    let (mut report, mut from_writer) = UnixStream::pair().unwrap();
    let (release, mut worker_end) = UnixStream::pair().unwrap();
    let writer = fork_child(|| {
        let conn = open_guarded(path);
        for i in 0..rows {
            if insert(&conn, &format!("row {i}")).is_err() {
                return 2;
            }
        }
        let (mut started, mut worker_started) = match UnixStream::pair() {
            Ok(pair) => pair,
            Err(_) => return 4,
        };
        let worker = fork_child(move || {
            // Runs after the atfork child handler: the worker's descriptions are its own now.
            let _ = worker_started.write_all(b"s");
            // Never longer than the test: its copy of the release end keeps EOF away.
            let _ = worker_end.set_read_timeout(Some(std::time::Duration::from_secs(20)));
            let mut go = [0u8; 1];
            let _ = worker_end.read_exact(&mut go);
            0
        });
        let mut s = [0u8; 1];
        if started.read_exact(&mut s).is_err() || report.write_all(&worker.to_ne_bytes()).is_err() {
            return 3;
        }
        // Exits holding the connection, as a killed or exiting process does.
        std::mem::forget(conn);
        0
    });
    let mut pid = [0u8; 4];
    from_writer.read_exact(&mut pid).unwrap();
    assert_eq!(wait(writer), 0);
    (libc::pid_t::from_ne_bytes(pid), release)
}

/// Waits for a process that is not this one's child to be gone.
fn release_worker(pid: libc::pid_t, mut release: UnixStream) {
    release.write_all(b"g").unwrap();
    for _ in 0..500 {
        // SAFETY: signal 0 only asks whether the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the worker {pid} did not exit");
}

test_alone! {
    /// Measured on cc1ba9f: the worker kept the writer's OFD locks, and another process's
    /// `journal_mode=DELETE` got SQLITE_BUSY until the worker exited.
    fn the_shield_leaves_with_its_writer_while_a_forked_worker_lives_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let (worker, release) = writer_exits_while_its_worker_lives(&path, 10);

        assert_shield_locks(&path, false);
        let other = Connection::open_with_flags(&path, OpenFlags::default()).unwrap();
        let mode: String = other
            .query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete");
        assert_eq!(count_like(&other, "row %"), 10);
        release_worker(worker, release);
    }
}

test_alone! {
    /// Measured on cc1ba9f: the worker's inherited DMS lock made the other process's close look
    /// like not the last one: the WAL was never deleted.
    fn the_last_close_after_the_writer_exits_deletes_the_wal_while_a_worker_lives_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let (worker, release) = writer_exits_while_its_worker_lives(&path, 10);

        let other = open_stock(&path);
        insert(&other, "after the writer").unwrap();
        drop(other);
        assert!(!sidecar(&path, "-wal").exists(), "the last close deletes the WAL");
        release_worker(worker, release);
    }
}
