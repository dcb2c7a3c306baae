//! Local scatter-gather: resolving lkeys and moving bytes between lists and buffers.
//!
//! Every element is checked (live lkey, bounds, local-write right where the NIC writes)
//! before any byte moves, so a bad list fails with `LocalProtectionError` and no effect.

use super::registry::{KeyMemo, Registry, Target};
use crate::sys::SharedMemory;
use crate::{Access, Sge, WcStatus};

/// A resolved scatter-gather element.
#[derive(Clone, Debug)]
pub(crate) struct Piece {
    pub target: Target,
    pub len: usize,
}

/// Resolves every element of `sg_list` for a queue pair of protection domain `pd`; `need`
/// is `LOCAL_WRITE` where the NIC writes.
pub(crate) fn resolve(
    registry: &Registry,
    pd: u32,
    sg_list: &[Sge],
    need: Access,
) -> Result<Vec<Piece>, WcStatus> {
    let mut pieces = Vec::with_capacity(sg_list.len());
    resolve_into(registry, &mut KeyMemo::new(pd), sg_list, need, &mut pieces)?;
    Ok(pieces)
}

/// [`resolve`] into `pieces` (cleared first), so that a loop reuses one allocation, with
/// the keys of a batch looked up through `memo`.
pub(crate) fn resolve_into(
    registry: &Registry,
    memo: &mut KeyMemo,
    sg_list: &[Sge],
    need: Access,
    pieces: &mut Vec<Piece>,
) -> Result<(), WcStatus> {
    pieces.clear();
    for sge in sg_list {
        let target = registry.resolve_memo(memo, sge.lkey, sge.addr, u64::from(sge.len), need);
        let target = target.ok_or(WcStatus::LocalProtectionError)?;
        pieces.push(Piece {
            target,
            len: sge.len as usize,
        });
    }
    Ok(())
}

/// A resolved scatter list kept with a request in flight; one element (the common case:
/// every READ of the lookup path) is held inline, so a request costs no allocation.
#[derive(Clone, Debug, Default)]
pub(crate) enum Pieces {
    #[default]
    Empty,
    One(Piece),
    Many(Vec<Piece>),
}

impl std::ops::Deref for Pieces {
    type Target = [Piece];

    fn deref(&self) -> &[Piece] {
        match self {
            Pieces::Empty => &[],
            Pieces::One(piece) => std::slice::from_ref(piece),
            Pieces::Many(pieces) => pieces,
        }
    }
}

/// [`resolve_into`] as [`Pieces`] (no allocation for a one-element list).
pub(crate) fn resolve_pieces(
    registry: &Registry,
    memo: &mut KeyMemo,
    sg_list: &[Sge],
    need: Access,
) -> Result<Pieces, WcStatus> {
    match sg_list {
        [] => Ok(Pieces::Empty),
        [sge] => {
            let target = registry.resolve_memo(memo, sge.lkey, sge.addr, u64::from(sge.len), need);
            let target = target.ok_or(WcStatus::LocalProtectionError)?;
            Ok(Pieces::One(Piece {
                target,
                len: sge.len as usize,
            }))
        }
        many => {
            let mut pieces = Vec::with_capacity(many.len());
            resolve_into(registry, memo, many, need, &mut pieces)?;
            Ok(Pieces::Many(pieces))
        }
    }
}

/// Total bytes of resolved pieces.
pub(crate) fn total_len(pieces: &[Piece]) -> usize {
    pieces.iter().map(|piece| piece.len).sum()
}

/// The first `len` bytes of `pieces` (the last piece shortened, the rest dropped).
pub(crate) fn truncate(pieces: Vec<Piece>, mut len: usize) -> Vec<Piece> {
    let mut kept = Vec::with_capacity(pieces.len());
    for mut piece in pieces {
        if len == 0 {
            break;
        }
        piece.len = piece.len.min(len);
        len -= piece.len;
        kept.push(piece);
    }
    kept
}

/// Appends the bytes of `pieces` to `out`.
pub(crate) fn gather_into(pieces: &[Piece], out: &mut Vec<u8>) {
    for piece in pieces {
        // Bounds were checked at resolve time; a failure here cannot happen.
        let _ = piece
            .target
            .mem
            .append_to(piece.target.offset, piece.len, out);
    }
}

/// Copies `data` across `pieces` in order; returns false if `data` does not fit.
pub(crate) fn scatter_from_bytes(pieces: &[Piece], mut data: &[u8]) -> bool {
    if data.len() > total_len(pieces) {
        return false;
    }
    for piece in pieces {
        if data.is_empty() {
            break;
        }
        let (head, rest) = data.split_at(piece.len.min(data.len()));
        let _ = piece.target.mem.write(piece.target.offset, head);
        data = rest;
    }
    true
}

/// Copies `len` bytes starting at `source` into `pieces` (memory to memory, no buffer).
pub(crate) fn scatter_from_memory(pieces: &[Piece], source: &Target) {
    let mut offset = source.offset;
    for piece in pieces {
        let _ = SharedMemory::copy(
            &source.mem,
            offset,
            &piece.target.mem,
            piece.target.offset,
            piece.len,
        );
        offset += piece.len;
    }
}

/// Copies `pieces` in order to `destination` (memory to memory, no buffer).
pub(crate) fn gather_to_memory(pieces: &[Piece], destination: &Target) {
    let mut offset = destination.offset;
    for piece in pieces {
        let _ = SharedMemory::copy(
            &piece.target.mem,
            piece.target.offset,
            &destination.mem,
            offset,
            piece.len,
        );
        offset += piece.len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn truncate_keeps_exactly_the_first_bytes() {
        let mem = Arc::new(SharedMemory::create(c"scatter", 4096).unwrap());
        let pieces: Vec<Piece> = [(0, 100), (1000, 200), (2000, 300)]
            .into_iter()
            .map(|(offset, len)| Piece {
                target: Target {
                    mem: Arc::clone(&mem),
                    offset,
                },
                len,
            })
            .collect();
        let lens = |kept: &[Piece]| {
            kept.iter()
                .map(|p| (p.target.offset, p.len))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            lens(&truncate(pieces.clone(), 250)),
            [(0, 100), (1000, 150)]
        );
        assert_eq!(
            lens(&truncate(pieces.clone(), 300)),
            [(0, 100), (1000, 200)]
        );
        assert_eq!(total_len(&truncate(pieces.clone(), 600)), 600);
        assert!(truncate(pieces, 0).is_empty());
    }
}
