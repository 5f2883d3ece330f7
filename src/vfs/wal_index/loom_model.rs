//! A `loom` model of the wal-index node's lock accounting (`node.rs`, `Node::lock`): a slot's
//! count of shared holders in the process (-1 for exclusive), each connection's held bits, and
//! the process's lock on the file, which changes only where the process's hold changes. Not a
//! module of the library: the test target `loom_wal_index` of `tests/loom/`, run by
//! `tests/loom.sh` with `--cfg loom`. `Node::lock`'s body is copied here with the system call
//! replaced by the kernel's answer for one open file description (`Kernel`), and must be kept in
//! step with it.
//!
//! What it proves, over every interleaving loom explores of three connections of one process
//! taking and releasing read marks, the write lock and a reset's span of four slots:
//!
//! 1. at every moment the node's count of a slot equals the number of connections holding it
//!    shared, or is -1 with exactly one connection holding it exclusively;
//! 2. the description holds a read lock on a slot exactly while the count is positive, a write
//!    lock exactly while it is -1, nothing while it is 0 — so another process sees what the
//!    process holds, no more, no less;
//! 3. no two connections hold a slot where one of them holds it exclusively.
#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;

const SLOTS: usize = 8;
const UNLOCK: i32 = 1;
const LOCK: i32 = 2;
const SHARED: i32 = 4;
const EXCLUSIVE: i32 = 8;
const OK: i32 = 0;
const BUSY: i32 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Unlock,
}

/// The node: its accounting and, beside it, what the kernel holds for its description (the
/// process's lock on each byte); both under the node's mutex, as the system call is made under it.
struct Node {
    inner: Mutex<Inner>,
}

struct Inner {
    locks: [i32; SLOTS],
    kernel: [Kind; SLOTS],
    /// Each connection's held bits (the model keeps them here to check invariant 1 under the
    /// same mutex; `node.rs` keeps them in the connection's slot, touched only by its own calls).
    held: Vec<(u8, u8)>,
}

impl Inner {
    /// `sys::set_lock` on the node's own description: a lock change of its own always succeeds
    /// (no other process in the model).
    fn set_lock(&mut self, kind: Kind, first: usize, n: usize) {
        self.kernel[first..first + n].fill(kind);
    }

    fn check(&self) {
        for slot in 0..SLOTS {
            let bit = 1u8 << slot;
            let shared = self.held.iter().filter(|(s, _)| s & bit != 0).count() as i32;
            let exclusive = self.held.iter().filter(|(_, e)| e & bit != 0).count() as i32;
            match self.locks[slot] {
                -1 => {
                    assert_eq!((exclusive, shared), (1, 0), "slot {slot}");
                    assert_eq!(self.kernel[slot], Kind::Write, "slot {slot}");
                }
                0 => {
                    assert_eq!((exclusive, shared), (0, 0), "slot {slot}");
                    assert_eq!(self.kernel[slot], Kind::Unlock, "slot {slot}");
                }
                n => {
                    assert_eq!((exclusive, shared), (0, n), "slot {slot}");
                    assert_eq!(self.kernel[slot], Kind::Read, "slot {slot}");
                }
            }
        }
    }
}

impl Node {
    /// `Node::lock` (node.rs), for connection `me`.
    fn lock(&self, me: usize, ofst: i32, n: i32, flags: i32) -> i32 {
        let mask = (((1u32 << (ofst + n)) - (1u32 << ofst)) & 0xff) as u8;
        let unlock = flags & UNLOCK != 0;
        let shared = flags & SHARED != 0;
        let mut inner = self.inner.lock().unwrap();
        let (my_shared, my_exclusive) = inner.held[me];
        let work = if unlock {
            (my_shared | my_exclusive) & mask != 0
        } else {
            !shared || my_shared & mask == 0
        };
        if !work {
            return OK;
        }
        let (first, count) = (ofst as usize, n as usize);
        let rc = if unlock {
            if shared && inner.locks[first] > 1 {
                inner.locks[first] -= 1;
                inner.held[me].0 &= !mask;
                OK
            } else {
                inner.set_lock(Kind::Unlock, first, count);
                inner.locks[first..first + count].fill(0);
                inner.held[me].0 &= !mask;
                inner.held[me].1 &= !mask;
                OK
            }
        } else if shared {
            if inner.locks[first] < 0 {
                BUSY
            } else {
                if inner.locks[first] == 0 {
                    inner.set_lock(Kind::Read, first, 1);
                }
                inner.locks[first] += 1;
                inner.held[me].0 |= mask;
                OK
            }
        } else if inner.locks[first..first + count].iter().any(|&l| l != 0) {
            BUSY
        } else {
            inner.set_lock(Kind::Write, first, count);
            inner.locks[first..first + count].fill(-1);
            inner.held[me].1 |= mask;
            OK
        };
        inner.check();
        rc
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

fn node(connections: usize) -> Arc<Node> {
    Arc::new(Node {
        inner: Mutex::new(Inner {
            locks: [0; SLOTS],
            kernel: [Kind::Unlock; SLOTS],
            held: vec![(0, 0); connections],
        }),
    })
}

/// A read transaction: a read mark shared, released.
fn read(node: &Node, me: usize, mark: i32) {
    if node.lock(me, mark, 1, LOCK | SHARED) == OK {
        node.lock(me, mark, 1, UNLOCK | SHARED);
    }
}

/// A write transaction: the write lock and read mark 0, released; a WAL reset's span of the read
/// locks 1-4 (`ofst` 4, `n` 4) inside it.
fn write(node: &Node, me: usize, reset: bool) {
    if node.lock(me, 0, 1, LOCK | EXCLUSIVE) != OK {
        return;
    }
    if node.lock(me, 3, 1, LOCK | SHARED) == OK {
        if reset && node.lock(me, 4, 4, LOCK | EXCLUSIVE) == OK {
            node.lock(me, 4, 4, UNLOCK | EXCLUSIVE);
        }
        node.lock(me, 3, 1, UNLOCK | SHARED);
    }
    node.lock(me, 0, 1, UNLOCK | EXCLUSIVE);
}

#[test]
fn readers_sharing_a_mark_hold_the_files_read_lock_until_the_last_lets_go() {
    model(|| {
        let n = node(3);
        let handles: Vec<_> = (0..3)
            .map(|me| {
                let n = n.clone();
                thread::spawn(move || read(&n, me, 4))
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let inner = n.inner.lock().unwrap();
        inner.check();
        assert_eq!(inner.kernel[4], Kind::Unlock);
    });
}

#[test]
fn writers_and_readers_on_three_connections_keep_the_counts_and_the_files_locks_equal() {
    model(|| {
        let n = node(3);
        let a = {
            let n = n.clone();
            thread::spawn(move || write(&n, 0, true))
        };
        let b = {
            let n = n.clone();
            thread::spawn(move || write(&n, 1, false))
        };
        let c = {
            let n = n.clone();
            thread::spawn(move || {
                read(&n, 2, 5);
                read(&n, 2, 3);
            })
        };
        for h in [a, b, c] {
            h.join().unwrap();
        }
        let inner = n.inner.lock().unwrap();
        inner.check();
        assert!(inner.kernel.iter().all(|&k| k == Kind::Unlock));
    });
}
