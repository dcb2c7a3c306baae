//! The `file` (NFS or local directory) and `hf3fs` (3FS mount) backends: blocks packed into
//! few big files under a base path (see `packing`), freed by punching holes.
//!
//! The base is the string every object name is appended to: NFS `root_path` verbatim (plain
//! concatenation, §14); 3FS `mountpoint/root_dir/` (a filesystem join). Allocation creates
//! the files' directories (one seen to exist within the last second is not looked up again:
//! `KnownDirs`) and, with `touch_file_when_create`, the empty files.
//!
//! Delete punches the block's hole and unlinks the file once no block of it is allocated any
//! more (`live_blocks`). Only allocations kvcm tracks are ever freed: a delete of a block
//! whose file is not tracked (never allocated by this process, nor adopted from the journal
//! on recovery) touches nothing, and an allocation refuses a file that exists untracked
//! (`StorageError::Foreign`) instead of writing into someone else's bytes.
//!
//! An unlink that fails (an I/O error, a mount gone read-only) leaves the file tracked with
//! no block held; it is tried again after each healthy probe (up to [`RETRIES_PER_PROBE`]
//! files a probe) until it succeeds or an allocation takes a block of the file again. Not
//! retried: across a restart (the journal holds no record of such a file), by a backend an
//! UpdateStorage or RemoveStorage replaced (no longer probed), or with probes off.
//!
//! A storage whose file system went away (an unmount leaves a bare mount point) is told by
//! the identity its first healthy probe read in `.kvcm/id` under the anchor: while that is
//! gone or another, probes fail and an unlink that finds its file missing fails and is noted
//! as above, instead of counting as done (see `vanished`).
//!
//! Invariant: `delete` only touches paths below the base, named by URIs with this backend's
//! scheme and storage name; all URIs are checked before any is acted on.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::block_file::{self, BlockRange, KnownDirs};
use crate::live_blocks::{LiveBlocks, Remaining};
use crate::names::check_name;
use crate::packing::{check_request, pack};
use crate::uri::BlockUri;
use crate::{
    AllocatedSpec, AllocationRequest, DataStorage, DurableAddress, NamedPart, PartAddress, PartRef,
    StorageConfig, StorageError, StorageKind, StorageSpec, UriTemplate,
};

/// Failed unlinks tried again per healthy probe (the probe's answer waits for them).
const RETRIES_PER_PROBE: usize = 256;

/// A storage of blocks in files below a base path.
#[derive(Debug)]
pub(crate) struct BlockFileStorage {
    config: StorageConfig,
    kind: StorageKind,
    base: String,
    /// `<scheme>://<storage name><base>`: what every URI of the storage starts with.
    uri_prefix: String,
    /// The directory that must exist for the storage to be healthy.
    anchor: PathBuf,
    key_count_per_file: i32,
    touch_files: bool,
    /// References to each allocated block of each file (not persisted).
    live: LiveBlocks,
    /// Parent directories of block files seen to exist lately.
    known_dirs: KnownDirs,
    /// Files whose unlink failed: their paths by name below the base.
    failed_unlinks: Mutex<HashMap<String, PathBuf>>,
    /// What `.kvcm/id` under the anchor held at the first healthy probe (`None` before).
    identity: Mutex<Option<String>>,
}

/// The file and block a URI names.
#[derive(Debug)]
struct Located {
    /// The file's name below the base.
    name: String,
    path: PathBuf,
    /// `None`: the whole file is the block (no `blkid`).
    block: Option<PackedBlock>,
}

/// One block of a multi-block file.
#[derive(Debug, Clone, Copy)]
struct PackedBlock {
    blkid: u64,
    range: BlockRange,
}

/// The plan of an allocation: its files (with the block ids each is given; `[0]` for a
/// single-block file), the URIs of its parts, and per part the index of its file.
#[derive(Debug)]
struct Plan {
    /// Per file: its name below the base, the size of its blocks, and the block ids
    /// allocated in it.
    files: Vec<(String, u64, Vec<u64>)>,
    placed: Vec<Vec<AllocatedSpec>>,
    file_of_part: Vec<Vec<usize>>,
}

