//! Benchmarks: hermes-guard against the stock unix VFS, interleaved, reported as ratios.
//!
//! The machines this runs on are shared and noisy, so absolute times mean little. Each workload
//! is measured in rounds; a round holds the workload open through both VFSes at once and
//! alternates between them in small chunks (stock-guard, then guard-stock, so neither always
//! runs second), and the round's ratio compares the two. The capture, a single long operation,
//! alternates with its floor round by round. The table reports the median ratio over the rounds
//! and its spread, by the wall clock and by CPU time, against the targets published in
//! docs/benchmarks.md.

mod capture;
mod cost;
mod mp;
mod recovery;
mod st;
mod stats;
mod workloads;

use std::path::{Path, PathBuf};
use std::time::Instant;

use workloads::{BenchError, CheckpointMode, Session, Synchronous, Timed, Vfs};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Arguments of `hermes-guard bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds per workload; each round measures stock and guard once [default: 7,
    /// or 2 with --smoke].
    #[arg(long)]
    rounds: Option<usize>,
    /// Rounds run first and thrown away (caches, file-system metadata, CPU frequency)
    /// [default: 1, or 0 with --smoke].
    #[arg(long)]
    warmup: Option<usize>,
    /// Run only these workloads: comma-separated IDs or ID prefixes (W1, W1-FULL, R, CK, CAP...).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Every workload tiny, seconds in all: proves the code runs; the numbers mean nothing.
    #[arg(long)]
    smoke: bool,
    /// Where the databases go [default: a new temporary directory under $TMPDIR].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// WAL size of the checkpoint workloads, MiB [default: 64].
    #[arg(long)]
    checkpoint_wal_mib: Option<u64>,
    /// WAL size of the capture workload, MiB [default: 256]; the main image is a quarter of it.
    #[arg(long)]
    capture_wal_mib: Option<u64>,
    /// Instead of the wall clock: syscalls (`strace -c -f`) and user-space instructions
    /// (`valgrind --tool=callgrind`) per operation of W1, R1 and W2 through both VFSes, each the
    /// difference between two run lengths of a child process. Needs strace and valgrind.
    #[arg(long)]
    cost: bool,
    /// CAP-TIME from the disk: drop the page cache (`/proc/sys/vm/drop_caches`, needs root)
    /// before each side of each round, so that the capture and the floor both read their bytes
    /// from the device instead of from memory.
    #[arg(long)]
    cold_cache: bool,
    /// Rows of the recovery workload's capture [default: 300000, or 2000 with --smoke].
    #[arg(long)]
    recovery_rows: Option<u64>,
    /// Rows the newer generation writes into the recovery workload's table before each side,
    /// on the rowids the captured rows have [default: 0].
    #[arg(long, default_value_t = 0)]
    recovery_newer_rows: u64,
}

/// Which benchmark child this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChildRole {
    /// One of the two MP writers.
    MpWriter,
    /// The process that captures, alone, so its memory high-water mark is the capture's.
    Capture,
    /// A run of a cost workload, under strace or callgrind.
    Cost,
    /// The process that recovers (`--db` is the capture), alone, for its memory high-water mark.
    Recovery,
}

/// Arguments of the benchmark child process.
#[derive(clap::Args)]
pub struct ChildArgs {
    /// What this child does.
    #[arg(long, value_enum)]
    role: ChildRole,
    /// The database.
    #[arg(long)]
    db: PathBuf,
    /// The VFS to open it through.
    #[arg(long, value_enum, default_value = "guard")]
    vfs: Vfs,
    /// The cost workload (role `cost`); `--db` is then the directory its database goes in, or
    /// R1's database.
    #[arg(long, value_enum)]
    workload: Option<cost::CostWorkload>,
    /// Operations of the cost workload.
    #[arg(long, default_value_t = 0)]
    ops: u64,
}

pub fn child(args: ChildArgs) -> Result<()> {
    match args.role {
        ChildRole::MpWriter => mp::writer_child(&args.db, args.vfs)?,
        ChildRole::Capture => capture::child(&args.db)?,
        ChildRole::Recovery => recovery::child(&args.db)?,
        ChildRole::Cost => {
            let workload = args.workload.ok_or("--role cost needs --workload")?;
            cost::child(workload, args.vfs, &args.db, args.ops)?
        }
    }
    Ok(())
}

/// How much of a workload one round runs through each VFS: `chunks` alternations of `ops`
/// operations.
#[derive(Clone, Copy)]
struct Chunks {
    chunks: u64,
    ops: u64,
}

/// Workload sizes.
struct Sizes {
    w1_normal: Chunks,
    w1_full: Chunks,
    w2: Chunks,
    w2_rows: u64,
    read_rows: u64,
    r1: Chunks,
    r2: Chunks,
    st: Chunks,
    ck: Chunks,
    ck_wal_bytes: u64,
    mp: Chunks,
    cap_wal_bytes: u64,
    cap_main_bytes: u64,
    rec_rows: u64,
    rec_newer_rows: u64,
}

const MIB: u64 = 1 << 20;

impl Sizes {
    fn new(args: &BenchArgs) -> Sizes {
        let c = |chunks, ops| Chunks { chunks, ops };
        let mut s = if args.smoke {
            Sizes {
                w1_normal: c(2, 10),
                w1_full: c(2, 2),
                w2: c(2, 1),
                w2_rows: 1000,
                read_rows: 2000,
                r1: c(2, 200),
                r2: c(2, 1),
                st: c(2, 2),
                ck: c(1, 1),
                ck_wal_bytes: MIB / 4,
                mp: c(2, 10),
                cap_wal_bytes: MIB,
                cap_main_bytes: MIB / 4,
                rec_rows: 2000,
                rec_newer_rows: args.recovery_newer_rows,
            }
        } else {
            Sizes {
                w1_normal: c(40, 100),
                w1_full: c(30, 10),
                w2: c(20, 2),
                w2_rows: 1000,
                read_rows: 200_000,
                r1: c(40, 5000),
                r2: c(10, 1),
                st: c(30, 10),
                ck: c(2, 1),
                ck_wal_bytes: 64 * MIB,
                mp: c(6, 2000),
                cap_wal_bytes: 256 * MIB,
                cap_main_bytes: 64 * MIB,
                rec_rows: 300_000,
                rec_newer_rows: args.recovery_newer_rows,
            }
        };
        if let Some(mib) = args.checkpoint_wal_mib {
            s.ck_wal_bytes = mib * MIB;
        }
        if let Some(rows) = args.recovery_rows {
            s.rec_rows = rows;
        }
        if let Some(mib) = args.capture_wal_mib {
            s.cap_wal_bytes = mib * MIB;
            s.cap_main_bytes = mib * MIB / 4;
        }
        s
    }
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Id {
    W1Normal,
    W1Full,
    W2,
    R1,
    R2,
    CkPassive,
    CkTruncate,
    St,
    Mp,
    CapTime,
    CapMem,
    RecTime,
    RecMem,
}

const ALL: [Id; 13] = [
    Id::W1Normal,
    Id::W1Full,
    Id::W2,
    Id::R1,
    Id::R2,
    Id::CkPassive,
    Id::CkTruncate,
    Id::St,
    Id::Mp,
    Id::CapTime,
    Id::CapMem,
    Id::RecTime,
    Id::RecMem,
];

/// The bound a row's median ratio is held to.
#[derive(Debug, Clone, Copy)]
enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Id {
    fn code(self) -> &'static str {
        match self {
            Id::W1Normal => "W1-NORMAL",
            Id::W1Full => "W1-FULL",
            Id::W2 => "W2",
            Id::R1 => "R1",
            Id::R2 => "R2",
            Id::CkPassive => "CK-PASSIVE",
            Id::CkTruncate => "CK-TRUNCATE",
            Id::St => "ST",
            Id::Mp => "MP",
            Id::CapTime => "CAP-TIME",
            Id::CapMem => "CAP-MEM",
            Id::RecTime => "MERGE-TIME",
            Id::RecMem => "MERGE-MEM",
        }
    }

    fn title(self, sizes: &Sizes) -> String {
        match self {
            Id::W1Normal => "1-row INSERT per txn, synchronous=NORMAL".into(),
            Id::W1Full => "1-row INSERT per txn, synchronous=FULL".into(),
            Id::W2 => format!("{}-row transactions, synchronous=NORMAL", sizes.w2_rows),
            Id::R1 => "point SELECT by primary key".into(),
            Id::R2 => "full table scan".into(),
            Id::CkPassive => format!("PASSIVE checkpoint of {}", mib(sizes.ck_wal_bytes)),
            Id::CkTruncate => format!("TRUNCATE checkpoint of {}", mib(sizes.ck_wal_bytes)),
            Id::St => "SessionDb::append_message (store defaults)".into(),
            Id::Mp => "2 processes, 1-row txns, same db".into(),
            Id::CapTime => format!(
                "capture {} WAL + {} main vs copy+sha256",
                mib(sizes.cap_wal_bytes),
                mib(sizes.cap_main_bytes)
            ),
            Id::CapMem => format!(
                "capture peak extra memory ({} WAL)",
                mib(sizes.cap_wal_bytes)
            ),
            Id::RecTime if sizes.rec_newer_rows > 0 => format!(
                "recover {} rows ({} newer) vs INSERT … SELECT",
                sizes.rec_rows, sizes.rec_newer_rows
            ),
            Id::RecTime => format!("recover {} rows vs INSERT … SELECT", sizes.rec_rows),
            Id::RecMem => format!("recovery peak extra memory ({} rows)", sizes.rec_rows),
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Id::W1Normal | Id::W1Full | Id::Mp => "txn/s",
            Id::St => "msg/s",
            Id::W2 | Id::R2 | Id::RecTime => "rows/s",
            Id::R1 => "query/s",
            Id::CkPassive | Id::CkTruncate | Id::CapTime => "MiB/s",
            Id::CapMem | Id::RecMem => "MiB",
        }
    }

    fn target(self) -> Target {
        match self {
            Id::W1Normal | Id::W1Full | Id::St | Id::Mp => Target::AtLeast(0.97),
            Id::W2 | Id::R1 | Id::R2 => Target::AtLeast(0.99),
            Id::CkPassive | Id::CkTruncate => Target::AtLeast(0.98),
            Id::CapTime => Target::AtMost(1.25),
            Id::CapMem => Target::AtMost(8.0),
            Id::RecTime => Target::AtMost(1.3),
            Id::RecMem => Target::AtMost(32.0),
        }
    }
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / 1024)
    }
}

/// One round of one row: the baseline's and the guard's figure, and the ratio the target is
/// about.
#[derive(Debug, Clone, Copy)]
struct Round {
    baseline: f64,
    guard: f64,
    /// By the wall clock: what a user waits.
    ratio: f64,
    /// By CPU time (the same ratio, from the CPU time of the threads doing the work): blind to
    /// waiting for the CPU, which on a shared machine is most of the noise, and to waiting for
    /// the disk, which dilutes the guard's cost; so it is the stricter, steadier figure.
    cpu_ratio: f64,
}

struct Row {
    id: Id,
    rounds: Vec<Round>,
}

fn selected(only: &[String]) -> Result<Vec<Id>> {
    if only.is_empty() {
        return Ok(ALL.to_vec());
    }
    let mut chosen = Vec::new();
    for token in only {
        let token = token.trim().to_ascii_uppercase();
        let matches: Vec<Id> = ALL
            .iter()
            .copied()
            .filter(|id| id.code().starts_with(&token))
            .collect();
        if matches.is_empty() {
            let known: Vec<&str> = ALL.iter().map(|id| id.code()).collect();
            return Err(format!(
                "--only {token}: no such workload; the workloads are {}",
                known.join(", ")
            )
            .into());
        }
        for id in matches {
            if !chosen.contains(&id) {
                chosen.push(id);
            }
        }
    }
    // The two capture rows come from the same child runs.
    if chosen.contains(&Id::CapTime) != chosen.contains(&Id::CapMem) {
        chosen.retain(|id| !matches!(id, Id::CapTime | Id::CapMem));
        chosen.extend([Id::CapTime, Id::CapMem]);
    }
    if chosen.contains(&Id::RecTime) != chosen.contains(&Id::RecMem) {
        chosen.retain(|id| !matches!(id, Id::RecTime | Id::RecMem));
        chosen.extend([Id::RecTime, Id::RecMem]);
    }
    Ok(ALL
        .iter()
        .copied()
        .filter(|id| chosen.contains(id))
        .collect())
}

pub fn run(args: BenchArgs) -> Result<()> {
    let cost_workloads = if args.cost {
        Some(cost::selected(&args.only).ok_or_else(|| {
            format!(
                "--only {}: bench --cost measures W1, R1 and W2 only",
                args.only.join(",")
            )
        })?)
    } else {
        None
    };
    let ids = if args.cost {
        Vec::new()
    } else {
        selected(&args.only)?
    };
    let sizes = Sizes::new(&args);
    let rounds = args.rounds.unwrap_or(if args.smoke { 2 } else { 7 }).max(1);
    let warmup = args.warmup.unwrap_or(if args.smoke { 0 } else { 1 });
    let temp = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            tempfile::Builder::new()
                .prefix("hermes-guard-bench-")
                .tempdir_in(dir)?
        }
        None => tempfile::Builder::new()
            .prefix("hermes-guard-bench-")
            .tempdir()?,
    };
    let dir = temp.path();
    let exe = std::env::current_exe()?;
    if let Some(workloads) = cost_workloads {
        return cost::run(&exe, dir, &workloads, args.smoke);
    }

    print_header(dir, rounds, warmup, args.smoke);
    let started = Instant::now();
    let mut bench = Bench {
        rounds,
        warmup,
        cold_cache: args.cold_cache,
        rows: Vec::new(),
    };
    let read_db = if ids.iter().any(|id| matches!(id, Id::R1 | Id::R2)) {
        Some(workloads::build_read_db(dir, sizes.read_rows)?)
    } else {
        None
    };
    for &id in &ids {
        match id {
            Id::W1Normal => bench.paired(id, sizes.w1_normal, 1.0, |vfs| {
                workloads::Inserts::open(vfs, dir, Synchronous::Normal, 1)
            })?,
            Id::W1Full => bench.paired(id, sizes.w1_full, 1.0, |vfs| {
                workloads::Inserts::open(vfs, dir, Synchronous::Full, 1)
            })?,
            Id::W2 => bench.paired(id, sizes.w2, sizes.w2_rows as f64, |vfs| {
                workloads::Inserts::open(vfs, dir, Synchronous::Normal, sizes.w2_rows)
            })?,
            Id::R1 => {
                let db = read_db.as_deref().expect("built above");
                bench.paired(id, sizes.r1, 1.0, |vfs| {
                    workloads::Reads::open(vfs, db, sizes.read_rows, false)
                })?
            }
            Id::R2 => {
                let db = read_db.as_deref().expect("built above");
                bench.paired(id, sizes.r2, 1.0, |vfs| {
                    workloads::Reads::open(vfs, db, sizes.read_rows, true)
                })?
            }
            Id::CkPassive => bench.paired(id, sizes.ck, 1.0 / MIB as f64, |vfs| {
                workloads::Checkpoints::open(vfs, dir, CheckpointMode::Passive, sizes.ck_wal_bytes)
            })?,
            Id::CkTruncate => bench.paired(id, sizes.ck, 1.0 / MIB as f64, |vfs| {
                workloads::Checkpoints::open(vfs, dir, CheckpointMode::Truncate, sizes.ck_wal_bytes)
            })?,
            Id::St => bench.paired(id, sizes.st, 1.0, |vfs| st::open(vfs, dir))?,
            Id::Mp => bench.paired(id, sizes.mp, 1.0, |vfs| mp::Writers::open(&exe, dir, vfs))?,
            Id::CapTime => bench.capture(&exe, dir, &sizes)?,
            Id::CapMem | Id::RecMem => {} // measured with CapTime, RecTime
            Id::RecTime => bench.recovery(&exe, dir, &sizes)?,
        }
    }
    print_table(&bench.rows, &sizes);
    println!(
        "\n{} rounds per workload (+{} warm-up), {:.0} s in all.",
        rounds,
        warmup,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes back every dirty page under `dir`'s file system, then has the kernel drop its clean
/// page cache (and dentries and inodes): the next reads come from the device.
fn drop_page_cache(dir: &Path) -> Result<()> {
    workloads::settle(dir)?;
    const KNOB: &str = "/proc/sys/vm/drop_caches";
    std::fs::write(KNOB, "3\n").map_err(|e| {
        format!(
            "bench --cold-cache: cannot write {KNOB} ({e}); it needs root (and a kernel that \
             lets this container drop its page cache)"
        )
    })?;
    Ok(())
}

struct Bench {
    rounds: usize,
    warmup: usize,
    /// CAP-TIME with the page cache dropped before each side (`--cold-cache`).
    cold_cache: bool,
    rows: Vec<Row>,
}

impl Bench {
    /// Rounds of a workload held open through both VFSes at once, alternating between them
    /// chunk by chunk (stock-guard, then guard-stock), so that both sides of a ratio see the
    /// same moments of a noisy machine. `scale` converts the sessions' operations into the row's
    /// unit.
    fn paired(
        &mut self,
        id: Id,
        size: Chunks,
        scale: f64,
        mut open: impl FnMut(Vfs) -> std::result::Result<Box<dyn Session>, BenchError>,
    ) -> Result<()> {
        let mut rounds = Vec::new();
        for n in 0..self.warmup + self.rounds {
            let mut stock = open(Vfs::Stock)?;
            let mut guard = open(Vfs::Guard)?;
            let (mut s, mut g) = (Timed::zero(), Timed::zero());
            for chunk in 0..size.chunks {
                stock.prepare()?;
                guard.prepare()?;
                if (n as u64 + chunk).is_multiple_of(2) {
                    s = s.plus(stock.run(size.ops)?);
                    g = g.plus(guard.run(size.ops)?);
                } else {
                    g = g.plus(guard.run(size.ops)?);
                    s = s.plus(stock.run(size.ops)?);
                }
            }
            stock.finish()?;
            guard.finish()?;
            let round = Round {
                baseline: s.rate() * scale,
                guard: g.rate() * scale,
                ratio: g.rate() / s.rate(),
                cpu_ratio: g.cpu_rate() / s.cpu_rate(),
            };
            self.progress(id, n, &round);
            if n >= self.warmup {
                rounds.push(round);
            }
        }
        self.rows.push(Row { id, rounds });
        Ok(())
    }

    /// The capture rows: the floor in this process, the capture in a child, alternating.
    fn capture(&mut self, exe: &Path, dir: &Path, sizes: &Sizes) -> Result<()> {
        let db = capture::build(dir, sizes.cap_main_bytes, sizes.cap_wal_bytes)?;
        let (mut time, mut memory) = (Vec::new(), Vec::new());
        for n in 0..self.warmup + self.rounds {
            // Both copies stay on disk until the round is over: removing one would have the
            // other measured against the file system's discards.
            let (mut floor, mut report) = (None, None);
            for floor_now in [n.is_multiple_of(2), !n.is_multiple_of(2)] {
                if self.cold_cache {
                    drop_page_cache(dir)?;
                }
                if floor_now {
                    floor = Some(capture::floor(dir, &db)?);
                } else {
                    report = Some(capture::measure(exe, dir, &db)?);
                }
            }
            let ((floor, floor_copy), report) = (floor.expect("ran"), report.expect("ran"));
            drop(floor_copy);
            std::fs::remove_dir_all(&report.artifact)
                .map_err(|e| format!("removing {}: {e}", report.artifact.display()))?;
            let capture_secs = report.elapsed_ns as f64 / 1e9;
            let floor_cpu = floor.cpu.map_or(f64::NAN, |c| c.as_secs_f64());
            let capture_cpu = report.cpu_ns.map_or(f64::NAN, |ns| ns as f64 / 1e9);
            let t = Round {
                baseline: floor.rate() / MIB as f64,
                guard: report.bytes as f64 / MIB as f64 / capture_secs,
                ratio: capture_secs / floor.elapsed.as_secs_f64(),
                cpu_ratio: capture_cpu / floor_cpu,
            };
            let extra = report.peak_kib.saturating_sub(report.baseline_kib) as f64 / 1024.0;
            let m = Round {
                baseline: f64::NAN,
                guard: extra,
                ratio: extra,
                cpu_ratio: f64::NAN,
            };
            if !report.hwm_reset {
                eprintln!(
                    "  (the capture child could not reset its RSS high-water mark; \
                     the extra memory is a lower bound)"
                );
            }
            self.progress(Id::CapTime, n, &t);
            self.progress(Id::CapMem, n, &m);
            if n >= self.warmup {
                time.push(t);
                memory.push(m);
            }
        }
        self.rows.push(Row {
            id: Id::CapTime,
            rounds: time,
        });
        self.rows.push(Row {
            id: Id::CapMem,
            rounds: memory,
        });
        Ok(())
    }

    fn progress(&self, id: Id, n: usize, r: &Round) {
        let which = if n < self.warmup {
            format!("warm-up {}/{}", n + 1, self.warmup)
        } else {
            format!("round {}/{}", n + 1 - self.warmup, self.rounds)
        };
        let cpu = if r.cpu_ratio.is_nan() {
            String::new()
        } else {
            format!("  cpu ratio {:.3}", r.cpu_ratio)
        };
        eprintln!(
            "{:<12} {which:<12} baseline {:>12} guard {:>12} {:<7}  ratio {}{cpu}",
            id.code(),
            number(r.baseline),
            number(r.guard),
            id.unit(),
            ratio_text(id, r.ratio)
        );
    }
}

/// A figure with thousands separators above 1,000, three significant digits below.
fn number(x: f64) -> String {
    if x.is_nan() {
        return "-".into();
    }
    if x.abs() >= 1000.0 {
        let digits = format!("{:.0}", x.abs());
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if x < 0.0 {
            out.insert(0, '-');
        }
        out
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn ratio_text(id: Id, x: f64) -> String {
    match id {
        Id::CapTime | Id::RecTime => format!("{x:.3}x"),
        Id::CapMem | Id::RecMem => format!("{x:.2} MiB"),
        _ => format!("{x:.3}"),
    }
}

fn target_text(id: Id) -> String {
    match (id, id.target()) {
        (Id::CapTime | Id::RecTime, Target::AtMost(t)) => format!("<= {t:.2}x"),
        (Id::CapMem | Id::RecMem, Target::AtMost(t)) => format!("<= {t:.0} MiB"),
        (_, Target::AtLeast(t)) => format!(">= {t:.2}"),
        (_, Target::AtMost(t)) => format!("<= {t:.2}"),
    }
}

fn verdict(id: Id, median: f64) -> &'static str {
    let pass = match id.target() {
        Target::AtLeast(t) => median >= t,
        Target::AtMost(t) => median <= t,
    };
    if pass {
        "PASS"
    } else {
        "MISS"
    }
}

fn print_table(rows: &[Row], sizes: &Sizes) {
    println!();
    println!(
        "{:<12} {:<46} {:<8} {:>12} {:>12} {:>11} {:>13} {:>13} {:>9} {:>10}  result",
        "id",
        "workload",
        "unit",
        "baseline",
        "guard",
        "ratio",
        "IQR",
        "min-max",
        "cpu ratio",
        "target"
    );
    for row in rows {
        let pick = |f: fn(&Round) -> f64| row.rounds.iter().map(f).collect::<Vec<_>>();
        let baseline = stats::summarize(&pick(|r| r.baseline));
        let guard = stats::summarize(&pick(|r| r.guard));
        let Some(ratio) = stats::summarize(&pick(|r| r.ratio)) else {
            continue;
        };
        let cpu = stats::summarize(&pick(|r| r.cpu_ratio));
        let short = |x: f64| match row.id {
            Id::CapMem | Id::RecMem => format!("{x:.2}"),
            _ => format!("{x:.3}"),
        };
        println!(
            "{:<12} {:<46} {:<8} {:>12} {:>12} {:>11} {:>13} {:>13} {:>9} {:>10}  {}",
            row.id.code(),
            row.id.title(sizes),
            row.id.unit(),
            baseline.map_or("-".into(), |s| number(s.median)),
            guard.map_or("-".into(), |s| number(s.median)),
            ratio_text(row.id, ratio.median),
            format!("{}-{}", short(ratio.q1), short(ratio.q3)),
            format!("{}-{}", short(ratio.min), short(ratio.max)),
            cpu.map_or("-".into(), |c| format!("{:.3}", c.median)),
            target_text(row.id),
            verdict(row.id, ratio.median)
        );
    }
    println!(
        "\nbaseline: the stock unix VFS, except for CAP-TIME (a plain copy of the same WAL and main file,\n\
         fsynced, then their sha256) and CAP-MEM (none).\n\
         ratio: guard/stock throughput, measured back to back in each round; the median over the\n\
         rounds, with its interquartile range and min-max (1.000 = no cost, 0.970 = 3% slower).\n\
         For CAP-TIME: capture time / floor time. For CAP-MEM: the capture child's resident-set\n\
         high-water mark above its level just before the capture, MiB. For MERGE-TIME: the time of\n\
         recover::apply from the opened capture / the time of INSERT … SELECT of the same rows\n\
         from the capture opened as a database; MERGE-MEM: the recovery child's high-water mark\n\
         (opening the capture, then the merge) above its level before, MiB.\n\
         cpu ratio: the same ratio from the CPU time of the threads doing the work (blind to waits\n\
         for a CPU or a disk: steadier on a shared machine, and stricter where I/O dominates).\n\
         result: the median wall-clock ratio against the target."
    );
}

fn print_header(dir: &Path, rounds: usize, warmup: usize, smoke: bool) {
    let machine = machine::describe(dir);
    println!("hermes-guard bench: hermes-guard vs the stock unix VFS, interleaved");
    println!(
        "  hermes-guard {}, SQLite {}, {} build",
        env!("CARGO_PKG_VERSION"),
        rusqlite::version(),
        if cfg!(debug_assertions) {
            "DEBUG (not representative: use --release)"
        } else {
            "release"
        }
    );
    println!("  cpu: {} x {}", machine.cpus, machine.cpu_model);
    println!("  kernel: {}", machine.kernel);
    println!("  databases in {} ({})", dir.display(), machine.filesystem);
    println!("  {rounds} rounds, {warmup} warm-up");
    if smoke {
        println!("  SMOKE RUN: tiny sizes, the numbers mean nothing");
    }
}

mod machine {
    use std::path::Path;

    pub struct Machine {
        pub cpus: usize,
        pub cpu_model: String,
        pub kernel: String,
        pub filesystem: String,
    }

    pub fn describe(dir: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, m)| m.trim())
            })
            .unwrap_or("unknown CPU")
            .to_owned();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!("Linux {}", s.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.to_owned());
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel,
            filesystem: filesystem_of(dir),
        }
    }

    /// The mount holding `dir`: the longest mount point that is a prefix of its real path.
    fn filesystem_of(dir: &Path) -> String {
        let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        mounts
            .lines()
            .filter_map(|line| {
                let mut f = line.split_whitespace();
                let (device, point, fstype) = (f.next()?, f.next()?, f.next()?);
                real.starts_with(point).then(|| {
                    (
                        point.len(),
                        format!("{fstype} on {device}, mounted at {point}"),
                    )
                })
            })
            .max_by_key(|(len, _)| *len)
            .map_or_else(|| "unknown file system".into(), |(_, s)| s)
    }
}
