//! tokio-rusqlite 0.8 in the loss scenario. It has no pool: each writer keeps one connection
//! (`tokio_rusqlite::Connection`, a rusqlite connection on a thread of its own) across its
//! batches, checks it at each batch (`hermes_guard::pool::check_out`), and replaces it when a
//! write is refused: the refused one closed (`close().await`: its close captures what it holds),
//! the new one opened until it passes `check_new` (docs/hosts.md's recipe, `open_healthy`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hermes_guard::pool::{check_new, check_out};
use hermes_guard_frameworks::{
    rusqlite_write, write_rows_async, Scenario, Write, INSERT, POOL, WRITERS,
};
use rusqlite::OpenFlags;
use tokio_rusqlite::Connection;

/// A new connection through the guard that did not attach to a lost generation: opened again,
/// after a pause doubling from 1 ms to 50 ms, while the old generation's connections close.
async fn open_healthy(sc: &Scenario) -> Connection {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pause = Duration::from_millis(1);
    loop {
        let conn = Connection::open_with_flags_and_vfs(
            &sc.db,
            OpenFlags::default(),
            hermes_guard::VFS_NAME,
        )
        .await
        .unwrap();
        let checked = conn
            .call(|c| {
                c.busy_timeout(Duration::from_secs(10))?;
                Ok::<_, rusqlite::Error>(check_new(c))
            })
            .await
            .unwrap();
        match checked {
            Ok(()) => return conn,
            Err(e) if Instant::now() + pause > deadline => panic!("no healthy connection: {e}"),
            Err(_) => {
                conn.close().await.unwrap();
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        }
    }
}

/// A writer's connection while it writes a batch; back in the writer's slot afterwards.
struct Held {
    conn: Option<Connection>,
    slot: Arc<Mutex<Option<Connection>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            *self.slot.lock().unwrap() = Some(conn);
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
        let slot = Arc::new(Mutex::new(None::<Connection>));
        async move {
            write_rows_async(
                sc,
                w,
                async || {
                    let kept = slot.lock().unwrap().take();
                    let conn = match kept {
                        Some(conn)
                            if conn
                                .call(|c| Ok::<_, rusqlite::Error>(check_out(c).is_ok()))
                                .await
                                .unwrap() =>
                        {
                            conn
                        }
                        Some(retired) => {
                            retired.close().await.unwrap();
                            open_healthy(sc).await
                        }
                        None => open_healthy(sc).await,
                    };
                    Held {
                        conn: Some(conn),
                        slot: slot.clone(),
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
            // The writer's last connection, closed.
            let last = slot.lock().unwrap().take();
            if let Some(conn) = last {
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
