//! [`CapacitySpec`]: a cache size as written on the command line, and its size in blocks.
//!
//! Forms: `20000` (blocks), `5%` (percent of the trace's unique blocks, rounded down),
//! `64000tok` (tokens, rounded down to whole blocks), `512MiB` / `2GiB` / `1000B` / `10KiB` /
//! `1TiB` (bytes; needs `--bytes-per-token`, rounded down to whole blocks).

use std::str::FromStr;

/// Why a capacity is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CapacityError {
    /// The text is none of the accepted forms.
    #[error("invalid capacity {0:?}: expected N (blocks), N% (of unique blocks), Ntok or N with B/KiB/MiB/GiB/TiB")]
    Syntax(String),
    /// A byte capacity was given without `--bytes-per-token`.
    #[error("capacity {0:?} is in bytes: pass --bytes-per-token")]
    NeedsBytesPerToken(String),
}

/// A capacity as the user wrote it.
#[derive(Debug, Clone, PartialEq)]
pub enum CapacitySpec {
    /// A number of blocks.
    Blocks(u64),
    /// Percent of the trace's unique blocks.
    Percent(f64),
    /// A number of tokens.
    Tokens(u64),
    /// A number of bytes.
    Bytes(u64),
}

const BYTE_UNITS: [(&str, u64); 5] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

impl FromStr for CapacitySpec {
    type Err = CapacityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || CapacityError::Syntax(text.to_string());
        let text = text.trim();
        if let Some(number) = text.strip_suffix('%') {
            let percent: f64 = number.trim().parse().map_err(|_| syntax())?;
            if !percent.is_finite() || percent < 0.0 {
                return Err(syntax());
            }
            return Ok(CapacitySpec::Percent(percent));
        }
        let integer = |number: &str| number.trim().parse::<u64>().map_err(|_| syntax());
        if let Some(number) = text.strip_suffix("tok") {
            return Ok(CapacitySpec::Tokens(integer(number)?));
        }
        for (unit, scale) in BYTE_UNITS {
            if let Some(number) = text.strip_suffix(unit) {
                let bytes = integer(number)?.checked_mul(scale).ok_or_else(syntax)?;
                return Ok(CapacitySpec::Bytes(bytes));
            }
        }
        Ok(CapacitySpec::Blocks(integer(text)?))
    }
}

impl CapacitySpec {
    /// The capacity in blocks for a trace with `unique_blocks` blocks of `block_tokens`
    /// tokens, at `bytes_per_token` bytes per token (needed for byte capacities only).
    pub fn blocks(
        &self,
        unique_blocks: usize,
        block_tokens: u32,
        bytes_per_token: Option<u64>,
    ) -> Result<usize, CapacityError> {
        let block_tokens = u64::from(block_tokens.max(1));
        let blocks = match *self {
            CapacitySpec::Blocks(blocks) => blocks,
            CapacitySpec::Percent(percent) => {
                // Integer percents round down exactly; fractional ones via f64.
                if percent.fract() == 0.0 {
                    (unique_blocks as u64).saturating_mul(percent as u64) / 100
                } else {
                    (unique_blocks as f64 * percent / 100.0).floor() as u64
                }
            }
            CapacitySpec::Tokens(tokens) => tokens / block_tokens,
            CapacitySpec::Bytes(bytes) => {
                let per_token = bytes_per_token
                    .filter(|&b| b > 0)
                    .ok_or_else(|| CapacityError::NeedsBytesPerToken(self.to_string()))?;
                bytes / per_token.saturating_mul(block_tokens)
            }
        };
        Ok(usize::try_from(blocks).unwrap_or(usize::MAX))
    }
}

impl std::fmt::Display for CapacitySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CapacitySpec::Blocks(blocks) => write!(f, "{blocks}"),
            CapacitySpec::Percent(percent) => write!(f, "{percent}%"),
            CapacitySpec::Tokens(tokens) => write!(f, "{tokens}tok"),
            CapacitySpec::Bytes(bytes) => write!(f, "{bytes}B"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(text: &str) -> Result<usize, CapacityError> {
        text.parse::<CapacitySpec>()?.blocks(43_924, 512, Some(2))
    }

    #[test]
    fn every_form_converts_to_blocks_rounding_down() {
        assert_eq!(blocks("20000"), Ok(20_000));
        assert_eq!(blocks("5%"), Ok(2_196));
        assert_eq!(blocks("40%"), Ok(17_569));
        assert_eq!(blocks("2.5%"), Ok(1_098));
        assert_eq!(blocks("1100tok"), Ok(2));
        // 1 MiB / (512 tokens * 2 bytes) = 1024 blocks.
        assert_eq!(blocks("1MiB"), Ok(1_024));
        assert_eq!(blocks("1023B"), Ok(0));
    }

    #[test]
    fn bad_capacities_are_rejected_with_the_text() {
        for bad in [
            "",
            "abc",
            "-5%",
            "5%%",
            "1.5",
            "10XB",
            "99999999999999999999TiB",
            "nan%",
        ] {
            let error = blocks(bad).unwrap_err();
            assert!(
                error.to_string().contains(&format!("{bad:?}")),
                "{bad}: {error}"
            );
        }
        let spec: CapacitySpec = "1GiB".parse().unwrap();
        assert_eq!(
            spec.blocks(10, 16, None),
            Err(CapacityError::NeedsBytesPerToken("1073741824B".to_string()))
        );
    }
}
