//! The scheduler: participants (each a thread) run one at a time; at every yield point the
//! running one hands the turn to the participant the strategy picks (PCT: random priorities,
//! `depth - 1` priority change points). Everything a participant does between two yield points
//! runs alone, so a schedule is a function of the seed.
//!
//! A participant that yields because it is blocked (SQLite's busy handler, a WAL read retry's
//! `xSleep`) is not picked again while another one can run, until somebody releases something
//! (an unlock, a close, an actor's step): blocked participants wait instead of spinning.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// SplitMix64: the seed's only source of choices (no dependency, same on every machine).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// What a participant was about to do when it yielded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// Runs on (a VFS call, an actor's step).
    Go,
    /// Blocked (busy handler, `xSleep`): picked again only when nobody else can run.
    Blocked,
    /// Releases something (unlock, close, an actor's file operation): wakes the blocked.
    Release,
}

/// One step of a schedule: who ran, what it was about to do.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Step {
    pub who: usize,
    pub what: String,
}

struct Part {
    name: String,
    done: bool,
    blocked: bool,
    priority: i64,
}

/// PCT (Burckhardt et al., ASPLOS 2010): distinct random initial priorities, and `depth - 1`
/// change points among the first `horizon` steps at which the running participant drops below
/// everybody.
struct Pct {
    change_points: Vec<(usize, i64)>,
}

/// How the next participant is chosen.
#[derive(Clone, Debug)]
pub enum Strategy {
    /// PCT of `depth`, its change points among the first `horizon` steps, from the seed.
    Pct { depth: usize, horizon: usize },
    /// The enumeration's (`dfs.rs`): at each choice point the default — the running participant
    /// while it is enabled, else the lowest-numbered enabled one (no preemption) — except at the
    /// listed choice points, `(choice point, participant)`, in increasing order.
    Deviations(Vec<(usize, usize)>),
}

/// One choice point of a schedule: who was enabled (a bit per participant: the runnable ones,
/// or the blocked ones when nobody else can run), who was running, who was picked.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Choice {
    pub enabled: u32,
    pub current: Option<usize>,
    pub chosen: usize,
}

impl Choice {
    /// The pick without a preemption: the running participant while it is enabled, else the
    /// lowest-numbered enabled one.
    pub fn default_pick(enabled: u32, current: Option<usize>) -> usize {
        match current {
            Some(c) if enabled & (1 << c) != 0 => c,
            _ => enabled.trailing_zeros() as usize,
        }
    }

    /// Whether picking `who` here preempts the running participant (it could have gone on).
    pub fn preempts(&self, who: usize) -> bool {
        self.current
            .is_some_and(|c| self.enabled & (1 << c) != 0 && who != c)
    }
}

struct State {
    running: Option<usize>,
    parts: Vec<Part>,
    pct: Pct,
    steps: Vec<Step>,
    /// `None`: PCT (`pct`); else the enumeration's deviations, the next one first.
    deviations: Option<std::collections::VecDeque<(usize, usize)>>,
    choices: Vec<Choice>,
    /// Whether `xUnfetch(0, NULL)` of a main file is a yield point (`Scenario::unfetch`).
    unfetch: bool,
}

/// The scheduler of one schedule.
pub struct Sched {
    state: Mutex<State>,
    turn: Condvar,
}

/// The (scheduler, participant) of this thread; `None` outside a schedule (setup, checks).
type Me = Option<(Arc<Sched>, usize)>;

thread_local! {
    static ME: RefCell<Me> = const { RefCell::new(None) };
}

/// A yield point: hands the turn to whoever the strategy picks and waits for it to come back.
/// Outside a schedule, nothing.
pub fn yield_now(kind: Kind, what: impl FnOnce() -> String) {
    let me = ME.with(|m| m.borrow().clone());
    if let Some((sched, id)) = me {
        sched.step(id, kind, what());
    }
}

/// Writes a note into the schedule's step list without yielding (a script's own steps).
pub fn note(what: impl FnOnce() -> String) {
    let me = ME.with(|m| m.borrow().clone());
    if let Some((sched, id)) = me {
        let mut s = sched.state.lock();
        let what = format!("# {}", what());
        s.steps.push(Step { who: id, what });
    }
}

/// Whether this schedule yields at a checkpoint's `xUnfetch(0, NULL)` (`Scenario::unfetch`).
pub fn yields_at_unfetch() -> bool {
    let me = ME.with(|m| m.borrow().clone());
    me.is_some_and(|(sched, _)| sched.state.lock().unfetch)
}

/// Whether this thread is a participant of a running schedule.
pub fn in_schedule() -> bool {
    ME.with(|m| m.borrow().is_some())
}

/// The number of the step about to be taken (for the ledger's order of events).
pub fn step_number() -> usize {
    let me = ME.with(|m| m.borrow().clone());
    me.map_or(0, |(sched, _)| sched.state.lock().steps.len())
}

/// A participant: its name and its script.
pub struct Participant {
    pub name: String,
    pub script: Box<dyn FnOnce() + Send>,
}

/// A finished schedule: its steps, its choice points, and the participants whose scripts
/// panicked.
pub struct Run {
    pub steps: Vec<Step>,
    pub choices: Vec<Choice>,
    pub names: Vec<String>,
    pub panics: Vec<String>,
}

impl Run {
    /// The step list as the replay prints it, one line per step.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.steps.iter().enumerate() {
            let _ = writeln!(out, "  {i:4} {:>4} {}", self.names[s.who], s.what);
        }
        out
    }
}

