//! The `hermes-guard` command line: the demonstration, the benchmarks, and the child-process
//! roles the tests and benchmarks drive.

mod bench;
mod demo;
mod writer;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hermes-guard",
    version,
    about = "A SQLite VFS that makes a lost WAL generation loud and lossless"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the loss scenario on the stock unix VFS and on hermes-guard, side by side.
    Demo(demo::DemoArgs),
    /// Compare hermes-guard with the stock unix VFS, interleaved, and print ratios.
    Bench(bench::BenchArgs),
    /// (internal) A writer process driven over stdin/stdout, for tests and the demo.
    #[command(hide = true)]
    Writer(writer::WriterArgs),
    /// (internal) A benchmark child process.
    #[command(hide = true)]
    BenchChild(bench::ChildArgs),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("off")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Writer(args) => writer::run(args),
        Command::BenchChild(args) => bench::child(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hermes-guard: {e}");
            ExitCode::FAILURE
        }
    }
}
