//! Crash-point enumeration: run a workload once to count its durable steps (the filesystem
//! enumerates them), then once per step with the power cut there, and check every disk image
//! ([`ALL_MODES`]) each cut leaves, and the reordered states (some of the unsynced name
//! operations kept, others not: every subset up to [`REORDER_ALL_UP_TO`] operations, a seeded
//! sample above). With [`Enumeration::with_faults`], also every run where one `fsync` fails with
//! `EIO`, or one write to a file the run created fails with `ENOSPC`, the power cut after it ends.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::model::{Data, Names, ALL_MODES};
use crate::{Crash, Fault, LazyFs};

/// At most this many pending name operations at a cut: every subset of them is explored.
pub const REORDER_ALL_UP_TO: usize = 4;
/// Above it, this many subsets drawn with the seed ([`seed`]).
pub const REORDER_SAMPLE: usize = 6;
/// Failing writes (ENOSPC) explored per workload at most: the first ones, then every
/// `n / WRITE_FULL_MAX`-th.
pub const WRITE_FULL_MAX: usize = 12;

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
    /// Its writes to files it created through the mount.
    pub writes: usize,
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
    /// The indices (in `steps`) of the name operations this image does not keep.
    pub lost: &'a [usize],
}

impl Point<'_> {
    /// Whether a name operation (a step `step` accepts) was performed and is durable in this
    /// image.
    pub fn durable(&self, step: impl Fn(&str) -> bool) -> bool {
        self.steps
            .iter()
            .enumerate()
            .any(|(i, s)| step(s) && !self.lost.contains(&i))
    }

    /// Whether a step `step` accepts was performed before the cut.
    pub fn performed(&self, step: impl Fn(&str) -> bool) -> bool {
        self.steps.iter().any(|s| step(s))
    }

    /// The point and the image, for a message.
    pub fn what(&self) -> String {
        format!("{} ({:?}, {:?})", self.label, self.names, self.data)
    }
}

/// How many states a workload's enumeration checked, per dimension.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// Crash points (each checked on the four images of [`ALL_MODES`]).
    pub points: usize,
    /// Reordered crash states (a subset of the pending name operations kept).
    pub reorder: usize,
    /// Runs with one failing `fsync` (each checked on two images).
    pub sync_errors: usize,
    /// Runs with one failing write (ENOSPC).
    pub write_errors: usize,
    /// Crash states of a recovery cut after a first cut ([`Enumeration::during_recovery`]).
    pub during_recovery: usize,
    /// Crash points checked rebooted under the same mount ([`Enumeration::with_reboot`]).
    pub same_inode: usize,
}

impl Counts {
    /// Prints one line per dimension (tests/crash-points.sh sums them).
    pub fn print(&self, scenario: &str) {
        println!("{scenario}: {} crash points", self.points);
        println!("{scenario}: {} crash states (reorder)", self.reorder);
        if self.sync_errors + self.write_errors > 0 {
            println!(
                "{scenario}: {} crash states (fsync error)",
                self.sync_errors
            );
            println!(
                "{scenario}: {} crash states (write error)",
                self.write_errors
            );
        }
        if self.same_inode > 0 {
            let n = self.same_inode;
            println!("{scenario}: {n} crash states (same device and inode)");
        }
        if self.during_recovery > 0 {
            let n = self.during_recovery;
            println!("{scenario}: {n} crash states (during recovery)");
        }
    }
}

