//! An instance's registration as the manager stores it, and the checks it must pass.
//!
//! Invariant of a stored registration: names are usable as path components and URI parts
//! and at most `MAX_NAME_BYTES` long (one file-tier path component), sizes positive and
//! summing to at most [`MAX_BLOCK_BYTES`] per block, spec names unique, spec groups sorted
//! by name, each with at least one and sorted spec names that all name registered specs.

use std::collections::HashSet;

use kvcm_storage::{BlockSpec, MAX_NAME_BYTES};

use crate::error::{ManagerError, ManagerResult};

/// One registered inference instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceInfo {
    /// The quota group (filled from the group at registration).
    pub quota_group_name: String,
    /// The owning group.
    pub instance_group_name: String,
    /// Unique id.
    pub instance_id: String,
    /// Tokens per block.
    pub block_size: i32,
    /// The parts of every block, in registration order.
    pub specs: Vec<BlockSpec>,
    /// The model served.
    pub model: ModelDeployment,
    /// Named subsets of the parts.
    pub spec_groups: Vec<SpecGroup>,
    /// What a GetHostCacheState of type QT_UNSPECIFIED means for this instance (upstream
    /// trunk `default_query_type`; not part of the identity: a re-registration keeps the
    /// first one).
    pub default_query: DefaultQuery,
}

/// The query types an instance can name as its default (upstream trunk's `QueryType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DefaultQuery {
    /// None named.
    #[default]
    Unspecified,
    /// QT_BATCH_GET.
    BatchGet,
    /// QT_PREFIX_MATCH.
    PrefixMatch,
    /// QT_REVERSE_ROLL_SW_MATCH.
    ReverseRollSwMatch,
    /// QT_PREFIX_MATCH_WITH_MAMBA.
    PrefixMatchWithMamba,
}

/// The model an instance serves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelDeployment {
    /// Model name.
    pub model_name: String,
    /// KV data type.
    pub dtype: String,
    /// Multi-head latent attention.
    pub use_mla: bool,
    /// Tensor parallelism.
    pub tp_size: i32,
    /// Data parallelism.
    pub dp_size: i32,
    /// LoRA adapter.
    pub lora_name: String,
    /// Pipeline parallelism.
    pub pp_size: i32,
    /// Free-form extra identity.
    pub extra: String,
    /// Opaque text (not part of the identity).
    pub user_data: String,
    /// Upstream trunk's EaglePop mode: GetHostCacheState answers each host's prefix one
    /// block shorter.
    pub use_eagle_pop: bool,
}

/// A named subset of an instance's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecGroup {
    /// Group name.
    pub name: String,
    /// Names of its parts.
    pub spec_names: Vec<String>,
}

impl InstanceInfo {
    /// The stored form of a registration: checked, spec groups normalised.
    pub fn validated(mut self) -> ManagerResult<InstanceInfo> {
        let names = std::iter::once(("instance_id", &self.instance_id))
            .chain(std::iter::once((
                "instance_group",
                &self.instance_group_name,
            )))
            .chain(
                self.specs
                    .iter()
                    .map(|s| ("location_spec_infos.name", &s.name)),
            );
        bounded_names(names)?;
        let checks = [
            (self.instance_group_name.is_empty(), "instance_group"),
            (!usable_name(&self.instance_id), "instance_id"),
            (self.block_size <= 0, "block_size"),
            (
                self.model.model_name.is_empty(),
                "model_deployment.model_name",
            ),
            (self.model.dtype.is_empty(), "model_deployment.dtype"),
            (
                self.specs.is_empty() || self.specs.len() > usize::from(u16::MAX),
                "location_spec_infos",
            ),
            (
                !self.specs.iter().all(|s| usable_name(&s.name)),
                "location_spec_infos.name",
            ),
            (
                self.specs.iter().any(|s| s.size <= 0),
                "location_spec_infos.size",
            ),
            (
                has_repeats(self.specs.iter().map(|s| &s.name)),
                "location_spec_infos.name (repeated)",
            ),
        ];
        if let Some((_, field)) = checks.iter().find(|(failed, _)| *failed) {
            return Err(ManagerError::invalid(field));
        }
        if !within_block_bound(&self.specs) {
            return Err(ManagerError::invalid_because(
                "location_spec_infos.size",
                format!("the sizes of a block's specs sum to more than {MAX_BLOCK_BYTES} bytes"),
            ));
        }
        self.spec_groups =
            normalised_spec_groups(std::mem::take(&mut self.spec_groups), &self.specs)
                .ok_or_else(|| ManagerError::invalid("location_spec_groups"))?;
        Ok(self)
    }

