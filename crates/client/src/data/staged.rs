//! Puts and gets of blocks in device memory (GPU), through a [`Device`]'s ring of staging
//! slots: the same sessions as `put_blocks` / `get_blocks`, with the parts moved a chunk at
//! a time (whole blocks, at most one slot of bytes per chunk).
//!
//! - put: the device copies chunk `i` into slot `i mod slots` while chunk `i − 1` is written
//!   from its slot to pool nodes and files (with one slot, a chunk is written before the
//!   next is copied into the slot);
//! - get: chunk `i` is read into slot `i mod slots` while the device copies chunk `i − 1`
//!   from its slot into the caller's device ranges; the last copies are awaited before the
//!   outcomes are returned.
//!
//! A block larger than a slot fails (put) or misses (get) with the reason; a device error
//! fails the blocks it may have touched, never the session: FinishWriteCache still runs. A
//! device may report a failed copy at a later wait on any slot, so a get's error fails every
//! block whose copies were queued and not yet known to be done (and a put's fails every
//! chunk not yet written).

use super::device::{Device, DeviceRange};
use super::{GetOutcome, Part, Planned, PutOutcome, TransferEngine};
use crate::ClientError;

impl TransferEngine {
    /// [`TransferEngine::put_blocks`] of blocks in device memory: `blocks[i]` holds one
    /// device range per spec, in the instance's spec order.
    pub fn put_device_blocks(
        &mut self,
        keys: &[i64],
        blocks: &[Vec<DeviceRange>],
        device: &mut dyn Device,
    ) -> Result<Vec<PutOutcome>, ClientError> {
        check_counts(keys, blocks)?;
        let mut put = self.begin_put(keys, &sizes(blocks))?;
        let (chunks, too_big) = chunks(&put.planned, device.slot_bytes());
        for (block, reason) in too_big {
            put.failed[block] = Some(reason);
        }
        // A device claiming no slot gets errors from them, not a division by zero.
        let slots = device.slots().max(1);
        // With two slots or more chunk `i` is staged while chunk `i - 1` is written; with
        // one, each chunk is written from the slot before the next is staged into it.
        let lag = usize::from(slots > 1);
        let mut broken: Option<String> = None;
        for i in 0..chunks.len() + lag {
            if let (Some(chunk), None) = (chunks.get(i), &broken) {
                let ranges = ranges_of(&put.planned, chunk, blocks);
                if let Err(error) = device.stage_out(i % slots, &ranges) {
                    broken = Some(error.to_string());
                }
            }
            let Some(w) = i.checked_sub(lag) else {
                continue;
            };
            let written = &chunks[w];
            if broken.is_none() {
                match device.slot(w % slots) {
                    Ok(bytes) => {
                        let parts = views(&put.planned, written, bytes);
                        self.write_recorded(&mut put, &parts);
                    }
                    Err(error) => broken = Some(error.to_string()),
                }
            }
            if let Some(reason) = &broken {
                for &part in written {
                    let block = put.planned[part].block;
                    put.failed[block].get_or_insert_with(|| reason.clone());
                }
            }
        }
        self.finish_put(put)
    }

    /// [`TransferEngine::get_blocks`] into device memory: `blocks[i]` holds one device range
    /// per spec, sized as the specs; a block that is not cached or cannot be read whole is a
    /// miss (its ranges then hold nothing valid).
    pub fn get_device_blocks(
        &mut self,
        keys: &[i64],
        blocks: &[Vec<DeviceRange>],
        device: &mut dyn Device,
    ) -> Result<Vec<GetOutcome>, ClientError> {
        check_counts(keys, blocks)?;
        let mut get = self.begin_get(keys, &sizes(blocks))?;
        let (chunks, too_big) = chunks(&get.planned, device.slot_bytes());
        for (block, reason) in too_big {
            get.failed[block] = Some(reason);
        }
        let slots = device.slots().max(1);
        // Per slot, the chunk whose copies from it into device memory are queued and not yet
        // known to be done. A device may report a copy's error at any later wait, so an
        // error fails every such chunk, not only the chunk at hand.
        let mut copying: Vec<Option<usize>> = vec![None; slots];
        let unsure = |copying: &mut [Option<usize>]| -> Vec<usize> {
            let queued = copying.iter_mut().filter_map(Option::take);
            queued.flat_map(|c| chunks[c].iter().copied()).collect()
        };
        for (i, chunk) in chunks.iter().enumerate() {
            let slot = i % slots;
            let staged = device.slot(slot).map(|bytes| {
                let mut parts = views_mut(&get.planned, chunk, bytes);
                let (results, sums) = self.read_parts(&mut parts);
                get.record(&parts, results, &sums);
            });
            if staged.is_ok() {
                // The slot's earlier copies completed without error.
                copying[slot] = None;
            }
            let ranges = ranges_of(&get.planned, chunk, blocks);
            match staged.and_then(|()| device.stage_in(slot, &ranges)) {
                Ok(()) => copying[slot] = Some(i),
                Err(error) => {
                    let mut failed = unsure(&mut copying);
                    failed.extend_from_slice(chunk);
                    fail(&mut get.failed, &get.planned, &failed, &error);
                }
            }
        }
        if let Err(error) = device.sync() {
            fail(&mut get.failed, &get.planned, &unsure(&mut copying), &error);
        }
        Ok(self.finish_get(keys, get))
    }
}

