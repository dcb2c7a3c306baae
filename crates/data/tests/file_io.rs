//! FileIo against real files on the target directory's disk (ext4 here, so O_DIRECT works),
//! each behaviour checked on both backends: io_uring and psync.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use kvcm_data::{
    AlignedBuf, DataError, DirectMode, FileIo, FileIoConfig, IoBackend, IoPath, ReadOp, WriteOp,
};

const BLOCK: usize = 4096;

fn backends() -> Vec<FileIo> {
    let uring = FileIo::new(FileIoConfig::default());
    let psync = FileIo::new(FileIoConfig {
        force_psync: true,
        ..FileIoConfig::default()
    });
    vec![uring, psync]
}

/// An io_uring `FileIo`, or `None` after a loud notice where the kernel refuses io_uring
/// (seccomp, `kernel.io_uring_disabled`); under `CI=true` (these machines have it) that fails.
fn uring_or_skip(test: &str) -> Option<FileIo> {
    let io = FileIo::new(FileIoConfig::default());
    match io.backend() {
        (IoBackend::Uring, _) => Some(io),
        (_, reason) => {
            let reason = reason.unwrap_or("unknown");
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: io_uring is refused under CI: {reason}"
            );
            eprintln!("SKIPPED {test}: io_uring is refused here ({reason})");
            None
        }
    }
}

fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn expected_path(io: &FileIo, direct: bool) -> IoPath {
    match (io.backend().0, direct) {
        (IoBackend::Uring, true) => IoPath::UringDirect,
        (IoBackend::Uring, false) => IoPath::UringBuffered,
        (IoBackend::Psync, true) => IoPath::PsyncDirect,
        (IoBackend::Psync, false) => IoPath::PsyncBuffered,
    }
}

/// The bytes of block `blkid` of file `file`: distinct per block and per byte.
fn pattern(file: usize, blkid: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ blkid.wrapping_mul(7) ^ file.wrapping_mul(131)) as u8)
        .collect()
}

