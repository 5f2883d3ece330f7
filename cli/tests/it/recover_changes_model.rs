//! What recover_changes.rs expects after the runbook, computed from a plan alone: the rows as N
//! left them, with W's own changes (from its base, the state N started from, to its last
//! acknowledged commit) applied the way the `changes` rule applies them — an insert always goes
//! in; an update or delete only where the live row still equals W's base version; an update or
//! delete of a row N changed, or an update of a row N deleted, is undecided (N's row stays).
//! Rows are compared by content (the plan's columns), as multisets.

use std::collections::BTreeMap;

use rusqlite::types::Value;

use crate::recover_changes_scenarios::{Op, Plan};

/// A row's content: its table and the plan's columns, as one comparable string.
pub type Content = String;

pub fn content(table: &str, values: &[Value]) -> Content {
    let words: Vec<String> = values
        .iter()
        .map(|v| match v {
            Value::Text(s) if s.len() > 40 => format!("{:?}…({} chars)", &s[..24], s.len()),
            other => format!("{other:?}"),
        })
        .collect();
    format!("{table}({})", words.join(", "))
}

#[derive(Clone)]
struct Row {
    table: usize,
    values: Vec<Value>,
}

/// Rows by logical identity.
#[derive(Clone, Default)]
struct State {
    rows: BTreeMap<u64, Row>,
    next: u64,
    history_rowids: Vec<i64>,
    /// History rows by (table, rowid).
    by_rowid: BTreeMap<(usize, i64), u64>,
}

impl State {
    fn apply(&mut self, op: &Op, history: bool) {
        match op {
            Op::Insert(table, values) => {
                let rowid = history.then(|| {
                    if self.history_rowids.len() <= *table {
                        self.history_rowids.resize(*table + 1, 0);
                    }
                    self.history_rowids[*table] += 1;
                    self.history_rowids[*table]
                });
                if let Some(rowid) = rowid {
                    self.by_rowid.insert((*table, rowid), self.next);
                }
                self.rows.insert(
                    self.next,
                    Row {
                        table: *table,
                        values: values.clone(),
                    },
                );
                self.next += 1;
            }
            Op::Update {
                table,
                rowid,
                col,
                value,
            } => {
                let id = self.find(*table, *rowid);
                self.rows.get_mut(&id).unwrap().values[*col] = value.clone();
            }
            Op::Delete(table, rowid) => {
                let id = self.find(*table, *rowid);
                self.rows.remove(&id);
                self.by_rowid.remove(&(*table, *rowid));
            }
        }
    }

    fn find(&self, table: usize, rowid: i64) -> u64 {
        *self
            .by_rowid
            .get(&(table, rowid))
            .unwrap_or_else(|| panic!("table {table} rowid {rowid}: no such row"))
    }
}

/// One of W's changes that may or may not be applied (over the cap: its base is not kept).
pub struct Either {
    /// What is live when it is not applied (N's row, or nothing).
    pub not_applied: Option<Content>,
    /// What is live when it is (W's row, or nothing).
    pub applied: Option<Content>,
}

pub struct Expected {
    /// The rows that must be live, each as many times as listed.
    pub live: BTreeMap<Content, usize>,
    /// W's changes that may go either way (T8), not counted in `live`.
    pub either: Vec<Either>,
    /// W's changes the `changes` rule cannot decide (N changed the row too): N's row stays.
    pub undecided: usize,
    /// W's net inserts, updates and deletes.
    pub w_inserts: usize,
    pub w_updates: usize,
    pub w_deletes: usize,
    /// What each content is, for a failure's message ("deleted by N", "W's insert", ...).
    pub labels: BTreeMap<Content, &'static str>,
    /// T4: the sum per group.
    pub balances: BTreeMap<String, i64>,
}

