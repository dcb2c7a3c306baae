//! `StorageConfig::validate`: the checks of AddStorage (§16.1), each error naming its field.
//!
//! Beyond the reference: the storage name must be usable as a URI host, paths that become
//! URI paths must be absolute, and port / protocol values must be in range. A file tier's
//! root (NFS `root_path`, 3FS `mountpoint` and `mountpoint/root_dir`) is never `/` or a
//! system directory (`/proc`, `/sys`, `/dev`, `/etc`, `/boot`, `/bin`, `/sbin`, `/lib*`,
//! `/usr`) or a path under one; temporary directories stay allowed.

use crate::names::check_name;
use crate::{ReportTimings, StorageConfig, StorageError, StorageSpec};

fn required(field: &str, value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{field} is empty"));
    }
    Ok(())
}

fn absolute_path(field: &str, value: &str) -> Result<(), String> {
    required(field, value)?;
    if !value.starts_with('/') {
        return Err(format!("{field} {value:?} is not an absolute path"));
    }
    let breaks_uri = |c: char| c == '?' || c == '#' || c.is_whitespace() || c.is_control();
    if let Some(bad) = value.chars().find(|&c| breaks_uri(c)) {
        return Err(format!("{field} {value:?} contains the character {bad:?}"));
    }
    if value.split('/').any(|part| part == "..") {
        return Err(format!("{field} {value:?} contains \"..\""));
    }
    Ok(())
}

/// Top-level directories no storage root may be or lie under (besides `/` and `/lib*`).
const SYSTEM_DIRS: [&str; 8] = ["proc", "sys", "dev", "etc", "boot", "bin", "sbin", "usr"];

/// A block file a client may read or write at a server's word: absolute, free of `..`,
/// and not under a system directory (the rule storage roots follow), so a server's URI
/// cannot aim an engine's writes at `/etc`, `/dev` or `/proc`.
pub fn check_block_file_path(path: &str) -> Result<(), String> {
    storage_root("the block file", path)
}

/// An absolute path that is not `/`, a system directory or under one.
fn storage_root(field: &str, value: &str) -> Result<(), String> {
    absolute_path(field, value)?;
    let mut parts = value
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".");
    let Some(top) = parts.next() else {
        return Err(format!("{field} {value:?} is the file system root"));
    };
    if SYSTEM_DIRS.contains(&top) || top.starts_with("lib") {
        return Err(format!(
            "{field} {value:?} lies in the system directory /{top}"
        ));
    }
    Ok(())
}

/// Where an NFS root without a trailing `/` puts its files: in its parent (the root is a
/// prefix of their names, so `/e` with instance `tc` writes under `/etc/`). That directory
/// must pass the checks a root passes; `None` for every other root.
pub(crate) fn nfs_prefix_dir(spec: &StorageSpec) -> Option<String> {
    match spec {
        StorageSpec::Nfs { root_path, .. } if !root_path.ends_with('/') => Some(
            crate::backends::nfs_anchor(root_path)
                .to_string_lossy()
                .into_owned(),
        ),
        _ => None,
    }
}

fn check_spec(spec: &StorageSpec) -> Result<(), String> {
    match spec {
        StorageSpec::Nfs { root_path, .. } => storage_root("storage_spec.root_path", root_path),
        StorageSpec::ThreeFs {
            mountpoint,
            root_dir,
            ..
        } => {
            storage_root("storage_spec.mountpoint", mountpoint)?;
            required("storage_spec.root_dir", root_dir)?;
            absolute_path("storage_spec.root_dir", &format!("/{root_dir}"))?;
            storage_root("storage_spec.root_dir", &format!("{mountpoint}/{root_dir}"))
        }
        StorageSpec::VcnsThreeFs {
            mountpoint,
            root_dir,
            remote_host,
            remote_port,
            meta_storage_uri,
        } => {
            storage_root("storage_spec.mountpoint", mountpoint)?;
            required("storage_spec.root_dir", root_dir)?;
            required("storage_spec.remote_host", remote_host)?;
            if !(1..=65_535).contains(remote_port) {
                return Err(format!(
                    "storage_spec.remote_port {remote_port} is not a port"
                ));
            }
            required("storage_spec.meta_storage_uri", meta_storage_uri)
        }
        StorageSpec::Mooncake { .. } => check_mooncake(spec),
        StorageSpec::TairMemPool {
            domain,
            service_discovery_url,
            media_type,
            ..
        } => {
            required("storage_spec.domain", domain)?;
            check_discovery_url(service_discovery_url)?;
            check_media_type(*media_type)
        }
        StorageSpec::Dummy { root_path, .. } => absolute_path("storage_spec.root_path", root_path),
        StorageSpec::EventReport { timings, .. } => check_timings(timings),
    }
}