/// The seed of the reorder samples: `LAZYFS_SEED`, else a fixed one; printed by each test.
pub fn seed() -> u64 {
    std::env::var("LAZYFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026_0037)
}

/// splitmix64: the sample's generator.
pub(crate) fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The subsets of `n` pending operations to explore besides none and all: every one when
/// `n <= REORDER_ALL_UP_TO`, else [`REORDER_SAMPLE`] drawn from `rng`.
fn subsets(n: usize, rng: &mut u64) -> Vec<Vec<bool>> {
    if n < 2 {
        return Vec::new();
    }
    if n <= REORDER_ALL_UP_TO {
        return (1..(1u32 << n) - 1)
            .map(|m| (0..n).map(|i| m & (1 << i) != 0).collect())
            .collect();
    }
    let mut out: Vec<Vec<bool>> = Vec::new();
    for _ in 0..REORDER_SAMPLE * 4 {
        let mask: Vec<bool> = (0..n).map(|_| next(rng) & 1 == 1).collect();
        if mask.iter().any(|&b| b) && !mask.iter().all(|&b| b) && !out.contains(&mask) {
            out.push(mask);
        }
        if out.len() == REORDER_SAMPLE {
            break;
        }
    }
    out
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
    pub(crate) scratch: PathBuf,
    pub(crate) workload: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) runs: usize,
    faults: bool,
    reboot: bool,
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
            faults: false,
            reboot: false,
        }
    }

    /// Also checks each crash point rebooted under the same mount (`(Strict, Drop)`): the files
    /// that survive keep their device and inode numbers ([`Enumeration::run_rebooted`]); the
    /// check's image is the mount point.
    pub fn with_reboot(mut self) -> Self {
        self.reboot = true;
        self
    }

    /// Also explores failing fsyncs and writes ([`Fault::SyncFails`], [`Fault::WriteFull`]).
    pub fn with_faults(mut self) -> Self {
        self.faults = true;
        self
    }

    /// One run, the power cut at step `crash_before` (or after the workload ended).
    pub fn run(&mut self, crash_before: Option<usize>) -> std::io::Result<Run> {
        self.run_with(crash_before.map(Fault::CrashBefore))
    }

    /// One run with `fault` armed, the power cut at the crash point or after the workload ended.
    pub fn run_with(&mut self, fault: Option<Fault>) -> std::io::Result<Run> {
        Ok(self.run_inner(fault, None)?.0)
    }

    /// One run, the power cut at step `crash_before` (or after the workload ended), then the
    /// reboot under the same mount ([`LazyFs::reboot`]): the mount serves the disk the cut left,
    /// every surviving file under its device and inode numbers of before.
    pub fn run_rebooted(
        &mut self,
        crash_before: Option<usize>,
        names: Names,
        data: Data,
    ) -> std::io::Result<(Run, LazyFs)> {
        let fault = crash_before.map(Fault::CrashBefore);
        let (run, lazy) = self.run_inner(fault, Some((names, data)))?;
        Ok((run, lazy.expect("the mount kept")))
    }

    fn run_inner(
        &mut self,
        fault: Option<Fault>,
        reboot: Option<(Names, Data)>,
    ) -> std::io::Result<(Run, Option<LazyFs>)> {
        self.runs += 1;
        let dir = self.scratch.join(format!("run-{}", self.runs));
        let (backing, mnt) = (dir.join("backing"), dir.join("mnt"));
        copy_dir(&self.template, &backing)?;
        std::fs::create_dir(&mnt)?;
        let acks = dir.join("acks");
        let stderr_path = dir.join("stderr");
        let lazy = LazyFs::mount_with(&backing, &mnt, fault)?;
        let (db_name, scenario) = self.args.split_last().expect("a database name");
        let scenario = scenario.to_vec();
        self.workload_run(&scenario, &mnt.join(db_name), &acks, &stderr_path)?;
        if let Some(Fault::CrashBefore(k)) = fault {
            assert!(
                lazy.frozen(),
                "the workload did not reach step {k} again: {:?}",
                lazy.steps()
            );
        }
        let steps = lazy.steps();
        let writes = lazy.writes();
        let (crash, kept) = match reboot {
            None => (lazy.power_cut()?, None),
            Some((names, data)) => (lazy.reboot(names, data)?, Some(lazy)),
        };
        let acked = std::fs::read_to_string(&acks)
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().expect("an acknowledged id"))
            .collect();
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let run = Run {
            steps,
            crash,
            acked,
            stderr,
            backing,
            writes,
        };
        Ok((run, kept))
    }

    /// Runs the workload program with `scenario` on `db` (through a mount) to its end (or its
    /// stop at a crash point).
    pub(crate) fn workload_run(
        &self,
        scenario: &[String],
        db: &Path,
        acks: &Path,
        stderr: &Path,
    ) -> std::io::Result<()> {
        let child = Command::new(&self.workload)
            .args(scenario)
            .arg(db)
            .arg(acks)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(stderr)?)
            .spawn()?;
        let mut child = ChildGuard(child);
        let started = Instant::now();
        while child.0.try_wait()?.is_none() {
            if started.elapsed() > WORKLOAD_TIMEOUT {
                panic!("the workload {scenario:?} hung");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Every crash point of the workload: before each durable step and after the last; `check`
    /// (`LAZYFS_PRINT_STEPS=1` prints the steps of the run without a crash first)
    /// sees the disk each leaves under each of [`ALL_MODES`] (a run per mode: the disk is restored
    /// in place, every surviving file keeping its inode), then the reordered states of the point
    /// (`Data::Drop`), then, [`Enumeration::with_faults`], every failing fsync and the sampled
    /// failing writes. Returns the counts (each test prints them with [`Counts::print`]).
    pub fn each_point(&mut self, mut check: impl FnMut(&Point<'_>)) -> std::io::Result<Counts> {
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
        let seed = seed();
        println!("{:?}: reorder seed {seed} (LAZYFS_SEED)", self.args);
        let mut rng = seed;
        let mut counts = Counts::default();
        for k in (1..=n).map(Some).chain([None]) {
            let label = match k {
                Some(k) => format!("crash before step {k} of {n} ({})", full.steps[k - 1]),
                None => format!("crash after the last of {n} steps"),
            };
            let mut pending = 0;
            for (names, data) in ALL_MODES {
                let run = self.run(k)?;
                pending = run.crash.pending().len();
                let lost: Vec<usize> = match names {
                    Names::Ordered => Vec::new(),
                    _ => run.crash.pending().iter().map(|op| op.step).collect(),
                };
                run.crash.restore(names, data)?;
                self.check(&run, &label, names, data, &lost, &mut check);
            }
            counts.points += 1;
            for kept in subsets(pending, &mut rng) {
                let run = self.run(k)?;
                let ops = run.crash.pending();
                assert_eq!(ops.len(), kept.len(), "{label}: the run did not repeat");
                let lost: Vec<usize> = ops
                    .iter()
                    .zip(&kept)
                    .filter(|(_, &k)| !k)
                    .map(|(op, _)| op.step)
                    .collect();
                let shown: Vec<&str> = ops
                    .iter()
                    .zip(&kept)
                    .filter(|(_, &k)| k)
                    .map(|(op, _)| run.steps[op.step].as_str())
                    .collect();
                run.crash.restore_with(&kept, Data::Drop)?;
                let label = format!("{label}, of its unsynced name operations only {shown:?} kept");
                self.check(
                    &run,
                    &label,
                    Names::Reordered,
                    Data::Drop,
                    &lost,
                    &mut check,
                );
                counts.reorder += 1;
            }
            if self.reboot {
                let (run, lazy) = self.run_rebooted(k, Names::Strict, Data::Drop)?;
                let lost: Vec<usize> = run.crash.pending().iter().map(|op| op.step).collect();
                check(&Point {
                    label: format!("{label}, rebooted under the same mount"),
                    image: lazy.path(),
                    acked: &run.acked,
                    steps: &run.steps,
                    names: Names::Strict,
                    data: Data::Drop,
                    lost: &lost,
                });
                drop(lazy);
                let _ = std::fs::remove_dir_all(self.scratch.join(format!("run-{}", self.runs)));
                counts.same_inode += 1;
            }
        }
        if self.faults {
            self.faulty(&full, &mut counts, &mut check)?;
        }
        Ok(counts)
    }

    /// Every failing fsync of the workload, and the sampled failing writes: the workload runs to
    /// its end, then the power cut, checked on `(Strict, Drop)` and `(Ordered, Torn)`.
    fn faulty(
        &mut self,
        full: &Run,
        counts: &mut Counts,
        check: &mut impl FnMut(&Point<'_>),
    ) -> std::io::Result<()> {
        let n = full.steps.len();
        let mut faults = Vec::new();
        for (i, step) in full.steps.iter().enumerate() {
            if step.starts_with("fsync") || step.starts_with("fdatasync") {
                let label = format!("step {} of {n} ({step}) fails with EIO", i + 1);
                faults.push((Fault::SyncFails(i + 1), label));
            }
        }
        let w = full.writes;
        let every = w.div_ceil(WRITE_FULL_MAX).max(1);
        for k in (1..=w).step_by(every) {
            let label = format!("write {k} of {w} to a file the run created fails with ENOSPC");
            faults.push((Fault::WriteFull(k), label));
        }
        for (fault, label) in faults {
            for (names, data) in [(Names::Strict, Data::Drop), (Names::Ordered, Data::Torn)] {
                let run = self.run_with(Some(fault))?;
                assert!(
                    run.steps
                        .iter()
                        .any(|s| s.ends_with("(EIO)") || s.ends_with("(ENOSPC)")),
                    "{label}: the run did not reach it: {:?}",
                    run.steps
                );
                if std::env::var_os("LAZYFS_PRINT_STEPS").is_some() {
                    eprintln!("{label}: {:?}\n{}", run.steps, run.stderr);
                }
                let lost: Vec<usize> = match names {
                    Names::Ordered => Vec::new(),
                    _ => run.crash.pending().iter().map(|op| op.step).collect(),
                };
                run.crash.restore(names, data)?;
                let label = format!("{label}, the power cut after the run");
                self.check(&run, &label, names, data, &lost, check);
            }
            match fault {
                Fault::WriteFull(_) => counts.write_errors += 1,
                _ => counts.sync_errors += 1,
            }
        }
        Ok(())
    }

    fn check(
        &self,
        run: &Run,
        label: &str,
        names: Names,
        data: Data,
        lost: &[usize],
        check: &mut impl FnMut(&Point<'_>),
    ) {
        check(&Point {
            label: label.to_string(),
            image: &run.backing,
            acked: &run.acked,
            steps: &run.steps,
            names,
            data,
            lost,
        });
        let _ = std::fs::remove_dir_all(self.scratch.join(format!("run-{}", self.runs)));
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
