//! `hermes-guard bench --smoke` runs every workload briefly, so the benchmark code cannot rot.
//! The numbers of a smoke run mean nothing, and nothing here looks at them.

use std::process::{Command, Output};

const WORKLOADS: [&str; 16] = [
    "W1-NORMAL",
    "W1-FULL",
    "W2",
    "R1",
    "R2",
    "CK-PASSIVE",
    "CK-TRUNCATE",
    "ST",
    "MP",
    "O1",
    "CAP-TIME",
    "CAP-MEM",
    "MERGE-TIME",
    "MERGE-MEM",
    "L1-DEFAULT",
    "L1-NORMAL",
];

fn bench(dir: &std::path::Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hermes-guard"))
        .args(["bench", "--smoke", "--dir"])
        .arg(dir)
        .args(extra)
        .output()
        .expect("hermes-guard runs")
}

/// The table's rows, by workload ID: the lines of stdout that start with one.
fn rows(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let id = line.split_whitespace().next()?;
            WORKLOADS
                .contains(&id)
                .then(|| (id.to_owned(), line.to_owned()))
        })
        .collect()
}

#[test]
fn smoke_run_prints_one_judged_row_per_workload() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(dir.path(), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench --smoke failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(&stdout);
    let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, WORKLOADS, "rows in the table:\n{stdout}");
    for (id, line) in &rows {
        let verdict = line.split_whitespace().last().unwrap_or_default();
        assert!(
            verdict == "PASS" || verdict == "MISS",
            "row {id} ends without a verdict: {line}"
        );
    }
    assert!(
        stdout.contains("ratio") && stdout.contains("target"),
        "no table header:\n{stdout}"
    );
}

#[test]
fn only_runs_the_workloads_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(dir.path(), &["--only", "r,ck-t"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench --only failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = rows(&stdout).into_iter().map(|(id, _)| id).collect();
    assert_eq!(
        ids,
        ["R1", "R2", "CK-TRUNCATE"],
        "rows in the table:\n{stdout}"
    );
}

#[test]
fn an_unknown_workload_is_refused_with_the_list_of_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(dir.path(), &["--only", "W9"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "bench --only W9 succeeded");
    assert!(
        stderr.contains("W9") && stderr.contains("W1-NORMAL") && stderr.contains("CAP-MEM"),
        "unhelpful error: {stderr}"
    );
}

#[test]
fn bench_leaves_nothing_behind_in_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(dir.path(), &["--only", "W1-NORMAL,CAP"]);
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Whether `tool` runs here (`--version`/`-V`).
fn tool_runs(tool: &str, flag: &str) -> bool {
    Command::new(tool)
        .arg(flag)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_cost_mode_judges_every_workload_and_names_its_extra_syscalls() {
    if !tool_runs("strace", "-V") || !tool_runs("valgrind", "--version") {
        eprintln!("skipped: bench --cost needs strace and valgrind on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bench(dir.path(), &["--cost"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench --cost --smoke failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in ["W1", "R1", "W2", "O1", "O2"] {
        let judged = stdout.lines().any(|l| {
            l.split_whitespace().next() == Some(id) && (l.ends_with("PASS") || l.ends_with("MISS"))
        });
        assert!(judged, "no judged row for {id}:\n{stdout}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("{id}: extra syscalls per operation by name: "))),
            "no syscall breakdown for {id}:\n{stdout}"
        );
    }
}
