//! A mount over the database's directory, or a lazy unmount of the mount it was opened through,
//! changes what its path names without any inotify event: the watch must notice the mount table
//! changed and send the next transaction to the full check. A mount does not hide a creation
//! from the watch, which is on the directory's inode: a capture's base survives a mount
//! elsewhere, and a newer generation made through a bind mount is counted. Needs root (or
//! CAP_SYS_ADMIN); where mounting is not allowed the tests say so and return. Each runs alone,
//! in a process of its own (`test_alone!`), and unmounts what it mounted.

use crate::common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use hermes_guard::recover::{self, Capture, MergeOptions, MergeRule};

/// A tmpfs or a bind mount at a path under a fresh temp dir, unmounted (lazily) when dropped.
struct TestMount {
    at: PathBuf,
}

impl TestMount {
    /// `None` (with the reason printed) where this process may not mount.
    fn tmpfs(at: &Path) -> Option<TestMount> {
        TestMount::mount(
            ["-t", "tmpfs", "-o", "size=16m", "hermes-guard-test"].map(OsStr::new),
            at,
        )
    }

    /// The directory `dir` bind-mounted at `at`: the same directory, reached through another
    /// mount. `None` (with the reason printed) where this process may not mount.
    fn bind(dir: &Path, at: &Path) -> Option<TestMount> {
        TestMount::mount([OsStr::new("--bind"), dir.as_os_str()], at)
    }

