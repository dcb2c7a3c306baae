//! The `file` and `hf3fs` backends on real files in temporary directories.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use kvcm_storage::{
    open, AllocationRequest, BlockSpec, BlockToAllocate, BlockUri, DataStorage, StorageConfig,
    StorageError, StorageSpec,
};

const BLOCK: i64 = 64 * 1024;

fn nfs(root: &Path, key_count_per_file: i32) -> std::sync::Arc<dyn DataStorage> {
    open(StorageConfig {
        global_unique_name: "nfs_01".to_string(),
        spec: StorageSpec::Nfs {
            root_path: format!("{}/", root.display()),
            key_count_per_file,
        },
        check_storage_available_when_open: true,
    })
    .expect("open nfs")
}

fn three_fs(mount: &Path, touch: bool) -> std::sync::Arc<dyn DataStorage> {
    open(StorageConfig {
        global_unique_name: "3fs_a".to_string(),
        spec: StorageSpec::ThreeFs {
            cluster_name: "c".to_string(),
            mountpoint: mount.display().to_string(),
            root_dir: "kv/data".to_string(),
            key_count_per_file: 4,
            touch_file_when_create: touch,
        },
        check_storage_available_when_open: true,
    })
    .expect("open 3fs")
}

/// Allocates `keys` for one part `tp0` of `BLOCK` bytes; returns one URI per key.
fn allocate(storage: &dyn DataStorage, keys: &[i64]) -> Vec<String> {
    try_allocate(storage, keys).expect("allocate")
}

fn try_allocate(storage: &dyn DataStorage, keys: &[i64]) -> Result<Vec<String>, StorageError> {
    let specs = [BlockSpec {
        name: "tp0".to_string(),
        size: BLOCK,
    }];
    let blocks: Vec<BlockToAllocate> = keys
        .iter()
        .map(|&key| BlockToAllocate {
            key,
            spec_indexes: vec![0],
        })
        .collect();
    let request = AllocationRequest {
        instance_id: "instance1",
        specs: &specs,
        blocks: &blocks,
    };
    let placed = storage.allocate(&request)?;
    Ok(placed
        .into_iter()
        .map(|parts| parts[0].uri.clone())
        .collect())
}

/// Writes the block a URI names as a client would: `fill` repeated at blkid × size.
fn write_block(uri: &str, fill: u8) -> PathBuf {
    let uri = BlockUri::parse(uri).expect("uri");
    let size = uri.param_u64("size").expect("size").expect("size present");
    let blkid = uri.param_u64("blkid").expect("blkid").unwrap_or(0);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&uri.path)
        .expect("open");
    file.write_all_at(&vec![fill; size as usize], blkid * size)
        .expect("write");
    file.sync_all().expect("sync");
    PathBuf::from(uri.path)
}

fn read_block(path: &Path, blkid: u64) -> Vec<u8> {
    let file = fs::File::open(path).expect("open");
    let mut bytes = vec![0; BLOCK as usize];
    file.read_exact_at(&mut bytes, blkid * BLOCK as u64)
        .expect("read");
    bytes
}

#[test]
fn allocation_creates_directories_only() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 8);
    let uris = allocate(storage.as_ref(), &[123]);
    let expected = format!(
        "file://nfs_01{}/instance1/tp0/7b?blkid=0&size=65536",
        root.path().display()
    );
    assert_eq!(uris, vec![expected]);
    assert!(
        root.path().join("instance1/tp0").is_dir(),
        "directories are created"
    );
    assert!(
        !root.path().join("instance1/tp0/7b").exists(),
        "NFS files are the client's to create"
    );
}

