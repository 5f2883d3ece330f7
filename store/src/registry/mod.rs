//! The shared registry of open SessionDb generations.
//!
//! [`Registry::acquire`] lends one shared [`SessionDb`] per *generation* of a path: the main
//! file's `(dev, ino)` as the lent handle opened it. When the file at the path is replaced (a
//! snapshot restore, a recovery), that generation is *retired*: the holders keep a valid handle
//! whose writes fail with [`StoreError::MainReplaced`], new callers get a fresh generation, a
//! retired generation is never lent again, and each generation's final release tears down
//! exactly that generation — never one that others still hold.
//!
//! A lost `-wal`/`-shm` leaves the main file in place, so it does not change the generation:
//! its holders (old and new) all get [`StoreError::WalLost`] from writes until the
//! last of them releases it; the next acquire then opens afresh. Lending a fresh connection
//! earlier would not help: SQLite's unix VFS shares one `-shm` mapping per main-file inode among
//! all connections of a process, so a new connection opened while the lost one is still open
//! attaches to the lost mapping and fails its first read.
//!
//! A lent handle is a [`SharedSessionDb`]: it derefs to the [`SessionDb`], and releases its
//! reference when dropped, closed or [released](SharedSessionDb::release). The teardown of a
//! final release (a PASSIVE checkpoint, then the guarded close) runs outside the registry's lock,
//! so one database's slow close never stalls acquisition of any other.
//!
//! A final teardown that cannot capture a retired generation leaves it open, *unsettled*: it
//! holds the only copy of the retired transactions. The next acquire of its path retries that
//! teardown before opening anything, and refuses with [`StoreError::CaptureFailed`]
//! while it still fails (a new connection would attach to the lost `-shm` anyway);
//! [`Registry::close_all`] retries every unsettled generation.
//!
//! The process-wide registry is [`global`], behind the free functions [`acquire`], [`release`],
//! [`release_or_close`], [`close_all`] and [`stats`]. A [`Registry`] value is an independent
//! registry (tests make one each; `with_opener`/`with_teardown` inject the open and teardown
//! steps, as the Python tests monkeypatch `_open_session_db` and `_teardown`).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hermes_guard::{identity_of_path, FileId};
use parking_lot::Mutex;

use crate::{HeldBack, SessionDb, StoreError};

mod shared;

pub use shared::{
    acquire, close_all, global, release, release_or_close, stats, ReleaseOrClose, SharedSessionDb,
};

/// How the registry opens a generation.
pub type Opener = dyn Fn(&Path) -> Result<SessionDb, StoreError> + Send + Sync;
/// How the registry tears a generation down after its final release.
pub type Teardown = dyn Fn(&SessionDb) -> Result<(), StoreError> + Send + Sync;

/// How many times an acquire opens the path when it keeps being replaced under the open.
const OPEN_ATTEMPTS: u32 = 8;

/// What the registry holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Generations that new acquires are lent (at most one per path).
    pub live_generations: usize,
    /// Retired generations still held by someone.
    pub retired_generations: usize,
    /// References held, over live and retired generations.
    pub references: usize,
    /// Generations whose final teardown could not capture their retired generation: kept open
    /// so the retired bytes stay recoverable, retried by the next [`Registry::acquire`] of their
    /// path and by [`Registry::close_all`].
    pub unsettled_generations: usize,
}

/// A registry of shared [`SessionDb`] generations. Cloning gives another handle to the same
/// registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    opener: Arc<Opener>,
    teardown: Arc<Teardown>,
}

#[derive(Default)]
struct State {
    /// The generation lent for each path.
    live: HashMap<PathBuf, Generation>,
    /// Retired generations with holders left, by serial.
    retired: HashMap<u64, Generation>,
    /// Torn down but not closed: their retired generation is not captured yet.
    unsettled: Vec<Unsettled>,
    next_serial: u64,
}

struct Unsettled {
    path: PathBuf,
    db: Arc<SessionDb>,
}

struct Generation {
    path: PathBuf,
    serial: u64,
    identity: FileId,
    db: Arc<SessionDb>,
    refs: usize,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("stats", &self.stats())
            .finish()
    }
}

/// The registry's own teardown of a generation: a PASSIVE checkpoint when it is live, then the
/// guarded close (which captures a retired generation first and refuses to close without it).
pub fn default_teardown(db: &SessionDb) -> Result<(), StoreError> {
    db.close_in_place()
}

impl Registry {
    /// An empty registry that opens with [`SessionDb::open`] and tears down with
    /// [`default_teardown`].
    pub fn new() -> Registry {
        Registry::from_hooks(
            Arc::new(|path: &Path| SessionDb::open(path)),
            Arc::new(default_teardown),
        )
    }

    /// An empty registry like this one but opening generations with `opener`.
    pub fn with_opener(
        self,
        opener: impl Fn(&Path) -> Result<SessionDb, StoreError> + Send + Sync + 'static,
    ) -> Registry {
        Registry::from_hooks(Arc::new(opener), self.inner.teardown.clone())
    }