fn aligned_copy(bytes: &[u8]) -> AlignedBuf {
    let mut buf = AlignedBuf::new(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    buf
}

fn assert_all_ok(results: &[Result<IoPath, DataError>], path: IoPath) {
    for (index, result) in results.iter().enumerate() {
        match result {
            Ok(ran) => assert_eq!(*ran, path, "op {index}"),
            Err(error) => panic!("op {index} failed: {error}"),
        }
    }
}

/// Writes `blocks_per_file` blocks of `size` bytes to each file, in one call, blocks in
/// reverse order so the offsets (not the order) place them.
fn write_files(io: &FileIo, files: &[PathBuf], blocks_per_file: usize, bufs: &[AlignedBuf]) {
    let size = bufs[0].len();
    let ops: Vec<WriteOp<'_>> = (0..files.len() * blocks_per_file)
        .rev()
        .map(|n| WriteOp {
            path: &files[n / blocks_per_file],
            offset: ((n % blocks_per_file) * size) as u64,
            data: bufs[n].as_slice(),
        })
        .collect();
    assert_all_ok(&io.write_blocks(&ops), expected_path(io, true));
}

#[test]
fn many_aligned_blocks_round_trip_at_wire_offsets_through_o_direct() {
    for io in backends() {
        let dir = scratch_dir();
        let files: Vec<PathBuf> = (0..3)
            .map(|f| dir.path().join(format!("i/tp0/{f}")))
            .collect();
        let blocks_per_file = 8;
        let bufs: Vec<AlignedBuf> = (0..files.len() * blocks_per_file)
            .map(|n| aligned_copy(&pattern(n / blocks_per_file, n % blocks_per_file, BLOCK)))
            .collect();
        write_files(&io, &files, blocks_per_file, &bufs);

        for (f, file) in files.iter().enumerate() {
            let on_disk = fs::read(file).expect("read back");
            assert_eq!(on_disk.len(), blocks_per_file * BLOCK);
            for blkid in 0..blocks_per_file {
                let at = blkid * BLOCK;
                assert_eq!(&on_disk[at..at + BLOCK], &pattern(f, blkid, BLOCK)[..]);
            }
        }

        let mut reads: Vec<AlignedBuf> = bufs.iter().map(|_| AlignedBuf::new(BLOCK)).collect();
        let mut ops: Vec<ReadOp<'_>> = reads
            .iter_mut()
            .enumerate()
            .map(|(n, buf)| ReadOp {
                path: &files[n / blocks_per_file],
                offset: ((n % blocks_per_file) * BLOCK) as u64,
                buf: buf.as_mut_slice(),
            })
            .collect();
        assert_all_ok(&io.read_blocks(&mut ops), expected_path(&io, true));
        for (read, written) in reads.iter().zip(&bufs) {
            assert_eq!(read.as_slice(), written.as_slice());
        }
    }
}

#[test]
fn wire_sized_unaligned_blocks_round_trip_buffered() {
    for io in backends() {
        let dir = scratch_dir();
        let file = dir.path().join("instance1/tp0/64_abc");
        let size = 1024;
        let blocks: Vec<Vec<u8>> = (0..3).map(|blkid| pattern(0, blkid, size)).collect();
        let ops: Vec<WriteOp<'_>> = blocks
            .iter()
            .enumerate()
            .map(|(blkid, data)| WriteOp {
                path: &file,
                offset: (blkid * size) as u64,
                data,
            })
            .collect();
        assert_all_ok(&io.write_blocks(&ops), expected_path(&io, false));
        let on_disk = fs::read(&file).expect("read back");
        assert_eq!(on_disk, blocks.concat());

        let mut third = vec![0u8; size];
        let mut read = [ReadOp {
            path: &file,
            offset: 2048,
            buf: &mut third,
        }];
        assert_all_ok(&io.read_blocks(&mut read), expected_path(&io, false));
        assert_eq!(third, blocks[2]);
    }
}

#[test]
fn one_unaligned_op_makes_its_whole_file_buffered_but_not_other_files() {
    for io in backends() {
        let dir = scratch_dir();
        let mixed = dir.path().join("mixed");
        let clean = dir.path().join("clean");
        let aligned = aligned_copy(&pattern(0, 0, BLOCK));
        let unaligned = pattern(0, 1, BLOCK - 1);
        let ops = [
            WriteOp {
                path: &mixed,
                offset: 0,
                data: aligned.as_slice(),
            },
            WriteOp {
                path: &mixed,
                offset: BLOCK as u64,
                data: &unaligned,
            },
            WriteOp {
                path: &clean,
                offset: 0,
                data: aligned.as_slice(),
            },
        ];
        let results = io.write_blocks(&ops);
        assert_eq!(results[0].as_ref().ok(), Some(&expected_path(&io, false)));
        assert_eq!(results[1].as_ref().ok(), Some(&expected_path(&io, false)));
        assert_eq!(results[2].as_ref().ok(), Some(&expected_path(&io, true)));
        let on_disk = fs::read(&mixed).expect("read back");
        assert_eq!(on_disk, [aligned.as_slice(), &unaligned].concat());
    }
}

#[test]
fn direct_mode_never_keeps_aligned_blocks_buffered() {
    for force_psync in [false, true] {
        let io = FileIo::new(FileIoConfig {
            direct: DirectMode::Never,
            force_psync,
            ..FileIoConfig::default()
        });
        let dir = scratch_dir();
        let file = dir.path().join("f");
        let block = aligned_copy(&pattern(1, 1, BLOCK));
        let ops = [WriteOp {
            path: &file,
            offset: 0,
            data: block.as_slice(),
        }];
        assert_all_ok(&io.write_blocks(&ops), expected_path(&io, false));
    }
}

#[test]
fn a_missing_file_is_a_miss() {
    for io in backends() {
        let dir = scratch_dir();
        let file = dir.path().join("never/written");
        let mut buf = AlignedBuf::new(BLOCK);
        let mut ops = [ReadOp {
            path: &file,
            offset: 0,
            buf: buf.as_mut_slice(),
        }];
        let results = io.read_blocks(&mut ops);
        match &results[0] {
            Err(error @ DataError::Open { path, .. }) => {
                assert_eq!(path, &file);
                assert!(error.is_miss());
            }
            other => panic!("expected a NotFound open error, got {other:?}"),
        }
    }
}

#[test]
fn a_block_past_a_truncated_end_is_a_short_read() {
    for io in backends() {
        let dir = scratch_dir();
        let file = dir.path().join("truncated");
        fs::write(&file, pattern(0, 0, BLOCK + 1000)).expect("write");
        let mut second = AlignedBuf::new(BLOCK);
        let mut third = vec![0u8; 100];
        let mut ops = [
            ReadOp {
                path: &file,
                offset: BLOCK as u64,
                buf: second.as_mut_slice(),
            },
            ReadOp {
                path: &file,
                offset: 3 * BLOCK as u64,
                buf: &mut third,
            },
        ];
        let results = io.read_blocks(&mut ops);
        match &results[0] {
            Err(
                error @ DataError::ShortRead {
                    offset,
                    expected,
                    got,
                    ..
                },
            ) => {
                assert_eq!((*offset, *expected, *got), (BLOCK as u64, BLOCK, 1000));
                assert!(error.is_miss());
            }
            other => panic!("expected ShortRead, got {other:?}"),
        }
        assert!(matches!(
            results[1],
            Err(DataError::ShortRead { got: 0, .. })
        ));
        assert_eq!(
            &second.as_slice()[..1000],
            &pattern(0, 0, BLOCK + 1000)[BLOCK..]
        );
    }
}

/// A file of a kernel file system is no block storage: refused at open, nothing read. (The
/// fallback to buffered I/O when a file system refuses O_DIRECT, which procfs showed here
/// before, is tested on the open itself: `file_io::open`'s unit tests.)
#[test]
fn a_procfs_file_is_refused_as_no_storage() {
    let file = Path::new("/proc/sys/kernel/ostype");
    for io in backends() {
        let mut aligned = AlignedBuf::new(BLOCK);
        let mut ops = [ReadOp {
            path: file,
            offset: 0,
            buf: aligned.as_mut_slice(),
        }];
        match &io.read_blocks(&mut ops)[0] {
            Err(DataError::Open { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput, "{source}")
            }
            other => panic!("expected a refused open, got {other:?}"),
        }
        assert!(
            aligned.as_slice().iter().all(|&b| b == 0),
            "nothing was read"
        );
    }
}

#[test]
fn the_writer_creates_directories_0755_and_files_0644_without_truncating() {
    for io in backends() {
        let dir = scratch_dir();
        let file = dir.path().join("a/b/c/blocks");
        let first = pattern(0, 0, 512);
        let second = pattern(0, 1, 512);
        let ops = [WriteOp {
            path: &file,
            offset: 0,
            data: &first,
        }];
        assert!(io.write_blocks(&ops)[0].is_ok());
        let ops = [WriteOp {
            path: &file,
            offset: 512,
            data: &second,
        }];
        assert!(io.write_blocks(&ops)[0].is_ok());
        assert_eq!(fs::read(&file).expect("read"), [first, second].concat());

        let mode = |path: &Path| fs::metadata(path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&file) & !0o644, 0, "file mode {:o}", mode(&file));
        assert_eq!(mode(&file) & 0o600, 0o600);
        let parent = file.parent().expect("parent");
        assert_eq!(mode(parent) & !0o755, 0, "dir mode {:o}", mode(parent));
        assert_eq!(mode(parent) & 0o700, 0o700);
    }
}

