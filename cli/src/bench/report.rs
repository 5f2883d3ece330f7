//! What `hermes-guard bench` prints: the header (the machine), the figures, and the table of
//! median ratios against their targets.

use std::path::Path;

use super::ids::{Id, Sizes, Target};
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

pub(super) fn print_header(dir: &Path, rounds: usize, warmup: usize, smoke: bool) {
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