impl Expected {
    pub fn of(plan: &Plan) -> Expected {
        let name = |t: usize| plan.tables[t].name;
        let mut base = State {
            next: 1,
            ..State::default()
        };
        for op in &plan.history {
            base.apply(op, true);
        }
        let history = base.clone();
        for op in plan.backfilled.iter().flatten() {
            base.apply(op, false);
        }
        let mut w = base.clone();
        w.next = 1 << 40;
        let mut n = base.clone();
        n.next = 1 << 41;
        // Versions a generation wrote and then changed again or deleted (labels only).
        let mut passing: Vec<(usize, Vec<Value>, &'static str)> = Vec::new();
        for (state, ops, label) in [
            (&mut w, &plan.w, "a version W changed again or deleted"),
            (&mut n, &plan.n, "a version N changed again or deleted"),
        ] {
            for op in ops.iter().flatten() {
                state.apply(op, false);
                if let Op::Update { table, rowid, .. } = op {
                    let row = &state.rows[&state.find(*table, *rowid)];
                    passing.push((row.table, row.values.clone(), label));
                }
            }
        }

        let mut labels = BTreeMap::new();
        let c = |r: &Row| content(name(r.table), &r.values);
        for (id, b) in &base.rows {
            let label = match (n.rows.get(id), w.rows.get(id)) {
                (None, _) => "deleted by N",
                (Some(nr), _) if nr.values != b.values => "old version of N's update",
                (_, None) => "deleted by W",
                (_, Some(wr)) if wr.values != b.values => "old version of W's update",
                _ => "untouched history",
            };
            labels.insert(c(b), label);
        }
        for (id, r) in &n.rows {
            match base.rows.get(id) {
                None => labels.insert(c(r), "N's insert"),
                Some(b) if b.values != r.values => labels.insert(c(r), "N's update"),
                Some(_) => None,
            };
        }

        for (id, h) in &history.rows {
            if base.rows.get(id).is_some_and(|b| b.values != h.values) {
                labels
                    .entry(c(h))
                    .or_insert("a version W's backfilled commits replaced");
            }
        }
        for (table, values, label) in passing {
            labels.entry(content(name(table), &values)).or_insert(label);
        }

        let mut finals = n.clone();
        let mut either = Vec::new();
        let (mut undecided, mut w_inserts, mut w_updates, mut w_deletes) = (0, 0, 0, 0);
        let ids: std::collections::BTreeSet<u64> =
            base.rows.keys().chain(w.rows.keys()).copied().collect();
        for id in ids {
            let (b, wr) = (base.rows.get(&id), w.rows.get(&id));
            let live = n.rows.get(&id);
            match (b, wr) {
                (None, Some(wr)) => {
                    w_inserts += 1;
                    labels.insert(c(wr), "W's insert");
                    if plan.over_cap {
                        either.push(Either {
                            not_applied: None,
                            applied: Some(c(wr)),
                        });
                    } else {
                        finals.rows.insert(id, wr.clone());
                    }
                }
                (Some(b), None) => {
                    w_deletes += 1;
                    match live {
                        None => {}
                        Some(l) if l.values == b.values => {
                            if plan.over_cap {
                                finals.rows.remove(&id);
                                either.push(Either {
                                    not_applied: Some(c(l)),
                                    applied: None,
                                });
                            } else {
                                finals.rows.remove(&id);
                            }
                        }
                        Some(_) => undecided += 1,
                    }
                }
                (Some(b), Some(wr)) if b.values != wr.values => {
                    w_updates += 1;
                    labels.insert(c(wr), "W's update");
                    match live {
                        Some(l) if l.values == b.values => {
                            if plan.over_cap {
                                finals.rows.remove(&id);
                                either.push(Either {
                                    not_applied: Some(c(l)),
                                    applied: Some(c(wr)),
                                });
                            } else {
                                finals.rows.insert(id, wr.clone());
                            }
                        }
                        Some(l) if l.values == wr.values => {}
                        _ => undecided += 1,
                    }
                }
                _ => {}
            }
        }
        let mut live = BTreeMap::new();
        for r in finals.rows.values() {
            *live.entry(c(r)).or_insert(0) += 1;
        }
        let mut balances = BTreeMap::new();
        if let Some((table, group, sum)) = plan.balances {
            for r in finals.rows.values().filter(|r| r.table == table) {
                let Value::Integer(amount) = r.values[sum] else {
                    panic!("a summed column holds integers");
                };
                *balances
                    .entry(format!("{:?}", r.values[group]))
                    .or_insert(0) += amount;
            }
        }
        Expected {
            live,
            either,
            undecided,
            w_inserts,
            w_updates,
            w_deletes,
            labels,
            balances,
        }
    }

    /// How `live` (content → count) differs from what is expected: `None` when it does not.
    pub fn differences(&self, live: &BTreeMap<Content, usize>) -> Option<String> {
        let mut rest = live.clone();
        let mut missing: BTreeMap<&str, (usize, Vec<&Content>)> = BTreeMap::new();
        for (content, &want) in &self.live {
            let have = rest.get(content).copied().unwrap_or(0);
            let take = have.min(want);
            if have > 0 {
                *rest.get_mut(content).unwrap() -= take;
            }
            if want > have {
                let label = self.label(content);
                let m = missing.entry(label).or_default();
                m.0 += want - have;
                m.1.push(content);
            }
        }
        let mut either_missing = 0;
        for e in &self.either {
            let applied_live = e
                .applied
                .as_ref()
                .is_some_and(|c| rest.get(c).is_some_and(|n| *n > 0));
            let mut take = |c: &Option<Content>| match c {
                None => true,
                Some(c) => match rest.get_mut(c) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        true
                    }
                    _ => false,
                },
            };
            // W's version if it is live, else N's; a change whose outcome is "nothing live"
            // (an applied delete, an insert not applied) may leave nothing.
            let found = (applied_live && take(&e.applied))
                || take(&e.not_applied)
                || e.applied.is_none()
                || e.not_applied.is_none();
            if !found {
                either_missing += 1;
            }
        }
        let mut extra: BTreeMap<&str, (usize, Vec<&Content>)> = BTreeMap::new();
        for (content, &n) in rest.iter().filter(|(_, n)| **n > 0) {
            let e = extra.entry(self.label(content)).or_default();
            e.0 += n;
            e.1.push(content);
        }
        if missing.is_empty() && extra.is_empty() && either_missing == 0 {
            return None;
        }
        let say = |what: &str, m: &BTreeMap<&str, (usize, Vec<&Content>)>| {
            m.iter()
                .map(|(label, (n, examples))| {
                    let shown: Vec<&str> = examples.iter().take(3).map(|s| s.as_str()).collect();
                    format!("{what} {n} {label} (e.g. {})", shown.join("; "))
                })
                .collect::<Vec<_>>()
        };
        let mut words = say("missing:", &missing);
        words.extend(say("extra:", &extra));
        if either_missing > 0 {
            words.push(format!(
                "{either_missing} of W's over-the-cap rows neither W's nor N's version"
            ));
        }
        Some(words.join("\n    "))
    }

    fn label(&self, content: &Content) -> &'static str {
        self.labels.get(content).copied().unwrap_or("unknown row")
    }
}

