//! The operator's allow-list of file-tier roots (`kvcm.service.storage_root_allow_list`):
//! when set, AddStorage and UpdateStorage accept a file tier only if its root (NFS
//! `root_path`, 3FS and VCNS `mountpoint/root_dir`) lies in one of the listed directories.
//! Empty = every root that [`StorageConfig::validate`] accepts.
//!
//! Invariant: containment is decided on path components after dropping empty and `.`
//! components (`/data` allows `/data/kv` and `/data/`, never `/data2`); a listed prefix is
//! absolute and has no `..`, and [`StorageConfig::validate`] refuses `..` in a root, so a
//! root cannot leave a listed directory through its text.

use crate::{StorageConfig, StorageError, StorageSpec};

/// Directories file-tier roots must lie in; empty allows every valid root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedRoots(Vec<String>);

fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter(|part| !part.is_empty() && *part != ".")
}

impl AllowedRoots {
    /// Parses a comma-separated list of absolute directories (entries trimmed, empties
    /// dropped); the error names the bad entry.
    pub fn parse(text: &str) -> Result<AllowedRoots, String> {
        let mut prefixes = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if !entry.starts_with('/') {
                return Err(format!("{entry:?} is not an absolute path"));
            }
            if components(entry).any(|part| part == "..") {
                return Err(format!("{entry:?} contains \"..\""));
            }
            prefixes.push(entry.to_string());
        }
        Ok(AllowedRoots(prefixes))
    }

    /// No allow-list: every valid root is accepted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The listed directories.
    pub fn prefixes(&self) -> &[String] {
        &self.0
    }

    /// `root` lies in (or is) one of the listed directories.
    fn allows(&self, root: &str) -> bool {
        self.0.iter().any(|prefix| {
            let mut inside = components(root);
            components(prefix).all(|part| inside.next() == Some(part))
        })
    }

    /// Refuses `config` when it is a file tier whose root lies outside every listed
    /// directory (INVALID_ARGUMENT naming the field and the setting); other storages pass.
    pub fn check(&self, config: &StorageConfig) -> Result<(), StorageError> {
        let (field, root) = match &config.spec {
            StorageSpec::Nfs { root_path, .. } => ("storage_spec.root_path", root_path.clone()),
            StorageSpec::ThreeFs {
                mountpoint,
                root_dir,
                ..
            }
            | StorageSpec::VcnsThreeFs {
                mountpoint,
                root_dir,
                ..
            } => ("storage_spec.root_dir", format!("{mountpoint}/{root_dir}")),
            _ => return Ok(()),
        };
        if self.is_empty() || self.allows(&root) {
            return Ok(());
        }
        Err(StorageError::InvalidConfig(format!(
            "{field} {root:?} lies outside kvcm.service.storage_root_allow_list ({})",
            self.0.join(", ")
        )))
    }

    /// For a storage being added or updated: an NFS root without a trailing `/` (a prefix
    /// of file names in its parent) is refused when that parent lies outside every listed
    /// directory — `/data/kv` under a list of `/data/kv` would write under `/data/kv2/`.
    pub fn check_files_dir(&self, config: &StorageConfig) -> Result<(), StorageError> {
        let Some(dir) = crate::validate::nfs_prefix_dir(&config.spec) else {
            return Ok(());
        };
        if self.is_empty() || self.allows(&dir) {
            return Ok(());
        }
        Err(StorageError::InvalidConfig(format!(
            "storage_spec.root_path has no trailing '/', so its files lie in {dir:?}, outside \
             kvcm.service.storage_root_allow_list ({}); add the '/'",
            self.0.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{config, nfs};

    #[test]
    fn roots_must_lie_in_a_listed_directory_by_components() {
        let allowed = AllowedRoots::parse(" /data/kv , /mnt/x/ ,").unwrap();
        assert_eq!(allowed.prefixes(), ["/data/kv", "/mnt/x/"]);
        for root in [
            "/data/kv",
            "/data/kv/",
            "/data//kv/a",
            "/data/./kv/b",
            "/mnt/x",
        ] {
            assert!(allowed.check(&config(nfs(root))).is_ok(), "{root}");
        }
        for root in ["/data", "/data/kv2", "/data/k", "/tmp/kv", "/mnt"] {
            let error = allowed.check(&config(nfs(root))).unwrap_err().to_string();
            assert!(
                error.contains("storage_spec.root_path")
                    && error.contains("kvcm.service.storage_root_allow_list"),
                "{root}: {error}"
            );
        }
    }

    #[test]
    fn an_nfs_prefix_root_is_checked_on_the_directory_its_files_land_in() {
        let allowed = AllowedRoots::parse("/data/kv").unwrap();
        for root in ["/data/kv/", "/data/kv/prefix_", "/data/kv/a/b"] {
            assert!(
                allowed.check_files_dir(&config(nfs(root))).is_ok(),
                "{root}"
            );
        }
        // "/data/kv" passes the root check, but its files would lie in /data (as
        // /data/kv2/... for an instance "2").
        assert!(allowed.check(&config(nfs("/data/kv"))).is_ok());
        let error = allowed
            .check_files_dir(&config(nfs("/data/kv")))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("\"/data\"") && error.contains("add the '/'"),
            "{error}"
        );
        assert!(AllowedRoots::default()
            .check_files_dir(&config(nfs("/x")))
            .is_ok());
    }

    #[test]
    fn three_fs_is_checked_on_its_mountpoint_and_root_dir() {
        let allowed = AllowedRoots::parse("/mnt/3fs/kvcm").unwrap();
        let three_fs = |root_dir: &str| {
            config(StorageSpec::ThreeFs {
                cluster_name: "c".into(),
                mountpoint: "/mnt/3fs".into(),
                root_dir: root_dir.into(),
                key_count_per_file: 1,
                touch_file_when_create: false,
            })
        };
        assert!(allowed.check(&three_fs("kvcm/a")).is_ok());
        let error = allowed.check(&three_fs("other")).unwrap_err().to_string();
        assert!(error.contains("storage_spec.root_dir"), "{error}");
    }

    #[test]
    fn an_empty_list_allows_every_root_and_bad_entries_are_named() {
        assert!(AllowedRoots::default()
            .check(&config(nfs("/anywhere")))
            .is_ok());
        assert_eq!(AllowedRoots::parse(" , ").unwrap(), AllowedRoots::default());
        assert!(AllowedRoots::parse("/a,relative")
            .unwrap_err()
            .contains("\"relative\""));
        assert!(AllowedRoots::parse("/a/../b").unwrap_err().contains(".."));
    }
}
