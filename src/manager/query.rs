//! Result shapes of the three query types (wire fact sheet §11), over per-key lookups that
//! were already resolved to "the readable location chosen for this key" or a miss.

use crate::proto::meta;

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

/// One entry per key: hits as found, misses replaced by `placeholder`.
pub fn batch_get(
    found: Vec<Option<meta::CacheLocation>>,
    placeholder: &meta::CacheLocation,
) -> Vec<meta::CacheLocation> {
    found
        .into_iter()
        .map(|hit| hit.unwrap_or_else(|| placeholder.clone()))
        .collect()
}

/// The leading run of hits (lookups after the first miss are never evaluated).
pub fn prefix_match(
    found: impl IntoIterator<Item = Option<meta::CacheLocation>>,
) -> Vec<meta::CacheLocation> {
    found.into_iter().map_while(|hit| hit).collect()
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

/// One entry per key: the right-most fully readable window keeps its locations, every other
/// position is a placeholder. `sw_size` must be in 1..=found.len() (validated by the caller).
pub fn sliding_window(
    found: Vec<Option<meta::CacheLocation>>,
    sw_size: usize,
    placeholder: &meta::CacheLocation,
) -> Vec<meta::CacheLocation> {
    let hits: Vec<bool> = found.iter().map(Option::is_some).collect();
    let window = rightmost_full_window(&hits, sw_size).map(|start| start..start + sw_size);
    found
        .into_iter()
        .enumerate()
        .map(|(i, hit)| match (&window, hit) {
            (Some(range), Some(location)) if range.contains(&i) => location,
            _ => placeholder.clone(),
        })
        .collect()
}

/// Keeps only the spec entries named in `names` (all when `names` is empty); `spec_size` is
/// left as stored.
pub fn filter_specs(locations: &mut [meta::CacheLocation], names: &[String]) {
    if names.is_empty() {
        return;
    }
    for location in locations {
        location
            .location_specs
            .retain(|spec| names.contains(&spec.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(uri: &str) -> Option<meta::CacheLocation> {
        Some(meta::CacheLocation {
            r#type: meta::StorageType::StNfs as i32,
            spec_size: 1,
            location_specs: vec![meta::LocationSpec {
                name: "tp0".into(),
                uri: uri.into(),
            }],
        })
    }

    fn uris(locations: &[meta::CacheLocation]) -> Vec<&str> {
        locations
            .iter()
            .map(|l| l.location_specs[0].uri.as_str())
            .collect()
    }

    fn placeholder() -> meta::CacheLocation {
        meta::CacheLocation {
            r#type: 0,
            spec_size: 1,
            location_specs: vec![meta::LocationSpec {
                name: "tp0".into(),
                uri: String::new(),
            }],
        }
    }

    #[test]
    fn prefix_stops_at_first_miss() {
        let found = vec![hit("a"), hit("b"), None, hit("d")];
        assert_eq!(uris(&prefix_match(found)), vec!["a", "b"]);
        assert!(prefix_match(vec![None, hit("b")]).is_empty());
    }

    #[test]
    fn batch_pads_misses() {
        let found = vec![None, hit("b")];
        assert_eq!(uris(&batch_get(found, &placeholder())), vec!["", "b"]);
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
        let found = vec![hit("a"), hit("b"), hit("c"), None];
        let result = sliding_window(found, 2, &placeholder());
        assert_eq!(uris(&result), vec!["", "b", "c", ""]);
    }

    #[test]
    fn spec_filter_keeps_spec_size() {
        let mut locations = vec![hit("a").unwrap()];
        filter_specs(&mut locations, &["tp1".to_string()]);
        assert!(locations[0].location_specs.is_empty());
        assert_eq!(locations[0].spec_size, 1);
    }
}