    /// An empty registry like this one but tearing generations down with `teardown`.
    pub fn with_teardown(
        self,
        teardown: impl Fn(&SessionDb) -> Result<(), StoreError> + Send + Sync + 'static,
    ) -> Registry {
        Registry::from_hooks(self.inner.opener.clone(), Arc::new(teardown))
    }

    fn from_hooks(opener: Arc<Opener>, teardown: Arc<Teardown>) -> Registry {
        Registry {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                opener,
                teardown,
            }),
        }
    }

    /// Lends the live generation of `path`, opening one if there is none or if the file at the
    /// path was replaced (the one there is then retired: its holders keep it, nobody new gets
    /// it). A generation whose `-wal`/`-shm` was lost is the same main file, so it is still lent
    /// (its writes fail with [`StoreError::WalLost`]) until its last holder
    /// releases it.
    ///
    /// Before opening, the teardown of an unsettled generation of this path (one whose capture
    /// failed at its final release) is retried, outside the registry's lock; while it still
    /// fails, the acquire returns [`StoreError::CaptureFailed`] and opens nothing.
    ///
    /// Concurrent first acquires end up sharing one generation: each may open, but only one
    /// open is installed and the others are torn down. If the open fails, the registry keeps no
    /// entry for the path, and the next acquire opens afresh.
    pub fn acquire(&self, path: impl AsRef<Path>) -> Result<SharedSessionDb, StoreError> {
        let path = std::path::absolute(path.as_ref()).map_err(|source| StoreError::Io {
            database: path.as_ref().to_path_buf(),
            operation: "making the path absolute",
            source,
        })?;
        for _ in 0..OPEN_ATTEMPTS {
            if let Some(handle) = self.lend_live(&mut self.inner.state.lock(), &path)? {
                return Ok(handle);
            }
            self.settle_path(&path)?;
            // Opening can be slow (schema migration, a busy database): not under the lock.
            let db = Arc::new((self.inner.opener)(&path)?);
            let mut state = self.inner.state.lock();
            if let Some(handle) = self.lend_live(&mut state, &path)? {
                drop(state);
                log::debug!("{}: lost the open race; closing ours", path.display());
                self.teardown_loser(&db);
                return Ok(handle);
            }
            let current = self.identity(&path)?;
            match db.generation() {
                Some(identity) if Some(identity) == current => {
                    let serial = state.next_serial;
                    state.next_serial += 1;
                    state.live.insert(
                        path.clone(),
                        Generation {
                            path: path.clone(),
                            serial,
                            identity,
                            db: db.clone(),
                            refs: 1,
                        },
                    );
                    return Ok(SharedSessionDb {
                        registry: self.inner.clone(),
                        path,
                        serial,
                        identity,
                        db,
                        released: false,
                    });
                }
                _ => {
                    drop(state);
                    log::debug!("{}: replaced while opening; opening again", path.display());
                    self.teardown_loser(&db);
                }
            }
        }
        Err(StoreError::Unstable {
            database: path,
            attempts: OPEN_ATTEMPTS,
        })
    }

    /// With the lock held: lends the live generation of `path` if it is still the file at the
    /// path and not retired; otherwise retires it (its holders keep it) and returns `None`.
    fn lend_live(
        &self,
        state: &mut State,
        path: &Path,
    ) -> Result<Option<SharedSessionDb>, StoreError> {
        let Entry::Occupied(mut entry) = state.live.entry(path.to_path_buf()) else {
            return Ok(None);
        };
        let current = self.identity(path)?;
        let generation = entry.get_mut();
        if current == Some(generation.identity) {
            generation.refs += 1;
            return Ok(Some(SharedSessionDb {
                registry: self.inner.clone(),
                path: path.to_path_buf(),
                serial: generation.serial,
                identity: generation.identity,
                db: generation.db.clone(),
                released: false,
            }));
        }
        let generation = entry.remove();
        log::info!(
            "{}: retiring the shared generation {} ({} holder(s) keep it): {}",
            path.display(),
            generation.identity,
            generation.refs,
            match current {
                Some(now) => format!("the path now holds {now}"),
                None => "the file is gone".to_owned(),
            }
        );
        state.retired.insert(generation.serial, generation);
        Ok(None)
    }

    /// Retries the teardown of every unsettled generation of `path`. Until each is settled,
    /// opening the path would attach to the lost `-shm` the unsettled connection still maps,
    /// and its retired transactions would still have no copy but that connection.
    fn settle_path(&self, path: &Path) -> Result<(), StoreError> {
        for db in self.inner.unsettled_of(Some(path)) {
            match self.inner.retry_unsettled(&db) {
                Ok(()) => log::info!(
                    "{}: the retired generation owed a capture is captured and closed",
                    path.display()
                ),
                Err(StoreError::CaptureFailed {
                    message, source, ..
                }) => {
                    return Err(StoreError::CaptureFailed {
                        database: path.to_path_buf(),
                        message,
                        held_back: HeldBack::Acquire,
                        source,
                    })
                }
                Err(e) => log_teardown_error(&e),
            }
        }
        Ok(())
    }

    fn identity(&self, path: &Path) -> Result<Option<FileId>, StoreError> {
        identity_of_path(path).map_err(|source| StoreError::Io {
            database: path.to_path_buf(),
            operation: "stat",
            source,
        })
    }

    fn teardown_loser(&self, db: &Arc<SessionDb>) {
        if let Err(e) = (self.inner.teardown)(db) {
            log_teardown_error(&e);
        }
    }

    /// Closes every generation, live and retired, including those whose teardown could not
    /// capture before. For process shutdown: holders of handles still out get
    /// [`StoreError::Closed`] from them afterwards. Returns how many generations are still
    /// unsettled (their capture failed again; each was logged at ERROR and is kept open).
    pub fn close_all(&self) -> usize {
        let generations: Vec<Generation> = {
            let mut state = self.inner.state.lock();
            let mut generations: Vec<_> = state.live.drain().map(|(_, g)| g).collect();
            generations.extend(state.retired.drain().map(|(_, g)| g));
            generations
        };
        for generation in generations {
            if let Err(e) = self.inner.teardown(&generation.path, generation.db) {
                log_teardown_error(&e);
            }
        }
        for db in self.inner.unsettled_of(None) {
            if let Err(e) = self.inner.retry_unsettled(&db) {
                log_teardown_error(&e);
            }
        }
        self.inner.state.lock().unsettled.len()
    }

    /// What the registry holds now.
    pub fn stats(&self) -> RegistryStats {
        let state = self.inner.state.lock();
        RegistryStats {
            live_generations: state.live.len(),
            retired_generations: state.retired.len(),
            references: state
                .live
                .values()
                .chain(state.retired.values())
                .map(|g| g.refs)
                .sum(),
            unsettled_generations: state.unsettled.len(),
        }
    }

    /// The identity of the generation lent for `path` now, if any.
    pub fn live_generation(&self, path: impl AsRef<Path>) -> Option<FileId> {
        let path = std::path::absolute(path.as_ref()).ok()?;
        self.inner.state.lock().live.get(&path).map(|g| g.identity)
    }
}

