//! A pool that heals itself. An r2d2 pool of 8 connections through the library's
//! `pool::GuardedManager`, 4 writer threads each holding a checkout for a batch of inserts; the
//! `-wal` and `-shm` are unlinked mid-stream. Every write refused on a connection of the lost
//! generation, retried once by the writer on a fresh checkout, lands; no checkout hands out a
//! retired connection; afterwards all 8 connections of the pool are healthy and take a write;
//! and once `hermes-guard recover` has merged each capture, every acknowledged row is live
//! exactly once. No restart: the same pool throughout, recovery included.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hermes_guard::pool::{r2d2, FileManager, GuardedManager};
use hermes_guard::{ErrorClass, GuardExt};

use crate::common::*;

const POOL: u32 = 8;
const WRITERS: usize = 4;
/// Rows each writer commits before the loss, and in all.
const BEFORE: usize = 25;
const ROWS: usize = 60;
/// Rows per checkout: the loss lands inside a checkout, so its next write is refused.
const BATCH: usize = 5;

type Pool = r2d2::Pool<GuardedManager<FileManager>>;

/// What the writers saw.
#[derive(Default)]
struct Seen {
    acknowledged: Vec<String>,
    refused_then_landed: usize,
    retired_at_checkout: usize,
    /// The longest a retried write waited for its fresh checkout.
    longest_retry_wait: Duration,
}

#[test]
fn a_pool_of_8_lets_go_of_a_lost_generation_and_every_refused_write_retried_once_lands() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    // The table, and a checkpointed history; the setup connection closes.
    checkpointed_history(&open_guarded(&db));

    // An init that does not read (as r2d2_sqlite's manager without one): a new connection
    // joins the `-shm` mapping only at its first read, which the manager's connect makes.
    let manager = GuardedManager::new(
        FileManager::new(&db).with_init(|conn| conn.pragma_update(None, "busy_timeout", 10_000)),
    );
    let pool: Pool = r2d2::Pool::builder()
        .max_size(POOL)
        .connection_timeout(Duration::from_secs(30))
        .build(manager)
        .unwrap();
    assert_eq!(pool.state().connections, POOL);

    let written = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (pool, written, seen) = (pool.clone(), written.clone(), seen.clone());
            thread::spawn(move || writer(w, &pool, &written, &seen))
        })
        .collect();

    // Mid-stream: every writer has committed its first rows (in the WAL only), then the loss.
    while written.load(Ordering::SeqCst) < WRITERS * BEFORE {
        thread::sleep(Duration::from_millis(1));
    }
    lose_sidecars(&db, false);
    for w in writers {
        w.join().unwrap();
    }

    let mut seen = Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap();
    eprintln!(
        "pool_heals: {} rows acknowledged, {} refused once and landed on retry (the longest \
         wait for the retry's checkout: {:?})",
        seen.acknowledged.len(),
        seen.refused_then_landed,
        seen.longest_retry_wait
    );
    assert_eq!(seen.acknowledged.len(), WRITERS * ROWS);
    assert!(
        seen.refused_then_landed >= 1,
        "the loss landed inside a checkout: some write was refused"
    );
    assert_eq!(
        seen.retired_at_checkout, 0,
        "a checkout handed out a retired connection"
    );

    // The pool now serves only healthy connections: all 8 at once, each takes a write.
    let all: Vec<_> = (0..POOL).map(|_| pool.get().unwrap()).collect();
    for (i, conn) in all.iter().enumerate() {
        assert!(!conn.is_retired(), "connection {i}");
        let status = conn.guard_status().unwrap();
        assert!(!status.retired, "connection {i}: {status:?}");
        assert_eq!(status.retired_connections_here, 0, "connection {i}");
        let row = format!("healthy {i}");
        insert(conn, &row).unwrap();
        seen.acknowledged.push(row);
    }
    drop(all);

    // Recovery under the same pool: every capture merged, then every acknowledged row is live
    // exactly once.
    let captures = artifacts(dir.path());
    assert!(
        !captures.is_empty(),
        "the lost generation held rows: captured"
    );
    eprintln!("pool_heals: {} capture(s)", captures.len());
    for capture in &captures {
        let (code, out, err) = hermes_guard_cli(&[
            OsStr::new("recover"),
            capture.as_os_str(),
            OsStr::new("--into"),
            db.as_os_str(),
            OsStr::new("--apply"),
        ]);
        assert_eq!(code, 0, "{}: {out}{err}", capture.display());
    }
    let conn = pool.get().unwrap();
    let mut live: HashMap<String, i64> = HashMap::new();
    let mut rows = conn
        .prepare("SELECT content FROM messages WHERE content NOT LIKE 'history %'")
        .unwrap();
    for content in rows.query_map([], |r| r.get::<_, String>(0)).unwrap() {
        *live.entry(content.unwrap()).or_default() += 1;
    }
    for row in &seen.acknowledged {
        assert_eq!(live.get(row), Some(&1), "{row}: live exactly once");
    }
    assert_eq!(
        live.len(),
        seen.acknowledged.len(),
        "no row that was not acknowledged"
    );
    assert!(integrity_ok(&conn));
    assert!(!conn.guard_status().unwrap().retired);
}