#[test]
fn deleting_a_block_punches_a_hole_and_spares_neighbours() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 4);
    let uris = allocate(storage.as_ref(), &[100, 101, 102]);
    let paths: Vec<PathBuf> = uris
        .iter()
        .zip([0xA1, 0xB2, 0xC3])
        .map(|(uri, fill)| write_block(uri, fill))
        .collect();
    assert!(
        paths.iter().all(|path| path == &paths[0]),
        "three blocks share one file"
    );
    let file = &paths[0];
    let blocks_before = fs::metadata(file).expect("stat").blocks();

    storage
        .delete(&uris[1..2])
        .expect("delete the middle block");
    let blocks_after = fs::metadata(file).expect("stat").blocks();
    assert!(
        blocks_before - blocks_after >= (BLOCK / 512) as u64,
        "st_blocks {blocks_before} -> {blocks_after}: 64 KiB must be freed"
    );
    assert_eq!(
        fs::metadata(file).expect("stat").len(),
        3 * BLOCK as u64,
        "size is kept"
    );
    assert_eq!(read_block(file, 0), vec![0xA1; BLOCK as usize]);
    assert_eq!(read_block(file, 1), vec![0; BLOCK as usize]);
    assert_eq!(read_block(file, 2), vec![0xC3; BLOCK as usize]);

    storage
        .delete(&[uris[0].clone()])
        .expect("delete the first block");
    assert!(file.exists(), "block 2 still holds data");
    storage
        .delete(&[uris[2].clone()])
        .expect("delete the last block");
    assert!(!file.exists(), "a file without data is unlinked");
    storage.delete(&uris).expect("deleting again is a no-op");
}

/// Opens the file of a URI as an engine holding it for writing would.
fn open_for_writing(uri: &str) -> fs::File {
    let path = BlockUri::parse(uri).expect("uri").path;
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open")
}

#[test]
fn a_neighbour_still_being_written_keeps_the_file() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 4);
    let uris = allocate(storage.as_ref(), &[100, 101, 102]);
    let file = write_block(&uris[0], 0xA1);
    let engine = open_for_writing(&uris[1]);

    storage.delete(&uris[..1]).expect("delete block 0");
    assert!(
        file.exists(),
        "blocks 1 and 2 are allocated: the file stays"
    );
    let late = |blkid: u64, fill: u8| {
        let bytes = vec![fill; BLOCK as usize];
        engine
            .write_all_at(&bytes, blkid * BLOCK as u64)
            .expect("late write");
    };
    late(1, 0xB2);
    late(2, 0xC3);
    engine.sync_all().expect("sync");
    assert_eq!(
        read_block(&file, 0),
        vec![0; BLOCK as usize],
        "block 0 freed"
    );
    assert_eq!(read_block(&file, 1), vec![0xB2; BLOCK as usize]);
    assert_eq!(read_block(&file, 2), vec![0xC3; BLOCK as usize]);

    storage.delete(&uris[1..]).expect("delete blocks 1 and 2");
    assert!(!file.exists(), "the last allocated block takes the file");
}

/// Two StartWriteCache calls for the same new keys get the same URIs (names depend on the keys
/// only); the loser frees its copy once, which must leave the winner's file and bytes alone.
#[test]
fn the_loser_of_a_write_race_frees_nothing_the_winner_holds() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 8);
    let winner_keys: Vec<i64> = (1..=8).collect();
    let loser_keys: Vec<i64> = (1..=9).collect();
    let winner = allocate(storage.as_ref(), &winner_keys);
    let loser = allocate(storage.as_ref(), &loser_keys);
    assert_eq!(winner[..], loser[..8], "same file, same blkids");
    let file = write_block(&winner[0], 1);
    for (blkid, uri) in winner.iter().enumerate().skip(1) {
        write_block(uri, blkid as u8 + 1);
    }

    storage
        .delete(&loser)
        .expect("the loser frees its allocation");
    assert!(file.exists(), "the winner's file is kept");
    for blkid in 0..8u64 {
        assert_eq!(
            read_block(&file, blkid),
            vec![blkid as u8 + 1; BLOCK as usize]
        );
    }
    storage
        .delete(&winner)
        .expect("the winner's blocks are deleted");
    assert!(!file.exists(), "the last reference takes the file");
}

