//! Shared harness for the integration tests: real databases in temp dirs, real unlinks and
//! renames, descriptors found through /proc like the Python seeds do.
#![allow(dead_code)]

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use hermes_guard::FileId;
use rusqlite::{Connection, OpenFlags};

pub const SENTINEL_PREFIX: &str = "committed only in the retired WAL ";

pub fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// A connection through hermes-guard, in WAL mode, with the `messages` table.
pub fn open_guarded(path: &Path) -> Connection {
    hermes_guard::register().unwrap();
    let conn =
        Connection::open_with_flags_and_vfs(path, OpenFlags::default(), hermes_guard::VFS_NAME)
            .unwrap();
    prepare(&conn);
    conn
}

/// The same, through the stock unix VFS.
pub fn open_stock(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    prepare(&conn);
    conn
}

fn prepare(conn: &Connection) {
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, session TEXT, content TEXT)",
    )
    .unwrap();
}

/// Seeds and checkpoints history, then commits one row that lives only in the WAL.
pub fn wal_only_sentinel(conn: &Connection) -> String {
    conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..20 {
        insert(conn, &format!("history {i}")).unwrap();
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let sentinel = format!("{SENTINEL_PREFIX}{}", "x".repeat(3000));
    insert(conn, &sentinel).unwrap();
    sentinel
}

pub fn insert(conn: &Connection, content: &str) -> rusqlite::Result<usize> {
    conn.execute(
        "INSERT INTO messages (session, content) VALUES ('gw-0', ?1)",
        [content],
    )
}

pub fn count_like(conn: &Connection, pattern: &str) -> i64 {
    conn.query_row(
        "SELECT COUNT(*) FROM messages WHERE content LIKE ?1",
        [pattern],
        |r| r.get(0),
    )
    .unwrap()
}

pub fn integrity_ok(conn: &Connection) -> bool {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .unwrap()
        == "ok"
}

/// Takes the sidecars away as a cleanup script (unlink) or a restore (rename) would.
pub fn lose_sidecars(path: &Path, rename: bool) {
    for suffix in ["-wal", "-shm"] {
        let side = sidecar(path, suffix);
        if rename {
            fs::rename(&side, sidecar(path, &format!("{suffix}.moved-away"))).unwrap();
        } else {
            fs::remove_file(&side).unwrap();
        }
    }
}

/// Replaces the main file with a copy: new inode, same logical database (snapshot restore).
pub fn replace_main_file(path: &Path) {
    let tmp = path.with_extension("replacement.tmp");
    fs::copy(path, &tmp).unwrap();
    fs::remove_file(path).unwrap();
    fs::rename(&tmp, path).unwrap();
}

pub fn identity(path: &Path) -> FileId {
    hermes_guard::identity::identity_of_path(path)
        .unwrap()
        .unwrap()
}

/// The bytes of the inode `id`, read through whichever descriptor of this process holds it.
pub fn descriptor_contents(id: FileId) -> Vec<u8> {
    for entry in fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let link = entry.path();
        let Ok(meta) = fs::metadata(&link) else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        if meta.dev() == id.dev && meta.ino() == id.ino {
            let mut bytes = Vec::new();
            fs::File::open(&link)
                .unwrap()
                .read_to_end(&mut bytes)
                .unwrap();
            return bytes;
        }
    }
    panic!("no descriptor of this process holds {id}");
}

pub fn manifest(artifact: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(artifact.join(hermes_guard::capture::MANIFEST_NAME)).unwrap())
        .unwrap()
}

/// Opens the captured image + WAL as a fresh database, nothing else from the original path.
pub fn recover(artifact: &Path, name: &str, workdir: &Path) -> Connection {
    fs::create_dir_all(workdir).unwrap();
    fs::copy(artifact.join(name), workdir.join(name)).unwrap();
    fs::copy(
        artifact.join(format!("{name}-wal")),
        workdir.join(format!("{name}-wal")),
    )
    .unwrap();
    Connection::open(workdir.join(name)).unwrap()
}

pub fn is_refusal(err: &rusqlite::Error) -> bool {
    matches!(err.sqlite_error(), Some(e) if e.extended_code == rusqlite::ffi::SQLITE_READONLY_DBMOVED)
}

pub fn artifacts(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(".retired-wal-"))
        .collect();
    found.sort();
    found
}