#[test]
fn a_failing_op_leaves_the_others_of_its_call_alone() {
    for io in backends() {
        let dir = scratch_dir();
        let blocker = dir.path().join("plain_file");
        fs::write(&blocker, b"x").expect("write");
        let under_a_file = blocker.join("child");
        let good = dir.path().join("good");
        let data = pattern(2, 2, 300);
        let ops = [
            WriteOp {
                path: &under_a_file,
                offset: 0,
                data: &data,
            },
            WriteOp {
                path: &good,
                offset: 0,
                data: &data,
            },
        ];
        let results = io.write_blocks(&ops);
        assert!(matches!(&results[0], Err(DataError::CreateDir { path, .. }) if path == &blocker));
        assert_eq!(results[1].as_ref().ok(), Some(&expected_path(&io, false)));
        assert_eq!(fs::read(&good).expect("read"), data);
    }
}

#[test]
fn a_batch_deeper_than_the_queue_completes() {
    for force_psync in [false, true] {
        let io = FileIo::new(FileIoConfig {
            queue_depth: 4,
            direct: DirectMode::Auto,
            force_psync,
        });
        let dir = scratch_dir();
        let file = dir.path().join("deep");
        let bufs: Vec<AlignedBuf> = (0..100)
            .map(|blkid| aligned_copy(&pattern(3, blkid, BLOCK)))
            .collect();
        let ops: Vec<WriteOp<'_>> = bufs
            .iter()
            .enumerate()
            .map(|(blkid, buf)| WriteOp {
                path: &file,
                offset: (blkid * BLOCK) as u64,
                data: buf.as_slice(),
            })
            .collect();
        assert_all_ok(&io.write_blocks(&ops), expected_path(&io, true));
        let on_disk = fs::read(&file).expect("read");
        let written: Vec<u8> = bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
        assert_eq!(on_disk, written);
    }
}

