//! `xOpen`'s decisions: the file's kind and state, and the stale-WAL gate before a WAL opens.
//! Its C side (the wrapped open into SQLite's buffer or the heap, the table's installation) is
//! `layout::open`.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::ffi;

use super::*;
use crate::vfs::state::ConnectionState;

/// The kind and state of a file the wrapped VFS just opened (`opened`); `Err`: SQLite's answer,
/// the open failed.
pub(super) fn kind_and_state(
    mut opened: Opened<'_>,
) -> Result<(Kind, Option<Arc<ConnectionState>>), c_int> {
    Ok(match opened.path.take() {
        Some(path) if opened.flags & ffi::SQLITE_OPEN_MAIN_DB != 0 => {
            (Kind::Main, Some(main_state(path, &opened)))
        }
        Some(path) if opened.flags & ffi::SQLITE_OPEN_WAL != 0 => match opened.wal_main {
            Some(state) => {
                if state.pin_wal(&path, opened.wal_fd).is_err() {
                    return Err(ffi::SQLITE_CANTOPEN);
                }
                (Kind::Wal, Some(state))
            }
            None => (Kind::Other, None),
        },
        _ => (Kind::Other, None),
    })
}

/// A main file's state: pinned to what SQLite opened, its main image and base reader, its
/// shield armed on SQLite's descriptor.
fn main_state(path: PathBuf, opened: &Opened<'_>) -> Arc<ConnectionState> {
    let h = opened.prefix.map(|p| p.h).filter(|&h| h >= 0);
    let state = ConnectionState::new_pinned(path, h, inode_file_id(opened.prefix));
    ConnectionState::opened_here(&state);
    state.set_main_image(Some(Box::new(MainImage(opened.sub))));
    state.set_base_reader(match h {
        Some(h) => Box::new(MainByDescriptor(h)),
        None => Box::new(MainImage(opened.sub)),
    });
    let main_fd = (opened.main_descriptor)(&state);
    state.shield().arm(main_fd, state.db_path());
    state
}

/// The stale-WAL judgement of an existing WAL, before SQLite opens it (`vfs/stale_wal/gate.rs`):
/// `main`, the main file whose WAL it is when it is one of the guard's, with its state; `path`,
/// the WAL's.
pub(super) fn stale_wal_gate(
    main: Option<(Live<'_>, &Arc<ConnectionState>)>,
    path: Option<&Path>,
) -> c_int {
    let Some((main, state)) = main else {
        return ffi::SQLITE_OK;
    };
    if let Some(fs) = state.wal_refused_on() {
        // Under `PRAGMA locking_mode=EXCLUSIVE` SQLite holds the main file EXCLUSIVE
        // before it opens the WAL and keeps its index in heap memory: one connection of one
        // process, no shared memory, safe on any filesystem. That is how such a database is
        // read, and taken out of WAL mode, where WAL is refused.
        if !state.main_locked_above_shared() {
            log::error!(
                "hermes-guard: refusing to open the WAL of {}: it is on {}, where SQLite's WAL \
                 mode is not safe; {}=refuse is set. To read it here, or take it out of WAL mode, \
                 open it alone with `PRAGMA locking_mode=EXCLUSIVE` first (no shared memory: safe \
                 there), then `PRAGMA journal_mode=DELETE`; or open it from a local filesystem",
                state.db_path().display(),
                fs.name,
                crate::filesystem::UNSAFE_FS_ENV
            );
            return ffi::SQLITE_CANTOPEN;
        }
        log::info!(
            "hermes-guard: the WAL of {} on {} is opened under locking_mode=EXCLUSIVE (heap \
             memory, one connection): allowed where {}=refuse refuses shared WAL mode",
            state.db_path().display(),
            fs.name,
            crate::filesystem::UNSAFE_FS_ENV
        );
    }
    let Some(path) = path else {
        return ffi::SQLITE_OK;
    };
    let image = main.io().main_image();
    crate::vfs::stale_wal::before_wal_open(&**state, &image, &OwnLocks(main), path)
}

/// The main file's locks through the guard's own table, as SQLite calls them (the shield and
/// the state follow the level, as for SQLite's own calls): SQLite holds SHARED on it while its
/// WAL opens.
struct OwnLocks<'a>(Live<'a>);

impl crate::vfs::stale_wal::MainLocks for OwnLocks<'_> {
    fn lock(&self, level: c_int) -> c_int {
        hot::lock(self.0, level)
    }

    fn unlock(&self, level: c_int) -> c_int {
        hot::unlock(self.0, level)
    }
}
