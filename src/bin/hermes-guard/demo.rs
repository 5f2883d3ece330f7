//! `hermes-guard demo`.

/// Arguments of `hermes-guard demo`.
#[derive(clap::Args)]
pub struct DemoArgs {}

pub fn run(_args: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    Err("not yet".into())
}
