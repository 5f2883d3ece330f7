//! A forked child never reads, changes or removes anything in its parent's inotify instance, and
//! every write after a loss is refused in whichever process lost it. Pre-fork servers (gunicorn,
//! uwsgi, Python multiprocessing) open a database in the master and fork their workers.
//!
//! Real `fork()`s from a multi-threaded test harness: each test of this file runs alone, in a
//! process of its own with one test thread (`test_alone!`), since a fork while another thread
//! holds a lock would leave the child deadlocked; a child does little, never returns into the
//! harness, and reports through its exit code.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use common::*;
use rusqlite::{Connection, OpenFlags};

/// Forks; the child runs `work` and exits with the code it returns (99 on a panic).
pub(crate) fn fork_child(work: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: no other thread of this process is inside hermes-guard or SQLite (each test here
    // runs alone in a process of its own); the child only runs `work` and then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or(99);
        // SAFETY: ends the child at once, without running the parent's atexit handlers or
        // destructors on state it shares with the parent.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// The child's exit code.
pub(crate) fn wait(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: `pid` is a child of this process; `status` is a valid out-pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid failed");
    assert!(libc::WIFEXITED(status), "child did not exit: {status:#x}");
    libc::WEXITSTATUS(status)
}

/// Opens a guarded connection and does nothing with it: SQLite opens the main file (the guard
/// pins it and watches its directory) but reads nothing.
pub(crate) fn open_only(path: &Path) -> Connection {
    Connection::open_with_flags_and_vfs(path, OpenFlags::default(), hermes_guard::VFS_NAME).unwrap()
}

/// How many inotify instances this process holds.
fn inotify_instances() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify")
        })
        .count()
}

#[track_caller]
pub(crate) fn assert_refused(conn: &Connection, writes: usize) {
    for i in 0..writes {
        match insert(conn, &format!("after the loss {i}")) {
            Err(e) if is_refusal(&e) => {}
            other => panic!("write {i} after the loss was not refused: {other:?}"),
        }
    }
}

/// The child drains the queue of whatever watcher it believes is its own (it opens a database
/// elsewhere); the parent's next writes after a loss must still be refused. `fork` makes the
/// child (a `fork()`, or a raw `clone` in fork_lifecycle.rs).
pub(crate) fn a_loss_before_a_childs_open_is_refused(
    fork: fn(Box<dyn FnOnce() -> i32>) -> libc::pid_t,
) {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = open_guarded(&path);
    for i in 0..30 {
        insert(&conn, &format!("row {i}")).unwrap();
    }
    lose_sidecars(&path, false);

    let other = elsewhere.path().join("worker.db");
    let child = fork(Box::new(move || {
        drop(open_only(&other));
        0
    }));
    assert_eq!(wait(child), 0);

    assert_refused(&conn, 20);
    let status = conn.guard_status().unwrap();
    assert!(status.retired);
    assert!(status.capture.is_some(), "{status:?}");
    assert_eq!(artifacts(dir.path()).len(), 1);
}

test_alone! {
    /// Measured: a child that opened any guarded database drained the shared queue, and the parent's
    /// next 20 writes went into the retired WAL.
    fn a_child_opening_a_database_leaves_the_parents_events_alone() {
        a_loss_before_a_childs_open_is_refused(fork_child);
    }
}

test_alone! {
    /// Measured: a child that opened and closed the parent's database (its copy of the watch table
    /// had no entry for it) removed the parent's watch, and every later loss went unseen.
    fn a_child_opening_and_closing_the_parents_database_leaves_the_parents_watch_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        // The master opened the database once before forking (migrations, say) and closed it.
        drop(open_guarded(&path));

        let (mut master, mut worker) = UnixStream::pair().unwrap();
        let child = fork_child(|| {
            let mut go = [0u8; 1];
            if worker.read_exact(&mut go).is_err() {
                return 2;
            }
            // A worker that opens and closes the database per request.
            for _ in 0..3 {
                drop(open_only(&path));
            }
            0
        });
        // The master opens it again while the worker lives.
        let conn = open_guarded(&path);
        for i in 0..30 {
            insert(&conn, &format!("row {i}")).unwrap();
        }
        master.write_all(b"g").unwrap();
        assert_eq!(wait(child), 0);

        for i in 0..10 {
            insert(&conn, &format!("after the worker {i}")).unwrap();
        }
        lose_sidecars(&path, true);
        assert_refused(&conn, 20);
        assert!(conn.guard_status().unwrap().capture.is_some());
    }
}

