//! diesel 2.4 in the loss scenario: an r2d2 pool of `SqliteConnection`s (`diesel::r2d2`) opened
//! through the guard (diesel opens with `SQLITE_OPEN_URI`: `?vfs=hermes-guard`), its
//! `ConnectionManager` wrapped in a manager of the application's (docs/hosts.md's recipe) that adds
//! the guard's three checks on the raw handle (`with_raw_connection`, `hermes_guard::raw`):
//! `has_broken` drops a refused connection as it is returned, `is_valid` an idle one of the lost
//! generation at its checkout, `connect` checks a new one once (it passes at once after a loss).
//! r2d2's default settings otherwise.
//! diesel's error keeps SQLite's message, not its code (and its statement's reset has cleared
//! the handle's): a failed write is the guard's refusal when the handle is retired
//! (`raw::is_retired`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use diesel::r2d2::{self, ConnectionManager, ManageConnection};
use diesel::sql_types::Text;
use diesel::{RunQueryDsl, SqliteConnection};
use hermes_guard::raw;
use hermes_guard_frameworks::{write_rows, Scenario, Write, INSERT, POOL, WRITERS};
use rusqlite::ffi;

/// diesel's manager with the guard's checks.
struct Guarded {
    inner: ConnectionManager<SqliteConnection>,
    /// New connections `check_new` refused (for the test: none).
    refused_new: Arc<AtomicUsize>,
}

/// The guard's check `check` on the connection's raw handle.
fn on_handle<T>(conn: &mut SqliteConnection, check: unsafe fn(*mut ffi::sqlite3) -> T) -> T {
    // SAFETY: the handle is open and used by this thread only for the call; it is of the one
    // SQLite in this graph (Cargo links one libsqlite3-sys).
    unsafe { conn.with_raw_connection(|h| check(h.cast())) }
}

fn refused(e: rusqlite::Error) -> r2d2::Error {
    r2d2::Error::ConnectionError(diesel::ConnectionError::BadConnection(format!(
        "hermes-guard: {e}"
    )))
}

impl ManageConnection for Guarded {
    type Connection = SqliteConnection;
    type Error = r2d2::Error;

    fn connect(&self) -> Result<SqliteConnection, r2d2::Error> {
        let mut conn = self.inner.connect()?;
        diesel::sql_query("PRAGMA busy_timeout = 10000")
            .execute(&mut conn)
            .map_err(r2d2::Error::QueryError)?;
        on_handle(&mut conn, raw::check_new).map_err(|e| {
            self.refused_new.fetch_add(1, Ordering::SeqCst);
            refused(e)
        })?;
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut SqliteConnection) -> Result<(), r2d2::Error> {
        self.inner.is_valid(conn)?;
        on_handle(conn, raw::check_out).map_err(refused)
    }

    fn has_broken(&self, conn: &mut SqliteConnection) -> bool {
        on_handle(conn, raw::is_retired) || self.inner.has_broken(conn)
    }
}

#[test]
fn a_diesel_r2d2_pool_lets_go_of_a_lost_generation_and_every_refused_write_lands_on_retry() {
    let sc = Arc::new(Scenario::new());
    let refused_new = Arc::new(AtomicUsize::new(0));
    let manager = Guarded {
        inner: ConnectionManager::new(sc.uri()),
        refused_new: refused_new.clone(),
    };
    let pool = r2d2::Pool::builder()
        .max_size(POOL as u32)
        .build(manager)
        .unwrap();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (sc, pool) = (sc.clone(), pool.clone());
            thread::spawn(move || {
                write_rows(
                    &sc,
                    w,
                    || pool.get().unwrap(),
                    |conn, row| match diesel::sql_query(INSERT)
                        .bind::<Text, _>(row)
                        .execute(&mut **conn)
                    {
                        Ok(_) => Write::Landed,
                        Err(e) if on_handle(conn, raw::is_retired) => Write::Refused(e.to_string()),
                        Err(e) => Write::Failed(e.to_string()),
                    },
                )
            })
        })
        .collect();
    sc.lose_sidecars_mid_stream();
    for w in writers {
        w.join().unwrap();
    }

    let mut all: Vec<_> = (0..POOL).map(|_| pool.get().unwrap()).collect();
    for (i, conn) in all.iter_mut().enumerate() {
        on_handle(conn, raw::check_out).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        let row = format!("healthy {i}");
        diesel::sql_query(INSERT)
            .bind::<Text, _>(&row)
            .execute(&mut **conn)
            .unwrap();
        sc.acknowledge(row);
    }
    drop(all);
    // More than 8 were opened (the refused ones were closed, and 8 were live at once), and no
    // new one was refused, which r2d2 would have quietly connected again.
    assert_eq!(
        refused_new.load(Ordering::SeqCst),
        0,
        "diesel: a new connection was refused by check_new"
    );
    sc.assert_every_row_kept("diesel");
}
