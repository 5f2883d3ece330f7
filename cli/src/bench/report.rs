//! What `hermes-guard bench` prints: the header (the machine), the figures, and the table of
//! median ratios against their targets.

use std::path::Path;

use super::ids::{Id, Sizes, Target};
use super::loss::{LossRow, ROWS, WITHIN};
use super::stats;

/// One round of one row: the baseline's and the guard's figure, and the ratio the target is
/// about.
#[derive(Debug, Clone, Copy)]
pub(super) struct Round {
    pub(super) baseline: f64,
    pub(super) guard: f64,
    /// By the wall clock: what a user waits.
    pub(super) ratio: f64,
    /// By CPU time (the same ratio, from the CPU time of the threads doing the work): blind to
    /// waiting for the CPU, which on a shared machine is most of the noise, and to waiting for
    /// the disk, which dilutes the guard's cost; so it is the stricter, steadier figure.
    pub(super) cpu_ratio: f64,
}

pub(super) struct Row {
    pub(super) id: Id,
    pub(super) rounds: Vec<Round>,
}

/// A figure with thousands separators above 1,000, three significant digits below.
pub(super) fn number(x: f64) -> String {
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

pub(super) fn ratio_text(id: Id, x: f64) -> String {
    match id {
        Id::CapTime | Id::RecTime => format!("{x:.3}x"),
        Id::CapMem | Id::RecMem => format!("{x:.2} MiB"),
        _ => format!("{x:.3}"),
    }
}

pub(super) fn target_text(id: Id) -> String {
    match (id, id.target()) {
        (Id::CapTime | Id::RecTime, Target::AtMost(t)) => format!("<= {t:.2}x"),
        (Id::CapMem | Id::RecMem, Target::AtMost(t)) => format!("<= {t:.0} MiB"),
        (_, Target::AtLeast(t)) => format!(">= {t:.2}"),
        (_, Target::AtMost(t)) => format!("<= {t:.2}"),
    }
}

pub(super) fn verdict(id: Id, median: f64) -> &'static str {
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

pub(super) fn print_table(rows: &[Row], sizes: &Sizes) {
    let mut table = crate::table::new(
        &[
            "id",
            "workload",
            "unit",
            "baseline",
            "guard",
            "ratio",
            "IQR",
            "min-max",
            "cpu ratio",
            "target",
            "result",
        ],
        &[3, 4, 5, 6, 7, 8, 9],
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
        table.add_row(vec![
            row.id.code().to_owned(),
            row.id.title(sizes),
            row.id.unit().to_owned(),
            baseline.map_or("-".into(), |s| number(s.median)),
            guard.map_or("-".into(), |s| number(s.median)),
            ratio_text(row.id, ratio.median),
            format!("{}-{}", short(ratio.q1), short(ratio.q3)),
            format!("{}-{}", short(ratio.min), short(ratio.max)),
            cpu.map_or("-".into(), |c| format!("{:.3}", c.median)),
            target_text(row.id),
            verdict(row.id, ratio.median).to_owned(),
        ]);
    }
    println!();
    println!("{}", crate::table::render(&table));
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

/// L1's table: per `synchronous` setting, the runs, B's rows per run, the time from the loss to
/// its last row, the runs within the bound, the runs whose old connection was refused.
pub(super) fn print_loss_table(rows: &[LossRow], sizes: &Sizes) {
    let mut table = crate::table::new(
        &[
            "id",
            "workload",
            "synchronous",
            "runs",
            "rows/run",
            "median ms",
            "max ms",
            "within",
            "old refused",
            "target",
            "result",
        ],
        &[3, 4, 5, 6, 7, 8],
    );
    let bound_ms = WITHIN.as_millis();
    for row in rows {
        let n = row.runs.len();
        let ms: Vec<f64> = row
            .runs
            .iter()
            .map(|r| r.elapsed.as_secs_f64() * 1e3)
            .collect();
        let Some(time) = stats::summarize(&ms) else {
            continue;
        };
        let rows_per_run: Vec<u64> = row
            .runs
            .iter()
            .map(|r| r.committed.min(u64::try_from(r.visible).unwrap_or(0)))
            .collect();
        let (least, most) = (
            rows_per_run.iter().min().copied().unwrap_or(0),
            rows_per_run.iter().max().copied().unwrap_or(0),
        );
        let committed = if least == most {
            format!("{least}/{ROWS}")
        } else {
            format!("{least}-{most}/{ROWS}")
        };
        let mut modes: Vec<i64> = row.runs.iter().map(|r| r.synchronous).collect();
        modes.sort_unstable();
        modes.dedup();
        let synchronous = modes
            .iter()
            .map(|&m| synchronous_name(m))
            .collect::<Vec<_>>()
            .join(",");
        let synchronous = match row.id {
            Id::L1Default => format!("{synchronous} (default)"),
            _ => synchronous,
        };
        let within = row.runs.iter().filter(|r| r.in_time()).count();
        let refused = row.runs.iter().filter(|r| r.old_refused).count();
        table.add_row(vec![
            row.id.code().to_owned(),
            row.id.title(sizes),
            synchronous,
            n.to_string(),
            committed,
            format!("{:.2}", time.median),
            format!("{:.2}", time.max),
            format!("{within}/{n}"),
            format!("{refused}/{n}"),
            format!("{ROWS}/{ROWS} <= {bound_ms} ms, {n}/{n} runs"),
            if row.pass() { "PASS" } else { "MISS" }.to_owned(),
        ]);
    }
    println!();
    println!("{}", crate::table::render(&table));
    println!(
        "\nL1: in one process a guarded connection A commits {} rows into its WAL\n\
         (wal_autocheckpoint=0) and stays open, idle; the database's -wal and -shm are unlinked;\n\
         from the unlink, a new guarded connection B opens (journal_mode=WAL already on the file,\n\
         busy_timeout 0: no retry, not even SQLite's) and inserts {ROWS} rows, one transaction each.\n\
         rows/run: B's rows committed on their only attempt (and read back), min-max over the runs.\n\
         median/max ms: wall clock from the unlink to B's last commit, B's open included.\n\
         within: runs whose {ROWS} rows all committed within {bound_ms} ms. old refused: runs where A's\n\
         write afterwards was refused (SQLITE_READONLY_DBMOVED, A's generation captured).\n\
         result: PASS when every run is within and its old connection refused.",
        super::loss::LOST_ROWS
    );
}

fn synchronous_name(mode: i64) -> String {
    match mode {
        0 => "OFF".into(),
        1 => "NORMAL".into(),
        2 => "FULL".into(),
        3 => "EXTRA".into(),
        other => other.to_string(),
    }
}

/// `rounds`: the ratio rows' rounds and warm-up rounds, when any runs; `losses`: L1's runs per
/// row, when it runs.
pub(super) fn print_header(
    dir: &Path,
    rounds: Option<(usize, usize)>,
    losses: Option<usize>,
    smoke: bool,
) {
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
    if let Some((rounds, warmup)) = rounds {
        println!("  {rounds} rounds, {warmup} warm-up");
    }
    if let Some(losses) = losses {
        println!("  L1: {losses} losses per row, each in a new directory");
    }
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
