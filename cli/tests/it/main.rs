//! The integration tests: one binary (the bundled SQLite is linked once), a module per concern,
//! the shared harness in [`common`].
//!
//! All tests of a binary run on parallel threads of one process. The few that touch something
//! process-wide — `fork()`, the default VFS, the pending-capture list, the mount table — are
//! declared with [`test_alone!`]: the test re-executes this binary to run its body alone, in a
//! process with one test thread.

/// Declares a test whose body runs in a process of its own.
///
/// `test_alone! { fn name() { body } }` makes the test `<module>::name`, which re-executes this
/// binary (`std::env::current_exe()`) as `--exact <module>::name::alone --ignored
/// --test-threads=1 --nocapture` with [`common::ALONE_ENV`] set, and passes when that process
/// ran the body and it passed. `<module>::name::alone` is ignored in an ordinary run and does
/// nothing outside such a process.
///
/// `test_alone! { memcheck fn name() { body } }` runs that process under valgrind's memcheck when
/// valgrind is installed (an invalid read or write fails the test), plainly otherwise.
macro_rules! test_alone {
    ($(#[$attr:meta])* memcheck fn $name:ident() $body:block) => {
        test_alone!(@runner run_alone_under_memcheck, $(#[$attr])* fn $name() $body);
    };
    ($(#[$attr:meta])* fn $name:ident() $body:block) => {
        test_alone!(@runner run_alone, $(#[$attr])* fn $name() $body);
    };
    (@runner $runner:ident, $(#[$attr:meta])* fn $name:ident() $body:block) => {
        $(#[$attr])*
        #[test]
        fn $name() {
            $crate::common::$runner(module_path!(), stringify!($name));
        }

        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            #[ignore = "runs in a process of its own, started by the test of the same name"]
            fn alone() {
                if !$crate::common::is_alone() {
                    return;
                }
                $body
            }
        }
    };
}

mod common;
mod system_python;

mod base_pages;
mod base_words;
mod bench_smoke;
mod capture_identity;
mod capture_permissions;
mod capture_pool;
mod changes_applied;
mod changes_cli;
mod churn_beside_checkpoints;
mod churn_siblings;
mod cli_answers;
mod close_capture;
mod close_heal;
mod close_no_checkpoint;
mod close_pending_retry;
mod commit_failed_after_its_frame;
mod commit_in_flight;
mod database_paths;
mod descriptors;
mod directory_deleted;
mod directory_moved;
mod exclusive_and_rollback;
mod exit_word;
mod file_layout;
mod fork;
mod fork_lifecycle;
mod fs_matrix;
mod fs_matrix_env;
mod fs_matrix_service_user;
mod halt_capture;
mod heal_once;
mod heal_peer_once;
mod held_cli;
mod house;
mod lock_shield;
mod long_names;
mod main_replaced;
mod many_databases;
mod mounts;
mod no_false_alarm;
mod non_utf8_paths;
mod overwrite_in_place;
mod overwrite_under_cache;
mod pause_vfs;
mod plain_rusqlite;
mod pool_heals;
mod process_exit_recovery;
mod raw_handle;
mod reconnect;
mod recover_again;
mod recover_changes;
mod recover_changes_harness;
mod recover_changes_model;
mod recover_changes_scenarios;
mod recover_cli;
mod recover_delta;
mod recover_exit_codes;
mod recover_ledger;
mod recover_library;
mod recover_newer_generation;
mod recover_scenarios;
mod recover_store_heal;
mod register_default;
mod registry_lifecycle;
mod registry_stress;
mod restore_in_process;
mod restore_once;
mod retirement_words;
mod second_name;
mod shm_directory;
mod single_threaded_sqlite;
mod sqlite_log_events;
mod stale_wal;
mod stale_wal_controls;
mod stale_wal_race;
mod status_cli;
mod store_api;
mod store_loss;
mod store_processes;
mod store_threads;
mod torn_main;
mod two_generations;
mod unsafe_fs_refuse;
mod unwritable_dir;
mod verify_from_bytes;
mod wal_index_protocol;
mod wal_left_for_opener;
mod wal_reset;
mod wal_reset_soak;
mod wal_write_gate;
mod walfile_real;
mod watch;
mod watch_paths;
