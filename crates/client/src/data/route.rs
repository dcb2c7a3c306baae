//! Where one part's bytes go: a pool node's region or a file, from its location URI.

use std::path::PathBuf;

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

/// The target of a part whose buffer is `len` bytes; the URI's size must equal it. A file
/// must lie outside the system directories and, when `file_roots` lists directories, under
/// one of them (the server names the path; the engine decides where it writes).
pub(crate) fn target_of(uri: &str, len: usize, file_roots: &[PathBuf]) -> Result<Target, String> {
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
        check_block_file_path(&block.path.to_string_lossy()).map_err(|e| format!("{uri}: {e}"))?;
        let inside = |root: &PathBuf| check_under_root(&block.path, root).is_ok();
        if !file_roots.is_empty() && !file_roots.iter().any(inside) {
            return Err(format!(
                "{uri}: the file lies outside the engine's file roots ({})",
                file_roots
                    .iter()
                    .map(|root| root.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let target = Target::File {
            path: block.path,
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
            &[],
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
        let file = target_of("file://nfs/tmp/a/b?blkid=2&size=1024", 1024, &[]);
        assert_eq!(
            file,
            Ok(Target::File {
                path: "/tmp/a/b".into(),
                offset: 2048
            })
        );
        assert!(target_of("file://nfs/tmp/a/b?blkid=2&size=1024", 1000, &[]).is_err());
        assert!(target_of("mooncake://m/?key=a&size=1", 1, &[]).is_err());
        assert!(target_of("file://nfs/tmp/../etc?size=1", 1, &[]).is_err());
    }

    #[test]
    fn files_in_system_directories_or_outside_the_file_roots_are_refused() {
        for uri in [
            "file://x/proc/self/mem?blkid=0&size=1",
            "file://x/etc/cron.d/a?blkid=0&size=1",
            "file://x/usr/lib/a?blkid=0&size=1",
            "file://x/lib64/a?blkid=0&size=1",
        ] {
            let refused = target_of(uri, 1, &[]).unwrap_err();
            assert!(refused.contains("system directory"), "{refused}");
        }
        let roots = [PathBuf::from("/data/kv"), PathBuf::from("/mnt/3fs")];
        assert!(target_of("file://nfs/data/kv/i/a?blkid=0&size=1", 1, &roots).is_ok());
        assert!(target_of("hf3fs://f/mnt/3fs/i/a?blkid=0&size=1", 1, &roots).is_ok());
        for uri in [
            "file://nfs/data/kv2/a?blkid=0&size=1",
            "file://nfs/home/u/.ssh/authorized_keys?blkid=0&size=1",
            "file://nfs/data/kv?blkid=0&size=1",
        ] {
            let refused = target_of(uri, 1, &roots).unwrap_err();
            assert!(refused.contains("file roots"), "{uri}: {refused}");
        }
    }
}
