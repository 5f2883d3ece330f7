//! tokio-rusqlite 0.8 in the loss scenario. It has no pool: each writer keeps the connections it
//! opened (`tokio_rusqlite::Connection`, a rusqlite connection on a thread of its own) in a stash
//! of its own between batches, checks one as it takes it (`hermes_guard::pool::check_out`: a
//! retired one is closed), and closes one whose write was refused (`close().await`: its close
//! captures what it holds). A new connection is checked once (`check_new`, docs/hosts.md's
//! recipe, `open_healthy`): after a loss it maps the new `-shm` and passes at once, whatever
//! connections of the lost generation the writers still hold.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hermes_guard::pool::{check_new, check_out};
use hermes_guard_frameworks::{
    rusqlite_write, write_rows_async, Scenario, Write, INSERT, POOL, WRITERS,
};
use rusqlite::OpenFlags;
use tokio_rusqlite::Connection;

/// A new connection through the guard, checked once (`check_new`): it passes at once, even
/// right after a loss.
async fn open_healthy(sc: &Scenario) -> Connection {
    let conn =
        Connection::open_with_flags_and_vfs(&sc.db, OpenFlags::default(), hermes_guard::VFS_NAME)
            .await
            .unwrap();
    conn.call(|c| {
        c.busy_timeout(Duration::from_secs(10))?;
        Ok::<_, rusqlite::Error>(check_new(c))
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("a new connection was refused: {e}"));
    conn
}

/// A writer's connection while it writes a batch; back in the writer's stash afterwards.
struct Held {
    conn: Option<Connection>,
    stash: Arc<Mutex<Vec<Connection>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.stash.lock().unwrap().push(conn);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokio_rusqlite_writers_replace_a_retired_connection_and_every_refused_write_lands_on_retry(
) {
    let sc = Arc::new(Scenario::new());
    let loss = tokio::task::spawn_blocking({
        let sc = sc.clone();
        move || sc.lose_sidecars_mid_stream()
    });
    futures::future::join_all((0..WRITERS).map(|w| {
        let sc = &sc;
        let stash = Arc::new(Mutex::new(Vec::<Connection>::new()));
        async move {
            write_rows_async(
                sc,
                w,
                async || {
                    // A kept connection whose generation is retired is closed; none left, a
                    // new one.
                    let kept = loop {
                        let Some(conn) = stash.lock().unwrap().pop() else {
                            break None;
                        };
                        if conn
                            .call(|c| Ok::<_, rusqlite::Error>(check_out(c).is_ok()))
                            .await
                            .unwrap()
                        {
                            break Some(conn);
                        }
                        conn.close().await.unwrap();
                    };
                    let conn = match kept {
                        Some(conn) => conn,
                        None => open_healthy(sc).await,
                    };
                    Held {
                        conn: Some(conn),
                        stash: stash.clone(),
                    }
                },
                async |held: &mut Held, row: &str| {
                    let row = row.to_string();
                    let conn = held.conn.as_ref().unwrap();
                    let wrote = conn
                        .call(move |c| {
                            Ok::<_, rusqlite::Error>(rusqlite_write(c.execute(INSERT, [row])))
                        })
                        .await
                        .unwrap();
                    if matches!(wrote, Write::Refused(_)) {
                        held.conn.take().unwrap().close().await.unwrap();
                    }
                    wrote
                },
            )
            .await;
            // The writer's connections, closed.
            let kept: Vec<Connection> = std::mem::take(&mut *stash.lock().unwrap());
            for conn in kept {
                conn.close().await.unwrap();
            }
        }
    }))
    .await;
    loss.await.unwrap();

    // Eight connections at once: each healthy, each takes a write.
    let mut all = Vec::new();
    for _ in 0..POOL {
        all.push(open_healthy(&sc).await);
    }
    for (i, conn) in all.into_iter().enumerate() {
        let row = format!("healthy {i}");
        let r = row.clone();
        conn.call(move |c| {
            check_out(c)?;
            c.execute(INSERT, [r])
        })
        .await
        .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        sc.acknowledge(row);
        conn.close().await.unwrap();
    }
    sc.assert_every_row_kept("tokio-rusqlite");
}