#[test]
fn the_loser_of_a_write_race_keeps_a_single_block_file() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 1);
    let winner = allocate(storage.as_ref(), &[7]);
    let loser = allocate(storage.as_ref(), &[7]);
    assert_eq!(winner, loser);
    let file = write_block(&winner[0], 9);

    storage
        .delete(&loser)
        .expect("the loser frees its allocation");
    assert_eq!(
        read_block(&file, 0),
        vec![9; BLOCK as usize],
        "winner's bytes kept"
    );
    storage
        .delete(&winner)
        .expect("the winner's block is deleted");
    assert!(!file.exists());
}

#[test]
fn deleting_a_block_twice_frees_it_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 4);
    let uris = allocate(storage.as_ref(), &[1, 2, 3]);
    let file = write_block(&uris[0], 1);
    write_block(&uris[1], 2);

    storage.delete(&uris[..1]).expect("delete block 0");
    let twice = [uris[0].clone(), uris[0].clone()];
    storage.delete(&twice).expect("delete block 0 again, twice");
    storage.delete(&uris[1..2]).expect("delete block 1");
    assert!(
        file.exists(),
        "block 2 is still allocated although no data is left"
    );
    write_block(&uris[2], 3);
    assert_eq!(read_block(&file, 2), vec![3; BLOCK as usize]);
    storage.delete(&uris[2..]).expect("delete block 2");
    assert!(!file.exists());
}

#[test]
fn a_touched_file_goes_with_its_last_block_even_unwritten() {
    let mount = tempfile::tempdir().expect("tempdir");
    let storage = three_fs(mount.path(), true);
    let uris = allocate(storage.as_ref(), &[10, 11, 12]);
    let file = PathBuf::from(BlockUri::parse(&uris[0]).expect("uri").path);
    assert!(file.exists(), "touched at allocation");
    storage.delete(&uris[..2]).expect("delete two of three");
    assert!(file.exists(), "block 2 is still allocated");
    storage.delete(&uris[2..]).expect("delete the last");
    assert!(!file.exists(), "all blocks freed: unlinked");
}

#[test]
fn concurrent_deletes_of_one_file_unlink_it_once_all_are_freed() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 8);
    let keys: Vec<i64> = (0..8).collect();
    let uris = allocate(storage.as_ref(), &keys);
    let file = write_block(&uris[7], 7);
    std::thread::scope(|scope| {
        for uri in &uris[..7] {
            let storage = storage.as_ref();
            scope.spawn(move || {
                let twice = [uri.clone(), uri.clone()];
                storage.delete(&twice).expect("delete");
            });
        }
    });
    assert!(file.exists(), "block 7 is still allocated");
    assert_eq!(read_block(&file, 7), vec![7; BLOCK as usize]);
    storage.delete(&uris[7..]).expect("delete the last");
    assert!(!file.exists());
}

#[test]
fn files_kvcm_does_not_track_are_never_touched() {
    let root = tempfile::tempdir().expect("tempdir");
    let before = nfs(root.path(), 4);
    let written = allocate(before.as_ref(), &[1, 2, 3]);
    let path = write_block(&written[0], 1);
    drop(before);

    // A new process that did not adopt the blocks (no journal) owns none of them: deletes
    // leave the bytes, and allocating the same names is refused rather than overwriting.
    let after = nfs(root.path(), 4);
    after.delete(&written).expect("deletes of untracked blocks");
    assert_eq!(
        read_block(&path, 0),
        vec![1; BLOCK as usize],
        "bytes untouched"
    );
    let refused = try_allocate(after.as_ref(), &[1, 2, 3]).unwrap_err();
    assert!(matches!(refused, StorageError::Foreign(_)), "{refused:?}");
    assert_eq!(read_block(&path, 0), vec![1; BLOCK as usize]);

    // A file someone else put where a block would go is left alone too.
    let single = nfs(root.path(), 1);
    let foreign = root.path().join("instance1/tp0/63");
    fs::create_dir_all(foreign.parent().unwrap()).unwrap();
    fs::write(&foreign, b"not kvcm's").unwrap();
    let refused = try_allocate(single.as_ref(), &[0x63]).unwrap_err();
    assert!(matches!(refused, StorageError::Foreign(_)), "{refused:?}");
    assert_eq!(fs::read(&foreign).unwrap(), b"not kvcm's");
}