impl Inner {
    /// Drops one reference of generation `serial`.
    fn release_ref(&self, path: &Path, serial: u64) -> Released {
        let mut state = self.state.lock();
        let state = &mut *state;
        let (generation, live) = match state.live.get_mut(path) {
            Some(g) if g.serial == serial => (g, true),
            _ => match state.retired.get_mut(&serial) {
                Some(g) => (g, false),
                None => return Released::Unknown,
            },
        };
        generation.refs -= 1;
        if generation.refs > 0 {
            return Released::StillHeld;
        }
        let generation = if live {
            state.live.remove(path)
        } else {
            state.retired.remove(&serial)
        };
        match generation {
            Some(g) => Released::Last(g.db),
            None => Released::StillHeld,
        }
    }

    /// Tears down `db`, a generation of `path` no longer in the registry; on a capture failure
    /// keeps it, open, among the unsettled.
    fn teardown(&self, path: &Path, db: Arc<SessionDb>) -> Result<(), StoreError> {
        let result = (self.teardown)(&db);
        if let Err(StoreError::CaptureFailed { .. }) = &result {
            self.state.lock().unsettled.push(Unsettled {
                path: path.to_path_buf(),
                db,
            });
        }
        result
    }

    /// The unsettled generations of `path`, or all of them. They stay listed while retried, so a
    /// concurrent retry of the same one meets the close already done (the teardown is
    /// idempotent and serialised on the handle's connection).
    fn unsettled_of(&self, path: Option<&Path>) -> Vec<Arc<SessionDb>> {
        let state = self.state.lock();
        state
            .unsettled
            .iter()
            .filter(|u| path.is_none_or(|p| u.path == p))
            .map(|u| u.db.clone())
            .collect()
    }

    fn is_unsettled(&self, db: &Arc<SessionDb>) -> bool {
        let state = self.state.lock();
        state.unsettled.iter().any(|u| Arc::ptr_eq(&u.db, db))
    }

    /// Retries the teardown of the unsettled `db`. It stays unsettled only while its capture
    /// keeps failing; any other outcome lets it go, as a first teardown would.
    fn retry_unsettled(&self, db: &Arc<SessionDb>) -> Result<(), StoreError> {
        let result = (self.teardown)(db);
        if !matches!(result, Err(StoreError::CaptureFailed { .. })) {
            let mut state = self.state.lock();
            state.unsettled.retain(|u| !Arc::ptr_eq(&u.db, db));
        }
        result
    }
}

/// What giving back one reference did.
enum Released {
    /// The registry no longer has the generation (after `close_all`).
    Unknown,
    /// Others still hold it.
    StillHeld,
    /// That was the last reference: the generation is out of the registry, to be torn down.
    Last(Arc<SessionDb>),
}

/// What a handle's release came to.
struct Release {
    /// The registry still had the generation (false after `close_all`, or a second release).
    found: bool,
    /// The teardown's outcome, when this was the last reference.
    teardown: Result<(), StoreError>,
}

fn log_teardown_error(e: &StoreError) {
    match e {
        StoreError::CaptureFailed { .. } => log::error!("{e}"),
        _ => log::debug!("closing a shared session store: {e}"),
    }
}
