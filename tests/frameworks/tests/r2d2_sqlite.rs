//! r2d2_sqlite 0.35: its `SqliteConnectionManager`, wrapped in the library's `GuardedManager`
//! (cargo feature `r2d2`), in the loss scenario.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use hermes_guard::pool::{r2d2, GuardedManager};
use hermes_guard_frameworks::{rusqlite_write, write_rows, Scenario, INSERT, POOL, WRITERS};
use r2d2_sqlite::SqliteConnectionManager;

#[test]
fn an_r2d2_sqlite_pool_lets_go_of_a_lost_generation_and_every_refused_write_lands_on_retry() {
    let sc = Arc::new(Scenario::new());
    let manager = GuardedManager::new(
        SqliteConnectionManager::file(sc.uri())
            .with_init(|c| c.pragma_update(None, "busy_timeout", 10_000)),
    );
    let pool = r2d2::Pool::builder()
        .max_size(POOL as u32)
        .connection_timeout(Duration::from_secs(30))
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
                    |conn, row| rusqlite_write(conn.execute(INSERT, [row])),
                )
            })
        })
        .collect();
    sc.lose_sidecars_mid_stream();
    for w in writers {
        w.join().unwrap();
    }

    // Every connection of the pool, checked out at once: healthy, and each takes a write.
    let all: Vec<_> = (0..POOL).map(|_| pool.get().unwrap()).collect();
    for (i, conn) in all.iter().enumerate() {
        hermes_guard::pool::check_out(conn).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        let row = format!("healthy {i}");
        conn.execute(INSERT, [&row]).unwrap();
        sc.acknowledge(row);
    }
    drop(all);
    sc.assert_every_row_kept("r2d2_sqlite");
}
