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
    /// Violations of a guard bug already reported (see `KNOWN`): printed, not counted.
    pub known: Vec<String>,
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
        for v in &self.known {
            out += &format!("  known guard bug: {v}\n");
        }
        out += &format!(
            "  acknowledged (row, step): {:?}\n  losses (what, step): {:?}\n",
            self.acked, self.losses
        );
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
    // EXPLORE_KEEP=1 (debugging a replay): the directory is kept, and a copy of it as the
    // schedule left it (before the checks' own opens and merges) beside it, `<dir>.before`.
    let keep = std::env::var_os("EXPLORE_KEEP").is_some();
    let db = dir.path().join("state.db");
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
    if keep {
        let before = dir.path().with_extension("before");
        let _ = std::process::Command::new("cp")
            .arg("-a")
            .arg(dir.path())
            .arg(&before)
            .status();
        eprintln!(
            "explore: the files before the checks in {}",
            before.display()
        );
    }
    let mut l = ledger.lock();
    // An abandoned connection (a killed writer's) is dropped before the checks: in one process
    // its locks and mappings would otherwise stay, where a killed process's go with it. Its drop
    // is a close through the guard (which may capture or heal): not what a kill does.
    let abandoned = std::mem::take(&mut l.abandoned);
    drop(l);
    drop(abandoned);
    let mut l = ledger.lock();
    violations.extend(check::check(&db, &l, built.stale_main.as_deref()));
    let captures = hermes_guard::recover::list_captures(&db).map_or(0, |c| c.len());
    let mut known = Vec::new();
    violations.retain(|v| match known_bug(sc.name, v) {
        Some(bug) => {
            known.push(format!("{v} [{bug}]"));
            false
        }
        None => true,
    });
    if keep {
        eprintln!(
            "explore: the files after the checks in {}",
            dir.keep().display()
        );
    }
    Outcome {
        scenario: sc.name,
        seed,
        depth,
        run,
        violations,
        known,
        errors: std::mem::take(&mut l.errors),
        captures,
        refusals: l.refusals.len(),
        acked: l.acked.clone(),
        losses: l.losses.clone(),
    }
}

/// Guard bugs the explorer found and reported, not fixed here (tests/explore/README.md, "Found"):
/// (scenario, what the violation says, the bug). A schedule that shows only these passes; each
/// has its rediscovery test (tests/explore/tests/explore.rs).
pub const KNOWN: &[(&str, &str, &str)] = &[
    (
        "restore-running",
        "neither live nor in a capture",
        "bug 5 (bug 2's window, in one process): an opener of the restored file, in the writer's process, gets its own unix -shm node (keyed by the main file's inode) and so SQLite's WAL write lock does not exclude the old inode's writer: both write one WAL, which cannot be read with any main file",
    ),
    (
        "restore-running",
        "is live 0 times",
        "bug 5, after recover --apply",
    ),
    (
        "restore-running",
        "the restore was undone",
        "bug 5: the opener's checkpoint copies the old inode's writer's frames of the shared WAL onto the restored file",
    ),
    (
        "peer-loss",
        "neither live nor in a capture",
        "bug 4: a -wal renamed or removed after its writer closed, while the peer is paused inside its open (before its WAL open, or before its first -shm map): the writer's acknowledged rows are lost silently, no refusal, no capture",
    ),
    (
        "peer-loss",
        "is live 0 times",
        "bug 4, after recover --apply",
    ),
    (
        "killed-peer",
        "neither live nor in a capture",
        "bug 4 (the writer closed, the -wal taken away while the abandoning peer is inside its open)",
    ),
    (
        "killed-peer",
        "is live 0 times",
        "bug 4, after recover --apply",
    ),
];

fn known_bug(scenario: &str, violation: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(s, what, _)| *s == scenario && violation.contains(what))
        .map(|(_, _, bug)| *bug)
}

/// What `explore` found for one scenario.
pub struct Summary {
    pub schedules: usize,
    pub distinct: usize,
    pub captures: usize,
    pub refusals: usize,
    /// Schedules that showed a known bug only.
    pub known: Vec<u64>,
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
        known: Vec::new(),
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
        } else if !o.known.is_empty() {
            s.known.push(seed);
        }
    }
    s
}
