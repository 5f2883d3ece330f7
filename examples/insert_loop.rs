//! N one-row autocommit INSERTs in WAL mode with `synchronous=NORMAL`, through hermes-guard or
//! the stock unix VFS: the workload for counting syscalls per write transaction.
//!
//! ```text
//! cargo build --release --example insert_loop
//! strace -c -f target/release/examples/insert_loop guard 1000 /tmp/x
//! strace -c -f target/release/examples/insert_loop guard 2000 /tmp/x
//! ```
//!
//! The difference of the two totals divided by 1000 is the cost of one transaction.

use rusqlite::{Connection, OpenFlags};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, vfs, n, dir] = &args[..] else {
        eprintln!("usage: insert_loop guard|stock N DIR");
        std::process::exit(2);
    };
    let n: u32 = n.parse().expect("N is a number");
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir).expect("creating DIR");
    let path = dir.join(format!("insert-loop-{vfs}-{n}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
    let conn = match vfs.as_str() {
        "guard" => {
            hermes_guard::register().expect("registering hermes-guard");
            Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), hermes_guard::VFS_NAME)
        }
        _ => Connection::open(&path),
    }
    .expect("opening the database");
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0;
         CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);",
    )
    .expect("preparing the database");
    let mut insert = conn
        .prepare("INSERT INTO t (v) VALUES (?1)")
        .expect("preparing the insert");
    for i in 0..n {
        insert.execute([format!("row {i}")]).expect("inserting");
    }
}