#[test]
fn each_backend_reads_what_the_other_wrote() {
    let [uring, psync]: [FileIo; 2] = backends().try_into().expect("two backends");
    let dir = scratch_dir();
    for (writer, reader, name) in [(&uring, &psync, "u2p"), (&psync, &uring, "p2u")] {
        let file = dir.path().join(name);
        let data = pattern(4, 4, 3 * BLOCK + 17);
        assert!(writer.write_blocks(&[WriteOp {
            path: &file,
            offset: 5,
            data: &data
        }])[0]
            .is_ok());
        let mut back = vec![0u8; data.len()];
        let mut ops = [ReadOp {
            path: &file,
            offset: 5,
            buf: &mut back,
        }];
        assert!(reader.read_blocks(&mut ops)[0].is_ok());
        assert_eq!(back, data);
    }
}

#[test]
fn empty_ops_and_empty_batches_succeed() {
    for io in backends() {
        let dir = scratch_dir();
        let file = dir.path().join("empty");
        assert!(io.write_blocks(&[]).is_empty());
        let ops = [WriteOp {
            path: &file,
            offset: 0,
            data: &[],
        }];
        assert!(io.write_blocks(&ops)[0].is_ok());
        let mut ops = [ReadOp {
            path: &file,
            offset: 0,
            buf: &mut [],
        }];
        assert!(io.read_blocks(&mut ops)[0].is_ok());
    }
}

#[test]
fn backends_say_which_they_are_and_why() {
    let psync = FileIo::new(FileIoConfig {
        force_psync: true,
        ..FileIoConfig::default()
    });
    assert_eq!(
        psync.backend(),
        (IoBackend::Psync, Some("force_psync is set"))
    );
    let default = FileIo::new(FileIoConfig::default());
    match default.backend() {
        (IoBackend::Uring, reason) => assert_eq!(reason, None),
        (IoBackend::Psync, reason) => assert!(reason.is_some_and(|r| r.contains("io_uring"))),
    }
    assert_eq!(IoPath::UringDirect.to_string(), "io_uring O_DIRECT");
    assert_eq!(IoPath::PsyncBuffered.to_string(), "psync buffered");
}

