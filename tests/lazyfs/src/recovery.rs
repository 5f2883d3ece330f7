//! A crash during recovery: the power cut at a first crash point of a workload, then the
//! recovery (another workload: `recover --apply`, the next open's heal or set-aside, the store's
//! self-heal) run on the disk that cut left, through the filesystem again, and cut at each of its
//! own durable steps. The check then runs a second recovery to the end.

use crate::harness::{copy_dir, next, seed, Enumeration, Point};
use crate::model::{Data, Names};

/// The images of a second cut.
const SECOND_MODES: [(Names, Data); 2] =
    [(Names::Strict, Data::Drop), (Names::Ordered, Data::Torn)];

impl Enumeration {
    /// The first cuts: after the workload's last step and `sample - 1` crash points drawn with
    /// the seed ([`seed`]) from the steps after the first one containing `after`, each on
    /// `(Strict, Drop)`. For each, `prepare` sees a copy of the disk
    /// it left (what must be recoverable from it), then `recovery` (a scenario of the same
    /// workload program) runs on that disk with the power cut before each of its durable steps
    /// and after its last, on two images, and `check` sees each (a [`Point`] whose `acked` are the
    /// recovery's) with what `prepare` returned. Returns the number of second crash states.
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
        let db_name = self.args.last().expect("a database name").clone();
        let mut states = 0;
        for k in firsts {
            let first = match k {
                Some(k) => format!("first cut before step {k} of {n}"),
                None => format!("first cut after the last of {n} steps"),
            };
            let run = self.run(k)?;
            run.crash.restore(Names::Strict, Data::Drop)?;
            let dir = self.scratch.join(format!("run-{}", self.runs));
            let copy = dir.join("prepared");
            copy_dir(&run.backing, &copy)?;
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
            let scratch = dir.join("second");
            std::fs::create_dir(&scratch)?;
            let mut second = Enumeration::new(
                &run.backing,
                &scratch,
                &self.workload,
                &[recovery],
                &db_name,
            )
            .with_modes(&SECOND_MODES);
            let counts = second.each_point(|point| {
                let label = format!("{first}, then {} of {recovery}", point.label);
                check(&state, &Point { label, ..*point });
            })?;
            states += counts.points * SECOND_MODES.len();
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(states)
    }
}