impl BlockFileStorage {
    /// The backend of a validated `Nfs` or `ThreeFs` config.
    pub(crate) fn new(config: StorageConfig) -> Result<Self, StorageError> {
        match &config.spec {
            StorageSpec::Nfs {
                root_path,
                key_count_per_file,
            } => Ok(Self {
                kind: StorageKind::Nfs,
                uri_prefix: uri_prefix(StorageKind::Nfs, &config, root_path),
                base: root_path.clone(),
                anchor: nfs_anchor(root_path),
                key_count_per_file: *key_count_per_file,
                touch_files: false,
                live: LiveBlocks::default(),
                known_dirs: KnownDirs::default(),
                failed_unlinks: Mutex::default(),
                identity: Mutex::default(),
                config: config.clone(),
            }),
            StorageSpec::ThreeFs {
                mountpoint,
                root_dir,
                key_count_per_file,
                touch_file_when_create,
                ..
            } => Ok(Self {
                kind: StorageKind::ThreeFs,
                uri_prefix: uri_prefix(
                    StorageKind::ThreeFs,
                    &config,
                    &three_fs_base(mountpoint, root_dir),
                ),
                base: three_fs_base(mountpoint, root_dir),
                anchor: PathBuf::from(mountpoint),
                key_count_per_file: *key_count_per_file,
                touch_files: *touch_file_when_create,
                live: LiveBlocks::default(),
                known_dirs: KnownDirs::default(),
                failed_unlinks: Mutex::default(),
                identity: Mutex::default(),
                config: config.clone(),
            }),
            other => Err(StorageError::Unsupported(other.kind())),
        }
    }

    /// The URI of block `blkid` (of `size` bytes) of the file `file_name` below the base
    /// (§14; the same text `BlockUri` prints: parameters sorted by name).
    fn uri(&self, file_name: &str, blkid: u64, size: i64) -> String {
        let mut uri = String::with_capacity(self.uri_prefix.len() + file_name.len() + 40);
        self.push_uri(&mut uri, file_name, blkid, size);
        uri
    }

    /// Appends the URI of [`BlockFileStorage::uri`] to `out`.
    fn push_uri(&self, out: &mut String, file_name: &str, blkid: u64, size: i64) {
        self.push_head(out, file_name);
        if self.key_count_per_file > 1 {
            out.push_str(itoa::Buffer::new().format(blkid));
        }
        self.push_tail(out, size);
    }

    /// The part of a block's URI before its block number.
    fn push_head(&self, out: &mut String, file_name: &str) {
        out.push_str(&self.uri_prefix);
        out.push_str(file_name);
        if self.key_count_per_file > 1 {
            out.push_str("?blkid=");
        }
    }

    /// The part of a block's URI after its block number.
    fn push_tail(&self, out: &mut String, size: i64) {
        out.push_str(if self.key_count_per_file > 1 {
            "&size="
        } else {
            "?size="
        });
        out.push_str(itoa::Buffer::new().format(size));
    }

    /// The path of the file `file_name` below the base.
    fn path(&self, file_name: &str) -> PathBuf {
        PathBuf::from(format!("{}{file_name}", self.base))
    }

    /// The files an allocation uses and the URIs of its parts; touches nothing.
    fn plan(&self, request: &AllocationRequest<'_>) -> Result<Plan, StorageError> {
        check_request(request)?;
        self.check_offsets_fit(request)?;
        let packed = pack(request, self.key_count_per_file);
        let mut placed: Vec<Vec<AllocatedSpec>> = request
            .blocks
            .iter()
            .map(|block| {
                let names = block
                    .spec_indexes
                    .iter()
                    .map(|&spec| &request.specs[spec].name);
                let unplaced = |name: &String| AllocatedSpec {
                    name: name.clone(),
                    uri: String::new(),
                    address: PartAddress::default(),
                };
                names.map(unplaced).collect()
            })
            .collect();
        let mut file_of_part: Vec<Vec<usize>> = placed.iter().map(|p| vec![0; p.len()]).collect();
        let mut files: Vec<(String, u64, Vec<u64>)> = Vec::with_capacity(packed.len());
        for file in packed {
            let mut blkids = Vec::with_capacity(file.members.len());
            // Every member of a file has one size (packing chunks each size on its own).
            let mut block_size = 0;
            for (blkid, member) in file.members.iter().enumerate() {
                let size = request.specs[member.spec].size;
                block_size = size as u64;
                let part = &mut placed[member.block][member.slot];
                part.uri = self.uri(&file.name, blkid as u64, size);
                part.address.block = blkid as u32;
                file_of_part[member.block][member.slot] = files.len();
                blkids.push(blkid as u64);
            }
            files.push((file.name, block_size, blkids));
        }
        Ok(Plan {
            files,
            placed,
            file_of_part,
        })
    }