#[test]
fn one_file_io_serves_several_threads() {
    for io in backends() {
        let dir = scratch_dir();
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (io, dir) = (&io, dir.path());
                scope.spawn(move || {
                    let file = dir.join(format!("t{thread}"));
                    let block = aligned_copy(&pattern(thread, 0, BLOCK));
                    for round in 0..20u64 {
                        let ops = [WriteOp {
                            path: &file,
                            offset: round * BLOCK as u64,
                            data: block.as_slice(),
                        }];
                        assert!(io.write_blocks(&ops)[0].is_ok());
                    }
                    let on_disk = fs::read(&file).expect("read");
                    assert_eq!(on_disk.len(), 20 * BLOCK);
                    assert!(on_disk.chunks(BLOCK).all(|chunk| chunk == block.as_slice()));
                });
            }
        });
    }
}

/// The first block of `file`, read into a buffer of its own (unregistered, so by
/// [`IoPath::UringDirect`]).
fn first_block(io: &FileIo, file: &Path) -> Vec<u8> {
    let mut block = AlignedBuf::new(BLOCK);
    let mut ops = [ReadOp {
        path: file,
        offset: 0,
        buf: block.as_mut_slice(),
    }];
    assert_all_ok(&io.read_blocks(&mut ops), IoPath::UringDirect);
    block.as_slice().to_vec()
}

/// Ops inside a registered range move through io_uring's buffer table and say so; ops
/// outside it, straddling its end, or after it is unregistered move as before; the bytes
/// are the same either way.
#[test]
fn ops_in_a_registered_buffer_move_through_it_and_say_so() {
    let blocks = 4;
    // Declared before `io`, so dropped after it even when an assertion fails.
    let mut arena = AlignedBuf::new(blocks * BLOCK);
    let Some(io) = uring_or_skip("ops_in_a_registered_buffer_move_through_it_and_say_so") else {
        return;
    };
    let dir = scratch_dir();
    let file = dir.path().join("i/tp0/registered");
    for (n, chunk) in arena.as_mut_slice().chunks_mut(BLOCK).enumerate() {
        chunk.copy_from_slice(&pattern(0, n, BLOCK));
    }
    let base = arena.as_mut_slice().as_mut_ptr();
    // SAFETY: the first three blocks of `arena` stay allocated until they are unregistered
    // below.
    unsafe { io.register_buffer(base, 3 * BLOCK) }.unwrap();
    assert_eq!(io.registered_buffers(), 1);
    let outside = aligned_copy(&pattern(0, 9, BLOCK));
    let ops: Vec<WriteOp<'_>> = arena
        .as_slice()
        .chunks(BLOCK)
        .chain([outside.as_slice()])
        .enumerate()
        .map(|(n, data)| WriteOp {
            path: &file,
            offset: (n * BLOCK) as u64,
            data,
        })
        .collect();
    let paths: Vec<IoPath> = io
        .write_blocks(&ops)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let registered = IoPath::UringDirectRegistered;
    let unregistered = IoPath::UringDirect;
    assert_eq!(
        paths,
        [
            registered,
            registered,
            registered,
            unregistered,
            unregistered
        ]
    );
    assert_eq!(
        registered.to_string(),
        "io_uring O_DIRECT, registered buffer"
    );

    // Read back: into the registered range, then into a span straddling its end.
    arena.as_mut_slice().fill(0);
    let (head, tail) = arena.as_mut_slice().split_at_mut(2 * BLOCK);
    let mut straddling = [&mut head[..BLOCK], &mut tail[..]];
    let mut ops: Vec<ReadOp<'_>> = straddling
        .iter_mut()
        .enumerate()
        .map(|(n, buf)| ReadOp {
            path: &file,
            offset: (n * 2 * BLOCK) as u64,
            buf,
        })
        .collect();
    let paths: Vec<IoPath> = io
        .read_blocks(&mut ops)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        paths,
        [registered, IoPath::UringDirect],
        "the second straddles the end"
    );
    let arena_bytes = arena.as_slice();
    assert_eq!(&arena_bytes[..BLOCK], pattern(0, 0, BLOCK));
    assert_eq!(&arena_bytes[2 * BLOCK..3 * BLOCK], pattern(0, 2, BLOCK));
    assert_eq!(&arena_bytes[3 * BLOCK..], pattern(0, 3, BLOCK));

    assert!(io.deregister_buffer(base).unwrap());
    assert!(!io.deregister_buffer(base).unwrap(), "already gone");
    assert_eq!(io.registered_buffers(), 0);
    assert_eq!(first_block(&io, &file), pattern(0, 0, BLOCK));
}