/// A pool's discovery URL: empty, or `vipserver://`, `spectrum://` or `static://` with
/// something after the scheme (`static://` a comma-separated list of `host:port`).
fn check_discovery_url(url: &str) -> Result<(), String> {
    const FIELD: &str = "storage_spec.service_discovery_url";
    if url.is_empty() {
        return Ok(());
    }
    let rest = ["vipserver://", "spectrum://", "static://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme).map(|rest| (*scheme, rest)));
    let Some((scheme, rest)) = rest else {
        return Err(format!(
            "{FIELD} {url:?} must start with vipserver://, spectrum:// or static://"
        ));
    };
    if rest.trim().is_empty() {
        return Err(format!("{FIELD} {url:?} names nothing after {scheme}"));
    }
    if scheme == "static://" {
        let bad = rest.split(',').find(|hp| {
            hp.rsplit_once(':')
                .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        });
        if let Some(bad) = bad {
            return Err(format!("{FIELD}: {bad:?} is not host:port"));
        }
    }
    Ok(())
}

/// A pool's medium: 0 (unset) or 2 (DRAM); 5 (SSD) belongs to ST_TAIRMEMPOOL_SSD.
fn check_media_type(media_type: i32) -> Result<(), String> {
    match media_type {
        0 | 2 => Ok(()),
        5 => Err("storage_spec.media_type 5 (SSD) needs storage type ST_TAIRMEMPOOL_SSD, which kvcm does not serve".into()),
        other => Err(format!("storage_spec.media_type {other} is not 0 (unset) or 2 (DRAM)")),
    }
}

/// Every timing is positive (a wire 0 was replaced by its default before) and at most a day.
fn check_timings(timings: &ReportTimings) -> Result<(), String> {
    const DAY_MS: u64 = 86_400_000;
    let fields = [
        ("heartbeat_timeout_ms", timings.heartbeat_timeout_ms),
        ("cleanup_grace_ms", timings.cleanup_grace_ms),
        (
            "liveness_check_interval_ms",
            timings.liveness_check_interval_ms,
        ),
        ("snapshot_min_interval_ms", timings.snapshot_min_interval_ms),
        (
            "snapshot_delta_drain_timeout_ms",
            timings.snapshot_delta_drain_timeout_ms,
        ),
    ];
    match fields.iter().find(|(_, ms)| !(1..=DAY_MS).contains(ms)) {
        Some((field, ms)) => Err(format!(
            "storage_spec.{field} {ms} is not between 1 and {DAY_MS} ms"
        )),
        None => Ok(()),
    }
}

fn check_mooncake(spec: &StorageSpec) -> Result<(), String> {
    let StorageSpec::Mooncake {
        local_hostname,
        metadata_connstring,
        protocol,
        rdma_device,
        master_service_entry,
    } = spec
    else {
        return Ok(());
    };
    required("storage_spec.local_hostname", local_hostname)?;
    required("storage_spec.metadata_connstring", metadata_connstring)?;
    required("storage_spec.master_service_entry", master_service_entry)?;
    match protocol.as_str() {
        "tcp" => Ok(()),
        "rdma" => required("storage_spec.rdma_device (protocol rdma)", rdma_device),
        other => Err(format!(
            "storage_spec.protocol {other:?} is neither \"rdma\" nor \"tcp\""
        )),
    }
}

impl StorageConfig {
    /// Checks the name and the backend settings; the error names the first bad field.
    pub fn validate(&self) -> Result<(), StorageError> {
        check_name("global_unique_name", &self.global_unique_name)
            .and_then(|()| check_spec(&self.spec))
            .map_err(StorageError::InvalidConfig)
    }

    /// For a storage being added or updated (not one restored from the journal, which was
    /// accepted before this check existed): an NFS root without a trailing `/` is refused
    /// when the directory its files land in is `/` or a system directory.
    pub fn validate_files_dir(&self) -> Result<(), StorageError> {
        let Some(dir) = nfs_prefix_dir(&self.spec) else {
            return Ok(());
        };
        storage_root("storage_spec.root_path", &dir).map_err(|why| {
            StorageError::InvalidConfig(format!(
                "{why}: storage_spec.root_path has no trailing '/', so it is a prefix of \
                 file names in {dir:?} (add the '/' to keep its files inside it)"
            ))
        })
    }
}

#[cfg(test)]
mod tests;
