//! A crash during recovery: the power cut at a first crash point of a workload and the reboot
//! under the same mount (every surviving file under its device and inode numbers of before), then
//! the recovery (another scenario of the workload program: `recover --apply`, the next open's
//! heal or set-aside, the store's self-heal) run there, and cut at each of its own durable steps.
//! The check then runs a second recovery to the end.

use std::path::PathBuf;

use crate::harness::{copy_dir, next, seed, Enumeration, Point};
use crate::model::{Data, Names};
use crate::{Crash, Fault};

/// The images of a second cut.
const SECOND_MODES: [(Names, Data); 2] =
    [(Names::Strict, Data::Drop), (Names::Ordered, Data::Torn)];

/// A recovery's run after a first cut.
struct Second {
    steps: Vec<String>,
    crash: Crash,
    acked: Vec<i64>,
    stderr: String,
    backing: PathBuf,
}

impl Enumeration {
    /// The first cuts: after the workload's last step and `sample - 1` crash points drawn with
    /// the seed ([`seed`]) from the steps after the first one containing `after`, each rebooted
    /// on `(Strict, Drop)`. For each, `prepare` sees a copy of the disk it left (what must be
    /// recoverable from it), then `recovery` runs on that disk under the same mount with the power
    /// cut before each of its durable steps and after its last, on two images, and `check` sees
    /// each (a [`Point`] whose `acked` are the recovery's) with what `prepare` returned. Returns
    /// the number of second crash states.
    pub fn during_recovery<T>(
        &mut self,
        recovery: &str,
        after: &str,
        sample: usize,
        mut prepare: impl FnMut(&Point<'_>) -> T,
        mut check: impl FnMut(&T, &Point<'_>),
    ) -> std::io::Result<usize> {
        let steps = self.run(None)?.steps;
        let n = steps.len();
        let from = steps
            .iter()
            .position(|s| s.contains(after))
            .unwrap_or_else(|| panic!("no step of {:?} contains {after:?}: {steps:?}", self.args))
            + 2;
        let mut rng = seed() ^ 0x2ec0_7e2d;
        let mut firsts = vec![None];
        while firsts.len() < sample.min(n + 2 - from) {
            let k = Some(from + (next(&mut rng) % (n + 1 - from) as u64) as usize);
            if !firsts.contains(&k) {
                firsts.push(k);
            }
        }
        println!(
            "{:?}: first cuts {firsts:?} (seed {}, LAZYFS_SEED)",
            self.args,
            seed()
        );
        let mut states = 0;
        for k in firsts {
            let first = match k {
                Some(k) => format!("first cut before step {k} of {n}"),
                None => format!("first cut after the last of {n} steps"),
            };
            let (run, lazy) = self.run_rebooted(k, Names::Strict, Data::Drop)?;
            let copy = self.scratch.join(format!("prepared-{}", self.runs));
            copy_dir(&run.backing, &copy)?;
            drop(lazy);
            let lost: Vec<usize> = run.crash.pending().iter().map(|op| op.step).collect();
            let state = prepare(&Point {
                label: first.clone(),
                image: &copy,
                acked: &run.acked,
                steps: &run.steps,
                names: Names::Strict,
                data: Data::Drop,
                lost: &lost,
            });
            let _ = std::fs::remove_dir_all(&copy);
            let full = self.second(k, recovery, None, SECOND_MODES[0])?;
            assert!(
                full.stderr.is_empty(),
                "{first}: {recovery} failed without a second cut: {}",
                full.stderr
            );
            let n2 = full.steps.len();
            for k2 in (1..=n2).map(Some).chain([None]) {
                for mode in SECOND_MODES {
                    let second = self.second(k, recovery, k2, mode)?;
                    let at = match k2 {
                        Some(k2) => {
                            format!("cut before its step {k2} of {n2} ({})", full.steps[k2 - 1])
                        }
                        None => format!("cut after its last of {n2} steps"),
                    };
                    let lost: Vec<usize> = match mode.0 {
                        Names::Ordered => Vec::new(),
                        _ => second.crash.pending().iter().map(|op| op.step).collect(),
                    };
                    check(
                        &state,
                        &Point {
                            label: format!("{first}, then {recovery} {at}"),
                            image: &second.backing,
                            acked: &second.acked,
                            steps: &second.steps,
                            names: mode.0,
                            data: mode.1,
                            lost: &lost,
                        },
                    );
                    let _ =
                        std::fs::remove_dir_all(self.scratch.join(format!("run-{}", self.runs)));
                    states += 1;
                }
            }
        }
        Ok(states)
    }

    /// The workload cut at `first` and rebooted, then `recovery` through the same mount, cut at
    /// its step `crash_before` (or after its end); the disk restored under `mode`.
    fn second(
        &mut self,
        first: Option<usize>,
        recovery: &str,
        crash_before: Option<usize>,
        mode: (Names, Data),
    ) -> std::io::Result<Second> {
        let (run, lazy) = self.run_rebooted(first, Names::Strict, Data::Drop)?;
        let dir = self.scratch.join(format!("run-{}", self.runs));
        let (acks, stderr) = (dir.join("acks-second"), dir.join("stderr-second"));
        lazy.arm(crash_before.map(Fault::CrashBefore));
        let db = lazy.path().join(self.args.last().expect("a database name"));
        self.workload_run(&[recovery.to_string()], &db, &acks, &stderr)?;
        if let Some(k) = crash_before {
            assert!(
                lazy.frozen(),
                "{recovery} did not reach step {k} again: {:?}",
                lazy.steps()
            );
        }
        let steps = lazy.steps();
        let crash = lazy.power_cut()?;
        crash.restore(mode.0, mode.1)?;
        let acked = std::fs::read_to_string(&acks)
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().expect("an acknowledged id"))
            .collect();
        let stderr = std::fs::read_to_string(&stderr).unwrap_or_default();
        Ok(Second {
            steps,
            crash,
            acked,
            stderr,
            backing: run.backing,
        })
    }
}
