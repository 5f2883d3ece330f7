//! The scenarios of recover_changes.rs (docs/plans/recovery-from-changes.md, "Real-process
//! tests"): for a scenario and a seed, the plan both children and the checks follow — the
//! schema, the history W commits and checkpoints, W's acknowledged transactions that live only
//! in its WAL, and the newer generation N's transactions. Every row carries a unique content
//! marker (`h…` history, `w…` W, `n…` N) except the ledger's credits, which are equal on
//! purpose. Deterministic: a seed gives the same plan in every process.

use rusqlite::types::Value;

/// A table of a plan: its name, its `CREATE TABLE` and the columns compared by content (an
/// `INTEGER PRIMARY KEY` is the rowid and is left out: recovery may move W's inserts to a fresh
/// rowid).
pub struct Table {
    pub name: &'static str,
    pub create: &'static str,
    pub cols: &'static [&'static str],
}

/// One statement. Updates and deletes address rows of the history by rowid (the history is
/// inserted in order into empty tables: its `i`-th row of a table has rowid `i + 1`).
#[derive(Clone, Debug)]
pub enum Op {
    Insert(usize, Vec<Value>),
    Update {
        table: usize,
        rowid: i64,
        col: usize,
        value: Value,
    },
    Delete(usize, i64),
}

/// Where N opens the database.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Link {
    /// The database's own path.
    None,
    /// A hard link beside it.
    SameDirectory,
    /// A hard link in another directory.
    OtherDirectory,
}

pub struct Plan {
    pub page_size: u32,
    pub tables: Vec<Table>,
    /// Committed by W in one transaction and checkpointed (TRUNCATE) before anything else.
    pub history: Vec<Op>,
    /// T7: transactions W commits before a reader takes its snapshot; W's PASSIVE checkpoint,
    /// held back by that reader, copies the pages these alone wrote into the main file (N
    /// starts from those; a page W wrote again after them keeps its older copy there).
    pub backfilled: Vec<Vec<Op>>,
    /// W's acknowledged transactions, only in its WAL at the loss.
    pub w: Vec<Vec<Op>>,
    /// N's transactions, then N's checkpoint.
    pub n: Vec<Vec<Op>>,
    pub link: Link,
    /// T8: W writes more pages than the guard keeps the base of: each of W's changes may be
    /// undecided (applied or not), and recover exits 3.
    pub over_cap: bool,
    /// T4: `(table, group column, summed column)` whose sums per group must be exact.
    pub balances: Option<(usize, usize, usize)>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scenario {
    /// The control: W and N only append (what `add-only` already recovers).
    Appends,
    Queue,
    Retention,
    MergesAndFrees,
    Ledger,
    HardLinkSameDirectory,
    HardLinkOtherDirectory,
    OwnFrees,
    PartialBackfill,
    OverTheCap,
}

impl Scenario {
    pub const ALL: [Scenario; 10] = [
        Scenario::Appends,
        Scenario::Queue,
        Scenario::Retention,
        Scenario::MergesAndFrees,
        Scenario::Ledger,
        Scenario::HardLinkSameDirectory,
        Scenario::HardLinkOtherDirectory,
        Scenario::OwnFrees,
        Scenario::PartialBackfill,
        Scenario::OverTheCap,
    ];

    pub fn name(self) -> String {
        format!("{self:?}")
    }

    pub fn from_name(name: &str) -> Scenario {
        *Scenario::ALL
            .iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("unknown scenario {name:?}"))
    }

    pub fn plan(self, seed: u64) -> Plan {
        let mut rng = Rng::new(seed ^ (self as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        match self {
            Scenario::Appends => appends(&mut rng),
            Scenario::Queue => queue(&mut rng),
            Scenario::Retention => retention(&mut rng),
            Scenario::MergesAndFrees => merges_and_frees(&mut rng),
            Scenario::Ledger => ledger(&mut rng),
            Scenario::HardLinkSameDirectory => hard_link(&mut rng, Link::SameDirectory),
            Scenario::HardLinkOtherDirectory => hard_link(&mut rng, Link::OtherDirectory),
            Scenario::OwnFrees => own_frees(&mut rng),
            Scenario::PartialBackfill => partial_backfill(&mut rng),
            Scenario::OverTheCap => over_the_cap(&mut rng),
        }
    }
}

/// splitmix64: tiny, deterministic, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn shuffled(&mut self, mut items: Vec<i64>) -> Vec<i64> {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
        items
    }
}

fn text(s: impl Into<String>) -> Value {
    Value::Text(s.into())
}

fn filler(n: usize) -> String {
    "x".repeat(n)
}

/// A table `name (id INTEGER PRIMARY KEY, k TEXT, v TEXT)`: `k` the marker, `v` the version.
fn notes(name: &'static str, create: &'static str) -> Table {
    Table {
        name,
        create,
        cols: &["k", "v"],
    }
}

