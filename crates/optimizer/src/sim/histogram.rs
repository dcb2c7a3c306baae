//! [`Log2Histogram`]: counts in power-of-two buckets: 0, 1, 2-3, 4-7, 8-15, ...

use serde::Serialize;

/// Histogram with buckets `[0]`, `[1]`, `[2, 3]`, `[4, 7]`, ...; bucket `i > 0` holds values
/// in `[2^(i-1), 2^i - 1]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Log2Histogram {
    counts: Vec<u64>,
}

impl Log2Histogram {
    /// Counts one occurrence of `value`.
    pub fn record(&mut self, value: u64) {
        let bucket = (u64::BITS - value.leading_zeros()) as usize;
        if self.counts.len() <= bucket {
            self.counts.resize(bucket + 1, 0);
        }
        self.counts[bucket] += 1;
    }

    /// Counts per bucket, from bucket 0.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Inclusive value range of bucket `bucket`.
    pub fn bucket_range(bucket: usize) -> (u64, u64) {
        match bucket {
            0 => (0, 0),
            b => (1 << (b - 1), (1u64 << (b - 1)) * 2 - 1),
        }
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Log2Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_power_of_two_buckets() {
        let mut histogram = Log2Histogram::default();
        for value in [0, 1, 2, 3, 4, 7, 8, 1000] {
            histogram.record(value);
        }
        assert_eq!(histogram.counts(), &[1, 1, 2, 2, 1, 0, 0, 0, 0, 0, 1]);
        assert_eq!(Log2Histogram::bucket_range(3), (4, 7));
        assert_eq!(Log2Histogram::bucket_range(10), (512, 1023));
    }
}