    fn mount<const N: usize>(args: [&OsStr; N], at: &Path) -> Option<TestMount> {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount").args(args).arg(at).output();
        match out {
            Ok(out) if out.status.success() => Some(TestMount {
                at: at.to_path_buf(),
            }),
            Ok(out) => {
                skip_unless_ci(&format!(
                    "cannot mount at {} (not root, or no CAP_SYS_ADMIN): {}",
                    at.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                None
            }
            Err(e) => {
                skip_unless_ci(&format!("no mount command: {e}"));
                None
            }
        }
    }

    fn unmount_lazily(&self) {
        let out = Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .output()
            .unwrap();
        assert!(out.status.success(), "umount -l {}", self.at.display());
    }

    fn mounted(&self) -> bool {
        let mountinfo = std::fs::read("/proc/self/mountinfo").unwrap();
        let at = self.at.as_os_str().as_encoded_bytes();
        mountinfo
            .split(|&b| b == b'\n')
            .any(|line| line.split(|&b| b == b' ').nth(4) == Some(at))
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if self.mounted() {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}

test_alone! {
    fn a_mount_over_the_database_directory_refuses_the_next_write() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("state.db");
        let conn = open_guarded(&path);
        let sentinel = wal_only_sentinel(&conn);
        // Many vouched transactions: the fast path is in use.
        for i in 0..50 {
            insert(&conn, &format!("row {i}")).unwrap();
        }

        let Some(tmpfs) = TestMount::tmpfs(&dir) else {
            return;
        };
        let err = insert(&conn, "through the mount").unwrap_err();
        assert!(is_refusal(&err), "{err}");
        for i in 0..4 {
            assert!(is_refusal(
                &insert(&conn, &format!("again {i}")).unwrap_err()
            ));
        }
        let status = conn.guard_status().unwrap();
        assert!(status.retired, "{status:?}");
        let artifact = status.capture.expect("captured at the halt");
        hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
        // The capture is written through the directory descriptor held since the open: beside the
        // database, in the directory the mount now hides, not on the tmpfs.
        assert!(!artifact.exists(), "not on the mount over the directory");
        drop(tmpfs);
        assert_eq!(artifacts(&dir), vec![artifact.clone()]);
        let recovered = recover(&artifact, "state.db", &top.path().join("recovered"));
        assert_eq!(count_like(&recovered, &sentinel), 1);
        assert_eq!(count_like(&recovered, "row %"), 50);
    }
}

test_alone! {
    fn a_lazy_unmount_of_the_database_mount_refuses_the_next_write() {
        let top = tempfile::tempdir().unwrap();
        let mnt = top.path().join("mnt");
        let Some(tmpfs) = TestMount::tmpfs(&mnt) else {
            return;
        };
        let path = mnt.join("state.db");
        let conn = open_guarded(&path);
        for i in 0..50 {
            insert(&conn, &format!("row {i}")).unwrap();
        }
        tmpfs.unmount_lazily();
        let err = insert(&conn, "after the unmount").unwrap_err();
        assert!(is_refusal(&err), "{err}");
        for i in 0..4 {
            assert!(is_refusal(
                &insert(&conn, &format!("again {i}")).unwrap_err()
            ));
        }
        let status = conn.guard_status().unwrap();
        assert!(status.retired, "{status:?}");
        drop(conn);
        drop(tmpfs);
    }
}

test_alone! {
    /// Mount-table churn elsewhere only costs full checks: no false alarm.
    fn an_unrelated_mount_is_no_loss() {
        let top = tempfile::tempdir().unwrap();
        let path = top.path().join("state.db");
        let conn = open_guarded(&path);
        insert(&conn, "before").unwrap();
        let Some(tmpfs) = TestMount::tmpfs(&top.path().join("elsewhere")) else {
            return;
        };
        for i in 0..10 {
            insert(&conn, &format!("row {i}")).unwrap();
        }
        tmpfs.unmount_lazily();
        insert(&conn, "after").unwrap();
        let status = conn.guard_status().unwrap();
        assert!(!status.retired && status.refusals == 0, "{status:?}");
    }
}

/// The rule `recover` would merge the capture `artifact` into `path` by, and why.
fn merge_rule(artifact: &Path, path: &Path) -> (MergeRule, String) {
    let capture = Capture::open(artifact).unwrap();
    let plan = recover::plan(&capture, path, &MergeOptions::default()).unwrap();
    (plan.rule, plan.rule_reason)
}

test_alone! {
    /// The directory watch is on the directory's inode: a mount elsewhere between the
    /// connection's pin and its capture hides no creation from it, so the capture still shows
    /// its image is its generation's own and recovery replays the generation's changes.
    fn a_mount_elsewhere_before_the_capture_keeps_its_base_own() {
        let top = tempfile::tempdir().unwrap();
        let path = top.path().join("state.db");
        let conn = open_guarded(&path);
        insert(&conn, "before").unwrap();
        let Some(tmpfs) = TestMount::tmpfs(&top.path().join("elsewhere")) else {
            return;
        };
        insert(&conn, "beside the mount").unwrap();
        tmpfs.unmount_lazily();
        lose_sidecars(&path, false);
        let err = insert(&conn, "after the loss").unwrap_err();
        assert!(is_refusal(&err), "{err}");
        let artifact = conn.guard_status().unwrap().capture.unwrap();
        close_while_restarted(conn, &path);
        let (rule, reason) = merge_rule(&artifact, &path);
        assert_eq!(rule, MergeRule::Delta, "{reason}");
    }
}

test_alone! {
    /// The other half of the rule above: a newer generation that opens the database through a
    /// bind mount of its directory creates its `-wal` and `-shm` in the same directory inode,
    /// and the watch counts them though they came through another mount: the capture cannot
    /// claim its base, and recovery applies only its own changes, read from its pages.
    fn a_newer_generation_through_a_bind_mount_of_the_directory_is_counted() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("state.db");
        let conn = open_guarded(&path);
        insert(&conn, "before").unwrap();
        let Some(bind) = TestMount::bind(&dir, &top.path().join("bound")) else {
            return;
        };
        lose_sidecars(&path, false);
        let newer = NewerGenerationOpen::start(&bind.at.join("state.db"));
        assert!(sidecar(&path, "-wal").exists(), "made through the bind mount");
        let err = insert(&conn, "after the loss").unwrap_err();
        assert!(is_refusal(&err), "{err}");
        let artifact = conn.guard_status().unwrap().capture.unwrap();
        hermes_guard::close(conn).map_err(|(_, e)| e).unwrap();
        drop(newer);
        let evidence = recover::read_manifest(&artifact)
            .unwrap()
            .base_evidence()
            .to_string();
        assert!(evidence.contains("was created in its directory"), "{evidence}");
        let (rule, reason) = merge_rule(&artifact, &path);
        assert_eq!(rule, MergeRule::Changes, "{reason}");
        drop(bind);
    }
}