const NOTES: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, k TEXT, v TEXT)";

/// `rows` history notes `h{i}` with `len` bytes of filler.
fn notes_history(rows: i64, len: usize) -> Vec<Op> {
    (0..rows)
        .map(|i| Op::Insert(0, vec![text(format!("h{i}")), text(filler(len))]))
        .collect()
}

fn note(marker: String, len: usize) -> Op {
    Op::Insert(0, vec![text(marker), text(filler(len))])
}

/// Updates note `rowid`'s version to `v`.
fn edit(rowid: i64, v: String) -> Op {
    Op::Update {
        table: 0,
        rowid,
        col: 1,
        value: text(v),
    }
}

/// `ops` in transactions of `n`.
fn batches(ops: Vec<Op>, n: usize) -> Vec<Vec<Op>> {
    ops.chunks(n).map(<[Op]>::to_vec).collect()
}

fn plan(tables: Vec<Table>, history: Vec<Op>, w: Vec<Vec<Op>>, n: Vec<Vec<Op>>) -> Plan {
    Plan {
        page_size: 4096,
        tables,
        history,
        backfilled: Vec::new(),
        w,
        n,
        link: Link::None,
        over_cap: false,
        balances: None,
    }
}

/// The control: 300 notes; W appends 20..40, N appends 30 and checkpoints.
fn appends(rng: &mut Rng) -> Plan {
    let w: Vec<Op> = (0..rng.between(20, 40))
        .map(|i| note(format!("w{i}"), 60))
        .collect();
    let n: Vec<Op> = (0..30).map(|i| note(format!("n{i}"), 60)).collect();
    plan(
        vec![notes("notes", NOTES)],
        notes_history(300, 60),
        batches(w, 1),
        batches(n, 10),
    )
}

/// T1: a job queue and its sessions (TEXT PRIMARY KEY). W inserts 48 jobs and 4 sessions,
/// claims 24 history jobs (2 that N deletes, 2 that N marks done, 20 N leaves alone) and
/// deletes 8 (1 N deletes too, 1 N marks done, 6 N leaves alone). N deletes 25 % of the 800
/// history jobs and 6 of the 40 sessions, marks 1/8 of the jobs done, inserts 20 jobs and 2
/// sessions. W's claims of jobs N deleted or marked done, and its delete of a job N marked
/// done, conflict: 5 undecided rows.
fn queue(rng: &mut Rng) -> Plan {
    const JOBS: i64 = 800;
    const SESSIONS: i64 = 40;
    let tables = vec![
        Table {
            name: "jobs",
            create: "CREATE TABLE jobs (id INTEGER PRIMARY KEY, session TEXT, state TEXT, \
                     payload TEXT)",
            cols: &["session", "state", "payload"],
        },
        Table {
            name: "sessions",
            create: "CREATE TABLE sessions (id TEXT PRIMARY KEY, title TEXT)",
            cols: &["id", "title"],
        },
    ];
    let job = |session: String, marker: String| {
        Op::Insert(
            0,
            vec![
                text(session),
                text("queued"),
                text(format!("{marker} {}", filler(60))),
            ],
        )
    };
    let state = |rowid: i64, s: &str| Op::Update {
        table: 0,
        rowid,
        col: 1,
        value: text(s),
    };
    let mut history: Vec<Op> = (0..SESSIONS)
        .map(|i| {
            Op::Insert(
                1,
                vec![text(format!("s{i}")), text(format!("session h{i}"))],
            )
        })
        .collect();
    history.extend((0..JOBS).map(|i| job(format!("s{}", i % SESSIONS), format!("job h{i}"))));
    // Rowids 1..JOBS-1: the last row stays, so no insert takes a deleted row's rowid.
    let jobs = rng.shuffled((1..JOBS).collect());
    let (n_deleted, rest) = jobs.split_at(JOBS as usize / 4);
    let (n_done, untouched) = rest.split_at(JOBS as usize / 8);
    let sessions = rng.shuffled((1..SESSIONS).collect());

    let mut w: Vec<Op> = (0..4)
        .map(|i| {
            Op::Insert(
                1,
                vec![text(format!("sw{i}")), text(format!("session w{i}"))],
            )
        })
        .collect();
    w.extend((0..48).map(|i| job(format!("sw{}", i % 4), format!("job w{i}"))));
    let claimed = n_deleted[..2]
        .iter()
        .chain(&n_done[..2])
        .chain(&untouched[..20]);
    w.extend(claimed.map(|&r| state(r, "claimed by w")));
    let deleted = [n_deleted[2], n_done[2]]
        .into_iter()
        .chain(untouched[20..26].iter().copied());
    w.extend(deleted.map(|r| Op::Delete(0, r)));
    // One acknowledged transaction each, in a seeded order.
    let order = rng.shuffled((0..w.len() as i64).collect());
    let w = order.iter().map(|&i| vec![w[i as usize].clone()]).collect();

    let mut n: Vec<Op> = n_deleted.iter().map(|&r| Op::Delete(0, r)).collect();
    n.extend(sessions[..6].iter().map(|&r| Op::Delete(1, r)));
    n.extend(n_done.iter().map(|&r| state(r, "done")));
    n.extend((0..20).map(|i| job("sn0".into(), format!("job n{i}"))));
    n.extend((0..2).map(|i| Op::Insert(1, vec![text(format!("sn{i}")), text("session n")])));
    plan(tables, history, w, batches(n, 50))
}

