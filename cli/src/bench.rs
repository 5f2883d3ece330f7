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
mod cost_workloads;
mod ids;
mod loss;
mod mp;
mod recovery;
mod report;
mod st;
mod stats;

use std::path::{Path, PathBuf};
use std::time::Instant;

/// `bench --help`'s exit codes.
pub const BENCH_EXIT_CODES: &str = "\
Exit codes:
  0  every workload ran and its ratios were printed
  1  a workload could not run (the message says which and why)
  2  a usage error";

use hermes_guard_cli::workloads::{
    self, BenchError, CheckpointMode, Session, Synchronous, Timed, Vfs,
};
use ids::{selected, Chunks, Id, Sizes, MIB};
use report::{number, print_header, print_loss_table, print_table, ratio_text, Round, Row};

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
    /// Run only these workloads: comma-separated IDs or ID prefixes (W1, W1-FULL, R, CK, CAP,
    /// L1...).
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
    /// on the rowids the captured rows have.
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
    /// The other databases O2 holds open (a smoke run's parent asks for fewer than 1,000).
    #[arg(long)]
    others: Option<u64>,
}

pub fn child(args: ChildArgs) -> Result<()> {
    match args.role {
        ChildRole::MpWriter => mp::writer_child(&args.db, args.vfs)?,
        ChildRole::Capture => capture::child(&args.db)?,
        ChildRole::Recovery => recovery::child(&args.db)?,
        ChildRole::Cost => {
            let workload = args.workload.ok_or("--role cost needs --workload")?;
            cost::child(workload, args.vfs, &args.db, args.ops, args.others)?
        }
    }
    Ok(())
}

pub fn run(args: BenchArgs) -> Result<()> {
    let cost_workloads = if args.cost {
        Some(cost::selected(&args.only).ok_or_else(|| {
            format!(
                "--only {}: bench --cost measures W1, R1, W2, O1 and O2 only",
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

    let losses = ids.iter().any(|id| id.is_loss()).then_some(sizes.loss_runs);
    let rounds_shown = ids
        .iter()
        .any(|id| !id.is_loss())
        .then_some((rounds, warmup));
    print_header(dir, rounds_shown, losses, args.smoke);
    let started = Instant::now();
    let mut bench = Bench {
        rounds,
        warmup,
        cold_cache: args.cold_cache,
        rows: Vec::new(),
        losses: Vec::new(),
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
            Id::O1 => bench.paired(id, sizes.o1, 1.0, |vfs| workloads::Churn::open(vfs, dir, 0))?,
            Id::CapTime => bench.capture(&exe, dir, &sizes)?,
            Id::CapMem | Id::RecMem => {} // measured with CapTime, RecTime
            Id::RecTime => bench.recovery(&exe, dir, &sizes)?,
            Id::L1Default | Id::L1Normal => bench.losses.push(loss::measure(id, dir, &sizes)?),
        }
    }
    if !bench.rows.is_empty() {
        print_table(&bench.rows, &sizes);
    }
    if !bench.losses.is_empty() {
        print_loss_table(&bench.losses, &sizes);
    }
    let mut done = Vec::new();
    if !bench.rows.is_empty() {
        done.push(format!("{rounds} rounds per workload (+{warmup} warm-up)"));
    }
    if !bench.losses.is_empty() {
        done.push(format!("{} losses per L1 row", sizes.loss_runs));
    }
    println!(
        "\n{}, {:.0} s in all.",
        done.join(", "),
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
    /// L1's rows: counts and times of runs, not ratios.
    losses: Vec<loss::LossRow>,
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
        self.push_time_and_memory((Id::CapTime, time), (Id::CapMem, memory));
        Ok(())
    }

    /// A time row and its memory row, measured in the same rounds.
    fn push_time_and_memory(&mut self, time: (Id, Vec<Round>), memory: (Id, Vec<Round>)) {
        for (id, rounds) in [time, memory] {
            self.rows.push(Row { id, rounds });
        }
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
