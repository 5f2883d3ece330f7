//! r2d2_sqlite 0.35: its `SqliteConnectionManager`, wrapped in the library's `GuardedManager`
//! (cargo feature `r2d2`), in the loss scenario, with r2d2's default settings. Every new
//! connection passes `GuardedManager`'s `connect` (its one `check_new`) at once: the test counts
//! the connections opened (r2d2_sqlite's init) against those r2d2 added to the pool (its
//! `handle_acquire` event), so a refused one, which r2d2 would quietly open again, shows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use hermes_guard::pool::{r2d2, GuardedManager};
use hermes_guard_frameworks::{rusqlite_write, write_rows, Scenario, INSERT, POOL, WRITERS};
use r2d2_sqlite::SqliteConnectionManager;

/// Counts the connections r2d2 added to the pool (an observer: r2d2's behaviour is unchanged).
#[derive(Debug)]
struct Added(Arc<AtomicUsize>);

impl r2d2::HandleEvent for Added {
    fn handle_acquire(&self, _: r2d2::event::AcquireEvent) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn an_r2d2_sqlite_pool_lets_go_of_a_lost_generation_and_every_refused_write_lands_on_retry() {
    let sc = Arc::new(Scenario::new());
    let (opened, added) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let manager = GuardedManager::new(SqliteConnectionManager::file(sc.uri()).with_init({
        let opened = opened.clone();
        move |c| {
            opened.fetch_add(1, Ordering::SeqCst);
            c.pragma_update(None, "busy_timeout", 10_000)
        }
    }));
    let pool = r2d2::Pool::builder()
        .max_size(POOL as u32)
        .event_handler(Box::new(Added(added.clone())))
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
    let (opened, added) = (opened.load(Ordering::SeqCst), added.load(Ordering::SeqCst));
    assert!(
        opened > POOL,
        "r2d2_sqlite: no connection was opened after the loss ({opened} in all)"
    );
    assert_eq!(
        opened, added,
        "r2d2_sqlite: a new connection was refused by `connect` (check_new)"
    );
    sc.assert_every_row_kept("r2d2_sqlite");
}