/// T2: 3,000 events; W appends 60 (12 transactions of 5) and edits 6 recent ones; N deletes the
/// 1,000 oldest (rows W never touched; secure_delete off), appends 20..40 and checkpoints.
fn retention(rng: &mut Rng) -> Plan {
    const ROWS: i64 = 3000;
    let mut w: Vec<Op> = (0..60).map(|i| note(format!("w{i}"), 80)).collect();
    let recent = rng.shuffled((2500..ROWS).collect());
    w.extend(
        recent[..6]
            .iter()
            .map(|&r| edit(r, format!("edited by w {r}"))),
    );
    let mut n: Vec<Op> = (1..=1000).map(|r| Op::Delete(0, r)).collect();
    n.extend((0..rng.between(20, 40)).map(|i| note(format!("n{i}"), 80)));
    plan(
        vec![notes("notes", NOTES)],
        notes_history(ROWS, 80),
        batches(w, 5),
        batches(n, 100),
    )
}

/// T3: 1,200 notes; W appends 96 short ones (24 transactions of 4). N marks 30..90 % of the history done,
/// then deletes them (leaf merges, freed pages), appends 40 (reusing freed pages) and
/// checkpoints.
fn merges_and_frees(rng: &mut Rng) -> Plan {
    const ROWS: i64 = 1200;
    // Short rows: W's appends land on the history's last leaf, and its WAL carries no
    // interior page that could still reach that leaf once N has merged it away.
    let w: Vec<Op> = (0..96).map(|i| note(format!("w{i}"), 4)).collect();
    let share = rng.between(30, 90) as usize;
    let picked = rng.shuffled((1..ROWS).collect());
    let done = &picked[..(ROWS as usize - 1) * share / 100];
    let mut n: Vec<Op> = done.iter().map(|&r| edit(r, "done".into())).collect();
    n.extend(done.iter().map(|&r| Op::Delete(0, r)));
    n.extend((0..40).map(|i| note(format!("n{i}"), 100)));
    plan(
        vec![notes("notes", NOTES)],
        notes_history(ROWS, 100),
        batches(w, 4),
        batches(n, 50),
    )
}

/// T4: a ledger of 400 credits over 8 accounts. W appends 40 credits; N, which never saw them,
/// appends 40 of which the first 20 equal W's first 20 (same account, amount and memo, hence
/// the same rowid too).
fn ledger(rng: &mut Rng) -> Plan {
    let table = Table {
        name: "credits",
        create: "CREATE TABLE credits (id INTEGER PRIMARY KEY, account TEXT, amount INTEGER, \
                 memo TEXT)",
        cols: &["account", "amount", "memo"],
    };
    let credit = |rng: &mut Rng| {
        Op::Insert(
            0,
            vec![
                text(format!("a{}", rng.between(0, 7))),
                Value::Integer(rng.between(1, 100) as i64),
                text("credit"),
            ],
        )
    };
    let history: Vec<Op> = (0..400).map(|_| credit(rng)).collect();
    let w: Vec<Op> = (0..40).map(|_| credit(rng)).collect();
    let mut n: Vec<Op> = w[..20].to_vec();
    n.extend((0..20).map(|_| credit(rng)));
    let mut p = plan(vec![table], history, batches(w, 1), batches(n, 1));
    p.balances = Some((0, 0, 1));
    p
}

/// T5: 300 notes; W appends 20, edits 10 and deletes 5; N, through a hard link, deletes 11,
/// edits 11 and appends 11 (33 changes), none of W's rows.
fn hard_link(rng: &mut Rng, link: Link) -> Plan {
    const ROWS: i64 = 300;
    let rows = rng.shuffled((1..ROWS).collect());
    let mut w: Vec<Op> = (0..20).map(|i| note(format!("w{i}"), 60)).collect();
    w.extend(
        rows[..10]
            .iter()
            .map(|&r| edit(r, format!("edited by w {r}"))),
    );
    w.extend(rows[10..15].iter().map(|&r| Op::Delete(0, r)));
    let mut n: Vec<Op> = rows[15..26].iter().map(|&r| Op::Delete(0, r)).collect();
    n.extend(
        rows[26..37]
            .iter()
            .map(|&r| edit(r, format!("edited by n {r}"))),
    );
    n.extend((0..11).map(|i| note(format!("n{i}"), 60)));
    let mut p = plan(
        vec![notes("notes", NOTES)],
        notes_history(ROWS, 60),
        batches(w, 1),
        batches(n, 3),
    );
    p.link = link;
    p
}

