//! The writer child process.

/// Arguments of the writer child.
#[derive(clap::Args)]
pub struct WriterArgs {}

pub fn run(_args: WriterArgs) -> Result<(), Box<dyn std::error::Error>> {
    Err("not yet".into())
}