    /// Refuses parts so large that a block's end offset in a full file overflows `i64`.
    fn check_offsets_fit(&self, request: &AllocationRequest<'_>) -> Result<(), StorageError> {
        let per_file = i64::from(self.key_count_per_file.max(1));
        match request
            .specs
            .iter()
            .find(|spec| spec.size.checked_mul(per_file).is_none())
        {
            Some(spec) => Err(StorageError::InvalidRequest(format!(
                "spec {:?} of {} bytes × {per_file} blocks per file overflows a file offset",
                spec.name, spec.size
            ))),
            None => Ok(()),
        }
    }

    /// The file and byte range a URI of this storage names.
    fn locate(&self, text: &str) -> Result<Located, StorageError> {
        let uri = BlockUri::parse(text)?;
        let invalid = |reason: &str| StorageError::InvalidUri {
            uri: text.to_string(),
            reason: reason.to_string(),
        };
        if uri.scheme != self.kind.scheme() || uri.storage_name != self.config.global_unique_name {
            return Err(invalid("not a location of this storage"));
        }
        let relative = uri
            .path
            .strip_prefix(&self.base)
            .ok_or_else(|| invalid("outside the storage"))?;
        // Only the canonical spelling of a path is accepted, so that it meets its file's count.
        let odd_part = |part: &str| part.is_empty() || part == ".." || part == ".";
        if relative.split('/').any(odd_part) {
            return Err(invalid("not a block file path"));
        }
        let size = uri
            .param_u64("size")?
            .filter(|&size| size > 0)
            .ok_or_else(|| invalid("no positive size"))?;
        let block = match uri.param_u64("blkid")? {
            None => None,
            Some(blkid) => {
                let range =
                    block_range(blkid, size).ok_or_else(|| invalid("blkid × size overflows"))?;
                Some(PackedBlock { blkid, range })
            }
        };
        let name = relative.to_string();
        let path = PathBuf::from(&uri.path);
        Ok(Located { name, path, block })
    }

    /// Creates the directories of a file of a new chunk and, if configured, the empty file.
    /// Prepares a file for an allocation. A file kvcm does not track yet must not exist: it
    /// belongs to someone else (or to a run whose journal is gone), and is never written,
    /// punched or unlinked by kvcm.
    fn create_file(&self, path: &Path, tracked: bool) -> Result<(), StorageError> {
        if !tracked && path.exists() {
            return Err(StorageError::Foreign(path.display().to_string()));
        }
        self.known_dirs.create_parents(path)?;
        if self.touch_files {
            block_file::touch(path)?;
        }
        Ok(())
    }

    /// Drops the counts of an allocation that failed part-way: its URIs were never handed
    /// out, so nobody will delete them. The files (if touched, empty) are left in place.
    fn forget_counts(&self, files: &[(String, u64, Vec<u64>)]) {
        for (name, _, blkids) in files {
            for &blkid in blkids {
                let Ok(()) = self.live.release::<Infallible>(name, blkid, |_| Ok(()));
            }
        }
    }

    /// Drops one reference to a located block and frees what nobody holds any more: the
    /// block's hole, the whole file once no block of it is held (an untracked file is not
    /// kvcm's: left alone).
    ///
    /// The reference is dropped even when punching fails (`EOPNOTSUPP` on NFSv3, FUSE or 3FS
    /// mounts): the error is returned, and the block's bytes go when the file is unlinked
    /// with its last block, which needs no punch.
    fn free(&self, located: &Located) -> Result<(), StorageError> {
        let path = located.path.as_path();
        let Some(block) = located.block else {
            return self
                .live
                .release(&located.name, 0, |remaining| match remaining {
                    Remaining::FileFreed => self.unlink(located),
                    Remaining::BlockHeld | Remaining::BlockFreed | Remaining::Untracked => Ok(()),
                });
        };
        self.live
            .release(&located.name, block.blkid, |remaining| match remaining {
                Remaining::BlockHeld | Remaining::Untracked => Ok(()),
                Remaining::BlockFreed => block_file::punch_hole(path, block.range).map(drop),
                Remaining::FileFreed => self.unlink(located),
            })
    }

    /// Unlinks a file no block of which is held; one that fails is noted to try again. A
    /// file missing from a storage that looks unmounted ([`BlockFileStorage::vanished`])
    /// fails: its bytes may be on the mount when it is back.
    fn unlink(&self, located: &Located) -> Result<(), StorageError> {
        let unlinked = self.remove_unless_vanished(&located.path);
        if unlinked.is_err() {
            self.failed_unlinks()
                .insert(located.name.clone(), located.path.clone());
        }
        unlinked
    }