#[cfg(test)]
mod tests {
    use super::Expected;
    use crate::recover_changes_scenarios::Scenario;

    /// What each plan is built to hold, whatever the seed: T1's five conflicts (two claims of
    /// jobs N deleted, two of jobs N marked done, one delete of a job N marked done), and no
    /// undecided row anywhere else.
    #[test]
    fn the_plans_hold_the_conflicts_they_are_built_for_and_no_others() {
        for seed in 0..20 {
            for scenario in Scenario::ALL {
                let e = Expected::of(&scenario.plan(seed));
                let want = if scenario == Scenario::Queue { 5 } else { 0 };
                assert_eq!(e.undecided, want, "{scenario:?} seed {seed}");
            }
            let t1 = Expected::of(&Scenario::Queue.plan(seed));
            assert_eq!((t1.w_inserts, t1.w_updates, t1.w_deletes), (52, 24, 8));
            let t3 = Expected::of(&Scenario::MergesAndFrees.plan(seed));
            assert_eq!((t3.w_inserts, t3.w_updates, t3.w_deletes), (96, 0, 0));
            let t6 = Expected::of(&Scenario::OwnFrees.plan(seed));
            assert_eq!(t6.w_deletes, 300);
            let t8 = Expected::of(&Scenario::OverTheCap.plan(seed));
            assert_eq!(t8.either.len(), t8.w_inserts + t8.w_updates + t8.w_deletes);
        }
    }
}
