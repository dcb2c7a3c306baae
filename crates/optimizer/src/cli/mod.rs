//! `kvcm optimize`: command-line arguments, validation and the run from trace to report.

mod analysis;
mod capacity;
mod progress;

pub use analysis::analyse;
pub use capacity::{CapacityError, CapacitySpec};
pub use progress::Progress;

use std::path::PathBuf;

use crate::model::Workload;
use crate::policy::PolicyKind;
use crate::report::{self, ReportError};
use crate::trace::{TraceError, TraceFormat};

/// Errors of `kvcm optimize`.
#[derive(Debug, thiserror::Error)]
pub enum OptimizeError {
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A capacity could not be resolved.
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// An argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The outputs could not be written.
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// Arguments of `kvcm optimize`.
#[derive(Debug, Clone, clap::Args)]
pub struct OptimizeArgs {
    /// Trace files, replayed in order; a directory means the rotated event log inside it.
    #[arg(long, required = true, num_args = 1..)]
    pub trace: Vec<PathBuf>,
    /// Trace format; detected from the first line when omitted.
    #[arg(long, value_enum)]
    pub format: Option<TraceFormat>,
    /// Policies to replay, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "lru")]
    pub policy: Vec<PolicyKind>,
    /// Capacities, comma-separated: N blocks, N% of unique blocks, Ntok, or bytes (512MiB).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "5%,10%,20%,40%,60%,80%,100%"
    )]
    pub capacity: Vec<CapacitySpec>,
    /// Replay two tiers: a memory tier of this size in front of each capacity.
    #[arg(long)]
    pub memory_tier: Option<CapacitySpec>,
    /// Tokens per block (overrides what the trace declares or its format implies).
    #[arg(long)]
    pub block_tokens: Option<u32>,
    /// Bytes of KV cache per token, for capacities given in bytes.
    #[arg(long)]
    pub bytes_per_token: Option<u64>,
    /// Capacity planning target, as a fraction of the infinite-cache block hit rate.
    #[arg(long, default_value_t = 0.9)]
    pub target: f64,
    /// Directory for results.csv, results.json, lru_curve.csv and the plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Time windows of the hit-rate-over-time series.
    #[arg(long, default_value_t = 40)]
    pub windows: usize,
}

impl OptimizeArgs {
    /// Checks the ranges clap cannot express.
    pub fn validate(&self) -> Result<(), OptimizeError> {
        let invalid = |message: &str| Err(OptimizeError::InvalidArgument(message.to_string()));
        if !(self.target > 0.0 && self.target <= 1.0) {
            return invalid("--target must be in (0, 1]");
        }
        if self.block_tokens == Some(0) {
            return invalid("--block-tokens must be at least 1");
        }
        if self.threads == Some(0) {
            return invalid("--threads must be at least 1");
        }
        if !(1..=100_000).contains(&self.windows) {
            return invalid("--windows must be in 1..=100000");
        }
        if self.policy.is_empty() || self.capacity.is_empty() {
            return invalid("--policy and --capacity need at least one value");
        }
        Ok(())
    }
}

/// Runs `kvcm optimize`: replays the trace, prints the table, writes the outputs.
pub fn run(args: OptimizeArgs) -> Result<(), OptimizeError> {
    args.validate()?;
    let workload = Workload::load(&args.trace, args.format, args.block_tokens)?;
    let report = analyse(&workload, &args)?;
    print!("{}", report::table(&report));
    if let Some(out) = &args.out {
        let files = report::write_report(&report, out)?;
        eprintln!("wrote {} files to {}", files.len(), out.display());
    }
    Ok(())
}