/// T6: 1,500 notes; W deletes a run of 300 (emptying and freeing leaves) and appends 10; N
/// deletes 50 and edits 20 other rows, appends 20.
fn own_frees(rng: &mut Rng) -> Plan {
    const ROWS: i64 = 1500;
    let start = rng.between(100, 1000) as i64;
    let run = start..start + 300;
    let mut w: Vec<Op> = run.clone().map(|r| Op::Delete(0, r)).collect();
    w.extend((0..10).map(|i| note(format!("w{i}"), 100)));
    let others = rng.shuffled((1..ROWS).filter(|r| !run.contains(r)).collect());
    let mut n: Vec<Op> = others[..50].iter().map(|&r| Op::Delete(0, r)).collect();
    n.extend(
        others[50..70]
            .iter()
            .map(|&r| edit(r, format!("edited by n {r}"))),
    );
    n.extend((0..20).map(|i| note(format!("n{i}"), 100)));
    plan(
        vec![notes("notes", NOTES)],
        notes_history(ROWS, 100),
        batches(w, 50),
        batches(n, 10),
    )
}

/// T7: 600 notes; W commits 30 appends and 5 edits, a reader takes its snapshot, W commits 30
/// more appends, 5 other edits and 5 deletes, and W's PASSIVE checkpoint, held at the reader's
/// mark, copies the pages whose every frame is in the first part (not the others: SQLite skips
/// a page whose latest frame is past the mark). N deletes 18, edits 8 and appends 10, none of
/// them rows W changed.
fn partial_backfill(rng: &mut Rng) -> Plan {
    const ROWS: i64 = 600;
    let rows = rng.shuffled((1..ROWS).collect());
    let mut a: Vec<Op> = (0..30).map(|i| note(format!("a{i}"), 80)).collect();
    a.extend(
        rows[..5]
            .iter()
            .map(|&r| edit(r, format!("edited by w before {r}"))),
    );
    let mut w: Vec<Op> = (0..30).map(|i| note(format!("w{i}"), 80)).collect();
    w.extend(
        rows[5..10]
            .iter()
            .map(|&r| edit(r, format!("edited by w after {r}"))),
    );
    w.extend(rows[10..15].iter().map(|&r| Op::Delete(0, r)));
    // N's rows: none of W's. Which of the backfilled part's edits reached N's start depends on
    // the pages the checkpoint copied (SQLite copies a page only when its latest frame is
    // backfilled: a page W wrote again after the reader's mark keeps its older copy), so an N
    // edit of one of them would be a real conflict (undecided) only on some seeds.
    let mut n: Vec<Op> = rows[15..33].iter().map(|&r| Op::Delete(0, r)).collect();
    n.extend(
        rows[33..41]
            .iter()
            .map(|&r| edit(r, format!("edited by n {r}"))),
    );
    n.extend((0..10).map(|i| note(format!("n{i}"), 80)));
    let mut p = plan(
        vec![notes("notes", NOTES)],
        notes_history(ROWS, 80),
        batches(w, 5),
        batches(n, 10),
    );
    p.backfilled = batches(a, 5);
    p
}

/// T8: 512-byte pages, 5,200 notes (about 4 a leaf). W edits every even rowid (so every leaf,
/// more pages than the guard keeps the base of: 1,024) and appends 20; N deletes 40, edits 40
/// odd rowids and appends 20.
fn over_the_cap(rng: &mut Rng) -> Plan {
    const ROWS: i64 = 5200;
    let mut w: Vec<Op> = (1..ROWS)
        .filter(|r| r % 2 == 0)
        .map(|r| edit(r, format!("w{r:0>99}")))
        .collect();
    w.extend((0..20).map(|i| note(format!("w{i}"), 100)));
    let odd = rng.shuffled((1..ROWS).filter(|r| r % 2 == 1).collect());
    let mut n: Vec<Op> = odd[..40].iter().map(|&r| Op::Delete(0, r)).collect();
    n.extend(
        odd[40..80]
            .iter()
            .map(|&r| edit(r, format!("edited by n {r}"))),
    );
    n.extend((0..20).map(|i| note(format!("n{i}"), 100)));
    let mut p = plan(
        vec![notes("notes", NOTES)],
        notes_history(ROWS, 100),
        batches(w, 500),
        batches(n, 20),
    );
    p.page_size = 512;
    p.over_cap = true;
    p
}
