//! deadpool-sqlite 0.14 in the loss scenario: its `Manager` wrapped in a manager of the
//! application's (docs/hosts.md's recipe) whose `create` checks a new connection once
//! (`hermes_guard::pool::check_new`) and whose `recycle` asks `check_out` first; a connection
//! whose write was refused is taken out of the pool (`Object::take`), deadpool's way with a
//! broken one. deadpool's default settings otherwise: no reaper, no retry of `create`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, RecycleError, RecycleResult};
use deadpool_sqlite::{rusqlite, Config, Runtime};
use hermes_guard::pool::{check_new, check_out};
use hermes_guard::GuardExt;
use hermes_guard_frameworks::{
    rusqlite_write, write_rows_async, Scenario, Write, INSERT, POOL, WRITERS,
};

/// deadpool-sqlite's manager with the guard's checks.
struct Guarded {
    inner: Counted,
}

/// deadpool-sqlite's pooled connection.
type SqliteConn = <deadpool_sqlite::Manager as managed::Manager>::Type;

/// deadpool-sqlite's manager, counting the connections it opens (for the tests only; an
/// application wraps `deadpool_sqlite::Manager` itself).
struct Counted {
    manager: deadpool_sqlite::Manager,
    opened: AtomicUsize,
}

impl Counted {
    async fn create(&self) -> Result<SqliteConn, rusqlite::Error> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        managed::Manager::create(&self.manager).await
    }

    async fn recycle(
        &self,
        conn: &mut SqliteConn,
        metrics: &Metrics,
    ) -> RecycleResult<rusqlite::Error> {
        managed::Manager::recycle(&self.manager, conn, metrics).await
    }
}

impl managed::Manager for Guarded {
    type Type = <deadpool_sqlite::Manager as managed::Manager>::Type;
    type Error = rusqlite::Error;

    async fn create(&self) -> Result<Self::Type, rusqlite::Error> {
        let conn = self.inner.create().await?;
        conn.interact(|c| {
            c.busy_timeout(Duration::from_secs(10))?;
            check_new(c)
        })
        .await
        .map_err(|e| rusqlite::Error::InvalidParameterName(e.to_string()))??;
        Ok(conn)
    }

    async fn recycle(
        &self,
        conn: &mut Self::Type,
        metrics: &Metrics,
    ) -> RecycleResult<rusqlite::Error> {
        conn.interact(|c| check_out(c))
            .await
            .map_err(|e| RecycleError::message(e.to_string()))??;
        self.inner.recycle(conn, metrics).await
    }
}

type Pool = managed::Pool<Guarded>;

/// The scenario's pool: deadpool-sqlite's manager wrapped, [`crate::POOL`] connections.
fn guarded_pool(sc: &Scenario) -> Pool {
    // deadpool-sqlite opens `Connection::open(path)`: with rusqlite's default flags a `file:`
    // URI, so `?vfs=hermes-guard` reaches the guard.
    let manager = Guarded {
        inner: Counted {
            manager: deadpool_sqlite::Manager::from_config(&Config::new(sc.uri()), Runtime::Tokio1),
            opened: AtomicUsize::new(0),
        },
    };
    managed::Pool::builder(manager)
        .max_size(POOL)
        .build()
        .unwrap()
}

/// An insert on a checked-out connection; a refused one is taken out of the pool.
async fn insert(conn: &mut Option<Object<Guarded>>, row: &str) -> Write {
    let row = row.to_string();
    let wrote = conn
        .as_ref()
        .unwrap()
        .interact(move |c| rusqlite_write(c.execute(INSERT, [row])))
        .await
        .unwrap();
    if matches!(wrote, Write::Refused(_)) {
        // Out of the pool for good (closed), not back among the idle ones.
        drop(Object::take(conn.take().unwrap()));
    }
    wrote
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deadpool_sqlite_pool_lets_go_of_a_lost_generation_and_every_refused_write_lands_on_retry(
) {
    let sc = Arc::new(Scenario::new());
    let pool = guarded_pool(&sc);

    // The writers run as futures of this task (their inserts on deadpool's blocking threads);
    // the loss comes from a blocking thread beside them.
    let loss = tokio::task::spawn_blocking({
        let sc = sc.clone();
        move || sc.lose_sidecars_mid_stream()
    });
    futures::future::join_all((0..WRITERS).map(|w| {
        write_rows_async(
            &sc,
            w,
            async || Some(pool.get().await.unwrap()),
            async |conn: &mut Option<Object<Guarded>>, row: &str| insert(conn, row).await,
        )
    }))
    .await;
    loss.await.unwrap();

    let mut all = Vec::new();
    for _ in 0..POOL {
        all.push(pool.get().await.unwrap());
    }
    for (i, conn) in all.iter().enumerate() {
        let row = format!("healthy {i}");
        let r = row.clone();
        conn.interact(move |c| {
            check_out(c)?;
            c.execute(INSERT, [r])
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        sc.acknowledge(row);
    }
    drop(all);
    sc.assert_every_row_kept("deadpool-sqlite");
}

/// The case the reaper was for, before the guard mapped the wal-index itself: a connection of
/// the lost generation still open (checked out, then idle in the pool, where nobody takes it)
/// while the retry's checkout creates a new one. The new one passes `check_new` at once, the
/// first opened, and takes the write; the old one, once back in the pool, is dropped at its
/// next recycle (`check_out`), never handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_of_the_lost_generation_still_open_does_not_hold_back_a_new_one() {
    let sc = Arc::new(Scenario::new());
    let pool = guarded_pool(&sc);
    let mut refused = Some(pool.get().await.unwrap());
    let idle = pool.get().await.unwrap();
    assert!(matches!(
        insert(&mut refused, "before 1").await,
        Write::Landed
    ));
    sc.acknowledge("before 1".into());
    sc.lose_sidecars_now();
    let Write::Refused(_) = insert(&mut refused, "after").await else {
        panic!("the write after the loss was not refused");
    };
    // `idle` (of the lost generation) is still checked out: the retry's checkout creates one.
    let mut fresh = Some(pool.get().await.expect("a new connection opens at once"));
    assert_eq!(
        pool.manager().inner.opened.load(Ordering::SeqCst),
        3,
        "two connections before the loss, and one new one, which passed check_new at once"
    );
    assert!(matches!(insert(&mut fresh, "after").await, Write::Landed));
    sc.landed_on_retry("after".into());
    let status = fresh
        .as_ref()
        .unwrap()
        .interact(|c| c.guard_status())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.retired, "{status:?}");
    drop(fresh);

    // The lost generation's connection goes back among the idle ones; the next checkouts
    // recycle it (`check_out` retires it) and hand out only healthy connections.
    drop(idle);
    let mut both = Vec::new();
    for _ in 0..2 {
        both.push(pool.get().await.unwrap());
    }
    for (i, conn) in both.iter().enumerate() {
        let status = conn.interact(|c| c.guard_status()).await.unwrap().unwrap();
        assert!(!status.retired, "checkout {i}: {status:?}");
    }
    drop(both);
    pool.close();
    sc.assert_every_row_kept("deadpool-sqlite, a lost connection still open");
}
