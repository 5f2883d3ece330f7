//! A deterministic scheduler of SQLite connections at VFS-call granularity: see README.md.
//! Participants (connections on their own threads, guarded or stock, and file actors) run one at a
//! time through the scheduling VFS (`vfs.rs`); the order of their steps comes from a seed
//! (`sched.rs`, PCT); after every schedule the invariants are checked (`check.rs`).

pub mod check;
pub mod dfs;
pub mod guard_log;
pub mod process;
pub mod scenarios;
pub mod sched;
pub mod vfs;
pub mod world;

use std::sync::Arc;

use parking_lot::Mutex;

use scenarios::Scenario;
use sched::{Rng, Run, Sched, Strategy};
use world::Ledger;

/// One schedule's outcome.
pub struct Outcome {
    pub scenario: &'static str,
    pub seed: u64,
    pub depth: usize,
    /// The variant the seed chose.
    pub variant: String,
    /// The enumeration's deviations (`dfs.rs`), `None` for a PCT schedule.
    pub deviations: Option<Vec<(usize, usize)>>,
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
        let (how, replay) = match &self.deviations {
            None => (format!("PCT depth {}", self.depth), String::new()),
            Some(d) => {
                let d = dfs::format_deviations(d);
                (
                    format!("enumerated, deviations [{d}]"),
                    format!(" --deviations '{d}'"),
                )
            }
        };
        // What else the replay needs: another SQLite (EXPLORE_SQLITE), the WAL-reset rule set
        // otherwise than by default, a fault switched on.
        let mut env = String::new();
        if !cfg!(feature = "bundled") {
            env += &format!("EXPLORE_SQLITE={} ", rusqlite::version());
        }
        match hermes_guard::wal_reset_guard() {
            hermes_guard::WalResetGuard::Auto => {}
            rule => {
                let on = rule == hermes_guard::WalResetGuard::On;
                env += &format!(
                    "{}={} ",
                    hermes_guard::WAL_RESET_GUARD_ENV,
                    if on { "on" } else { "off" }
                );
            }
        }
        let replay = format!("{}{replay}", faults::replay_args());
        let mut out = format!(
            "scenario {} seed {} ({}; {how}): {} steps, {} violation(s)\n  replay: {env}bash tests/explore.sh --scenario {} --seed {}{replay}\n",
            self.scenario,
            self.seed,
            self.variant,
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
    run_with(sc, seed, None)
}

/// As [`run_one`]; with `deviations`, the schedule is the enumeration's (the seed chooses the
/// variant only), else PCT's.
pub fn run_with(
    sc: &'static Scenario,
    seed: u64,
    deviations: Option<Vec<(usize, usize)>>,
) -> Outcome {
    // One schedule at a time in a process: the guard's directory watch is the process's, so
    // another schedule's file events (a test running beside this one) would turn this one's
    // fast checks into full ones, and a decision that follows them (a close left to a sibling
    // or not) would change the steps a seed replays.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock();
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
    guard_log::start();
    // The variant and the depth from the seed, apart from the scheduler's own stream.
    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(7));
    let depth = 1 + rng.below(3) as usize;
    let built = (sc.build)(&db, &mut rng, &ledger);
    let strategy = match &deviations {
        None => Strategy::Pct {
            depth,
            horizon: sc.horizon,
        },
        Some(d) => Strategy::Deviations(d.clone()),
    };
    let run = Sched::run(seed, strategy, sc.unfetch, built.parts);
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
    l.warnings.extend(guard_log::take());
    let guard_first = guard_first(&run);
    violations.extend(check::check(
        &db,
        &l,
        built.stale_main.as_deref(),
        guard_first,
    ));
    let captures = hermes_guard::recover::list_captures(&db).map_or(0, |c| c.len());
    let mut known = Vec::new();
    violations.retain(
        |v| match known_bug(sc.name, v).filter(|_| !faults::any_on()) {
            Some(bug) => {
                known.push(format!("{v} [{bug}]"));
                false
            }
            None => true,
        },
    );
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
        variant: built.variant,
        deviations,
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

/// The guard's fault switches (`hermes_guard::explore_faults`), for proving that the explorer
/// finds a bug the guard once had. While one is on, no violation is taken for a known bug.
pub mod faults {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::sched::{yield_now, Kind};

    /// The faults switched on: a bit per name of `NAMES`.
    static ON: AtomicUsize = AtomicUsize::new(0);

    /// The names `--fault` takes: the stale-WAL gate's old order (judged first, EXCLUSIVE after),
    /// recovery's old rules (a capture's delta replayed whatever its base), the old overwrite
    /// judgement (no `READ(0)` at the close, no confirmation with the wal-index's salts), and
    /// recovery without the changes rule (`add-only` for a capture that holds its pages' base,
    /// never `changes`).
    pub const NAMES: &[&str] = &[
        "judged-before-exclusive",
        "capture-base-ignored",
        "judgement-unconfirmed",
        "changes-ignored",
    ];

    /// The environment variable that hands the faults switched on to a child process
    /// (`process.rs`): their names, comma-separated.
    pub const CHILD_ENV: &str = "EXPLORE_CHILD_FAULTS";

    /// The stale-WAL gate's window between its judgement and its EXCLUSIVE attempt, in the old
    /// order: a yield point.
    fn gate_window() {
        yield_now(Kind::Go, || {
            "gate: judged, EXCLUSIVE not yet asked (judged-before-exclusive)".into()
        });
    }

