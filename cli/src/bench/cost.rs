//! `hermes-guard bench --cost`: the guard's cost in counts that a noisy machine does not move.
//!
//! For each workload and each VFS, this binary runs itself as a child (`bench-child --role
//! cost`) that opens the workload (untimed setup) and runs N of its operations, once under
//! `strace -c -f` (syscalls) and once under `valgrind --tool=callgrind` (user-space instructions),
//! at two run lengths. The difference between the two runs, divided by the difference of their
//! lengths, is the cost of one operation: process start-up, opening and closing cancel.
//!
//! The workloads are the wall-clock bench's own sessions (`workloads.rs`), so the statements are
//! the same: W1 (one-row autocommit INSERT, WAL, synchronous=NORMAL), R1 (point SELECT by
//! primary key), W2 (1,000-row transactions), and O1/O2 (open + one read + close beside a
//! long-lived connection, O2 with 1,000 other databases open). The workloads and their
//! targets: `cost_workloads.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use super::cost_workloads::{child, selected, CostWorkload};
use super::cost_workloads::{
    o2_others, CHECKPOINT_SYSCALLS, OVERWRITE_JUDGE_SYSCALLS, READ_ROWS, WAL_RESET_RULE_SYSCALLS,
    WAL_RESTART_SYSCALLS,
};
use super::Result;
use hermes_guard_cli::workloads::{self, BenchError, Context, Vfs};

/// Syscalls of the allocator's heap growth, judged on their own (see `print_table`).
const ALLOCATOR_SYSCALLS: [&str; 5] = ["brk", "mmap", "munmap", "mremap", "madvise"];

/// The most the allocator's syscalls per operation may differ between the VFSes: the few calls
/// per run that a shifted heap top moves, not a call per operation.
const ALLOCATOR_TOLERANCE: f64 = 0.1;