test_alone! {
    /// A database opened before the fork, a connection of the child's own after it: the child's
    /// writes go through a watch of its own (a fresh inotify instance), its loss is refused there,
    /// and the parent refuses too.
    fn a_loss_in_the_child_is_refused_in_the_child_and_in_the_parent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        for i in 0..10 {
            insert(&conn, &format!("row {i}")).unwrap();
        }
        let instances = inotify_instances();
        assert_eq!(instances, 1);

        let child = fork_child(|| {
            let own = open_guarded(&path);
            for i in 0..30 {
                if insert(&own, &format!("child row {i}")).is_err() {
                    return 2;
                }
            }
            // Its own instance, beside the inherited one it never touches.
            if inotify_instances() != instances + 1 {
                return 3;
            }
            lose_sidecars(&path, false);
            for i in 0..10 {
                match insert(&own, &format!("child after the loss {i}")) {
                    Err(e) if is_refusal(&e) => {}
                    _ => return 4,
                }
            }
            0
        });
        assert_eq!(wait(child), 0);
        assert_refused(&conn, 10);
    }
}

test_alone! {
    /// A loss in the parent while a child has the same database open on its own connection: both
    /// refuse.
    fn a_loss_in_the_parent_is_refused_in_the_parent_and_in_a_live_child() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = open_guarded(&path);
        insert(&conn, "before the fork").unwrap();

        let (mut parent, mut child_end) = UnixStream::pair().unwrap();
        let child = fork_child(|| {
            let own = open_guarded(&path);
            for i in 0..10 {
                if insert(&own, &format!("child row {i}")).is_err() {
                    return 2;
                }
            }
            let mut step = [0u8; 1];
            if child_end.write_all(b"r").is_err() || child_end.read_exact(&mut step).is_err() {
                return 3;
            }
            for i in 0..10 {
                match insert(&own, &format!("child after the loss {i}")) {
                    Err(e) if is_refusal(&e) => {}
                    _ => return 4,
                }
            }
            0
        });
        let mut ready = [0u8; 1];
        parent.read_exact(&mut ready).unwrap();
        for i in 0..10 {
            insert(&conn, &format!("parent row {i}")).unwrap();
        }
        lose_sidecars(&path, false);
        assert_refused(&conn, 10);
        parent.write_all(b"g").unwrap();
        assert_eq!(wait(child), 0);
    }
}

test_alone! {
    /// A child that closes the connection it inherited (and opens, writes to and closes its own
    /// databases) changes nothing for the parent: the parent's watch still sees its next loss.
    fn a_child_closing_an_inherited_connection_leaves_the_parents_watch_alone() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut inherited = Some(open_guarded(&path));
        for i in 0..10 {
            insert(inherited.as_ref().unwrap(), &format!("row {i}")).unwrap();
        }

        let other = elsewhere.path().join("worker.db");
        let child = fork_child(|| {
            // SQLite's advice is to not use a connection across fork; closing it is what a worker's
            // cleanup would do.
            drop(inherited.take());
            let own = open_guarded(&other);
            for i in 0..10 {
                if insert(&own, &format!("worker row {i}")).is_err() {
                    return 2;
                }
            }
            drop(own);
            0
        });
        assert_eq!(wait(child), 0);

        let conn = inherited.take().unwrap();
        for i in 0..10 {
            insert(&conn, &format!("after the worker {i}")).unwrap();
        }
        assert!(!conn.guard_status().unwrap().retired);
        lose_sidecars(&path, false);
        assert_refused(&conn, 20);
    }
}