/// Bad ranges are refused with the rule they break and change nothing; the psync backend
/// refuses registration and names itself; with every slot taken a range is refused, and a
/// freed slot is taken again (and moves blocks).
#[test]
fn registration_refuses_bad_ranges_and_reuses_slots() {
    let slots = 1024;
    let mut arena = AlignedBuf::new((slots + 1) * BLOCK);
    let Some(io) = uring_or_skip("registration_refuses_bad_ranges_and_reuses_slots") else {
        return;
    };
    let base = arena.as_mut_slice().as_mut_ptr();
    // SAFETY: `arena` stays allocated until the range is unregistered below; what is
    // refused registers nothing.
    unsafe {
        io.register_buffer(base, 2 * BLOCK).unwrap();
        for (addr, len, says) in [
            (base.wrapping_add(BLOCK), 2 * BLOCK, "overlaps"),
            (base.wrapping_add(3 * BLOCK), 0, "empty"),
            (std::ptr::null_mut(), BLOCK, "null"),
        ] {
            let error = io.register_buffer(addr, len).unwrap_err();
            assert!(
                matches!(error, DataError::RegisterBuffer { .. }),
                "{error:?}"
            );
            assert!(error.to_string().contains(says), "{error}");
        }
    }
    assert_eq!(io.registered_buffers(), 1, "refusals changed nothing");
    assert!(io.deregister_buffer(base).unwrap());

    let block = |n: usize| base.wrapping_add(n * BLOCK);
    for n in 0..slots {
        // SAFETY: `arena` stays allocated until every range is unregistered below.
        unsafe { io.register_buffer(block(n), BLOCK) }.unwrap();
    }
    // SAFETY: as above.
    let full = unsafe { io.register_buffer(block(slots), BLOCK) }.unwrap_err();
    assert!(full.to_string().contains("too few are free"), "{full}");
    assert!(io.deregister_buffer(block(7)).unwrap());
    // SAFETY: as above.
    unsafe { io.register_buffer(block(slots), BLOCK) }.expect("the freed slot is reused");
    let dir = scratch_dir();
    let file = dir.path().join("i/tp0/reused");
    let last = &mut arena.as_mut_slice()[slots * BLOCK..];
    last.copy_from_slice(&pattern(1, 0, BLOCK));
    let ops = [WriteOp {
        path: &file,
        offset: 0,
        data: last,
    }];
    assert_all_ok(&io.write_blocks(&ops), IoPath::UringDirectRegistered);
    for n in (0..=slots).filter(|&n| n != 7) {
        assert!(io.deregister_buffer(block(n)).unwrap(), "range {n}");
    }
    assert_eq!(io.registered_buffers(), 0);
    assert_eq!(first_block(&io, &file), pattern(1, 0, BLOCK));

    let psync = FileIo::new(FileIoConfig {
        force_psync: true,
        ..FileIoConfig::default()
    });
    // SAFETY: refused (psync), so nothing is registered.
    let error = unsafe { psync.register_buffer(base, BLOCK) }.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("psync backend runs (force_psync is set)"),
        "{error}"
    );
    assert!(!psync.deregister_buffer(base).unwrap());
}