    /// Switches fault `name` on (`NAMES`); `false` when there is no such fault.
    pub fn switch_on(name: &str) -> bool {
        match name {
            "judged-before-exclusive" => {
                hermes_guard::explore_faults::set_stale_wal_judged_before_exclusive(Some(
                    gate_window,
                ))
            }
            "capture-base-ignored" => hermes_guard::explore_faults::set_capture_base_ignored(true),
            "judgement-unconfirmed" => {
                hermes_guard::explore_faults::set_judgement_unconfirmed(true)
            }
            "changes-ignored" => hermes_guard::explore_faults::set_changes_ignored(true),
            _ => return false,
        }
        let bit = NAMES
            .iter()
            .position(|n| *n == name)
            .expect("a listed fault");
        ON.fetch_or(1 << bit, Ordering::AcqRel);
        true
    }

    /// Switches every fault off.
    pub fn switch_off() {
        hermes_guard::explore_faults::set_stale_wal_judged_before_exclusive(None);
        hermes_guard::explore_faults::set_capture_base_ignored(false);
        hermes_guard::explore_faults::set_judgement_unconfirmed(false);
        hermes_guard::explore_faults::set_changes_ignored(false);
        ON.store(0, Ordering::Release);
    }

    pub fn any_on() -> bool {
        ON.load(Ordering::Acquire) != 0
    }

    /// The faults switched on, comma-separated (for [`CHILD_ENV`]).
    pub fn names_on() -> String {
        let on = ON.load(Ordering::Acquire);
        let names: Vec<&str> = NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| on & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        names.join(",")
    }

    /// The `--fault` arguments of a replay (empty when none is on).
    pub fn replay_args() -> String {
        let on = ON.load(Ordering::Acquire);
        NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| on & (1 << i) != 0)
            .map(|(_, n)| format!(" --fault {n}"))
            .collect()
    }
}

/// Whether a guarded participant's stale-WAL gate ran before any stock participant took its
/// SHARED lock on the main file: then the guard saw a restore first. A step is what its
/// participant is about to do, done when it next runs: the gate runs after the guarded one's
/// `xOpen state.db-wal` step, before its next step; the lock after the stock one's `xLock main
/// SHARED`, before its next. The run that ends first came first.
fn guard_first(run: &Run) -> bool {
    let opened = |how: &str| -> Vec<usize> {
        let note = format!("# open {how}");
        let mut who: Vec<usize> = run
            .steps
            .iter()
            .filter(|s| s.what == note)
            .map(|s| s.who)
            .collect();
        who.dedup();
        who
    };
    let (guarded, stock) = (opened("guarded"), opened("stock"));
    // The step after which `what` of one of `who` was done: its participant's next step.
    let done = |who: &[usize], what: &str| {
        let at = run
            .steps
            .iter()
            .position(|s| who.contains(&s.who) && s.what == what)?;
        let by = run.steps[at].who;
        Some(
            run.steps[at + 1..]
                .iter()
                .position(|s| s.who == by)
                .map_or(usize::MAX, |n| at + 1 + n),
        )
    };
    match (
        done(&guarded, "xOpen state.db-wal"),
        done(&stock, "xLock main SHARED"),
    ) {
        (Some(g), Some(s)) => g < s,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Guard bugs the explorer found and reported, not fixed yet (tests/explore/README.md, "Found"):
/// (scenario, what the violation says, the bug). A schedule that shows only these passes; each gets
/// a rediscovery test (tests/explore/tests/it/explore.rs) that fails once it is fixed. The bugs
/// fixed are gone from this list, each seed that showed one a regression test.
pub const KNOWN: &[(&str, &str, &str)] = &[(
    "newer-changes",
    "is not live in that version",
    "bug 8: a retired writer's UPDATE took the write lock before the loss, and its read of a \
     main-file page came after a newer generation checkpointed into that page: mixed with the \
     writer's cached pages it finds no row, changes nothing and returns Ok (nothing is written, \
     so nothing is refused)",
)];

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

/// What an enumeration found for one scenario.
pub struct DfsSummary {
    pub schedules: usize,
    /// The variants enumerated (seed, variant), each completely unless `complete` is false.
    pub variants: Vec<(u64, String)>,
    pub complete: bool,
    /// Schedules that showed a known bug only: (seed, deviations).
    pub known: Vec<(u64, Vec<(usize, usize)>)>,
    pub failures: Vec<Outcome>,
}

/// Enumerates every schedule of `sc` within `bound` preemptions, for each variant the seeds
/// `0..seeds` choose (a variant is enumerated once, for the first seed that chooses it); stops
/// after `max` schedules (then `complete` is false) or, with `stop_at_first`, at the first
/// failing one.
pub fn explore_dfs(
    sc: &'static Scenario,
    bound: usize,
    seeds: u64,
    max: usize,
    stop_at_first: bool,
) -> DfsSummary {
    let mut s = DfsSummary {
        schedules: 0,
        variants: Vec::new(),
        complete: true,
        known: Vec::new(),
        failures: Vec::new(),
    };
    'seeds: for seed in 0..seeds {
        let mut search = dfs::Dfs::new(bound);
        while let Some(d) = search.next_schedule() {
            if s.schedules >= max {
                s.complete = false;
                break 'seeds;
            }
            let first = d.is_empty() && search_is_fresh(&search);
            let o = run_with(sc, seed, Some(d.clone()));
            if first {
                if s.variants.iter().any(|(_, v)| *v == o.variant) {
                    continue 'seeds;
                }
                s.variants.push((seed, o.variant.clone()));
            }
            s.schedules += 1;
            search.record(&o.run.choices);
            if !o.violations.is_empty() {
                s.failures.push(o);
                if stop_at_first {
                    s.complete = false;
                    break 'seeds;
                }
            } else if !o.known.is_empty() {
                s.known.push((seed, d));
            }
        }
    }
    s
}

/// Whether the search has run nothing yet but its first schedule (the default one).
fn search_is_fresh(search: &dfs::Dfs) -> bool {
    search.save().ends_with("stack=")
}
