//! Where one part's bytes go: a pool node's region or a file, from its location URI.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kvcm_data::{check_under_root, parse_block_uri, FileScheme};
use kvcm_storage::check_block_file_path;
use kvcm_storage::pool::PoolPartUri;

/// The place of one part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// In a pool node's region.
    Pool {
        /// The pool storage.
        storage: String,
        /// The node.
        node_id: String,
        /// Its incarnation the part was placed on.
        range_id: u64,
        /// Byte offset in the region.
        offset: u64,
    },
    /// In a file of the file tier.
    File {
        /// The file.
        path: PathBuf,
        /// Byte offset in it.
        offset: u64,
    },
}

/// Where the engine lets a server's file paths lead (the server names the path; the engine
/// decides where it writes). A path's existing directories are resolved (symlinks followed,
/// once per directory per batch) and the real path must lie outside the system directories
/// and, when roots are listed, under one of them (compared resolved too). The real path is
/// what is opened, with no symlink followed then (`kvcm_data::FileIo`), so a link planted
/// or swapped in on the storage leads nowhere else.
pub(crate) struct FilePolicy {
    roots: Vec<PathBuf>,
    real_dirs: HashMap<PathBuf, PathBuf>,
}

impl FilePolicy {
    /// The policy of an engine whose file roots are `roots`.
    pub(crate) fn new(roots: &[PathBuf]) -> FilePolicy {
        FilePolicy {
            roots: roots.iter().map(|root| resolve_existing(root)).collect(),
            real_dirs: HashMap::new(),
        }
    }

    /// The real path of the file `path` names, when the engine may use it.
    fn admit(&mut self, path: &Path) -> Result<PathBuf, String> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(format!("{path:?} names no file"));
        };
        let real_dir = self
            .real_dirs
            .entry(dir.to_path_buf())
            .or_insert_with(|| resolve_existing(dir));
        let real = real_dir.join(name);
        check_block_file_path(&real.to_string_lossy())?;
        let inside = |root: &PathBuf| check_under_root(&real, root).is_ok();
        if !self.roots.is_empty() && !self.roots.iter().any(inside) {
            let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
            return Err(format!(
                "{} lies outside the engine's file roots ({})",
                real.display(),
                roots.join(", ")
            ));
        }
        Ok(real)
    }
}

/// `path` with its deepest existing ancestor's symlinks resolved and the rest (directories
/// not made yet) appended as named.
fn resolve_existing(path: &Path) -> PathBuf {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return rest.iter().rev().fold(real, |real, part| real.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// The target of a part whose buffer is `len` bytes; the URI's size must equal it. A file
/// must pass `files` ([`FilePolicy`]); its target is the real path.
pub(crate) fn target_of(uri: &str, len: usize, files: &mut FilePolicy) -> Result<Target, String> {
    let (target, size) = if uri.starts_with("pace://") {
        let part = PoolPartUri::parse(uri).map_err(|e| e.to_string())?;
        let target = Target::Pool {
            storage: part.storage_name,
            node_id: part.node_id,
            range_id: part.range_id,
            offset: part.offset,
        };
        (target, part.size)
    } else {
        let block = parse_block_uri(uri).map_err(|e| e.to_string())?;
        debug_assert!(matches!(block.scheme, FileScheme::File | FileScheme::Hf3fs));
        let path = files
            .admit(&block.path)
            .map_err(|why| format!("{uri}: {why}"))?;
        let target = Target::File {
            path,
            offset: block.offset,
        };
        (target, block.size)
    };
    if size != len as u64 {
        return Err(format!(
            "{uri}: the buffer has {len} bytes, the location {size}"
        ));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_and_file_uris_route_and_sizes_must_match() {
        let pool = target_of(
            "pace://p/4096?media_type=2&node_id=n&range_id=9&size=16",
            16,
            &mut FilePolicy::new(&[]),
        );
        assert_eq!(
            pool,
            Ok(Target::Pool {
                storage: "p".into(),
                node_id: "n".into(),
                range_id: 9,
                offset: 4096
            })
        );
        let file = target_of(
            "file://nfs/tmp/a/b?blkid=2&size=1024",
            1024,
            &mut FilePolicy::new(&[]),
        );
        assert_eq!(
            file,
            Ok(Target::File {
                path: "/tmp/a/b".into(),
                offset: 2048
            })
        );
        assert!(target_of(
            "file://nfs/tmp/a/b?blkid=2&size=1024",
            1000,
            &mut FilePolicy::new(&[])
        )
        .is_err());
        assert!(target_of("mooncake://m/?key=a&size=1", 1, &mut FilePolicy::new(&[])).is_err());
        assert!(target_of("file://nfs/tmp/../etc?size=1", 1, &mut FilePolicy::new(&[])).is_err());
    }

    #[test]
    fn files_in_system_directories_or_outside_the_file_roots_are_refused() {
        for uri in [
            "file://x/proc/self/mem?blkid=0&size=1",
            "file://x/etc/cron.d/a?blkid=0&size=1",
            "file://x/usr/lib/a?blkid=0&size=1",
            "file://x/lib64/a?blkid=0&size=1",
        ] {
            let refused = target_of(uri, 1, &mut FilePolicy::new(&[])).unwrap_err();
            assert!(refused.contains("system directory"), "{refused}");
        }
        let roots = [PathBuf::from("/data/kv"), PathBuf::from("/mnt/3fs")];
        assert!(target_of(
            "file://nfs/data/kv/i/a?blkid=0&size=1",
            1,
            &mut FilePolicy::new(&roots)
        )
        .is_ok());
        assert!(target_of(
            "hf3fs://f/mnt/3fs/i/a?blkid=0&size=1",
            1,
            &mut FilePolicy::new(&roots)
        )
        .is_ok());
        for uri in [
            "file://nfs/data/kv2/a?blkid=0&size=1",
            "file://nfs/home/u/.ssh/authorized_keys?blkid=0&size=1",
            "file://nfs/data/kv?blkid=0&size=1",
        ] {
            let refused = target_of(uri, 1, &mut FilePolicy::new(&roots)).unwrap_err();
            assert!(refused.contains("file roots"), "{uri}: {refused}");
        }
    }

    /// A symlink on the storage (planted by a hostile server) is resolved before the
    /// checks: it cannot lead into a system directory or out of the file roots, while a
    /// root that is itself a link to the real mount works.
    #[test]
    fn symlinks_on_the_storage_lead_nowhere_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mount = dir.path().join("mount");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(mount.join("inst")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink("/etc", mount.join("inst/to-etc")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, mount.join("inst/out")).unwrap();
        let alias = dir.path().join("alias");
        std::os::unix::fs::symlink(&mount, &alias).unwrap();
        let uri = |path: &Path| format!("file://nfs{}?blkid=0&size=1", path.display());
        let mut open = FilePolicy::new(&[]);
        let refused = target_of(&uri(&mount.join("inst/to-etc/cron")), 1, &mut open).unwrap_err();
        assert!(refused.contains("system directory /etc"), "{refused}");
        let mut rooted = FilePolicy::new(std::slice::from_ref(&alias));
        let refused = target_of(&uri(&mount.join("inst/out/a")), 1, &mut rooted).unwrap_err();
        assert!(refused.contains("file roots"), "{refused}");
        // Through the alias root, into a directory not made yet: the real path is kept.
        let real = mount.canonicalize().unwrap().join("inst/new/a");
        assert_eq!(
            target_of(&uri(&alias.join("inst/new/a")), 1, &mut rooted),
            Ok(Target::File {
                path: real,
                offset: 0
            })
        );
    }
}
