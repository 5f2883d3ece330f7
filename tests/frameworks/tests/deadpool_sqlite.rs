//! deadpool-sqlite 0.14 in the loss scenario: its `Manager` wrapped in a manager of the
//! application's (docs/hosts.md's recipe) whose `create` keeps only a new connection that passes
//! `hermes_guard::pool::check_new` and whose `recycle` asks `check_out` first; a connection whose
//! write was refused is taken out of the pool (`Object::take`), deadpool's way with a broken one;
//! and a reaper (`Pool::retain`) closes connections idle for 2 s, as deadpool has no idle timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, RecycleError, RecycleResult};
use deadpool_sqlite::{rusqlite, Config, Runtime};
use hermes_guard::pool::{check_new, check_out};
use hermes_guard_frameworks::{
    rusqlite_write, write_rows_async, Scenario, Write, INSERT, POOL, WRITERS,
};

/// deadpool-sqlite's manager with the guard's checks.
struct Guarded {
    inner: Counted,
    /// One new connection at a time: two probing at once would keep a lost `-shm` mapping
    /// alive for each other.
    creating: tokio::sync::Mutex<()>,
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
        let _one_at_a_time = self.creating.lock().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut pause = Duration::from_millis(1);
        loop {
            let conn = self.inner.create().await?;
            let checked = conn
                .interact(|c| {
                    c.busy_timeout(Duration::from_secs(10))?;
                    check_new(c)
                })
                .await
                .map_err(|e| rusqlite::Error::InvalidParameterName(e.to_string()))?;
            match checked {
                Ok(()) => return Ok(conn),
                // Attached to a lost generation's mapping: closed, and opened again once the
                // old connections are gone.
                Err(e) if Instant::now() + pause > deadline => return Err(e),
                Err(_) => {
                    drop(conn);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
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

/// deadpool has no idle timeout: a connection left idle since before a loss, which nobody checks
/// out again, would keep the lost generation's `-shm` mapping for every new connection, and
/// `create` would wait for it in vain. Every second, connections idle for 2 s are closed.
fn reap_idle(pool: &Pool) -> tokio::task::JoinHandle<()> {
    let pool = pool.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            pool.retain(|_, metrics| metrics.last_used() < Duration::from_secs(2));
        }
    })
}

/// The scenario's pool: deadpool-sqlite's manager wrapped, [`crate::POOL`] connections.
fn guarded_pool(sc: &Scenario) -> Pool {
    // deadpool-sqlite opens `Connection::open(path)`: with rusqlite's default flags a `file:`
    // URI, so `?vfs=hermes-guard` reaches the guard.
    let manager = Guarded {
        inner: Counted {
            manager: deadpool_sqlite::Manager::from_config(&Config::new(sc.uri()), Runtime::Tokio1),
            opened: AtomicUsize::new(0),
        },
        creating: tokio::sync::Mutex::new(()),
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
    let reaper = reap_idle(&pool);

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
    reaper.abort();
    sc.assert_every_row_kept("deadpool-sqlite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_idle_since_before_the_loss_is_reaped_so_a_new_one_opens() {
    let sc = Arc::new(Scenario::new());
    let pool = guarded_pool(&sc);
    let reaper = reap_idle(&pool);
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
    // The retry's checkout finds no idle connection and creates one, which attaches to the lost
    // mapping `idle` holds; only then does `idle` go back to the pool, where no checkout will
    // take it: the reaper must.
    let retry = tokio::spawn({
        let pool = pool.clone();
        async move { pool.get().await }
    });
    // Two connections before, the retry's first, and a second once the first found the mapping.
    while pool.manager().inner.opened.load(Ordering::SeqCst) < 4 {
        assert!(
            !retry.is_finished(),
            "the retry's checkout ended before its new connection found the lost mapping"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(idle);
    let mut fresh = Some(
        retry
            .await
            .unwrap()
            .expect("a new connection opens once the idle one is reaped"),
    );
    assert!(matches!(insert(&mut fresh, "after").await, Write::Landed));
    sc.landed_on_retry("after".into());
    drop(fresh);
    reaper.abort();
    pool.close();
    sc.assert_every_row_kept("deadpool-sqlite, an idle connection reaped");
}
