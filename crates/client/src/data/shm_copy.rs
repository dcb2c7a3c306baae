//! Direct copies between the caller's buffers and a pool node's region mapped over
//! soft-shm, spread over a few threads, each hashing what it copies while it is in cache.
//!
//! A checksummed copy done as "copy everything, then hash everything" (or hash on other
//! threads beside the copy) reads the caller's bytes from memory twice; here each thread
//! copies [`CHUNK`] bytes and hashes that chunk at once from its cache, so the bytes cross
//! the memory bus once. A large batch is split into contiguous shares of about equal
//! bytes, one per thread (at most [`MAX_THREADS`], at least [`SHARE_BYTES`] each).
//!
//! Invariants: every operation was checked to lie in one run of the region before it gets
//! here (the copies are still checked by the queue pair); a copy refused anywhere fails the
//! whole batch (the link is then broken by its caller), and no thread outlives the call.

use kvcm_transport::soft::SoftQp;
use kvcm_transport::{RemoteAddr, TransportError};
use std::hash::Hasher;
use twox_hash::XxHash3_64;

/// Bytes copied before the copied bytes are hashed (well inside a core's L2 cache).
const CHUNK: usize = 64 << 10;
/// Least bytes a thread of a batch copies: below, starting a thread costs more than it
/// saves (a 4 MiB batch ran no faster on two threads on a 2-core VM).
const SHARE_BYTES: usize = 8 << 20;
/// Most threads one batch is copied on.
const MAX_THREADS: usize = 4;

/// Writes each `(remote, bytes)`, in order within each share; with `hash`, the xxh3-64 of
/// every operation's bytes, in operation order.
pub(crate) fn write(
    qp: &SoftQp,
    writes: &mut [(RemoteAddr, &[u8])],
    hash: bool,
) -> Result<Vec<Option<u64>>, String> {
    in_shares(
        writes,
        |(_, data)| data.len(),
        |ops, sums| write_share(qp, ops, hash, sums),
    )
}

/// Reads into each `(remote, buffer)`, in order within each share; with `hash`, the xxh3-64
/// of every buffer's bytes as read, in operation order.
pub(crate) fn read(
    qp: &SoftQp,
    reads: &mut [(RemoteAddr, &mut [u8])],
    hash: bool,
) -> Result<Vec<Option<u64>>, String> {
    in_shares(
        reads,
        |(_, buf)| buf.len(),
        |ops, sums| read_share(qp, ops, hash, sums),
    )
}

/// Runs `copy` over the [`shares`] of `ops` (`len_of`: an operation's bytes), each with
/// its slice of the per-operation checksums, which it returns in operation order.
fn in_shares<T: Send>(
    ops: &mut [T],
    len_of: impl Fn(&T) -> usize,
    copy: impl Fn(&mut [T], &mut [Option<u64>]) -> Result<(), String> + Sync,
) -> Result<Vec<Option<u64>>, String> {
    let lengths: Vec<usize> = ops.iter().map(len_of).collect();
    let shares = shares(&lengths);
    let mut sums = vec![None; ops.len()];
    let (mut rest_ops, mut rest_sums) = (ops, &mut sums[..]);
    let copy = &copy;
    let mut jobs = Vec::with_capacity(shares.len());
    for count in shares {
        let (share, after) = rest_ops.split_at_mut(count);
        let (out, after_sums) = rest_sums.split_at_mut(count);
        (rest_ops, rest_sums) = (after, after_sums);
        jobs.push(move || copy(share, out));
    }
    run_all(jobs)?;
    Ok(sums)
}

/// How many operations (of these lengths, in order) each thread takes: contiguous shares
/// of about equal bytes; one share when the batch is small or there is one core.
fn shares(lengths: &[usize]) -> Vec<usize> {
    let total: usize = lengths.iter().sum();
    let threads = (total / SHARE_BYTES)
        .min(super::cores())
        .min(MAX_THREADS)
        .min(lengths.len())
        .max(1);
    let target = total.div_ceil(threads);
    let mut shares = Vec::with_capacity(threads);
    let (mut count, mut bytes) = (0, 0);
    for &len in lengths {
        count += 1;
        bytes += len;
        if bytes >= target && shares.len() + 1 < threads {
            shares.push(count);
            (count, bytes) = (0, 0);
        }
    }
    if count > 0 || shares.is_empty() {
        shares.push(count);
    }
    shares
}

