//! The read paths: GetCacheLocation (three query types, masks, replica choice) and
//! GetCacheMeta. Lookups are one batch `get` on the index; entries are shared, never decoded.

use kvcm_index::BlockKey;

use super::entry::{Entry, LocationState};
use super::error::{invalid, ManagerResult};
use super::instance::Instance;
use super::mask::BlockMask;
use super::query::{self, QueryKind};
use super::storages::ReadWeights;
use super::Manager;
use crate::proto::meta;

/// GetCacheMeta's answer: one location and one status JSON per unmasked key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheMeta {
    /// A stored location of the key in any state, or an empty location.
    pub locations: Vec<meta::CacheLocation>,
    /// `{"id":..,"status":"CLS_.."}` or `{"status":"CLS_NOT_FOUND"}`.
    pub metas: Vec<String>,
}

impl Manager {
    /// Readable locations of `keys` (wire fact sheet §11). The mask applies to prefix match
    /// only; `spec_names`, when non-empty, filters the spec entries of every result.
    pub fn get_cache_location(
        &self,
        instance: &Instance,
        kind: QueryKind,
        keys: &[BlockKey],
        mask: &BlockMask,
        spec_names: &[String],
    ) -> ManagerResult<Vec<meta::CacheLocation>> {
        if let QueryKind::SlidingWindow { sw_size } = kind {
            if sw_size == 0 || sw_size > keys.len() {
                return Err(invalid("GetCacheLocation", "sw_size"));
            }
        }
        let group = self.shared_group(instance.group());
        let candidates = group
            .as_deref()
            .map_or(&[][..], |g| g.storage_candidates.as_slice());
        let weights = self.storages.read_weights(candidates)?;
        let mut locations = match kind {
            QueryKind::PrefixMatch => {
                let unmasked: Vec<BlockKey> = unmasked_keys(keys, mask);
                let entries = instance.index.get(&unmasked)?;
                query::prefix_match(entries.iter().map(|e| readable(e.as_ref(), &weights)))
            }
            QueryKind::BatchGet | QueryKind::SlidingWindow { .. } => {
                let entries = instance.index.get(keys)?;
                let found = entries
                    .iter()
                    .map(|e| readable(e.as_ref(), &weights))
                    .collect();
                match kind {
                    QueryKind::SlidingWindow { sw_size } => {
                        query::sliding_window(found, sw_size, instance.placeholder())
                    }
                    _ => query::batch_get(found, instance.placeholder()),
                }
            }
        };
        query::filter_specs(&mut locations, spec_names);
        Ok(locations)
    }

    /// Raw location and status of every unmasked key, in order.
    pub fn get_cache_meta(
        &self,
        instance: &Instance,
        keys: &[BlockKey],
        mask: &BlockMask,
    ) -> ManagerResult<CacheMeta> {
        let unmasked = unmasked_keys(keys, mask);
        let entries = instance.index.get(&unmasked)?;
        let mut answer = CacheMeta::default();
        for entry in entries {
            match entry.as_ref().and_then(|e| e.locations.first()) {
                Some(location) => {
                    answer.locations.push(location.cache_location.clone());
                    answer.metas.push(
                        serde_json::json!({"id": &*location.id, "status": location.state.status_name()})
                            .to_string(),
                    );
                }
                None => {
                    answer.locations.push(meta::CacheLocation::default());
                    answer
                        .metas
                        .push(r#"{"status":"CLS_NOT_FOUND"}"#.to_string());
                }
            }
        }
        Ok(answer)
    }
}

/// The keys whose positions are not in the mask, in order.
fn unmasked_keys(keys: &[BlockKey], mask: &BlockMask) -> Vec<BlockKey> {
    keys.iter()
        .enumerate()
        .filter(|(i, _)| !mask.contains(*i))
        .map(|(_, &key)| key)
        .collect()
}

/// The readable location chosen for a key: among SERVING locations of positive weight, one
/// drawn at random in proportion to its weight.
fn readable(entry: Option<&Entry>, weights: &ReadWeights<'_>) -> Option<meta::CacheLocation> {
    let entry = entry?;
    let weighted = entry
        .locations
        .iter()
        .filter(|l| l.state == LocationState::Serving)
        .map(|l| (l, weights.weight(l)))
        .filter(|(_, w)| *w > 0);
    let mut chosen = None;
    let mut total = 0u32;
    for (location, weight) in weighted {
        // Weighted reservoir sampling: keep this one with probability weight / total.
        total += weight;
        if fastrand::u32(..total) < weight {
            chosen = Some(location);
        }
    }
    chosen.map(|l| l.cache_location.clone())
}