    /// The first field (as the request names it) in which a re-registration's identity
    /// differs from this one; `None` for the same identity. The identity is everything but
    /// the group, the quota group and `model.user_data`.
    pub fn identity_difference(&self, other: &InstanceInfo) -> Option<&'static str> {
        let model = |info: &InstanceInfo| ModelDeployment {
            user_data: String::new(),
            ..info.model.clone()
        };
        [
            (self.block_size != other.block_size, "block_size"),
            (self.specs != other.specs, "location_spec_infos"),
            (model(self) != model(other), "model_deployment"),
            (
                self.spec_groups != other.spec_groups,
                "location_spec_groups",
            ),
        ]
        .into_iter()
        .find_map(|(differs, field)| differs.then_some(field))
    }
}

/// Whether a name can be a path component and a URI host/path part: non-empty, not `.` or
/// `..`, without `/ ? # & =`, white space or control characters (the storage backends build
/// paths and URIs from instance ids and spec names).
pub fn usable_name(name: &str) -> bool {
    let breaks_uris = |c: char| matches!(c, '/' | '?' | '#' | '&' | '=');
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| breaks_uris(c) || c.is_whitespace() || c.is_control())
}

/// The most bytes one block may have: the sum of an instance's spec sizes is at most 2^32
/// (4 GiB, far above any KV block), so that 2^31 blocks of one instance — more than any
/// index holds — still sum below `i64::MAX`, and quota arithmetic stays exact.
pub const MAX_BLOCK_BYTES: i64 = 1 << 32;

/// Whether the specs' sizes sum to at most [`MAX_BLOCK_BYTES`].
fn within_block_bound(specs: &[BlockSpec]) -> bool {
    specs
        .iter()
        .try_fold(0i64, |sum, s| sum.checked_add(s.size))
        .is_some_and(|total| total <= MAX_BLOCK_BYTES)
}

/// Refuses the first name longer than a path component, naming its field and the limit.
pub fn bounded_names<'a>(
    mut names: impl Iterator<Item = (&'static str, &'a String)>,
) -> ManagerResult<()> {
    match names.find(|(_, name)| name.len() > MAX_NAME_BYTES) {
        None => Ok(()),
        Some((field, name)) => Err(ManagerError::invalid_because(
            field,
            format!(
                "{} bytes exceed the limit of {MAX_NAME_BYTES} bytes (one path component)",
                name.len()
            ),
        )),
    }
}

/// Whether some item occurs twice.
fn has_repeats<'a>(mut items: impl Iterator<Item = &'a String>) -> bool {
    let mut seen = HashSet::new();
    !items.all(|item| seen.insert(item))
}

/// Spec groups sorted by name with sorted spec names; `None` when a group has no name, no
/// spec, or names a spec that is not registered (so every stored block has a part).
fn normalised_spec_groups(
    mut groups: Vec<SpecGroup>,
    specs: &[BlockSpec],
) -> Option<Vec<SpecGroup>> {
    let registered: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let known = |name: &String| registered.contains(name.as_str());
    for group in &mut groups {
        group.spec_names.sort();
        if group.name.is_empty()
            || group.spec_names.is_empty()
            || !group.spec_names.iter().all(known)
        {
            return None;
        }
    }
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    Some(groups)
}