    /// Tries up to [`RETRIES_PER_PROBE`] failed unlinks again; keeps those that fail again
    /// (and the rest for the next probe).
    fn retry_unlinks(&self) {
        let due: Vec<(String, PathBuf)> = {
            let mut failed = self.failed_unlinks();
            let names: Vec<String> = failed.keys().take(RETRIES_PER_PROBE).cloned().collect();
            names
                .into_iter()
                .filter_map(|name| failed.remove_entry(&name))
                .collect()
        };
        let failing: Vec<_> = due
            .into_iter()
            .filter(|(name, path)| {
                let unlink = || self.remove_unless_vanished(path);
                self.live.finish_unreferenced(name, unlink).is_err()
            })
            .collect();
        let mut failed = self.failed_unlinks();
        for (name, path) in failing {
            failed.entry(name).or_insert(path);
        }
    }

    /// Unlinks `path`; a missing file is fine unless the storage looks unmounted.
    fn remove_unless_vanished(&self, path: &Path) -> Result<(), StorageError> {
        match block_file::remove_file(path) {
            Ok(false) => self.vanished().map_or(Ok(()), Err),
            other => other.map(drop),
        }
    }

    /// Why the storage looks unmounted or replaced, if it does: the identity its first
    /// healthy probe read (or wrote) in `.kvcm/id` is not what the file says now (gone on a
    /// bare mount point, or another one: a `.kvcm/id` a probe once left on the bare mount
    /// point, or another file system); a file that cannot be read fails safe (its error).
    fn vanished(&self) -> Option<StorageError> {
        let expected = self.identity()?;
        let found = block_file::read_identity(&self.anchor);
        let path = block_file::identity_path(&self.anchor);
        let why = match found {
            Ok(found) if found == expected => return None,
            Ok(_) => "names another storage than the one probed before",
            Err(StorageError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                "is gone"
            }
            Err(error) => return Some(error),
        };
        Some(StorageError::Unavailable(format!(
            "{} {why}: the file system under {} looks unmounted or replaced, and the \
             storage's files are not freed meanwhile; it comes back by itself once that file \
             system is mounted again (to take the storage as it is now, update it or restart \
             kvcm)",
            path.display(),
            self.anchor.display()
        )))
    }

