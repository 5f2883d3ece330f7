//! The stale-WAL tests' controls: ordinary life is untouched. Each runs alone (the log is
//! process-wide) and asserts every expected row, no capture, and nothing logged above INFO.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::{
    artifacts, integrity_ok, open_guarded, open_stock, record_logs_into, sidecar, Gateway,
};
use crate::stale_wal::{count, killed_writer, seed_with_backup, RESTORED};
use hermes_guard::GuardExt;

static LOUD: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());

fn watch_logs() {
    record_logs_into(|r| {
        if r.level() <= log::Level::Warn {
            LOUD.lock().push(format!("{}: {}", r.level(), r.args()));
        }
    });
}

#[track_caller]
fn assert_untouched(db: &Path, rows: i64) {
    let conn = open_guarded(db);
    assert_eq!(count(&conn), rows, "every committed row");
    assert!(integrity_ok(&conn));
    assert!(conn.guard_status().unwrap().stale_wal.is_none());
    drop(conn);
    assert!(artifacts(db.parent().unwrap()).is_empty(), "no capture");
    assert!(
        LOUD.lock().is_empty(),
        "logged above INFO: {:?}",
        LOUD.lock()
    );
}

fn setup() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let backup = dir.path().join("backup.db");
    seed_with_backup(&db, &backup);
    (dir, db, backup)
}

test_alone! {
    fn crash_recovery_after_kill_replays_as_always() {
        watch_logs();
        let (_dir, db, _) = setup();
        let rows = killed_writer(&db, "guard", 30);
        assert_untouched(&db, rows);
    }
}

test_alone! {
    fn a_database_and_its_wal_copied_together_elsewhere_replay() {
        watch_logs();
        let (dir, db, _) = setup();
        let rows = killed_writer(&db, "guard", 30);
        // With their attributes (cp -a: the record travels) and without (plain copies).
        for (sub, args) in [("snap-a", &["-a"][..]), ("snap-plain", &[][..])] {
            let to = dir.path().join(sub);
            fs::create_dir(&to).unwrap();
            for f in ["state.db", "state.db-wal", "state.db-shm"] {
                let ok = Command::new("cp")
                    .args(args)
                    .arg(dir.path().join(f))
                    .arg(to.join(f))
                    .status()
                    .unwrap();
                assert!(ok.success());
            }
            assert_untouched(&to.join("state.db"), rows);
        }
    }
}

test_alone! {
    fn a_restore_through_the_backup_api_onto_the_live_path_replays() {
        watch_logs();
        let (_dir, db, backup) = setup();
        let (mut gw, _) = Gateway::start(&db, "guard");
        gw.send(&format!("backup-from {}", backup.display()));
        let done = gw.next_event("backup");
        assert!(done["error"].is_null(), "{done}");
        gw.send("bulk 10");
        gw.next_event("bulk");
        gw.kill();
        assert_untouched(&db, RESTORED + 10);
    }
}

test_alone! {
    fn a_clean_close_then_a_restore_leaves_no_wal_to_judge() {
        watch_logs();
        let (_dir, db, backup) = setup();
        let (mut gw, _) = Gateway::start(&db, "guard");
        gw.send("close");
        gw.next_event("closed");
        assert!(gw.quit().success());
        assert!(!sidecar(&db, "-wal").exists());
        fs::copy(&backup, &db).unwrap();
        assert_untouched(&db, RESTORED);
    }
}

test_alone! {
    fn an_unguarded_process_writing_and_checkpointing_beside_a_guarded_writer() {
        watch_logs();
        let (_dir, db, _) = setup();
        let (mut gw, _) = Gateway::start(&db, "guard");
        let stock = open_stock(&db);
        for i in 0..30 {
            crate::common::insert(&stock, &format!("stock {i} {}", "s".repeat(400))).unwrap();
        }
        // An unseen checkpoint of the guarded writer's generation (page 1 among its frames).
        stock
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .unwrap();
        gw.send("bulk 20");
        gw.next_event("bulk");
        // And again, of whatever generation the guarded writer then wrote in.
        stock
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .unwrap();
        drop(stock);
        gw.kill();
        assert_untouched(&db, RESTORED + 20 + 4 + 30 + 20);
    }
}

test_alone! {
    fn an_unguarded_process_restarting_the_wal_beside_a_guarded_writer() {
        watch_logs();
        let (_dir, db, _) = setup();
        let (mut gw, _) = Gateway::start(&db, "guard");
        gw.send("bulk 20");
        gw.next_event("bulk");
        let stock = open_stock(&db);
        stock
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        for i in 0..30 {
            crate::common::insert(&stock, &format!("stock {i} {}", "s".repeat(400))).unwrap();
        }
        drop(stock);
        gw.kill();
        assert_untouched(&db, RESTORED + 20 + 4 + 20 + 30);
    }
}

test_alone! {
    fn a_wal_written_entirely_by_unguarded_processes_replays() {
        watch_logs();
        let (_dir, db, _) = setup();
        let rows = killed_writer(&db, "stock", 30);
        assert_untouched(&db, rows);
    }
}
