//! deadpool-sqlite 0.14 in the loss scenario: its `Manager` wrapped in a manager of the
//! application's (the README's recipe) whose `create` keeps only a new connection that passes
//! `hermes_guard::pool::check_new` and whose `recycle` asks `check_out` first; a connection whose
//! write was refused is taken out of the pool (`Object::take`), deadpool's way with a broken one.

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
    inner: deadpool_sqlite::Manager,
    /// One new connection at a time: two probing at once would keep a lost `-shm` mapping
    /// alive for each other.
    creating: tokio::sync::Mutex<()>,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deadpool_sqlite_pool_lets_go_of_a_lost_generation_and_every_refused_write_lands_on_retry(
) {
    let sc = Arc::new(Scenario::new());
    // deadpool-sqlite opens `Connection::open(path)`: with rusqlite's default flags a `file:`
    // URI, so `?vfs=hermes-guard` reaches the guard.
    let manager = Guarded {
        inner: deadpool_sqlite::Manager::from_config(&Config::new(sc.uri()), Runtime::Tokio1),
        creating: tokio::sync::Mutex::new(()),
    };
    let pool: Pool = managed::Pool::builder(manager)
        .max_size(POOL)
        .build()
        .unwrap();

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
            async |conn: &mut Option<Object<Guarded>>, row: &str| {
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
            },
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
