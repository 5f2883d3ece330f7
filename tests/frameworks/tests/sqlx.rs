//! sqlx 0.9 (and 0.8: tests/frameworks-older runs this file too) in the loss scenario: a
//! `SqlitePool` whose connections are opened through the guard (`SqliteConnectOptions::vfs`),
//! with the guard's three checks in sqlx's hooks on the raw handle
//! (`lock_handle().as_raw_handle()`, `hermes_guard::raw`): `after_release` closes a connection
//! whose write was refused, `before_acquire` drops an idle one whose generation was lost,
//! `after_connect` checks a new one once (it passes at once after a loss: the guard maps the new
//! `-shm`). sqlx's default settings otherwise: no `idle_timeout`, its own `acquire_timeout`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hermes_guard::raw;
use hermes_guard_frameworks::{write_rows_async, Scenario, Write, INSERT, POOL, WRITERS};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions};
use sqlx::Sqlite;

/// The guard's check `check` on the connection's raw handle.
async fn on_handle<T>(
    conn: &mut SqliteConnection,
    check: unsafe fn(*mut rusqlite::ffi::sqlite3) -> T,
) -> Result<T, sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    // SAFETY: the handle is open and locked for this task for the call (`lock_handle`), and
    // it is of the one SQLite in this graph (Cargo links one libsqlite3-sys).
    Ok(unsafe { check(handle.as_raw_handle().as_ptr()) })
}

/// New connections `after_connect` refused (for the test: none).
static REFUSED_NEW: AtomicUsize = AtomicUsize::new(0);

/// sqlx's error for the guard's refusal of a new connection.
fn refused(e: rusqlite::Error) -> sqlx::Error {
    REFUSED_NEW.fetch_add(1, Ordering::SeqCst);
    sqlx::Error::Protocol(format!("hermes-guard: {e}"))
}

fn write(result: Result<sqlx::sqlite::SqliteQueryResult, sqlx::Error>) -> Write {
    match result {
        Ok(_) => Write::Landed,
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("1032") => {
            Write::Refused(e.to_string())
        }
        Err(e) => Write::Failed(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_sqlx_pool_lets_go_of_a_lost_generation_and_every_refused_write_lands_on_retry() {
    let sc = Arc::new(Scenario::new());
    let options = SqliteConnectOptions::new()
        .filename(&sc.db)
        .vfs(hermes_guard::VFS_NAME)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(POOL as u32)
        .after_release(|conn, _| {
            Box::pin(async move { Ok(!on_handle(conn, raw::is_retired).await?) })
        })
        .before_acquire(|conn, _| {
            Box::pin(async move { Ok(on_handle(conn, raw::check_out).await?.is_ok()) })
        })
        .after_connect(|conn, _| {
            Box::pin(async move { on_handle(conn, raw::check_new).await?.map_err(refused) })
        })
        .connect_with(options)
        .await
        .unwrap();

    let loss = tokio::task::spawn_blocking({
        let sc = sc.clone();
        move || sc.lose_sidecars_mid_stream()
    });
    futures::future::join_all((0..WRITERS).map(|w| {
        write_rows_async(
            &sc,
            w,
            async || pool.acquire().await.unwrap(),
            async |conn: &mut PoolConnection<Sqlite>, row: &str| {
                write(sqlx::query(INSERT).bind(row).execute(&mut **conn).await)
            },
        )
    }))
    .await;
    loss.await.unwrap();

    let mut all = Vec::new();
    for _ in 0..POOL {
        all.push(pool.acquire().await.unwrap());
    }
    for (i, conn) in all.iter_mut().enumerate() {
        on_handle(conn, raw::check_out)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        let row = format!("healthy {i}");
        sqlx::query(INSERT)
            .bind(&row)
            .execute(&mut **conn)
            .await
            .unwrap();
        sc.acknowledge(row);
    }
    drop(all);
    // More than 8 were opened (the refused ones were closed, and 8 were live at once), and no
    // new one was refused, which sqlx would have quietly connected again.
    assert_eq!(
        REFUSED_NEW.load(Ordering::SeqCst),
        0,
        "sqlx: a new connection was refused by check_new"
    );
    sc.assert_every_row_kept("sqlx");
}
