//! diesel 2.3 in the loss scenario. It has no raw handle (`with_raw_connection` is diesel
//! 2.4's), so the guard is asked through SQL, which every host can run:
//! `SELECT hermes_guard_status() AS status` (installed by `hermes_guard::register()` on every
//! connection opened afterwards), read by column name with `sql_query` — the status after the
//! guard's retirement check, as JSON. An r2d2 manager of the application's wraps diesel's: a new
//! connection is kept once the status says it is not retired (after a read, which maps the
//! `-shm`; it is at once after a loss), a checkout checks the status; `has_broken` may not run
//! SQL (r2d2's rule), so a refused connection leaves at its next checkout, and a failed write is
//! the guard's refusal when the status says retired. r2d2's default settings otherwise.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use diesel::r2d2::{self, ConnectionManager, ManageConnection};
use diesel::sql_types::Text;
use diesel::{QueryableByName, RunQueryDsl, SqliteConnection};
use hermes_guard_frameworks::{write_rows, Scenario, Write, INSERT, POOL, WRITERS};

#[derive(QueryableByName)]
struct Status {
    #[diesel(sql_type = Text)]
    status: String,
}

/// Whether the guard says `conn`'s generation is retired.
fn retired(conn: &mut SqliteConnection) -> Result<bool, diesel::result::Error> {
    let row: Status =
        diesel::sql_query("SELECT hermes_guard_status() AS status").get_result(conn)?;
    let status: serde_json::Value = serde_json::from_str(&row.status).expect("the status is JSON");
    Ok(status["retired"] == serde_json::Value::Bool(true))
}

fn refused() -> r2d2::Error {
    r2d2::Error::ConnectionError(diesel::ConnectionError::BadConnection(
        "hermes-guard: this connection's generation is retired".into(),
    ))
}

/// diesel's manager with the guard's checks, through SQL.
struct Guarded {
    inner: ConnectionManager<SqliteConnection>,
    /// New connections found retired (for the test: none).
    refused_new: Arc<AtomicUsize>,
}

impl ManageConnection for Guarded {
    type Connection = SqliteConnection;
    type Error = r2d2::Error;

    fn connect(&self) -> Result<SqliteConnection, r2d2::Error> {
        let mut conn = self.inner.connect()?;
        diesel::sql_query("PRAGMA busy_timeout = 10000")
            .execute(&mut conn)
            .map_err(r2d2::Error::QueryError)?;
        // One read maps the -shm (the one now at the path, after a loss), then the status.
        diesel::sql_query("PRAGMA schema_version")
            .execute(&mut conn)
            .map_err(r2d2::Error::QueryError)?;
        match retired(&mut conn).map_err(r2d2::Error::QueryError)? {
            true => {
                self.refused_new.fetch_add(1, Ordering::SeqCst);
                Err(refused())
            }
            false => Ok(conn),
        }
    }

    fn is_valid(&self, conn: &mut SqliteConnection) -> Result<(), r2d2::Error> {
        self.inner.is_valid(conn)?;
        match retired(conn).map_err(r2d2::Error::QueryError)? {
            true => Err(refused()),
            false => Ok(()),
        }
    }

    fn has_broken(&self, conn: &mut SqliteConnection) -> bool {
        self.inner.has_broken(conn)
    }
}

#[test]
fn a_diesel_2_3_r2d2_pool_asking_the_guard_through_sql_lets_go_of_a_lost_generation() {
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
                        Err(e) if retired(conn).unwrap_or(false) => Write::Refused(e.to_string()),
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
        assert!(!retired(conn).unwrap(), "connection {i}");
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
        "diesel 2.3: a new connection was found retired"
    );
    sc.assert_every_row_kept("diesel 2.3");
}