impl Sched {
    /// Runs `parts` one at a time in the order `strategy` gives (PCT from `seed`, or the
    /// enumeration's deviations); `unfetch`: whether a checkpoint's `xUnfetch(0, NULL)` yields.
    pub fn run(seed: u64, strategy: Strategy, unfetch: bool, parts: Vec<Participant>) -> Run {
        let (depth, horizon, deviations) = match strategy {
            Strategy::Pct { depth, horizon } => (depth, horizon, None),
            Strategy::Deviations(d) => (1, 1, Some(d.into_iter().collect())),
        };
        let mut rng = Rng::new(seed);
        let n = parts.len();
        assert!(
            n <= 32,
            "at most 32 participants (the enabled sets are bit masks)"
        );
        // Initial priorities: a random permutation of depth..depth+n (all above the change points').
        let mut prios: Vec<i64> = (0..n as i64).map(|i| i + depth as i64).collect();
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            prios.swap(i, j);
        }
        let mut change_points: Vec<(usize, i64)> = (1..depth)
            .map(|p| (1 + rng.below(horizon.max(1) as u64) as usize, p as i64))
            .collect();
        change_points.sort();
        let names: Vec<String> = parts.iter().map(|p| p.name.clone()).collect();
        let sched = Arc::new(Sched {
            state: Mutex::new(State {
                running: None,
                parts: names
                    .iter()
                    .zip(&prios)
                    .map(|(name, &priority)| Part {
                        name: name.clone(),
                        done: false,
                        blocked: false,
                        priority,
                    })
                    .collect(),
                pct: Pct { change_points },
                steps: Vec::new(),
                deviations,
                choices: Vec::new(),
                unfetch,
            }),
            turn: Condvar::new(),
        });
        {
            let mut s = sched.state.lock();
            s.running = pick(&mut s);
        }
        let panics = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(id, part)| {
                let sched = Arc::clone(&sched);
                let panics = Arc::clone(&panics);
                std::thread::Builder::new()
                    .name(format!("explore-{}", part.name))
                    .spawn(move || {
                        sched.wait_turn(id);
                        ME.with(|m| *m.borrow_mut() = Some((Arc::clone(&sched), id)));
                        let script = part.script;
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(script));
                        ME.with(|m| *m.borrow_mut() = None);
                        if let Err(e) = r {
                            let msg = e
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            panics.lock().push(format!("{}: {msg}", part.name));
                        }
                        sched.finish(id);
                    })
                    .expect("spawn a participant")
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
        let steps = std::mem::take(&mut sched.state.lock().steps);
        let choices = std::mem::take(&mut sched.state.lock().choices);
        let panics = std::mem::take(&mut *panics.lock());
        Run {
            steps,
            choices,
            names,
            panics,
        }
    }

    fn wait_turn(&self, id: usize) {
        let mut s = self.state.lock();
        while s.running != Some(id) {
            self.turn.wait(&mut s);
        }
    }

    fn step(&self, id: usize, kind: Kind, what: String) {
        let mut s = self.state.lock();
        debug_assert_eq!(s.running, Some(id));
        s.steps.push(Step { who: id, what });
        let n = s.steps.len();
        while let Some(&(at, priority)) = s.pct.change_points.first() {
            if at > n {
                break;
            }
            s.pct.change_points.remove(0);
            s.parts[id].priority = priority;
        }
        match kind {
            Kind::Go => s.parts[id].blocked = false,
            Kind::Blocked => s.parts[id].blocked = true,
            Kind::Release => s.parts.iter_mut().for_each(|p| p.blocked = false),
        }
        let next = pick(&mut s);
        if next != Some(id) {
            s.running = next;
            self.turn.notify_all();
            while s.running != Some(id) {
                self.turn.wait(&mut s);
            }
        }
    }

    fn finish(&self, id: usize) {
        let mut s = self.state.lock();
        s.parts[id].done = true;
        // Whatever it held is released now (a script ends after its close or its abandonment).
        s.parts.iter_mut().for_each(|p| p.blocked = false);
        s.running = pick(&mut s);
        self.turn.notify_all();
    }
}

/// The next participant (a choice point, recorded): PCT's, or the enumeration's.
fn pick(s: &mut State) -> Option<usize> {
    let enabled = |blocked: bool| {
        s.parts
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.done && p.blocked == blocked)
            .fold(0u32, |m, (i, _)| m | 1 << i)
    };
    let enabled = match enabled(false) {
        0 => enabled(true),
        m => m,
    };
    if enabled == 0 {
        return None;
    }
    let current = s.running;
    let at = s.choices.len();
    let pct = s.deviations.is_none().then(|| pick_pct(s));
    let chosen = match (pct, s.deviations.as_mut()) {
        (Some(p), _) => p.expect("an enabled participant"),
        (None, None) => unreachable!(),
        (None, Some(d)) => {
            match d.front() {
                // A deviation the schedule cannot take (a replay of another scenario, or a
                // schedule that is not deterministic) is not taken: no panic here, inside a VFS
                // call; the enumeration finds the difference in the recorded choice points.
                Some(&(c, who)) if c == at => {
                    d.pop_front();
                    if enabled & (1 << who) != 0 {
                        who
                    } else {
                        Choice::default_pick(enabled, current)
                    }
                }
                _ => Choice::default_pick(enabled, current),
            }
        }
    };
    s.choices.push(Choice {
        enabled,
        current,
        chosen,
    });
    Some(chosen)
}

/// The runnable participant of highest priority; the blocked ones only when nobody else can run.
fn pick_pct(s: &State) -> Option<usize> {
    let best = |blocked: bool| {
        s.parts
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.done && p.blocked == blocked)
            .max_by_key(|(_, p)| p.priority)
            .map(|(i, _)| i)
    };
    best(false).or_else(|| best(true))
}

impl std::fmt::Debug for Sched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        let names: Vec<&str> = s.parts.iter().map(|p| p.name.as_str()).collect();
        write!(f, "Sched {names:?}")
    }
}
