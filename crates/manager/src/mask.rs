//! BlockMask semantics (wire fact sheet §10): a position is "in the mask" when it is below the
//! offset, or when the bool vector is long enough and true at it. An unset mask masks nothing.

/// A block mask in one of its two wire forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockMask {
    /// The first `n` positions are in the mask.
    Offset(usize),
    /// Position `i` is in the mask when `i < len` and `values[i]`.
    Bools(Vec<bool>),
}

impl Default for BlockMask {
    fn default() -> Self {
        BlockMask::Bools(Vec::new())
    }
}

impl BlockMask {
    /// Whether no position is in the mask.
    pub fn is_empty(&self) -> bool {
        match self {
            BlockMask::Offset(n) => *n == 0,
            BlockMask::Bools(values) => !values.contains(&true),
        }
    }

    /// Whether position `i` is in the mask.
    pub fn contains(&self, i: usize) -> bool {
        match self {
            BlockMask::Offset(n) => i < *n,
            BlockMask::Bools(values) => values.get(i).copied().unwrap_or(false),
        }
    }

    /// The StartWriteCache answer for these presence flags: `Offset(k)` when the present
    /// blocks are exactly the first k (including none and all) and each of those is
    /// `prefix_eligible` (has a location of read weight > 0, §8.5), else the flags themselves.
    pub fn from_presence(present: Vec<bool>, prefix_eligible: &[bool]) -> Self {
        let leading = present
            .iter()
            .zip(prefix_eligible)
            .take_while(|(&p, &eligible)| p && eligible)
            .count();
        if present[leading..].iter().all(|&p| !p) {
            BlockMask::Offset(leading)
        } else {
            BlockMask::Bools(present)
        }
    }

    /// Checks a FinishWriteCache `success_blocks` mask against the session's `count` blocks:
    /// a vector must have exactly `count` entries (an empty one is valid for an empty session),
    /// an offset must not exceed `count`.
    pub fn check_len(&self, count: usize) -> Result<(), String> {
        match self {
            BlockMask::Offset(n) if *n > count => Err(format!(
                "success_blocks offset {n} exceeds the session's {count} blocks"
            )),
            BlockMask::Bools(values) if values.len() != count => Err(format!(
                "success_blocks has {} values, the session has {count} blocks",
                values.len()
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_in_both_forms() {
        let offset = BlockMask::Offset(2);
        assert!(offset.contains(0) && offset.contains(1) && !offset.contains(2));
        let bools = BlockMask::Bools(vec![false, true]);
        assert!(!bools.contains(0) && bools.contains(1) && !bools.contains(5));
        assert!(!BlockMask::default().contains(0));
    }

    #[test]
    fn presence_becomes_offset_only_for_pure_prefixes() {
        assert_eq!(
            BlockMask::from_presence(vec![], &[true; 3]),
            BlockMask::Offset(0)
        );
        assert_eq!(
            BlockMask::from_presence(vec![false, false], &[true; 3]),
            BlockMask::Offset(0)
        );
        assert_eq!(
            BlockMask::from_presence(vec![true, true, false], &[true; 3]),
            BlockMask::Offset(2)
        );
        assert_eq!(
            BlockMask::from_presence(vec![true, true], &[true; 3]),
            BlockMask::Offset(2)
        );
        assert_eq!(
            BlockMask::from_presence(vec![false, true], &[true; 3]),
            BlockMask::Bools(vec![false, true])
        );
        assert_eq!(
            BlockMask::from_presence(vec![true, true, false], &[true, false, true]),
            BlockMask::Bools(vec![true, true, false]),
            "a present block of weight 0 ends the prefix"
        );
    }

    #[test]
    fn finish_mask_length_rules() {
        assert!(BlockMask::Offset(3).check_len(3).is_ok());
        assert!(BlockMask::Offset(4).check_len(3).is_err());
        assert!(BlockMask::Bools(vec![true; 3]).check_len(3).is_ok());
        assert!(BlockMask::Bools(vec![true; 2]).check_len(3).is_err());
        assert!(BlockMask::Bools(vec![]).check_len(0).is_ok());
        assert!(BlockMask::Bools(vec![]).check_len(2).is_err());
        assert!(BlockMask::Offset(0).check_len(0).is_ok());
    }
}
