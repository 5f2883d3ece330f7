//! `explore [--scenario X] [--seed S] [--schedules N] [--first F]`: every scenario (or X) over
//! seeds F..F+N, printing `explored N schedules` per scenario and `violations V` in all (exit 1
//! when V > 0, with each failing schedule's seed, replay command and steps); with `--seed S`,
//! the one schedule S of X, replayed and printed step by step (`--deviations D`: the
//! enumeration's schedule D of the variant seed S chooses).
//!
//! `explore --scenario X --dfs B [--variant-seeds K] [--max N] [--stop-at-first]`: every
//! schedule of X within B preemptions, for each variant the seeds 0..K choose (`dfs.rs`).

use std::process::ExitCode;
use std::time::Instant;

use hermes_guard_explore::{dfs, explore, explore_dfs, process, run_with, scenarios};

fn main() -> ExitCode {
    let mut scenario = None;
    let mut seed = None;
    let mut schedules = 200u64;
    let mut first = 0u64;
    let mut deviations = None;
    let mut bound = None;
    let mut variant_seeds = 8u64;
    let mut max = usize::MAX;
    let mut stop_at_first = false;
    let mut args = std::env::args().skip(1);
    if std::env::args().nth(1).as_deref() == Some(process::CHILD_ARG) {
        // A connection in another process (`process.rs`), not a command for people.
        let (Some(db), Some(how)) = (std::env::args().nth(2), std::env::args().nth(3)) else {
            usage("--child needs a database and guarded|stock");
        };
        return process::child_main(std::path::Path::new(&db), &how);
    }
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--scenario" => scenario = Some(value()),
            "--seed" => {
                seed = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--seed: a number")),
                )
            }
            "--schedules" => {
                schedules = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--schedules: a number"))
            }
            "--list" => {
                for s in scenarios::ALL {
                    println!("{}", s.name);
                }
                return ExitCode::SUCCESS;
            }
            "--deviations" => {
                deviations = Some(
                    dfs::parse_deviations(&value())
                        .unwrap_or_else(|| usage("--deviations: choice:participant,...")),
                )
            }
            "--dfs" => {
                bound = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--dfs: a preemption bound")),
                )
            }
            "--variant-seeds" => {
                variant_seeds = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--variant-seeds: a number"))
            }
            "--max" => max = value().parse().unwrap_or_else(|_| usage("--max: a number")),
            "--stop-at-first" => stop_at_first = true,
            "--fault" => {
                let name = value();
                if !hermes_guard_explore::faults::switch_on(&name) {
                    usage(&format!(
                        "no fault {name} (there are: {:?})",
                        hermes_guard_explore::faults::NAMES
                    ));
                }
            }
            "--first" => {
                first = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--first: a number"))
            }
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let chosen: Vec<&'static scenarios::Scenario> = match &scenario {
        Some(name) => {
            vec![scenarios::find(name).unwrap_or_else(|| usage(&format!("no scenario {name}")))]
        }
        None => scenarios::ALL.iter().collect(),
    };
    if let Some(seed) = seed {
        let [sc] = chosen[..] else {
            usage("--seed needs --scenario");
        };
        let o = run_with(sc, seed, deviations);
        scenarios::remove_template();
        print!("{}", o.describe());
        return if o.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if let Some(bound) = bound {
        return enumerate(&chosen, bound, variant_seeds, max, stop_at_first);
    }
    let mut violations = 0;
    let mut total = 0;
    for sc in chosen {
        let t = Instant::now();
        let s = explore(sc, first, schedules);
        println!(
            "{}: explored {} schedules (seeds {first}..{}), {} distinct, {} with a refusal, {} with a capture, {} failing ({:.1}s): {}",
            sc.name,
            s.schedules,
            first + schedules,
            s.distinct,
            s.refusals,
            s.captures,
            s.failures.len(),
            t.elapsed().as_secs_f64(),
            sc.about
        );
        if !s.known.is_empty() {
            println!(
                "  {} schedule(s) showed a known guard bug only (not counted; tests/explore/README.md): seeds {:?}",
                s.known.len(),
                &s.known[..s.known.len().min(10)]
            );
        }
        for f in s.failures.iter().take(3) {
            print!("{}", f.describe());
        }
        for f in &s.failures {
            println!(
                "  failing seed {} (replay: bash tests/explore.sh --scenario {} --seed {})",
                f.seed, sc.name, f.seed
            );
        }
        violations += s.failures.len();
        total += s.schedules;
    }
    scenarios::remove_template();
    println!("explored {total} schedules in all; violations {violations}");
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--dfs`: every schedule within `bound` preemptions of each chosen scenario.
fn enumerate(
    chosen: &[&'static scenarios::Scenario],
    bound: usize,
    variant_seeds: u64,
    max: usize,
    stop_at_first: bool,
) -> ExitCode {
    let (mut violations, mut total) = (0, 0);
    for &sc in chosen {
        let t = Instant::now();
        let s = explore_dfs(sc, bound, variant_seeds, max, stop_at_first);
        let variants: Vec<String> = s
            .variants
            .iter()
            .map(|(seed, v)| format!("{v} (seed {seed})"))
            .collect();
        println!(
            "{}: enumerated {} schedules within {bound} preemption(s){}, {} variant(s): {}; {} failing ({:.1}s)",
            sc.name,
            s.schedules,
            if s.complete { ", all of them" } else { ", stopped early" },
            s.variants.len(),
            variants.join("; "),
            s.failures.len(),
            t.elapsed().as_secs_f64()
        );
        if !s.known.is_empty() {
            println!(
                "  {} schedule(s) showed a known guard bug only (not counted; tests/explore/README.md), first: seed {} --deviations '{}'",
                s.known.len(),
                s.known[0].0,
                dfs::format_deviations(&s.known[0].1)
            );
        }
        for f in s.failures.iter().take(3) {
            print!("{}", f.describe());
        }
        violations += s.failures.len();
        total += s.schedules;
    }
    scenarios::remove_template();
    println!("enumerated {total} schedules in all; violations {violations}");
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn usage(why: &str) -> ! {
    eprintln!(
        "explore: {why}\nusage: explore [--scenario X] [--seed S [--deviations D]] [--schedules N] [--first F] | --scenario X --dfs B [--variant-seeds K] [--max N] [--stop-at-first] | --list; --fault F puts back a bug the guard once had"
    );
    eprintln!("scenarios:");
    for s in scenarios::ALL {
        eprintln!("  {}: {}", s.name, s.about);
    }
    std::process::exit(2)
}
