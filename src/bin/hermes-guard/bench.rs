//! Benchmarks: hermes-guard against the stock unix VFS, interleaved.

/// Arguments of `hermes-guard bench`.
#[derive(clap::Args)]
pub struct BenchArgs {}

/// Arguments of the benchmark child process.
#[derive(clap::Args)]
pub struct ChildArgs {}

pub fn run(_args: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    Err("the benchmark suite is being written".into())
}

pub fn child(_args: ChildArgs) -> Result<(), Box<dyn std::error::Error>> {
    Err("the benchmark suite is being written".into())
}