/// Writer `w`: `ROWS` inserts, `BATCH` per checkout. A refused insert is retried once, on a
/// fresh checkout asked for while the refused connection is still held (a new connection maps the
/// `-shm` now at the path, whatever old ones stay open), and must land; the refused one is then
/// returned, and the pool lets it go.
fn writer(w: usize, pool: &Pool, written: &AtomicUsize, seen: &Mutex<Seen>) {
    let checkout = || {
        let conn = pool.get().unwrap();
        if conn.is_retired() {
            seen.lock().unwrap().retired_at_checkout += 1;
        }
        conn
    };
    let mut conn = checkout();
    for i in 0..ROWS {
        if i % BATCH == 0 && i > 0 {
            // The next checkout is asked for while this one is still held: a connection of a lost
            // generation held meanwhile does not hold a new one back.
            let next = checkout();
            drop(conn);
            conn = next;
        }
        let row = format!("writer {w} row {i}");
        match insert(&conn, &row) {
            Ok(_) => {}
            Err(e) => {
                assert!(is_refusal(&e), "writer {w} row {i}: {e}");
                assert_eq!(conn.classify(&e), ErrorClass::WalLost, "{e}");
                let asked = Instant::now();
                let next = checkout();
                let waited = asked.elapsed();
                drop(conn);
                conn = next;
                insert(&conn, &row).unwrap_or_else(|e| {
                    panic!("writer {w} row {i}: the write retried once did not land: {e}")
                });
                let mut seen = seen.lock().unwrap();
                seen.refused_then_landed += 1;
                seen.longest_retry_wait = seen.longest_retry_wait.max(waited);
            }
        }
        seen.lock().unwrap().acknowledged.push(row);
        written.fetch_add(1, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(2));
    }
}

/// The hooks one step at a time, on one thread: a refused connection leaves the pool as it is
/// returned (`has_broken`), the idle one of the lost generation at its checkout (`is_valid`),
/// and the new connection that checkout gets passes its check at once (`connect`).
#[test]
fn a_refused_connection_leaves_at_its_return_and_an_idle_one_at_its_checkout() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    checkpointed_history(&open_guarded(&db));
    let pool = r2d2::Pool::builder()
        .max_size(2)
        .build(GuardedManager::file(&db))
        .unwrap();
    let conn = pool.get().unwrap();
    insert(&conn, "before the loss").unwrap();
    lose_sidecars(&db, false);
    let refused = insert(&conn, "after the loss").unwrap_err();
    assert!(is_refusal(&refused), "{refused}");
    assert!(conn.is_retired());
    drop(conn);
    assert_eq!(
        pool.state().connections,
        1,
        "the refused connection is closed as it is returned, not kept idle"
    );

    let conn = pool.get().unwrap();
    assert!(!conn.is_retired());
    let status = conn.guard_status().unwrap();
    assert!(!status.retired, "{status:?}");
    assert_eq!(status.retired_connections_here, 0);
    insert(&conn, "after the loss").unwrap();

    let captures = artifacts(dir.path());
    assert_eq!(captures.len(), 1, "{captures:?}");
    let (code, out, err) = hermes_guard_cli(&[
        OsStr::new("recover"),
        captures[0].as_os_str(),
        OsStr::new("--into"),
        db.as_os_str(),
        OsStr::new("--apply"),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(count_like(&conn, "before the loss"), 1);
    assert_eq!(count_like(&conn, "after the loss"), 1);
}
