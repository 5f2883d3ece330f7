//! Writers in several threads of one process, each on its own `SessionDb` (its own connection)
//! to one database: they contend for SQLite's write lock, the store's `BEGIN IMMEDIATE` retry
//! resolves every collision, each message lands once, the counters bumped in the same
//! transactions agree, and the full-text index keeps in step.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use hermes_guard_store::{NewMessage, SessionDb, StoreOptions};
use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags};

const WRITERS: usize = 4;
const MESSAGES_EACH: usize = 30;
/// A deadlock bound, not a performance assertion.
const STUCK: Duration = Duration::from_secs(120);

/// The names of the threads whose `append_message` met a locked database and retried.
static RETRIED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps the names of the threads whose `append_message` retried.
fn record_retry(record: &log::Record<'_>) {
    let text = record.args().to_string();
    if record.target().starts_with("hermes_guard_store")
        && text.contains("append_message: database locked, retrying")
    {
        let name = thread::current().name().unwrap_or("").to_owned();
        RETRIED.lock().push(name);
    }
}

fn record_retries() {
    crate::common::record_logs_into(record_retry);
}

fn own_session(t: usize) -> String {
    format!("writer-{t}")
}

/// Appends, alternately to its own session and to the shared one, messages each carrying a
/// token found nowhere else (`w<t>m<i>`, `w<t>s<i>`).
fn write(db: &SessionDb, t: usize) -> Result<(), hermes_guard_store::StoreError> {
    for i in 0..MESSAGES_EACH {
        db.append_message(
            &own_session(t),
            &NewMessage::new("user", format!("w{t}m{i} from writer {t}")),
        )?;
        db.append_message(
            "shared",
            &NewMessage::new("assistant", format!("w{t}s{i} from writer {t}")),
        )?;
    }
    Ok(())
}

#[test]
fn writers_in_several_threads_each_on_its_own_connection_all_land_with_consistent_counters() {
    record_retries();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let setup = SessionDb::open(&path).unwrap();
    setup.ensure_session("shared", "threads").unwrap();
    for t in 0..WRITERS {
        setup.ensure_session(&own_session(t), "threads").unwrap();
    }
    setup.close().unwrap();

    // Another connection holds the write lock until every writer has met it, so each one's
    // retry runs for certain rather than by luck of timing.
    let blocker =
        Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), hermes_guard::VFS_NAME)
            .unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    // SQLite's own busy wait off: every collision comes back as SQLITE_BUSY and the store's
    // bounded retry has to resolve it. Enough attempts that only a deadlock exhausts them.
    let options = StoreOptions {
        busy_timeout: Duration::ZERO,
        write_attempts: 1000,
        ..StoreOptions::default()
    };
    let (done_tx, done_rx) = mpsc::channel();
    for t in 0..WRITERS {
        let (path, options, done_tx) = (path.clone(), options.clone(), done_tx.clone());
        thread::Builder::new()
            .name(own_session(t))
            .spawn(move || {
                let result = SessionDb::open_with(&path, options).and_then(|db| {
                    write(&db, t)?;
                    db.close().map(drop).map_err(|(_, e)| e)
                });
                let _ = done_tx.send((t, result));
            })
            .unwrap();
    }

    let mut waited = Duration::ZERO;
    loop {
        let mut retried = RETRIED.lock().clone();
        retried.sort();
        retried.dedup();
        if retried.len() == WRITERS {
            break;
        }
        assert!(waited < STUCK, "writers never met the lock: {retried:?}");
        thread::sleep(Duration::from_millis(5));
        waited += Duration::from_millis(5);
    }
    blocker.execute_batch("COMMIT").unwrap();
    drop(blocker);

    for _ in 0..WRITERS {
        let (t, result) = done_rx.recv_timeout(STUCK).expect("a writer is stuck");
        if let Err(e) = result {
            panic!("writer {t}: {e}");
        }
    }

    let db = SessionDb::open(&path).unwrap();
    for t in 0..WRITERS {
        let own = db.get_session(&own_session(t)).unwrap().unwrap();
        assert_eq!(own.message_count, MESSAGES_EACH as i64, "writer {t}");
        assert_eq!(db.get_messages(&own.id).unwrap().len(), MESSAGES_EACH);
    }
    let shared = db.get_session("shared").unwrap().unwrap();
    assert_eq!(shared.message_count, (WRITERS * MESSAGES_EACH) as i64);
    assert_eq!(
        db.get_messages("shared").unwrap().len(),
        WRITERS * MESSAGES_EACH
    );
    for t in 0..WRITERS {
        for i in 0..MESSAGES_EACH {
            for (token, session) in [
                (format!("w{t}m{i}"), own_session(t)),
                (format!("w{t}s{i}"), "shared".to_owned()),
            ] {
                let hits = db.search_messages(&token, 10).unwrap();
                assert_eq!(hits.len(), 1, "{token}: {hits:?}");
                assert_eq!(hits[0].session_id, session, "{token}");
                assert!(hits[0].snippet.contains(&format!(">>>{token}<<<")));
            }
        }
    }
}
