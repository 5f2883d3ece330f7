//! Crash-point enumeration: run a workload once to count its durable steps (the filesystem
//! enumerates them), then once per step with the power cut there, and check every disk image
//! ([`ALL_MODES`]) each cut leaves.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::model::{Crash, Data, Names, ALL_MODES};
use crate::LazyFs;

/// How long a workload may run before it is taken as hung.
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// One run of a workload up to a power cut.
pub struct Run {
    /// The durable steps performed before the cut.
    pub steps: Vec<String>,
    /// What the disk holds.
    pub crash: Crash,
    /// The row ids the workload acknowledged (their commit returned OK).
    pub acked: Vec<i64>,
    /// The workload's stderr.
    pub stderr: String,
    /// The backing directory the workload wrote through the mount.
    pub backing: PathBuf,
}

/// What a check sees of one crash point.
pub struct Point<'a> {
    /// `crash before step k of n` or `crash after the last step`.
    pub label: String,
    /// The disk image, a directory holding the database as `db_name`.
    pub image: &'a Path,
    /// The row ids acknowledged before the cut.
    pub acked: &'a [i64],
    /// The durable steps performed before the cut.
    pub steps: &'a [String],
    /// The image's modes.
    pub names: Names,
    /// The image's modes.
    pub data: Data,
}

/// Kills the workload when a test fails before it ended.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch directory: `template` (the starting state), then one directory per run.
pub struct Enumeration {
    /// The starting state, copied into each run's backing directory.
    pub template: PathBuf,
    scratch: PathBuf,
    workload: PathBuf,
    args: Vec<String>,
    runs: usize,
}

impl Enumeration {
    /// Runs `workload args... <db in mount> <acks>` over copies of `template` (under `scratch`);
    /// `db_name` is the database's name inside the template.
    pub fn new(
        template: &Path,
        scratch: &Path,
        workload: &Path,
        args: &[&str],
        db_name: &str,
    ) -> Self {
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.push(db_name.to_string());
        Enumeration {
            template: template.to_path_buf(),
            scratch: scratch.to_path_buf(),
            workload: workload.to_path_buf(),
            args,
            runs: 0,
        }
    }

    /// One run, the power cut at step `crash_before` (or after the workload ended).
    pub fn run(&mut self, crash_before: Option<usize>) -> std::io::Result<Run> {
        self.runs += 1;
        let dir = self.scratch.join(format!("run-{}", self.runs));
        let (backing, mnt) = (dir.join("backing"), dir.join("mnt"));
        copy_dir(&self.template, &backing)?;
        std::fs::create_dir(&mnt)?;
        let acks = dir.join("acks");
        let stderr_path = dir.join("stderr");
        let lazy = LazyFs::mount(&backing, &mnt, crash_before)?;
        let (db_name, scenario) = self.args.split_last().expect("a database name");
        let child = Command::new(&self.workload)
            .args(scenario)
            .arg(mnt.join(db_name))
            .arg(&acks)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path)?)
            .spawn()?;
        let mut child = ChildGuard(child);
        let started = Instant::now();
        while child.0.try_wait()?.is_none() {
            if started.elapsed() > WORKLOAD_TIMEOUT {
                panic!(
                    "the workload {:?} hung at crash point {crash_before:?}",
                    self.args
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(child);
        if let Some(k) = crash_before {
            assert!(
                lazy.frozen(),
                "the workload did not reach step {k} again: {:?}",
                lazy.steps()
            );
        }
        let steps = lazy.steps();
        let crash = lazy.power_cut()?;
        let acked = std::fs::read_to_string(&acks)
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().expect("an acknowledged id"))
            .collect();
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        Ok(Run {
            steps,
            crash,
            acked,
            stderr,
            backing,
        })
    }

    /// Every crash point of the workload: before each durable step and after the last; `check`
    /// (`LAZYFS_PRINT_STEPS=1` prints the steps of the run without a crash first)
    /// sees the disk each leaves under each of [`ALL_MODES`] (a run per mode: the disk is restored
    /// in place, every surviving file keeping its inode). Returns the number of crash points.
    pub fn each_point(&mut self, mut check: impl FnMut(&Point<'_>)) -> std::io::Result<usize> {
        let full = self.run(None)?;
        assert!(
            full.stderr.is_empty(),
            "the workload failed without a crash: {}",
            full.stderr
        );
        let n = full.steps.len();
        if std::env::var_os("LAZYFS_PRINT_STEPS").is_some() {
            for (i, step) in full.steps.iter().enumerate() {
                eprintln!("{:?} step {}: {step}", self.args, i + 1);
            }
        }
        let mut points = 0;
        for k in (1..=n).map(Some).chain([None]) {
            let label = match k {
                Some(k) => format!("crash before step {k} of {n} ({})", full.steps[k - 1]),
                None => format!("crash after the last of {n} steps"),
            };
            for (names, data) in ALL_MODES {
                let run = self.run(k)?;
                run.crash.restore(names, data)?;
                check(&Point {
                    label: label.clone(),
                    image: &run.backing,
                    acked: &run.acked,
                    steps: &run.steps,
                    names,
                    data,
                });
                let _ = std::fs::remove_dir_all(self.scratch.join(format!("run-{}", self.runs)));
            }
            points += 1;
        }
        Ok(points)
    }
}

/// Copies the directory tree `from` to `to` (created).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), &dest)?;
            copy_xattrs(&entry.path(), &dest)?;
        }
    }
    Ok(())
}

/// Copies the extended attributes of `from` to `to` (the guard's WAL-base record is one).
fn copy_xattrs(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut names = vec![0u8; 1 << 16];
    let n = rustix::fs::llistxattr(from, &mut names[..])?;
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = std::ffi::OsStr::from_bytes(name);
        let mut value = vec![0u8; 1 << 16];
        let len = rustix::fs::lgetxattr(from, name, &mut value[..])?;
        rustix::fs::lsetxattr(to, name, &value[..len], rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}