#[test]
fn single_block_files_are_unlinked_and_missing_files_are_fine() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 1);
    let uris = allocate(storage.as_ref(), &[7, 8]);
    assert!(uris.iter().all(|uri| !uri.contains("blkid")), "{uris:?}");
    let written = write_block(&uris[0], 1);
    storage
        .delete(&uris)
        .expect("delete a written and a never-written block");
    assert!(!written.exists());
}

#[test]
fn bad_uris_are_refused_before_anything_is_freed() {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = nfs(root.path(), 4);
    let uris = allocate(storage.as_ref(), &[1, 2]);
    let file = write_block(&uris[0], 9);
    write_block(&uris[1], 9);
    let file_path = uris[0].split('?').next().expect("path part").to_string();
    let root_text = root.path().display().to_string();
    let bad = [
        uris[0].replace("file://", "hf3fs://"),
        uris[0].replace("nfs_01", "nfs_02"),
        format!("file://nfs_01/etc/passwd?size={BLOCK}"),
        format!("file://nfs_01{root_text}/instance1/../../x?size={BLOCK}"),
        format!("file://nfs_01{root_text}/?size={BLOCK}"),
        uris[0].replace("/instance1/", "/instance1//"),
        uris[0].replace("/instance1/", "//instance1/"),
        format!("{file_path}?blkid=0"),
        format!("{file_path}?blkid=0&size=0"),
        format!("{file_path}?blkid=x&size={BLOCK}"),
        format!("{file_path}?blkid=18446744073709551615&size={BLOCK}"),
        "not a uri".to_string(),
    ];
    for uri in bad {
        let result = storage.delete(&[uris[0].clone(), uri.clone()]);
        assert!(
            matches!(result, Err(StorageError::InvalidUri { .. })),
            "{uri}: {result:?}"
        );
        assert_eq!(
            read_block(&file, 0),
            vec![9; BLOCK as usize],
            "{uri} freed a block"
        );
    }
}

#[test]
fn three_fs_joins_paths_and_touches_files_when_asked() {
    let mount = tempfile::tempdir().expect("tempdir");
    let mount_text = mount.path().display();
    let touching = three_fs(mount.path(), true);
    let uris = allocate(touching.as_ref(), &[123]);
    assert_eq!(
        uris,
        vec![format!(
            "hf3fs://3fs_a{mount_text}/kv/data/instance1/tp0/7b?blkid=0&size=65536"
        )]
    );
    let touched = mount.path().join("kv/data/instance1/tp0/7b");
    assert_eq!(fs::metadata(&touched).expect("touched file").len(), 0);

    let lazy = three_fs(mount.path(), false);
    allocate(lazy.as_ref(), &[124]);
    assert!(!mount.path().join("kv/data/instance1/tp0/7c").exists());
    write_block(&uris[0], 5);
    touching.delete(&uris).expect("delete");
    assert!(!touched.exists());
}

#[test]
fn health_follows_the_directory() {
    let parent = tempfile::tempdir().expect("tempdir");
    let root = parent.path().join("store");
    let config = |check| StorageConfig {
        global_unique_name: "nfs_01".to_string(),
        spec: StorageSpec::Nfs {
            root_path: format!("{}/", root.display()),
            key_count_per_file: 8,
        },
        check_storage_available_when_open: check,
    };
    let refused = open(config(true));
    assert!(
        matches!(refused, Err(StorageError::Io { .. })),
        "{refused:?}"
    );
    let storage = open(config(false)).expect("opened without a probe");
    assert!(storage.check_health().is_err());
    fs::create_dir(&root).expect("mkdir");
    storage
        .check_health()
        .expect("healthy once the directory exists");
    let entries: Vec<_> = fs::read_dir(&root)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        entries,
        [".kvcm"],
        "the probe writes only in kvcm's own subdirectory"
    );
    let own: Vec<_> = fs::read_dir(root.join(".kvcm"))
        .expect("ls .kvcm")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        own,
        ["id"],
        "the probe leaves nothing behind but the storage's identity"
    );
}
