//! The `kvcm` binary: one executable, one subcommand per role.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kvcm",
    version,
    about = "Global KVCache manager for LLM inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace, compare eviction policies and plan capacity.
    Optimize(kvcm_optimizer::cli::OptimizeArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Optimize(args) => kvcm_optimizer::cli::run(args)?,
    }
    Ok(())
}