/// Runs `jobs`, the first on this thread and each other on a thread of its own; the first
/// error, if any.
fn run_all<J>(jobs: Vec<J>) -> Result<(), String>
where
    J: FnOnce() -> Result<(), String> + Send,
{
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return Ok(());
    };
    std::thread::scope(|scope| {
        let others: Vec<_> = jobs.map(|job| scope.spawn(job)).collect();
        let mut outcome = first();
        for other in others {
            let joined = other
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            outcome = outcome.and(joined);
        }
        outcome
    })
}

/// Runs `copy(from, to, hasher)` over the byte range `0..len` of one operation: in pieces
/// of [`CHUNK`] when there is a `hasher` (which `copy` feeds each piece right after copying
/// it, while it is in cache), in one piece otherwise. An empty operation is one empty
/// piece: its copy is still checked (peer alive, key) like any other.
pub(crate) fn hashing<E>(
    len: usize,
    mut hasher: Option<&mut XxHash3_64>,
    mut copy: impl FnMut(usize, usize, Option<&mut XxHash3_64>) -> Result<(), E>,
) -> Result<(), E> {
    let piece = if hasher.is_some() { CHUNK } else { len.max(1) };
    let mut from = 0;
    loop {
        let to = (from + piece).min(len);
        copy(from, to, hasher.as_deref_mut())?;
        from = to;
        if from >= len {
            return Ok(());
        }
    }
}

fn write_share(
    qp: &SoftQp,
    ops: &[(RemoteAddr, &[u8])],
    hash: bool,
    sums: &mut [Option<u64>],
) -> Result<(), String> {
    if !hash {
        return qp.write_direct(ops).map_err(|e| e.to_string());
    }
    for ((remote, data), sum) in ops.iter().zip(sums) {
        let mut hasher = XxHash3_64::new();
        hashing(data.len(), Some(&mut hasher), |from, to, hasher| {
            let bytes = &data[from..to];
            qp.write_direct(&[(at_offset(*remote, from), bytes)])?;
            if let Some(hasher) = hasher {
                hasher.write(bytes);
            }
            Ok(())
        })
        .map_err(|e: TransportError| e.to_string())?;
        *sum = Some(hasher.finish());
    }
    Ok(())
}

fn read_share(
    qp: &SoftQp,
    ops: &mut [(RemoteAddr, &mut [u8])],
    hash: bool,
    sums: &mut [Option<u64>],
) -> Result<(), String> {
    for ((remote, buf), sum) in ops.iter_mut().zip(sums) {
        let mut hasher = hash.then(XxHash3_64::new);
        hashing(buf.len(), hasher.as_mut(), |from, to, hasher| {
            let bytes = &mut buf[from..to];
            qp.read_direct(&[(at_offset(*remote, from), to - from)], bytes)?;
            if let Some(hasher) = hasher {
                hasher.write(bytes);
            }
            Ok(())
        })
        .map_err(|e: TransportError| e.to_string())?;
        *sum = hasher.map(|h| h.finish());
    }
    Ok(())
}