    /// The identity of the storage seen by its first healthy probe.
    fn identity(&self) -> Option<String> {
        self.identity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn failed_unlinks(&self) -> std::sync::MutexGuard<'_, HashMap<String, PathBuf>> {
        self.failed_unlinks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn block_range(blkid: u64, size: u64) -> Option<BlockRange> {
    let offset = i64::try_from(blkid.checked_mul(size)?).ok()?;
    let len = i64::try_from(size).ok()?;
    offset.checked_add(len)?;
    Some(BlockRange { offset, len })
}

/// `<scheme>://<storage name><base>`.
fn uri_prefix(kind: StorageKind, config: &StorageConfig, base: &str) -> String {
    format!("{}://{}{base}", kind.scheme(), config.global_unique_name)
}

/// NFS: the directory `root_path` names or lies in (without a trailing `/`, `root_path`
/// is a prefix of the names of files in its parent).
pub(crate) fn nfs_anchor(root_path: &str) -> PathBuf {
    if root_path.ends_with('/') {
        return PathBuf::from(root_path);
    }
    Path::new(root_path)
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

/// 3FS: `mountpoint/root_dir/` with single slashes.
fn three_fs_base(mountpoint: &str, root_dir: &str) -> String {
    let mount = mountpoint.trim_end_matches('/');
    let dir = root_dir.trim_matches('/');
    if dir.is_empty() {
        return format!("{mount}/");
    }
    format!("{mount}/{dir}/")
}

impl DataStorage for BlockFileStorage {
    fn config(&self) -> &StorageConfig {
        &self.config
    }

    fn kind(&self) -> StorageKind {
        self.kind
    }

    fn allocate(
        &self,
        request: &AllocationRequest<'_>,
    ) -> Result<Vec<Vec<AllocatedSpec>>, StorageError> {
        let mut plan = self.plan(request)?;
        let mut file_ids = Vec::with_capacity(plan.files.len());
        for (done, (name, block_size, blkids)) in plan.files.iter().enumerate() {
            let path = self.path(name);
            match self.live.allocate(name, blkids, *block_size, |tracked| {
                self.create_file(&path, tracked)
            }) {
                Ok(id_and_generation) => file_ids.push(id_and_generation),
                Err(error) => {
                    self.forget_counts(&plan.files[..done]);
                    return Err(error);
                }
            }
        }
        for (parts, files) in plan.placed.iter_mut().zip(&plan.file_of_part) {
            for (part, &file) in parts.iter_mut().zip(files) {
                (part.address.object, part.address.generation) = file_ids[file];
            }
        }
        Ok(plan.placed)
    }

    fn write_uri(&self, part: &PartRef<'_>, out: &mut String) -> bool {
        let block = u64::from(part.address.block);
        let address = part.address;
        let written = self
            .live
            .with_name(address.object, address.generation, |name| {
                self.push_uri(out, name, block, part.spec.size)
            });
        written.is_some()
    }

    fn uri_template(&self, part: &PartRef<'_>) -> Option<UriTemplate> {
        let address = part.address;
        let mut head = String::new();
        self.live
            .with_name(address.object, address.generation, |name| {
                self.push_head(&mut head, name)
            })?;
        let mut tail = String::new();
        self.push_tail(&mut tail, part.spec.size);
        let block = (self.key_count_per_file > 1).then_some(address.block);
        Some(UriTemplate {
            head,
            block,
            block_shift: 0,
            tail,
        })
    }

    fn delete(&self, uris: &[String]) -> Result<(), StorageError> {
        let located: Vec<_> = uris
            .iter()
            .map(|uri| self.locate(uri))
            .collect::<Result<_, _>>()?;
        let mut first_error = None;
        for block in &located {
            if let Err(error) = self.free(block) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Probes the anchor directory (refused while the storage looks unmounted); when it is
    /// healthy, tries the failed unlinks again.
    fn check_health(&self) -> Result<(), StorageError> {
        if let Some(vanished) = self.vanished() {
            return Err(vanished);
        }
        // Once the identity is known kvcm's directory is not made again: an unmount between
        // the check above and the probe must not leave it on the bare mount point.
        let known = self.identity().is_some();
        block_file::probe_directory(&self.anchor, known)
            .map_err(|error| self.vanished().unwrap_or(error))?;
        if !known {
            let identity = block_file::read_or_create_identity(&self.anchor)?;
            *self.identity.lock().unwrap_or_else(PoisonError::into_inner) = Some(identity);
        }
        self.retry_unlinks();
        Ok(())
    }

    fn durable_address(&self, address: PartAddress) -> DurableAddress {
        let named = self
            .live
            .with_name(address.object, address.generation, str::to_string);
        named.map_or(DurableAddress::Lost, DurableAddress::Named)
    }

    fn adopt(&self, part: &NamedPart<'_>) -> Result<PartAddress, StorageError> {
        check_object_path(part.name).map_err(StorageError::InvalidRequest)?;
        let blocks = [u64::from(part.block)];
        let (object, generation) =
            self.live
                .allocate::<StorageError>(part.name, &blocks, part.size, |_| Ok(()))?;
        Ok(PartAddress {
            object,
            block: part.block,
            generation,
        })
    }
}

/// An object name to adopt must be a relative path of usable components (never leaving the
/// base).
fn check_object_path(name: &str) -> Result<(), String> {
    name.split('/')
        .try_for_each(|component| check_name("object name", component))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{blocks, specs};

    fn nfs_at(root_path: &str, key_count_per_file: i32) -> BlockFileStorage {
        let config = StorageConfig {
            global_unique_name: "nfs_01".to_string(),
            spec: StorageSpec::Nfs {
                root_path: root_path.to_string(),
                key_count_per_file,
            },
            check_storage_available_when_open: false,
        };
        BlockFileStorage::new(config).expect("nfs config")
    }

    fn nfs_01(key_count_per_file: i32) -> BlockFileStorage {
        nfs_at("/tmp/nfs/", key_count_per_file)
    }

    fn uris_of(storage: &BlockFileStorage, keys: &[i64]) -> Vec<String> {
        let (specs, blocks) = (specs(&[1024]), blocks(keys, &[0]));
        let request = AllocationRequest {
            instance_id: "instance1",
            specs: &specs,
            blocks: &blocks,
        };
        let plan = storage.plan(&request).expect("plan");
        plan.placed
            .into_iter()
            .flatten()
            .map(|spec| spec.uri)
            .collect()
    }

    /// An NFS storage on the directory `root` with `key_count_per_file` keys per file.
    fn nfs_in(root: &Path, key_count_per_file: i32) -> BlockFileStorage {
        nfs_at(&format!("{}/", root.display()), key_count_per_file)
    }

    /// The file a block URI names.
    fn block_path(uri: &str) -> PathBuf {
        PathBuf::from(BlockUri::parse(uri).expect("uri").path)
    }

    /// Allocates `keys` (one part of 1024 bytes) for instance `i`; one URI per key.
    fn allocate_uris(storage: &BlockFileStorage, keys: &[i64]) -> Vec<String> {
        let (specs, blocks) = (specs(&[1024]), blocks(keys, &[0]));
        let request = AllocationRequest {
            instance_id: "i",
            specs: &specs,
            blocks: &blocks,
        };
        let placed = storage.allocate(&request).expect("allocate");
        placed.into_iter().flatten().map(|spec| spec.uri).collect()
    }

    #[test]
    fn a_file_goes_with_its_last_block_even_when_punching_fails() {
        let root = tempfile::tempdir().expect("tempdir");
        let storage = nfs_in(root.path(), 4);
        let uris = allocate_uris(&storage, &[1, 2]);
        let path = block_path(&uris[0]);
        std::fs::write(&path, vec![1; 2048]).expect("write both blocks");

        block_file::set_punch_unsupported(true);
        let first = storage.delete(&uris[..1]);
        let last = storage.delete(&uris[1..]);
        block_file::set_punch_unsupported(false);
        assert!(
            matches!(first, Err(StorageError::Io { .. })),
            "the failed punch is reported: {first:?}"
        );
        last.expect("the last block unlinks the file without punching");
        assert!(!path.exists(), "no block referenced: unlinked");
        assert_eq!(storage.live.tracked_files(), 0);
    }

    #[test]
    fn a_failed_unlink_is_tried_again_after_a_healthy_probe() {
        let root = tempfile::tempdir().expect("tempdir");
        let storage = nfs_in(root.path(), 1);
        let uris = allocate_uris(&storage, &[1, 2]);
        let paths: Vec<PathBuf> = uris.iter().map(|uri| block_path(uri)).collect();
        for path in &paths {
            std::fs::write(path, vec![1; 1024]).expect("write the block");
        }

        block_file::set_unlink_fails(true);
        let failed = storage.delete(&uris);
        storage.retry_unlinks();
        block_file::set_unlink_fails(false);
        assert!(
            matches!(failed, Err(StorageError::Io { .. })),
            "the failed unlink is reported: {failed:?}"
        );
        assert!(paths.iter().all(|p| p.exists()), "nothing unlinked yet");
        assert_eq!(storage.live.tracked_files(), 2, "kept to try again");
        assert_eq!(
            storage.failed_unlinks().len(),
            2,
            "a failing retry keeps them"
        );

        // Key 2's file is allocated again meanwhile: it is in use, not to be unlinked.
        allocate_uris(&storage, &[2]);
        storage.check_health().expect("healthy");
        assert!(!paths[0].exists(), "the next healthy probe unlinks it");
        assert!(paths[1].exists(), "a file allocated again stays");
        assert_eq!(storage.live.tracked_files(), 1);
        assert!(storage.failed_unlinks().is_empty(), "nothing left to try");
    }

    #[test]
    fn a_storage_whose_own_directory_vanished_is_unavailable_and_frees_nothing_until_back() {
        let parent = tempfile::tempdir().expect("tempdir");
        let root = parent.path().join("mnt");
        std::fs::create_dir(&root).expect("mount point");
        let storage = nfs_in(&root, 1);
        storage
            .check_health()
            .expect("healthy: kvcm's directory made");
        let uris = allocate_uris(&storage, &[1]);
        let path = block_path(&uris[0]);
        std::fs::write(&path, vec![1; 1024]).expect("write the block");

        // The file system under the mount point goes away: a bare, empty directory is left.
        let mounted = parent.path().join("mounted");
        std::fs::rename(&root, &mounted).expect("unmount");
        std::fs::create_dir(&root).expect("the bare mount point");
        let down = storage.check_health();
        assert!(
            matches!(&down, Err(StorageError::Unavailable(why)) if why.contains("unmounted")),
            "{down:?}"
        );
        assert!(
            !root.join(block_file::PROBE_SUBDIR).exists(),
            "the probe does not make its directory on the bare mount point"
        );
        let freed = storage.delete(&uris);
        assert!(
            matches!(freed, Err(StorageError::Unavailable(_))),
            "a missing file is not taken as freed: {freed:?}"
        );
        // A `.kvcm/id` an earlier probe left on the bare mount point does not fool it.
        std::fs::create_dir(root.join(block_file::PROBE_SUBDIR)).expect("stale dir");
        std::fs::write(block_file::identity_path(&root), "0123\n").expect("stale id");
        let still = storage.check_health();
        assert!(
            matches!(&still, Err(StorageError::Unavailable(why)) if why.contains("another storage")),
            "{still:?}"
        );
        std::fs::remove_dir_all(root.join(block_file::PROBE_SUBDIR)).expect("stale dir");

        // Mounted again: the next healthy probe frees the file.
        std::fs::remove_dir(&root).expect("bare mount point");
        std::fs::rename(&mounted, &root).expect("mount again");
        assert!(path.exists(), "nothing was freed meanwhile");
        storage.check_health().expect("healthy again");
        assert!(!path.exists(), "unlinked once the storage is back");
        assert_eq!(storage.live.tracked_files(), 0);
    }

    #[test]
    fn a_missing_file_is_freed_when_no_probe_ever_ran() {
        let root = tempfile::tempdir().expect("tempdir");
        let storage = nfs_in(root.path(), 1);
        let uris = allocate_uris(&storage, &[1]);
        storage
            .delete(&uris)
            .expect("never written: nothing to unlink");
        assert_eq!(storage.live.tracked_files(), 0);
    }

    #[test]
    fn an_adopted_part_renders_its_uri_in_another_process_and_is_freed_by_one_delete() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = format!("{}/", root.path().display());
        let (before, after) = (nfs_at(&base, 4), nfs_at(&base, 4));
        let specs = specs(&[1024]);
        let blocks = blocks(&[1, 2], &[0]);
        let request = AllocationRequest {
            instance_id: "i",
            specs: &specs,
            blocks: &blocks,
        };
        let placed = before.allocate(&request).expect("allocate");
        for (block, parts) in blocks.iter().zip(&placed) {
            let part = &parts[0];
            let DurableAddress::Named(name) = before.durable_address(part.address) else {
                panic!("a tracked file has a name");
            };
            let named = NamedPart {
                instance_id: "i",
                name: &name,
                block: part.address.block,
                size: 0,
            };
            let address = after.adopt(&named).expect("adopt");
            let reference = PartRef {
                instance_id: "i",
                key: block.key,
                spec: &specs[0],
                address,
            };
            let mut uri = String::new();
            assert!(after.write_uri(&reference, &mut uri));
            assert_eq!(uri, part.uri, "the same URI in the adopting process");
        }
        let uris: Vec<String> = placed.iter().map(|parts| parts[0].uri.clone()).collect();
        after.delete(&uris).expect("delete");
        assert_eq!(after.live.tracked_files(), 0, "one delete per adoption");
        let freed = before.durable_address(PartAddress {
            object: u32::MAX,
            ..PartAddress::default()
        });
        assert_eq!(freed, DurableAddress::Lost);
        for bad in ["../x", "a//b", "", "a/./b"] {
            let named = NamedPart {
                instance_id: "i",
                name: bad,
                block: 0,
                size: 0,
            };
            assert!(
                matches!(after.adopt(&named), Err(StorageError::InvalidRequest(_))),
                "{bad:?} is refused"
            );
        }
    }

    #[test]
    fn addresses_render_the_allocated_uris_until_their_file_is_freed() {
        let root = tempfile::tempdir().expect("tempdir");
        for key_count_per_file in [1, 4] {
            let storage = nfs_in(root.path(), key_count_per_file);
            let specs = specs(&[1024, 2048]);
            let blocks = blocks(&[1, 2, 3, 4, 5], &[0, 1]);
            let request = AllocationRequest {
                instance_id: "i",
                specs: &specs,
                blocks: &blocks,
            };
            let placed = storage.allocate(&request).expect("allocate");
            let mut uris = Vec::new();
            for (block, parts) in blocks.iter().zip(&placed) {
                for (part, &spec) in parts.iter().zip(&block.spec_indexes) {
                    let reference = PartRef {
                        instance_id: "i",
                        key: block.key,
                        spec: &specs[spec],
                        address: part.address,
                    };
                    let mut again = String::new();
                    assert!(storage.write_uri(&reference, &mut again));
                    assert_eq!(again, part.uri);
                    let template = storage.uri_template(&reference).expect("template");
                    let mut rendered = String::new();
                    template.render(&mut rendered);
                    assert_eq!(rendered, part.uri, "the template renders the same URI");
                    assert_eq!(template.block.is_some(), key_count_per_file > 1);
                    uris.push((part.uri.clone(), part.address, spec, block.key));
                }
            }
            let all: Vec<String> = uris.iter().map(|(uri, ..)| uri.clone()).collect();
            storage.delete(&all).expect("delete all");
            let (_, address, spec, key) = uris[0];
            let gone = PartRef {
                instance_id: "i",
                key,
                spec: &specs[spec],
                address,
            };
            let mut nothing = String::new();
            assert!(
                !storage.write_uri(&gone, &mut nothing),
                "the file was freed"
            );
            assert!(nothing.is_empty());
            assert_eq!(storage.uri_template(&gone), None);
        }
    }

    #[test]
    fn counts_are_dropped_with_their_files() {
        let root = tempfile::tempdir().expect("tempdir");
        let storage = nfs_in(root.path(), 4);
        let uris = allocate_uris(&storage, &[1, 2, 3, 4, 5]);
        assert_eq!(
            storage.live.tracked_files(),
            2,
            "a file of 4 blocks and one of 1"
        );
        storage.delete(&uris[..4]).expect("delete the first file");
        assert_eq!(storage.live.tracked_files(), 1);
        storage.delete(&uris).expect("delete all, some twice");
        assert_eq!(storage.live.tracked_files(), 0);
    }

    #[test]
    fn a_failed_allocation_leaves_no_counts() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("i")).expect("mkdir");
        std::fs::write(root.path().join("i/tp1"), b"not a directory").expect("write");
        let storage = nfs_in(root.path(), 4);
        // Different sizes: each part has its own files, tp0's in i/tp0, tp1's in i/tp1.
        let (specs, blocks) = (specs(&[1024, 2048]), blocks(&[1, 2], &[0, 1]));
        let request = AllocationRequest {
            instance_id: "i",
            specs: &specs,
            blocks: &blocks,
        };
        let refused = storage.allocate(&request);
        assert!(
            matches!(refused, Err(StorageError::Io { .. })),
            "{refused:?}"
        );
        assert!(
            root.path().join("i/tp0").is_dir(),
            "tp0's file was set up first"
        );
        assert_eq!(storage.live.tracked_files(), 0, "and its count forgotten");
    }

    #[test]
    fn fact_sheet_example_one_key() {
        assert_eq!(
            uris_of(&nfs_01(8), &[123]),
            vec!["file://nfs_01/tmp/nfs/instance1/tp0/7b?blkid=0&size=1024"]
        );
    }

    #[test]
    fn fact_sheet_example_three_keys() {
        let names = "instance1/tp0/64|instance1/tp0/65|instance1/tp0/66";
        let hash = xxhash_rust::xxh3::xxh3_64_with_seed(names.as_bytes(), 42);
        let file = format!("file://nfs_01/tmp/nfs/instance1/tp0/64_{hash:016x}");
        assert_eq!(
            uris_of(&nfs_01(8), &[100, 101, 102]),
            vec![
                format!("{file}?blkid=0&size=1024"),
                format!("{file}?blkid=1&size=1024"),
                format!("{file}?blkid=2&size=1024"),
            ]
        );
    }

    #[test]
    fn parts_too_big_for_a_file_are_refused() {
        let (specs, blocks) = (specs(&[i64::MAX / 4]), blocks(&[1], &[0]));
        let request = AllocationRequest {
            instance_id: "i",
            specs: &specs,
            blocks: &blocks,
        };
        let refused = nfs_01(8).plan(&request);
        assert!(
            matches!(refused, Err(StorageError::InvalidRequest(ref m)) if m.contains("overflows"))
        );
        assert!(
            nfs_01(4).plan(&request).is_ok(),
            "4 blocks of i64::MAX / 4 still fit"
        );
    }

    #[test]
    fn one_key_per_file_has_no_blkid() {
        for key_count_per_file in [1, 0, -3] {
            assert_eq!(
                uris_of(&nfs_01(key_count_per_file), &[123, -1]),
                vec![
                    "file://nfs_01/tmp/nfs/instance1/tp0/7b?size=1024",
                    "file://nfs_01/tmp/nfs/instance1/tp0/ffffffffffffffff?size=1024",
                ]
            );
        }
    }

    #[test]
    fn three_fs_base_joins_with_single_slashes() {
        assert_eq!(three_fs_base("/mnt/3fs", "kv"), "/mnt/3fs/kv/");
        assert_eq!(three_fs_base("/mnt/3fs/", "/kv/data/"), "/mnt/3fs/kv/data/");
        assert_eq!(three_fs_base("/", "kv"), "/kv/");
    }

    #[test]
    fn nfs_anchor_is_the_directory_of_root_path() {
        assert_eq!(nfs_anchor("/tmp/nfs/"), PathBuf::from("/tmp/nfs/"));
        assert_eq!(nfs_anchor("/tmp/nfs/prefix_"), PathBuf::from("/tmp/nfs"));
    }

    #[test]
    fn block_ranges_refuse_overflow() {
        assert_eq!(
            block_range(2, 1024),
            Some(BlockRange {
                offset: 2048,
                len: 1024
            })
        );
        assert_eq!(block_range(u64::MAX, 2), None);
        assert_eq!(block_range(1, i64::MAX as u64), None);
    }
}
