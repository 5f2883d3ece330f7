//! Exhaustive enumeration of a scenario's schedules with a preemption bound: a stateless
//! depth-first search over the scheduler's choice points (as CHESS does, Musuvathi and Qadeer,
//! PLDI 2007). A schedule is the non-preemptive default (the running participant goes on while
//! it is enabled, else the lowest-numbered enabled one) with a few deviations; the search runs
//! one schedule, keeps its choice points on a stack, and backtracks to the deepest choice point
//! with an alternative not yet tried whose preemptions stay within the bound. Each schedule is
//! run from the start (real SQLite, real files: nothing is snapshotted), and the choice points
//! of the replayed prefix must be the same as before (determinism, asserted).
//!
//! A preemption is picking another participant while the running one could go on; switching
//! when it finished or is blocked is free. Blocked participants are enabled only when nobody
//! else can run, as in PCT.
//!
//! The stack can be written out and read back (`save`/`load`), so that a long enumeration runs
//! in several processes (the guard's process-wide state grows with every database it has seen).

use crate::sched::Choice;

struct Node {
    choice: Choice,
    /// The participants tried at this choice point (a bit each).
    tried: u32,
}

/// The search: its stack, its bound, whether it started and whether it is complete.
pub struct Dfs {
    pub bound: usize,
    stack: Vec<Node>,
    started: bool,
}

impl Dfs {
    pub fn new(bound: usize) -> Dfs {
        Dfs {
            bound,
            stack: Vec::new(),
            started: false,
        }
    }

    /// The deviations of the next schedule to run, `None` when every schedule within the bound
    /// was run.
    pub fn next_schedule(&mut self) -> Option<Vec<(usize, usize)>> {
        if !self.started {
            self.started = true;
            return Some(Vec::new());
        }
        while let Some(i) = self.stack.len().checked_sub(1) {
            let before: usize = self.stack[..i]
                .iter()
                .map(|n| usize::from(n.choice.preempts(n.choice.chosen)))
                .sum();
            let node = &mut self.stack[i];
            let untried = (0..32usize).find(|&who| {
                let bit = 1u32 << who;
                node.choice.enabled & bit != 0
                    && node.tried & bit == 0
                    && before + usize::from(node.choice.preempts(who)) <= self.bound
            });
            if let Some(who) = untried {
                node.tried |= 1 << who;
                node.choice.chosen = who;
                return Some(self.deviations());
            }
            self.stack.pop();
        }
        None
    }

    /// The deviations from the default along the current stack.
    fn deviations(&self) -> Vec<(usize, usize)> {
        self.stack
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                n.choice.chosen != Choice::default_pick(n.choice.enabled, n.choice.current)
            })
            .map(|(i, n)| (i, n.choice.chosen))
            .collect()
    }

    /// Takes note of the choice points of the schedule just run (from [`Dfs::next_schedule`]'s
    /// deviations): the prefix must be the stack's, the rest is pushed.
    pub fn record(&mut self, choices: &[Choice]) {
        let n = self.stack.len();
        assert!(
            choices.len() >= n,
            "the schedule ended at choice point {} of a replayed prefix of {n}: not deterministic",
            choices.len()
        );
        for (i, (node, c)) in self.stack.iter().zip(choices).enumerate() {
            assert_eq!(
                node.choice, *c,
                "choice point {i} differs from the same prefix's earlier run: not deterministic"
            );
        }
        self.stack.extend(choices[n..].iter().map(|&choice| Node {
            choice,
            tried: 1 << choice.chosen,
        }));
    }

    /// The search's state as one line (`load` reads it back).
    pub fn save(&self) -> String {
        let nodes: Vec<String> = self
            .stack
            .iter()
            .map(|n| {
                let current = n.choice.current.map_or("-".to_string(), |c| c.to_string());
                format!(
                    "{:x}.{current}.{}.{:x}",
                    n.choice.enabled, n.choice.chosen, n.tried
                )
            })
            .collect();
        format!(
            "bound={} started={} stack={}",
            self.bound,
            self.started,
            nodes.join(",")
        )
    }

    /// The search `save` wrote; `None` when the line is not one.
    pub fn load(line: &str) -> Option<Dfs> {
        let mut bound = None;
        let mut started = None;
        let mut stack = Vec::new();
        for part in line.split_whitespace() {
            let (key, value) = part.split_once('=')?;
            match key {
                "bound" => bound = value.parse().ok(),
                "started" => started = value.parse().ok(),
                "stack" => {
                    for node in value.split(',').filter(|s| !s.is_empty()) {
                        let f: Vec<&str> = node.split('.').collect();
                        let [enabled, current, chosen, tried] = f[..] else {
                            return None;
                        };
                        stack.push(Node {
                            choice: Choice {
                                enabled: u32::from_str_radix(enabled, 16).ok()?,
                                current: match current {
                                    "-" => None,
                                    c => Some(c.parse().ok()?),
                                },
                                chosen: chosen.parse().ok()?,
                            },
                            tried: u32::from_str_radix(tried, 16).ok()?,
                        });
                    }
                }
                _ => return None,
            }
        }
        Some(Dfs {
            bound: bound?,
            stack,
            started: started?,
        })
    }
}

/// Deviations as the replay command takes them: `choice:participant,...` (empty: none).
pub fn format_deviations(d: &[(usize, usize)]) -> String {
    let parts: Vec<String> = d.iter().map(|(c, w)| format!("{c}:{w}")).collect();
    parts.join(",")
}

/// Reads `format_deviations`' form back.
pub fn parse_deviations(s: &str) -> Option<Vec<(usize, usize)>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (c, w) = p.split_once(':')?;
            Some((c.parse().ok()?, w.parse().ok()?))
        })
        .collect()
}