/// `remote` moved `by` bytes on (same key).
fn at_offset(remote: RemoteAddr, by: usize) -> RemoteAddr {
    RemoteAddr {
        addr: remote.addr + by as u64,
        rkey: remote.rkey,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcm_transport::soft::{SoftConfig, SoftCq, SoftDomain, SoftRegion, Wire};
    use kvcm_transport::{Access, Domain, HostMemory, Memory, QueuePair, Region};

    const MIB: usize = 1 << 20;

    /// A queue pair connected over soft-shm to a peer's registered region.
    struct ShmPeer {
        qp: SoftQp,
        memory: HostMemory,
        region: SoftRegion,
        _kept: (SoftDomain, SoftDomain, SoftQp, [SoftCq; 2]),
    }

    fn shm_peer(len: usize) -> ShmPeer {
        let open = || SoftDomain::open(SoftConfig::with_wire(Wire::Shm)).expect("soft-shm");
        let (ours, theirs) = (open(), open());
        let (cq, peer_cq) = (
            ours.create_cq().expect("cq"),
            theirs.create_cq().expect("cq"),
        );
        let qp = ours.create_qp(&cq, &cq, Default::default()).expect("qp");
        let peer_qp = theirs
            .create_qp(&peer_cq, &peer_cq, Default::default())
            .expect("peer qp");
        qp.connect(&peer_qp.endpoint()).expect("connect");
        peer_qp.connect(&qp.endpoint()).expect("connect the peer");
        let memory = theirs.alloc(len).expect("alloc");
        let region = theirs
            .register(&memory, 0, len, Access::ALL)
            .expect("register");
        ShmPeer {
            qp,
            memory,
            region,
            _kept: (ours, theirs, peer_qp, [cq, peer_cq]),
        }
    }

    #[test]
    fn copies_hash_what_they_move_exactly_as_a_one_shot_hash_on_one_thread_or_several() {
        // Lengths around the chunk size, and a batch large enough for several shares.
        let mut lengths = vec![0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * MIB + 7];
        lengths.extend([2 * MIB; 8]);
        let total: usize = lengths.iter().sum();
        let peer = shm_peer(total);
        let sources: Vec<Vec<u8>> = lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| (0..len).map(|b| (b * 31 + i * 7) as u8).collect())
            .collect();
        let mut at = 0usize;
        let remotes: Vec<RemoteAddr> = lengths
            .iter()
            .map(|&len| {
                let remote = at_offset(
                    RemoteAddr {
                        addr: peer.region.addr(),
                        rkey: peer.region.rkey(),
                    },
                    at,
                );
                at += len;
                remote
            })
            .collect();
        let expected: Vec<Option<u64>> = sources
            .iter()
            .map(|s| Some(twox_hash::XxHash3_64::oneshot(s)))
            .collect();
        for batch in [&lengths[..6], &lengths[..]] {
            let count = batch.len();
            let mut writes: Vec<(RemoteAddr, &[u8])> = remotes[..count]
                .iter()
                .zip(&sources)
                .map(|(r, s)| (*r, &s[..]))
                .collect();
            assert_eq!(
                write(&peer.qp, &mut writes, true).unwrap(),
                expected[..count]
            );
            assert_eq!(
                write(&peer.qp, &mut writes, false).unwrap(),
                vec![None; count]
            );
            let mut landed = vec![0u8; at];
            peer.memory.read(0, &mut landed).unwrap();
            let written: Vec<u8> = sources[..count].concat();
            assert_eq!(&landed[..written.len()], &written[..]);
            let mut buffers: Vec<Vec<u8>> = batch.iter().map(|&len| vec![0u8; len]).collect();
            let mut reads: Vec<(RemoteAddr, &mut [u8])> = remotes[..count]
                .iter()
                .zip(buffers.iter_mut())
                .map(|(r, b)| (*r, &mut b[..]))
                .collect();
            assert_eq!(read(&peer.qp, &mut reads, true).unwrap(), expected[..count]);
            assert_eq!(buffers, sources[..count]);
        }
        // A copy outside the region fails the whole batch.
        let mut past = [(at_offset(remotes[0], at), &sources[1][..])];
        assert!(write(&peer.qp, &mut past, true).is_err());
    }

    #[test]
    fn shares_split_large_batches_into_contiguous_parts_of_about_equal_bytes() {
        let cores = crate::data::cores();
        assert_eq!(
            shares(&[MIB; 15]),
            [15],
            "under two shares' bytes: one thread"
        );
        assert_eq!(shares(&[]), [0]);
        let split = shares(&[MIB; 64]);
        assert_eq!(split.iter().sum::<usize>(), 64);
        assert_eq!(split.len(), cores.clamp(1, MAX_THREADS));
        assert!(
            split.iter().all(|&n| n.abs_diff(64 / split.len()) <= 1),
            "{split:?}"
        );
        let uneven = shares(&[32 * MIB, 8 * MIB, 8 * MIB, 8 * MIB, 8 * MIB]);
        assert_eq!(uneven.iter().sum::<usize>(), 5);
        if cores >= 2 {
            assert_eq!(
                uneven[0], 1,
                "the large first part is a share alone: {uneven:?}"
            );
        }
    }
}
