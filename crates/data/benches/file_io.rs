//! Put/get bandwidth of `FileIo` (batches of 64 blocks, O_DIRECT) beside its floor: a plain
//! sequential O_DIRECT `pwrite`/`pread` loop of the same bytes to one file, measured in the
//! same run. Prints GB/s, the ratio to the floor, and the process's CPU time (user + system,
//! io_uring workers included) per MiB moved by each side; each size runs twice, the second
//! time with the blocks registered as io_uring buffers. Runs on the target directory's disk;
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
        "{:>8} {:>4} {:>14} {:>12} {:>7} {:>12} {:>12}  path",
        "block", "op", "FileIo GB/s", "floor GB/s", "ratio", "CPU µs/MiB", "floor CPU"
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
    let bytes = batch_bytes * rounds;
    for registered in [false, true] {
        if registered {
            if let Err(refused) = register_all(io, &mut blocks) {
                println!(
                    "{:>7}K registered rows skipped: {refused}",
                    block_size >> 10
                );
                break;
            }
        }
        let put = alternate(
            rounds,
            &mut blocks,
            |blocks| put_batch(io, &io_file, blocks),
            |blocks| floor_put(&floor_file, blocks),
        );
        report(block_size, "put", bytes, put);
        let get = alternate(
            rounds,
            &mut blocks,
            |blocks| get_batch(io, &io_file, blocks),
            |blocks| floor_get(&floor_file, blocks),
        );
        report(block_size, "get", bytes, get);
    }
    // Those that were registered (all, or those before a refusal).
    for block in &blocks {
        io.deregister_buffer(block.as_slice().as_ptr())
            .expect("unregister");
    }
    let expected = filled_block(block_size, 1);
    assert_eq!(blocks[1].as_slice(), expected.as_slice());
    drop(floor_file);
    std::fs::remove_file(&io_file).expect("remove");
    std::fs::remove_file(&floor_path).expect("remove");
}

/// Registers every block with io_uring (RLIMIT_MEMLOCK may refuse: 256 MiB at 4 MiB blocks).
fn register_all(io: &FileIo, blocks: &mut [AlignedBuf]) -> Result<(), kvcm_data::DataError> {
    for block in blocks {
        let block = block.as_mut_slice();
        // SAFETY: every block stays allocated and mapped until it is unregistered at the
        // end of `bench_block_size`.
        unsafe { io.register_buffer(block.as_mut_ptr(), block.len()) }?;
    }
    Ok(())
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

/// Time and CPU time of the rounds of one side.
#[derive(Default)]
struct Spent {
    wall: Duration,
    cpu: Duration,
}

impl Spent {
    fn add(&mut self, run: impl FnOnce()) {
        let (wall, cpu) = (Instant::now(), cpu_time());
        run();
        self.wall += wall.elapsed();
        self.cpu += cpu_time() - cpu;
    }
}

/// What `alternate` measured: FileIo's time, the floor's, and the path FileIo's last round
/// took.
struct Measured {
    fileio: Spent,
    floor: Spent,
    path: IoPath,
}

/// Runs `rounds` rounds of `fileio` and `floor` taking turns, so that both see the same
/// disk and load (at least 2 rounds, so each goes first once).
fn alternate(
    rounds: usize,
    blocks: &mut [AlignedBuf],
    mut fileio: impl FnMut(&mut [AlignedBuf]) -> IoPath,
    mut floor: impl FnMut(&mut [AlignedBuf]),
) -> Measured {
    let (mut fileio_spent, mut floor_spent) = (Spent::default(), Spent::default());
    let mut path = None;
    for round in 0..rounds {
        // Which goes first alternates too: on a virtual disk the second of two back-to-back
        // runs can be systematically faster or slower.
        if round % 2 == 1 {
            floor_spent.add(|| floor(blocks));
        }
        fileio_spent.add(|| path = Some(fileio(blocks)));
        if round % 2 == 0 {
            floor_spent.add(|| floor(blocks));
        }
    }
    Measured {
        fileio: fileio_spent,
        floor: floor_spent,
        path: path.expect("at least one round"),
    }
}

/// The process's CPU time so far (user + system, every thread).
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer it is given, a valid one here.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let of = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    of(usage.ru_utime) + of(usage.ru_stime)
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

fn report(block_size: usize, op: &str, bytes: usize, measured: Measured) {
    let rate = |spent: &Spent| bytes as f64 / spent.wall.as_secs_f64() / 1e9;
    let cpu_per_mib = |spent: &Spent| spent.cpu.as_secs_f64() * 1e6 / (bytes >> 20) as f64;
    let Measured {
        fileio,
        floor,
        path,
    } = measured;
    println!(
        "{:>7}K {op:>4} {:>14.2} {:>12.2} {:>6.0}% {:>12.1} {:>12.1}  {path}",
        block_size >> 10,
        rate(&fileio),
        rate(&floor),
        100.0 * rate(&fileio) / rate(&floor),
        cpu_per_mib(&fileio),
        cpu_per_mib(&floor),
    );
}
