//! Result shapes of the three query types (wire fact sheet §11), over per-key lookups that
//! were already resolved to "the readable location chosen for this key" or a miss. Misses
//! stay `None`; the edge renders them as the reference's placeholders.

/// The three GetCacheLocation query types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryKind {
    /// One entry per key; misses are placeholders.
    BatchGet,
    /// The readable run starting at the first unmasked key; no placeholders.
    PrefixMatch,
    /// The right-most fully readable window of `sw_size` keys; the rest placeholders.
    SlidingWindow {
        /// Window length in blocks (1..=number of keys).
        sw_size: usize,
    },
}

/// The leading run of hits (lookups after the first miss are never evaluated).
pub fn prefix_match<T>(found: impl IntoIterator<Item = Option<T>>) -> Vec<T> {
    found.into_iter().map_while(|hit| hit).collect()
}

/// How many of `found` a prefix match keeps: the length of its leading run of hits (the
/// in-place form of [`prefix_match`]).
pub fn prefix_len<T>(found: &[Option<T>]) -> usize {
    found.iter().take_while(|hit| hit.is_some()).count()
}

/// Start of the right-most window of `sw_size` consecutive hits, scanning windows from the
/// right end; after a miss at position p the next candidate window ends just before p.
pub fn rightmost_full_window(hits: &[bool], sw_size: usize) -> Option<usize> {
    let mut end = hits.len();
    while sw_size > 0 && end >= sw_size {
        let start = end - sw_size;
        match hits[start..end].iter().rposition(|&hit| !hit) {
            None => return Some(start),
            Some(miss) => end = start + miss,
        }
    }
    None
}

/// One entry per key: the right-most fully readable window keeps its hits, every other
/// position is a miss. `sw_size` must be in 1..=found.len() (validated by the caller).
pub fn sliding_window<T>(found: Vec<Option<T>>, sw_size: usize) -> Vec<Option<T>> {
    let hits: Vec<bool> = found.iter().map(Option::is_some).collect();
    let window = rightmost_full_window(&hits, sw_size).map(|start| start..start + sw_size);
    found
        .into_iter()
        .enumerate()
        .map(|(i, hit)| hit.filter(|_| window.as_ref().is_some_and(|w| w.contains(&i))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_stops_at_first_miss() {
        let found = vec![Some("a"), Some("b"), None, Some("d")];
        assert_eq!(prefix_match(found), vec!["a", "b"]);
        assert!(prefix_match(vec![None, Some("b")]).is_empty());
    }

    #[test]
    fn window_skips_past_misses_from_the_right() {
        // hits:      0 1 2 3 4 5
        let hits = [true, true, true, false, true, false];
        assert_eq!(rightmost_full_window(&hits, 2), Some(1));
        assert_eq!(rightmost_full_window(&hits, 1), Some(4));
        assert_eq!(rightmost_full_window(&hits, 4), None);
        assert_eq!(rightmost_full_window(&hits, 0), None);
        assert_eq!(rightmost_full_window(&[true; 3], 3), Some(0));
    }

    #[test]
    fn window_result_has_one_entry_per_key() {
        let found = vec![Some("a"), Some("b"), Some("c"), None];
        assert_eq!(
            sliding_window(found, 2),
            vec![None, Some("b"), Some("c"), None]
        );
    }
}
