//! Put/get bandwidth of `FileIo` (batches of 64 blocks, O_DIRECT) beside its floor: a plain
//! sequential O_DIRECT `pwrite`/`pread` loop of the same bytes to one file, measured in the
//! same run. Prints GB/s and the ratio to the floor. Runs on the target directory's disk;
//! deletes its files. `cargo bench -p kvcm-data`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use kvcm_data::{AlignedBuf, FileIo, FileIoConfig, IoPath, ReadOp, WriteOp};

const BLOCKS_PER_BATCH: usize = 64;
const BLOCK_SIZES: [usize; 3] = [64 << 10, 1 << 20, 4 << 20];
/// Bytes moved per measurement (per size, per direction, per method).
const BYTES_PER_MEASUREMENT: usize = 512 << 20;

fn main() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let io = FileIo::new(FileIoConfig::default());
    println!(
        "backend: {:?}; {BLOCKS_PER_BATCH} blocks per batch",
        io.backend()
    );
    println!(
        "{:>8} {:>4} {:>14} {:>12} {:>7}  path",
        "block", "op", "FileIo GB/s", "floor GB/s", "ratio"
    );
    for block_size in BLOCK_SIZES {
        bench_block_size(&io, dir.path(), block_size);
    }
}

fn bench_block_size(io: &FileIo, dir: &Path, block_size: usize) {
    let batch_bytes = block_size * BLOCKS_PER_BATCH;
    let rounds = (BYTES_PER_MEASUREMENT / batch_bytes).max(2);
    let mut blocks: Vec<AlignedBuf> = (0..BLOCKS_PER_BATCH)
        .map(|blkid| filled_block(block_size, blkid))
        .collect();
    let io_file = dir.join(format!("fileio_{block_size}"));
    let floor_path = dir.join(format!("floor_{block_size}"));
    let floor_file = open_direct(&floor_path);

    // One unmeasured round each, so both files are allocated before timing.
    put_batch(io, &io_file, &blocks);
    floor_put(&floor_file, &blocks);

    // Both sides move the same buffers: on this VM, which memory a buffer has was seen to
    // change O_DIRECT bandwidth by 2x, more than the I/O method does.
    let (put_time, floor_put_time, put_path) = alternate(
        rounds,
        &mut blocks,
        |blocks| put_batch(io, &io_file, blocks),
        |blocks| floor_put(&floor_file, blocks),
    );
    let (get_time, floor_get_time, get_path) = alternate(
        rounds,
        &mut blocks,
        |blocks| get_batch(io, &io_file, blocks),
        |blocks| floor_get(&floor_file, blocks),
    );

    let bytes = batch_bytes * rounds;
    report(block_size, "put", bytes, put_time, floor_put_time, put_path);
    report(block_size, "get", bytes, get_time, floor_get_time, get_path);
    let expected = filled_block(block_size, 1);
    assert_eq!(blocks[1].as_slice(), expected.as_slice());
    drop(floor_file);
    std::fs::remove_file(&io_file).expect("remove");
    std::fs::remove_file(&floor_path).expect("remove");
}

fn filled_block(block_size: usize, blkid: usize) -> AlignedBuf {
    let mut block = AlignedBuf::new(block_size);
    block.as_mut_slice().fill(blkid as u8);
    block
}

fn open_direct(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("O_DIRECT open")
}

/// Runs `rounds` rounds of `fileio` and `floor` taking turns, so that both see the same
/// disk and load (at least 2 rounds, so each goes first once); returns the time each took in total and the path FileIo's last round took.
fn alternate(
    rounds: usize,
    blocks: &mut [AlignedBuf],
    mut fileio: impl FnMut(&mut [AlignedBuf]) -> IoPath,
    mut floor: impl FnMut(&mut [AlignedBuf]),
) -> (Duration, Duration, IoPath) {
    let mut fileio_time = Duration::ZERO;
    let mut floor_time = Duration::ZERO;
    let mut path = None;
    for round in 0..rounds {
        // Which goes first alternates too: on a virtual disk the second of two back-to-back
        // runs can be systematically faster or slower.
        if round % 2 == 1 {
            floor_time += time(|| floor(blocks));
        }
        let start = Instant::now();
        path = Some(fileio(blocks));
        fileio_time += start.elapsed();
        if round % 2 == 0 {
            floor_time += time(|| floor(blocks));
        }
    }
    (fileio_time, floor_time, path.expect("at least one round"))
}

fn time(run: impl FnOnce()) -> Duration {
    let start = Instant::now();
    run();
    start.elapsed()
}

fn put_batch(io: &FileIo, file: &Path, blocks: &[AlignedBuf]) -> IoPath {
    let ops: Vec<WriteOp<'_>> = blocks
        .iter()
        .enumerate()
        .map(|(blkid, block)| WriteOp {
            path: file,
            offset: (blkid * block.len()) as u64,
            data: block.as_slice(),
        })
        .collect();
    single_path(io.write_blocks(&ops))
}

fn get_batch(io: &FileIo, file: &Path, blocks: &mut [AlignedBuf]) -> IoPath {
    let mut ops: Vec<ReadOp<'_>> = blocks
        .iter_mut()
        .enumerate()
        .map(|(blkid, block)| ReadOp {
            path: file,
            offset: (blkid * block.len()) as u64,
            buf: block.as_mut_slice(),
        })
        .collect();
    single_path(io.read_blocks(&mut ops))
}

/// The one path every op of a batch took; panics on an error or a mix.
fn single_path(results: Vec<Result<IoPath, kvcm_data::DataError>>) -> IoPath {
    let paths: Vec<IoPath> = results
        .into_iter()
        .map(|result| result.expect("block I/O"))
        .collect();
    assert!(paths.iter().all(|path| *path == paths[0]), "{paths:?}");
    paths[0]
}

fn floor_put(file: &File, blocks: &[AlignedBuf]) {
    for (blkid, block) in blocks.iter().enumerate() {
        let offset = (blkid * block.len()) as u64;
        file.write_all_at(block.as_slice(), offset).expect("pwrite");
    }
}

fn floor_get(file: &File, blocks: &mut [AlignedBuf]) {
    for (blkid, block) in blocks.iter_mut().enumerate() {
        let offset = (blkid * block.len()) as u64;
        file.read_exact_at(block.as_mut_slice(), offset)
            .expect("pread");
    }
}

fn report(
    block_size: usize,
    op: &str,
    bytes: usize,
    took: Duration,
    floor: Duration,
    path: IoPath,
) {
    let rate = |time: Duration| bytes as f64 / time.as_secs_f64() / 1e9;
    println!(
        "{:>7}K {op:>4} {:>14.2} {:>12.2} {:>6.0}%  {path}",
        block_size >> 10,
        rate(took),
        rate(floor),
        100.0 * rate(took) / rate(floor),
    );
}
