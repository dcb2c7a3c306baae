//! GetCacheLocationsByBackend (upstream trunk §3.7): wire ⇄ domain and the request's shape
//! rules; the choice is `kvcm_manager::reports::by_backend`'s.

use kvcm_manager::reports::{BackendQuery, BackendSelector, ChosenLocation, SelectStrategy};
use kvcm_manager::{ManagerError, StorageType};

use super::convert::{location_to_wire, mask_from_wire};
use super::meta::{take_ids, MetaHandler};
use super::rpcs;
use super::wire_admin::{storage_type, storage_type_number};
use crate::proto::meta::{self, LocationSelectStrategy as Lss};

/// Most backend selectors in one request (storage types times strategies are fewer; each
/// selector may add a location per key and spec to the answer).
pub const MAX_BACKEND_SELECTORS: usize = 16;

impl MetaHandler {
    /// GetCacheLocationsByBackend: QT_BATCH_GET only; `location_spec_names` empty or one
    /// non-empty name per key; 1 to [`MAX_BACKEND_SELECTORS`] selectors, each of a known storage type and
    /// strategy (V6D strategies for event-report types only).
    pub fn get_cache_locations_by_backend(
        &self,
        mut request: meta::GetCacheLocationsByBackendRequest,
    ) -> meta::GetCacheLocationsByBackendResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        let rpc = &rpcs::meta::GET_CACHE_LOCATIONS_BY_BACKEND;
        core.instance_call(rpc, &trace_id, &instance_id, |instance| {
            if request.query_type != meta::QueryType::QtBatchGet as i32 {
                return Err(ManagerError::invalid_because(
                    "query_type",
                    format!("{}: only QT_BATCH_GET is served", request.query_type),
                ));
            }
            mask_from_wire(request.block_mask.as_ref(), "block_mask")?;
            let count = request.backend_selectors.len();
            if count == 0 || count > MAX_BACKEND_SELECTORS {
                return Err(ManagerError::invalid_because(
                    "backend_selectors",
                    format!("{count} selectors: give 1 to {MAX_BACKEND_SELECTORS}"),
                ));
            }
            let selectors = request
                .backend_selectors
                .iter()
                .map(selector_from_wire)
                .collect::<Result<Vec<_>, _>>()?;
            let keys = core.located_keys_times(
                &instance,
                request.block_keys,
                &request.token_ids,
                selectors.len(),
            )?;
            let names = &request.location_spec_names;
            if !names.is_empty()
                && (names.len() != keys.len() || names.iter().any(String::is_empty))
            {
                return Err(ManagerError::invalid_because(
                    "location_spec_names",
                    format!(
                        "{} names for {} keys: give one non-empty name per key, or none",
                        names.len(),
                        keys.len()
                    ),
                ));
            }
            let query = BackendQuery {
                keys: &keys,
                spec_names: names,
                selectors: &selectors,
            };
            let answers = core.manager.locations_by_backend(&instance, query)?;
            let key_locations = answers.into_iter().map(|chosen| meta::CacheLocationVector {
                locations: chosen
                    .into_iter()
                    .map(|c| chosen_to_wire(&instance, c))
                    .collect(),
            });
            let reply = meta::GetCacheLocationsByBackendResponse {
                header: None,
                key_locations: key_locations.collect(),
            };
            Ok((reply, "Cache locations retrieved successfully".into()))
        })
    }
}

fn selector_from_wire(
    selector: &meta::BackendLocationSelector,
) -> Result<BackendSelector, ManagerError> {
    let field = "backend_selectors.backend_type";
    let storage_type = storage_type(selector.backend_type, field)?;
    if storage_type == StorageType::Unspecified {
        return Err(ManagerError::invalid_because(field, "ST_UNSPECIFIED"));
    }
    let strategy = match Lss::try_from(selector.strategy) {
        Ok(Lss::LssUnspecified | Lss::LssWeightedRandom) => SelectStrategy::WeightedRandom,
        Ok(Lss::LssV6dPrefix) => SelectStrategy::Prefix,
        Ok(Lss::LssV6dCoverage) => SelectStrategy::Coverage,
        Err(_) => {
            return Err(ManagerError::invalid_because(
                "backend_selectors.strategy",
                format!("{} is not a LocationSelectStrategy", selector.strategy),
            ))
        }
    };
    if strategy != SelectStrategy::WeightedRandom && !storage_type.is_event_report() {
        return Err(ManagerError::invalid_because(
            "backend_selectors.strategy",
            "LSS_V6D_PREFIX / LSS_V6D_COVERAGE choose among reporters: event-report types only",
        ));
    }
    Ok(BackendSelector {
        storage_type,
        strategy,
    })
}

/// The wire location of a chosen one; `spec_size` counts the answered specs (upstream M).
fn chosen_to_wire(
    instance: &kvcm_manager::Instance,
    chosen: ChosenLocation,
) -> meta::CacheLocation {
    let mut location = match chosen {
        ChosenLocation::Stored(stored) => location_to_wire(instance, stored),
        ChosenLocation::Reported {
            storage_type,
            specs,
        } => meta::CacheLocation {
            r#type: storage_type_number(storage_type),
            spec_size: 0,
            location_specs: specs
                .into_iter()
                .map(|(name, uri)| meta::LocationSpec {
                    name,
                    uri,
                    checksum: None,
                })
                .collect(),
        },
    };
    location.spec_size = i32::try_from(location.location_specs.len()).unwrap_or(i32::MAX);
    location
}
