//! A deterministic scheduler of SQLite connections at VFS-call granularity (issue 38): see
//! README.md. Participants (connections on their own threads, guarded or stock, and file
//! actors) run one at a time through the scheduling VFS (`vfs.rs`); the order of their steps
//! comes from a seed (`sched.rs`, PCT); after every schedule the invariants are checked
//! (`check.rs`).

pub mod check;
pub mod scenarios;
pub mod sched;
pub mod vfs;
pub mod world;

use std::sync::Arc;

use parking_lot::Mutex;

use scenarios::Scenario;
use sched::{Rng, Run, Sched};
use world::Ledger;

/// One schedule's outcome.
pub struct Outcome {
    pub scenario: &'static str,
    pub seed: u64,
    pub depth: usize,
    pub run: Run,
    pub violations: Vec<String>,
    /// The errors the scripts saw (refusals, busy, I/O errors): context for a replay.
    pub errors: Vec<String>,
    pub captures: usize,
    pub refusals: usize,
    /// The acknowledged rows with their steps, and the losses with theirs.
    pub acked: Vec<(String, usize)>,
    pub losses: Vec<(String, usize)>,
}

impl Outcome {
    /// The replay's report: the seed, the command, the violations, the errors, the steps.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "scenario {} seed {} (PCT depth {}): {} steps, {} violation(s)\n  replay: bash tests/explore.sh --scenario {} --seed {}\n",
            self.scenario,
            self.seed,
            self.depth,
            self.run.steps.len(),
            self.violations.len(),
            self.scenario,
            self.seed
        );
        for v in &self.violations {
            out += &format!("  VIOLATION: {v}\n");
        }
        out += &format!("  acknowledged (row, step): {:?}\n  losses (what, step): {:?}\n", self.acked, self.losses);
        for e in &self.errors {
            out += &format!("  seen: {e}\n");
        }
        out += "  steps:\n";
        out += &self.run.describe();
        out
    }
}

/// Runs scenario `sc` with `seed`: setup in a fresh directory, the schedule, the checks.
pub fn run_one(sc: &'static Scenario, seed: u64) -> Outcome {
    vfs::register();
    let dir = tempfile::Builder::new()
        .prefix("explore-")
        .tempdir()
        .expect("a work directory");
    let dir = if std::env::var_os("EXPLORE_KEEP").is_some() {
        let kept = dir.keep();
        eprintln!("explore: kept {}", kept.display());
        tempfile::TempDir::with_prefix_in("unused-", &kept).expect("a directory")
    } else {
        dir
    };
    let db = dir.path().parent().map(|p| p.join("state.db")).filter(|_| std::env::var_os("EXPLORE_KEEP").is_some()).unwrap_or_else(|| dir.path().join("state.db"));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    // The variant and the depth from the seed, apart from the scheduler's own stream.
    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(7));
    let depth = 1 + rng.below(3) as usize;
    let built = (sc.build)(&db, &mut rng, &ledger);
    let run = Sched::run(seed, depth, sc.horizon, built.parts);
    let mut violations: Vec<String> = run
        .panics
        .iter()
        .map(|p| format!("a script panicked: {p}"))
        .collect();
    if std::env::var_os("EXPLORE_KEEP").is_some() {
        let before = dir.path().parent().unwrap().with_extension("before");
        let _ = std::process::Command::new("cp").arg("-a").arg(dir.path().parent().unwrap()).arg(&before).status();
        eprintln!("explore: the files before the checks in {}", before.display());
    }
    let mut l = ledger.lock();
    violations.extend(check::check(&db, &l, built.stale_main.as_deref()));
    let captures = hermes_guard::recover::list_captures(&db).map_or(0, |c| c.len());
    // A killed process's connections go away after the checks.
    l.abandoned.clear();
    Outcome {
        scenario: sc.name,
        seed,
        depth,
        run,
        violations,
        errors: std::mem::take(&mut l.errors),
        captures,
        refusals: l.refusals.len(),
        acked: l.acked.clone(),
        losses: l.losses.clone(),
    }
}

/// What `explore` found for one scenario.
pub struct Summary {
    pub schedules: usize,
    pub distinct: usize,
    pub captures: usize,
    pub refusals: usize,
    pub failures: Vec<Outcome>,
}

/// Runs seeds `first..first + n` of `sc`; keeps the failing outcomes.
pub fn explore(sc: &'static Scenario, first: u64, n: u64) -> Summary {
    let mut seen = std::collections::HashSet::new();
    let mut s = Summary {
        schedules: 0,
        distinct: 0,
        captures: 0,
        refusals: 0,
        failures: Vec::new(),
    };
    for seed in first..first + n {
        let o = run_one(sc, seed);
        s.schedules += 1;
        s.captures += usize::from(o.captures > 0);
        s.refusals += usize::from(o.refusals > 0);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for st in &o.run.steps {
            std::hash::Hash::hash(&(st.who, &st.what), &mut h);
        }
        if seen.insert(std::hash::Hasher::finish(&h)) {
            s.distinct += 1;
        }
        if !o.violations.is_empty() {
            s.failures.push(o);
        }
    }
    s
}
