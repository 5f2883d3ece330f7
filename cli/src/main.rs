//! The `hermes-guard` command line: the demonstration, the benchmarks, and the child-process
//! roles the tests and benchmarks drive.

mod bench;
mod database_arg;
mod demo;
mod held;
mod help;
mod recover_cmd;
mod status_cmd;
mod table;
mod writer;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hermes-guard",
    version,
    about = "A SQLite VFS that makes a lost WAL generation loud and lossless",
    // `help <topic>` is ours: it also prints the docs compiled in (`help recovery`).
    disable_help_subcommand = true,
    after_help = "Exit codes: 0 done; 1 failed (nothing written); 2 bad input (nothing written); \
                  3 something is left over (recover, captures, changes) or needs attention (status). Each command's --help says more.\n\
                  A write was refused? `hermes-guard help recovery` prints the runbook."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the loss scenario on the stock unix VFS and on hermes-guard, side by side.
    #[command(after_help = demo::DEMO_EXIT_CODES)]
    Demo(demo::DemoArgs),
    /// Compare hermes-guard with the stock unix VFS, interleaved, and print ratios.
    #[command(after_help = bench::BENCH_EXIT_CODES)]
    Bench(bench::BenchArgs),
    /// List the captures beside a database (or in a directory): when, why, verified, rows missing.
    #[command(after_help = recover_cmd::CAPTURES_EXIT_CODES)]
    Captures(recover_cmd::CapturesArgs),
    /// Check a capture from its bytes: both files against the manifest, the WAL frame by frame.
    #[command(after_help = recover_cmd::VERIFY_EXIT_CODES)]
    Verify(recover_cmd::VerifyArgs),
    /// What a capture's own generation inserted, updated and deleted, per table, from its pages
    /// and their bases alone (read-only).
    #[command(after_help = recover_cmd::CHANGES_EXIT_CODES)]
    Changes(recover_cmd::ChangesArgs),
    /// Plan (and with --apply, merge) a capture's missing rows into the live database.
    #[command(after_help = recover_cmd::RECOVER_EXIT_CODES)]
    Recover(recover_cmd::RecoverArgs),
    /// Is this database healthy: its -wal judged, who holds it, its captures and their missing
    /// rows (read-only).
    #[command(after_help = status_cmd::STATUS_EXIT_CODES)]
    Status(status_cmd::StatusArgs),
    /// List the processes that hold retired WAL generations open (deleted -wal descriptors).
    #[command(after_help = held::HELD_EXIT_CODES)]
    Held(held::HeldArgs),
    /// Print a help topic compiled into this binary (recovery, exit-codes, capture-format,
    /// merge-rules), or a command's --help.
    #[command(after_help = help::HELP_AFTER)]
    Help(help::HelpArgs),
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
        Command::Captures(args) => return recover_cmd::captures(args),
        Command::Verify(args) => return recover_cmd::verify(args),
        Command::Changes(args) => return recover_cmd::changes(args),
        Command::Recover(args) => return recover_cmd::recover(args),
        Command::Held(args) => return held::held(args),
        Command::Status(args) => return status_cmd::status(args),
        Command::Help(args) => return help::help(args),
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