impl Figures {
    /// The allocator's syscalls per operation.
    fn allocator_syscalls(&self) -> f64 {
        self.by_name
            .iter()
            .filter(|(name, _)| ALLOCATOR_SYSCALLS.contains(&name.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Syscalls per operation, the allocator's excepted.
    fn judged_syscalls(&self) -> f64 {
        self.syscalls - self.allocator_syscalls()
    }
}

/// One workload's figures per operation.
#[derive(Debug, Clone)]
struct Figures {
    syscalls: f64,
    /// The same, syscall by syscall.
    by_name: BTreeMap<String, f64>,
    /// Checkpoints (W1 and W2 run autocheckpoints).
    checkpoints: f64,
    instructions: f64,
}

/// The tools the cost mode runs, checked before anything is measured.
fn check_tools() -> Result<()> {
    for (tool, version) in [("strace", "-V"), ("valgrind", "--version")] {
        match Command::new(tool).arg(version).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(format!(
                    "bench --cost: `{tool} {version}` failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )
                .into())
            }
            Err(e) => {
                return Err(format!(
                    "bench --cost needs `{tool}` on PATH ({e}); install it (e.g. `apt-get install \
                     strace valgrind`) or run the wall-clock bench without --cost"
                )
                .into())
            }
        }
    }
    Ok(())
}

/// Runs the cost mode and prints its table.
pub fn run(exe: &Path, dir: &Path, workloads: &[CostWorkload], smoke: bool) -> Result<()> {
    check_tools()?;
    let read_db = if workloads.contains(&CostWorkload::R1) {
        Some(workloads::build_read_db(
            dir,
            if smoke { 200 } else { READ_ROWS },
        )?)
    } else {
        None
    };
    println!("hermes-guard bench --cost: syscalls (strace -c -f) and user-space instructions");
    println!("(valgrind --tool=callgrind) per operation, from the difference of two run lengths");
    if smoke {
        println!(
            "  SMOKE RUN: tiny run lengths (and O2 beside {} other databases, not {}), the numbers mean nothing",
            o2_others(true),
            o2_others(false)
        );
    }
    let mut rows = Vec::new();
    for &w in workloads {
        let place = match w {
            CostWorkload::R1 => read_db.clone().expect("built above"),
            _ => dir.to_path_buf(),
        };
        let (n1, n2) = w.lengths(smoke);
        let mut per_vfs = Vec::new();
        for vfs in [Vfs::Stock, Vfs::Guard] {
            let child = ChildRun {
                exe,
                dir,
                workload: w,
                vfs,
                place: &place,
                smoke,
            };
            let s1 = child.syscalls(n1)?;
            let s2 = child.syscalls(n2)?;
            let i1 = child.instructions(n1)?;
            let i2 = child.instructions(n2)?;
            let span = (n2 - n1) as f64;
            let per_op = |a: u64, b: u64| (b as f64 - a as f64) / span;
            let names: std::collections::BTreeSet<&String> =
                s1.by_name.keys().chain(s2.by_name.keys()).collect();
            let f = Figures {
                syscalls: per_op(s1.total, s2.total),
                by_name: names
                    .into_iter()
                    .map(|name| {
                        let count = |s: &SyscallCounts| s.by_name.get(name).copied().unwrap_or(0);
                        (name.clone(), per_op(count(&s1), count(&s2)))
                    })
                    .collect(),
                checkpoints: per_op(s1.checkpoints, s2.checkpoints),
                instructions: per_op(i1, i2),
            };
            eprintln!(
                "{:<3} {:<6} syscalls {} @{n1}, {} @{n2}: {:.2}/op; instructions {i1} @{n1}, \
                 {i2} @{n2}: {:.0}/op; checkpoints {:.3}/op",
                w.code(),
                vfs.arg(),
                s1.total,
                s2.total,
                f.syscalls,
                f.instructions,
                f.checkpoints
            );
            per_vfs.push(f);
        }
        let guard = per_vfs.pop().expect("two runs");
        let stock = per_vfs.pop().expect("two runs");
        rows.push((w, stock, guard));
    }
    print_table(&rows);
    Ok(())
}

fn print_table(rows: &[(CostWorkload, Figures, Figures)]) {
    let mut table = crate::table::new(
        &[
            "id",
            "workload",
            "sys stock",
            "sys guard",
            "extra",
            "instr stock",
            "instr guard",
            "extra",
            "target",
            "result",
        ],
        &[2, 3, 4, 5, 6, 7, 8],
    );
    for (w, stock, guard) in rows {
        // The allocator's heap growth (`brk`, `mmap`...) is judged on its own: where the heap
        // top sits when the page cache grows past a threshold depends on what was allocated
        // before, so the two VFSes' counts can differ by a few calls per run (a few hundredths
        // per operation); a cost per operation would show as a whole call or more.
        let extra_sys = guard.judged_syscalls() - stock.judged_syscalls();
        let extra_alloc = guard.allocator_syscalls() - stock.allocator_syscalls();
        let extra_pct = (guard.instructions / stock.instructions - 1.0) * 100.0;
        let (per_txn, max_pct) = w.target();
        // A checkpoint is a write of its own, checked like a transaction (W2's autocheckpoints:
        // a few hundredths per transaction), and stamped once it synced the main file (the
        // `stat` a heal at close compares with): two per checkpoint. A WAL restart (one after
        // each complete checkpoint) also records the main file the new generation is written
        // on, by which a later open tells a stale WAL: one `pread` of its first pages and one
        // `fsetxattr` on the WAL, two more per checkpoint for write workloads (R1 writes
        // nothing). The count is the guard run's, the same as stock's.
        // Before a checkpoint's first main-file write, the main file is judged against the
        // generation's record (was it overwritten in place?): three more per checkpoint.
        // With the WAL-reset rule on, two `fcntl` more at that restart.
        let rule = if hermes_guard::wal_reset_guard_on() {
            WAL_RESET_RULE_SYSCALLS
        } else {
            0.0
        };
        let max_sys = if w.is_churn() {
            per_txn
        } else {
            let per_checkpoint =
                CHECKPOINT_SYSCALLS + OVERWRITE_JUDGE_SYSCALLS + WAL_RESTART_SYSCALLS + rule;
            per_txn * (1.0 + per_checkpoint * guard.checkpoints)
        };
        // Syscall counts per operation are exact: a thousandth is rounding, not cost.
        let pass = extra_sys <= max_sys + 0.001
            && extra_alloc.abs() <= ALLOCATOR_TOLERANCE
            && extra_pct <= max_pct;
        table.add_row(vec![
            w.code().to_owned(),
            w.title().to_owned(),
            format!("{:.2}", stock.judged_syscalls()),
            format!("{:.2}", guard.judged_syscalls()),
            format!("{extra_sys:+.2}"),
            super::number(stock.instructions),
            super::number(guard.instructions),
            format!("{extra_pct:+.2}%"),
            format!("+{max_sys:.2} sys, +{max_pct}%"),
            (if pass { "PASS" } else { "MISS" }).to_owned(),
        ]);
    }
    println!();
    println!("{}", crate::table::render(&table));
    println!();
    for (w, stock, guard) in rows {
        let mut extra: Vec<String> = guard
            .by_name
            .iter()
            .map(|(name, n)| (name, n - stock.by_name.get(name).copied().unwrap_or(0.0)))
            .filter(|(_, d)| d.abs() >= 0.005)
            .map(|(name, d)| format!("{name} {d:+.3}"))
            .collect();
        if extra.is_empty() {
            extra.push("none".into());
        }
        println!(
            "{}: extra syscalls per operation by name: {}; checkpoints per operation {:.3}",
            w.code(),
            extra.join(", "),
            guard.checkpoints
        );
    }
    println!(
        "\nsys: syscalls per operation (strace -c -f, every thread); instr: user-space instructions\n\
         per operation (callgrind's Ir); each is (count at the long run - count at the short run) /\n\
         (difference of their lengths), so process start-up, setup and close cancel.\n\
         extra: guard - stock, syscalls without the allocator's (brk, mmap, munmap, mremap,\n\
         madvise), which are judged on their own: within 0.1 per operation of stock's (the heap\n\
         top's position moves them by a few calls per run; listed by name above);\n\
         target: the most the guard may add: two syscalls per write transaction, seven per\n\
         checkpoint (its check, the judgement of the main file before its first write: the\n\
         record's fgetxattr and two preads, the main file's stamp after it, and the WAL-base\n\
         record's pread and fsetxattr at the WAL restart that follows; with the WAL-reset rule on,\n\
         two fcntl more there) (W1, W2), none for reads (R1), six per open + read + close (O1, O2), and the\n\
         instructions."
    );
}

/// One child configuration, run under a tool at some length.
struct ChildRun<'a> {
    exe: &'a Path,
    dir: &'a Path,
    workload: CostWorkload,
    vfs: Vfs,
    place: &'a Path,
    smoke: bool,
}

impl ChildRun<'_> {
    fn child_args(&self, ops: u64) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![self.exe.into()];
        for a in [
            "bench-child",
            "--role",
            "cost",
            "--vfs",
            self.vfs.arg(),
            "--workload",
            self.workload.arg(),
            "--ops",
        ] {
            args.push(a.into());
        }
        args.push(ops.to_string().into());
        args.push("--db".into());
        args.push(self.place.into());
        if self.workload == CostWorkload::O2 {
            args.push("--others".into());
            args.push(o2_others(self.smoke).to_string().into());
        }
        args
    }

    fn out_file(&self, tool: &str, ops: u64) -> PathBuf {
        self.dir.join(format!(
            "cost-{tool}-{}-{}-{ops}.out",
            self.workload.arg(),
            self.vfs.arg()
        ))
    }

    fn run_tool(&self, tool: &str, tool_args: &[std::ffi::OsString], out: &Path) -> Result<String> {
        Ok(self.run_tool_with_stdout(tool, tool_args, out)?.0)
    }

    /// `tool` run on the child: its output file's text, and the child's standard output.
    fn run_tool_with_stdout(
        &self,
        tool: &str,
        tool_args: &[std::ffi::OsString],
        out: &Path,
    ) -> Result<(String, String)> {
        let output = Command::new(tool)
            .args(tool_args)
            .output()
            .ctx("running", Path::new(tool))?;
        let text = std::fs::read_to_string(out);
        let _ = std::fs::remove_file(out);
        if !output.status.success() {
            return Err(BenchError::Invalid(format!(
                "{tool} of the {} {} child exited with {}: {}",
                self.workload.code(),
                self.vfs.arg(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
            .into());
        }
        Ok((
            text.ctx("reading", out)?,
            String::from_utf8_lossy(&output.stdout).into_owned(),
        ))
    }

    /// Syscalls of a child running `ops` operations, all threads, and the checkpoints it made.
    fn syscalls(&self, ops: u64) -> Result<SyscallCounts> {
        let out = self.out_file("strace", ops);
        let mut args: Vec<std::ffi::OsString> =
            vec!["-f".into(), "-c".into(), "-o".into(), out.clone().into()];
        args.push("--".into());
        args.extend(self.child_args(ops));
        let (text, stdout) = self.run_tool_with_stdout("strace", &args, &out)?;
        let total = strace_total(&text).ok_or_else(|| {
            format!(
                "no `total` line in strace's summary of {}:\n{text}",
                out.display()
            )
        })?;
        let checkpoints = stdout
            .lines()
            .find_map(|l| l.strip_prefix("checkpoints ")?.trim().parse().ok())
            .unwrap_or(0);
        Ok(SyscallCounts {
            total,
            by_name: strace_counts(&text),
            checkpoints,
        })
    }

    /// User-space instructions of a child running `ops` operations.
    fn instructions(&self, ops: u64) -> Result<u64> {
        let out = self.out_file("callgrind", ops);
        let mut file_arg = std::ffi::OsString::from("--callgrind-out-file=");
        file_arg.push(&out);
        let mut args: Vec<std::ffi::OsString> =
            vec!["--tool=callgrind".into(), "-q".into(), file_arg];
        args.extend(self.child_args(ops));
        let text = self.run_tool("valgrind", &args, &out)?;
        callgrind_total(&text).ok_or_else(|| {
            format!(
                "no `totals:`/`summary:` line in callgrind's output {}",
                out.display()
            )
            .into()
        })
    }
}

/// A child run's syscalls: the total, per syscall, and the checkpoints it reported.
struct SyscallCounts {
    total: u64,
    by_name: BTreeMap<String, u64>,
    checkpoints: u64,
}

/// The call count of each syscall in `strace -c`'s summary table.
pub fn strace_counts(summary: &str) -> BTreeMap<String, u64> {
    summary
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // % time, seconds, usecs/call, calls, [errors,] syscall
            if fields.len() < 5 || fields[0].parse::<f64>().is_err() {
                return None;
            }
            let name = *fields.last()?;
            if name == "total" {
                return None;
            }
            Some((name.to_string(), fields[3].parse().ok()?))
        })
        .collect()
}

