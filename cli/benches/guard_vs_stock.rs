//! Criterion benches of the in-process workloads of `hermes-guard bench`, each through the stock
//! unix VFS and through hermes-guard: `cargo bench --bench guard_vs_stock [-- W1]`.
//!
//! Criterion measures one VFS after the other, so on a shared machine the two sides can drift
//! apart with the load; the ratios to publish come from `hermes-guard bench`, which interleaves
//! them. These benches are for a closer look at one workload (criterion's distributions, its
//! comparison with the previous run) and run the very same workload code.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use hermes_guard_cli::workloads::{
    self, CheckpointMode, Checkpoints, Inserts, Reads, Session, Synchronous, Timed, Vfs,
};

const READ_ROWS: u64 = 100_000;
const CHECKPOINT_WAL_BYTES: u64 = 16 << 20;

/// One group per workload, a `stock` and a `guard` function in each. `measure(vfs, n)` times `n`
/// operations (criterion's iterations) after an untimed setup (for the checkpoints, each one's
/// WAL is rebuilt untimed).
fn pair(
    c: &mut Criterion,
    name: &str,
    throughput: Throughput,
    slow: bool,
    measure: impl Fn(Vfs, u64) -> Result<Timed, workloads::BenchError>,
) {
    let mut group = c.benchmark_group(name);
    group.throughput(throughput);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(if slow { 10 } else { 4 }));
    if slow {
        group.sampling_mode(SamplingMode::Flat);
    }
    for vfs in [Vfs::Stock, Vfs::Guard] {
        group.bench_function(vfs.arg(), |b| {
            b.iter_custom(|iters| match measure(vfs, iters) {
                Ok(timed) => timed.elapsed,
                Err(e) => panic!("{name} through {}: {e}", vfs.arg()),
            })
        });
    }
    group.finish();
}

/// Opens a session, times `n` of its operations, closes it.
fn once(
    session: Result<Box<dyn Session>, workloads::BenchError>,
    n: u64,
) -> Result<Timed, workloads::BenchError> {
    let mut session = session?;
    let timed = session.run(n)?;
    session.finish()?;
    Ok(timed)
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dir = dir.path();
    pair(c, "W1-NORMAL", Throughput::Elements(1), false, |vfs, n| {
        once(Inserts::open(vfs, dir, Synchronous::Normal, 1), n)
    });
    pair(c, "W1-FULL", Throughput::Elements(1), false, |vfs, n| {
        once(Inserts::open(vfs, dir, Synchronous::Full, 1), n)
    });
    pair(c, "W2", Throughput::Elements(1000), false, |vfs, n| {
        once(Inserts::open(vfs, dir, Synchronous::Normal, 1000), n)
    });
    let read_db = workloads::build_read_db(dir, READ_ROWS).expect("the read database");
    pair(c, "R1", Throughput::Elements(1), false, |vfs, n| {
        once(Reads::open(vfs, &read_db, READ_ROWS, false), n)
    });
    pair(c, "R2", Throughput::Elements(READ_ROWS), false, |vfs, n| {
        once(Reads::open(vfs, &read_db, READ_ROWS, true), n)
    });
    pair(
        c,
        "CK-PASSIVE",
        Throughput::Bytes(CHECKPOINT_WAL_BYTES),
        true,
        |vfs, n| {
            once(
                Checkpoints::open(vfs, dir, CheckpointMode::Passive, CHECKPOINT_WAL_BYTES),
                n,
            )
        },
    );
    pair(
        c,
        "CK-TRUNCATE",
        Throughput::Bytes(CHECKPOINT_WAL_BYTES),
        true,
        |vfs, n| {
            once(
                Checkpoints::open(vfs, dir, CheckpointMode::Truncate, CHECKPOINT_WAL_BYTES),
                n,
            )
        },
    );
}

criterion_group!(guard_vs_stock, benches);
criterion_main!(guard_vs_stock);