fn check_counts(keys: &[i64], blocks: &[Vec<DeviceRange>]) -> Result<(), ClientError> {
    if keys.len() == blocks.len() {
        return Ok(());
    }
    Err(ClientError::InvalidArgument(format!(
        "{} keys for {} blocks",
        keys.len(),
        blocks.len()
    )))
}

fn sizes(blocks: &[Vec<DeviceRange>]) -> Vec<Vec<usize>> {
    blocks
        .iter()
        .map(|ranges| ranges.iter().map(|r| r.len).collect())
        .collect()
}

/// Marks the blocks of these planned parts failed by a device error (the first reason of a
/// block stays).
fn fail(failed: &mut [Option<String>], planned: &[Planned], parts: &[usize], error: &ClientError) {
    for &part in parts {
        failed[planned[part].block].get_or_insert_with(|| error.to_string());
    }
}

/// Groups the planned parts (indexes, whole blocks in order) into chunks of at most
/// `slot_bytes`; the blocks larger than a slot are left out with the reason.
fn chunks(planned: &[Planned], slot_bytes: usize) -> (Vec<Vec<usize>>, Vec<(usize, String)>) {
    let mut chunks = Vec::new();
    let mut too_big = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut used = 0usize;
    let mut start = 0;
    while start < planned.len() {
        let block = planned[start].block;
        let end = start
            + planned[start..]
                .iter()
                .take_while(|p| p.block == block)
                .count();
        let bytes: usize = planned[start..end].iter().map(|p| p.len).sum();
        if bytes > slot_bytes {
            too_big.push((
                block,
                format!("a block of {bytes} bytes does not fit a staging slot of {slot_bytes}"),
            ));
        } else {
            if used + bytes > slot_bytes {
                chunks.push(std::mem::take(&mut current));
                used = 0;
            }
            current.extend(start..end);
            used += bytes;
        }
        start = end;
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    (chunks, too_big)
}

/// The device ranges of a chunk's parts, in order.
fn ranges_of(
    planned: &[Planned],
    chunk: &[usize],
    blocks: &[Vec<DeviceRange>],
) -> Vec<DeviceRange> {
    chunk
        .iter()
        .map(|&part| blocks[planned[part].block][planned[part].spec])
        .collect()
}

/// The chunk's parts over a slot's bytes, back to back.
fn views<'b>(planned: &[Planned], chunk: &[usize], bytes: &'b [u8]) -> Vec<Part<&'b [u8]>> {
    let mut at = 0;
    chunk
        .iter()
        .map(|&part| {
            let planned = &planned[part];
            let view = &bytes[at..at + planned.len];
            at += planned.len;
            planned.with(view)
        })
        .collect()
}

/// The chunk's parts over a slot's bytes, back to back, writable.
fn views_mut<'b>(
    planned: &[Planned],
    chunk: &[usize],
    mut bytes: &'b mut [u8],
) -> Vec<Part<&'b mut [u8]>> {
    chunk
        .iter()
        .map(|&part| {
            let planned = &planned[part];
            let (view, rest) = std::mem::take(&mut bytes).split_at_mut(planned.len);
            bytes = rest;
            planned.with(view)
        })
        .collect()
}