/// The call count of the `total` line of `strace -c`'s summary table.
pub fn strace_total(summary: &str) -> Option<u64> {
    summary.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors,] "total"
        if fields.last() != Some(&"total") || fields.len() < 5 {
            return None;
        }
        fields[3].parse().ok()
    })
}

/// The total of the first event (`Ir`) in a callgrind output file.
pub fn callgrind_total(out: &str) -> Option<u64> {
    let find = |key: &str| {
        out.lines().find_map(|line| {
            line.strip_prefix(key)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
    };
    find("totals:").or_else(|| find("summary:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summary_total_with_and_without_errors() {
        let with_errors = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 40.00    0.000400           1       400           pwrite64
 60.00    0.000600           1       600        12 fcntl
------ ----------- ----------- --------- --------- ----------------
100.00    0.001000           1      1000        12 total
";
        assert_eq!(strace_total(with_errors), Some(1000));
        let counts = strace_counts(with_errors);
        assert_eq!(counts.get("pwrite64"), Some(&400));
        assert_eq!(counts.get("fcntl"), Some(&600));
        assert_eq!(counts.len(), 2);
        let without = "100.00    0.000010           0        17           total\n";
        assert_eq!(strace_total(without), Some(17));
        assert_eq!(strace_total("strace: exec failed\n"), None);
    }

    #[test]
    fn callgrind_totals_line() {
        let out = "# callgrind format\nversion: 1\nevents: Ir\nfn=(1) main\n3 4\nsummary: 99\ntotals: 123456\n";
        assert_eq!(callgrind_total(out), Some(123456));
        assert_eq!(callgrind_total("events: Ir\nsummary: 42\n"), Some(42));
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }

    #[test]
    fn only_selects_cost_workloads_by_prefix() {
        assert_eq!(selected(&[]).map(|v| v.len()), Some(5));
        assert_eq!(
            selected(&["o".into()]),
            Some(vec![CostWorkload::O1, CostWorkload::O2])
        );
        assert_eq!(
            selected(&["w".into()]),
            Some(vec![CostWorkload::W1, CostWorkload::W2])
        );
        assert_eq!(
            selected(&["r1".into(), "W1-NORMAL".into()]),
            Some(vec![CostWorkload::W1, CostWorkload::R1])
        );
        assert_eq!(selected(&["CK".into()]), None);
    }
}
