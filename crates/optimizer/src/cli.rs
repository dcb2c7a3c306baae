//! `kvcm optimize` command-line arguments and entry point.

use std::path::PathBuf;

/// Errors of the optimizer CLI.
#[derive(Debug, thiserror::Error)]
pub enum OptimizeError {
    /// The optimizer is not built yet.
    #[error("kvcm optimize is not implemented yet (trace {0})")]
    NotImplemented(PathBuf),
}

/// Arguments of `kvcm optimize`.
#[derive(Debug, clap::Args)]
pub struct OptimizeArgs {
    /// Trace file to replay.
    #[arg(long)]
    pub trace: PathBuf,
}

/// Runs `kvcm optimize`.
pub fn run(args: OptimizeArgs) -> Result<(), OptimizeError> {
    Err(OptimizeError::NotImplemented(args.trace))
}
