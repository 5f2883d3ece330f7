//! The distribution's Python (`/usr/bin/python3`, whose stdlib `sqlite3` is the system SQLite,
//! 3.40 on Debian 12) as a peer process, and its `F_GETLK` probe: what another process sees of a
//! file's locks. Shared by the tests of the wal-index protocol and of the lock shield.

use std::path::Path;
use std::process::Command;

use crate::common::skip_unless_ci;

pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// The dead-man switch: byte 128 of the `-shm` (`UNIX_SHM_DMS`).
pub const SHM_DMS: i64 = 128;

/// Asks with `F_GETLK` whether a write lock on `len` bytes at `start` of a file would conflict
/// and prints `<read|write|none> <l_pid>`.
const GETLK: &str = r#"
import fcntl, os, struct, sys
path, start, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDWR)
req = struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0) + b"\0" * 4
res = fcntl.fcntl(fd, fcntl.F_GETLK, req)
l_type, _, _, _, l_pid = struct.unpack("hhqqi", res[:28])
kind = {fcntl.F_RDLCK: "read", fcntl.F_WRLCK: "write", fcntl.F_UNLCK: "none"}[l_type]
print(kind, l_pid)
"#;

/// The system Python with a working `sqlite3`, or `None` (and why, printed; a failure in CI).
pub fn system_python() -> Option<&'static str> {
    let ok = Command::new(SYSTEM_PYTHON)
        .args(["-c", "import sqlite3, fcntl"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_unless_ci(&format!(
            "{SYSTEM_PYTHON} with the stdlib sqlite3 is not available"
        ));
    }
    ok.then_some(SYSTEM_PYTHON)
}

/// What another process sees when it asks for a write lock on `len` bytes at `start` of `file`:
/// `("read", -1)` for an OFD read lock, `("read", pid)` for a POSIX one, `("none", _)` for none.
pub fn peer_getlk(python: &str, file: &Path, start: i64, len: i64) -> (String, i64) {
    let out = Command::new(python)
        .arg("-c")
        .arg(GETLK)
        .arg(file)
        .args([start.to_string(), len.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "getlk failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let (kind, pid) = line.trim().split_once(' ').unwrap();
    (kind.to_string(), pid.parse().unwrap())
}
