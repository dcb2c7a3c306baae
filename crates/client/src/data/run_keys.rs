//! The rkeys of an instance's runs on an isolating pool node: a queue pair there reaches
//! only the runs of the instance its ticket names, each registered on its own with its own
//! rkey (`kvcm::pool::listener`, "runs"). A link asks the node for the runs holding the
//! offsets it is about to move, once per run, and caches them.
//!
//! A cached run may go stale (the instance gave it up and the node dropped its
//! registration; given back to the instance later, it has another rkey): an operation with
//! its rkey then fails as a bad key, and the link makes the batch again over a fresh link
//! that learned the runs anew (`PoolLink::renew`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kvcm::pool::listener::{MAX_RUN_QUERIES, RUNS, RUN_ENTRY};
use kvcm::pool::ticket::Ticket;
use kvcm::pool::RunKey;

/// The runs known, by their first offset: (bytes, rkey).
#[derive(Debug, Default)]
pub(crate) struct RunKeys {
    runs: BTreeMap<u64, (u64, u32)>,
}

impl RunKeys {
    /// The rkey of the known run holding `[offset, offset + len)` whole.
    pub(crate) fn rkey(&self, offset: u64, len: u64) -> Option<u32> {
        let (start, (run_len, rkey)) = self.runs.range(..=offset).next_back()?;
        let end = offset.checked_add(len)?;
        (end <= start.checked_add(*run_len)?).then_some(*rkey)
    }

    /// Those of `offsets` no known run holds, sorted, once each.
    pub(crate) fn unknown(&self, offsets: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut unknown: Vec<u64> = offsets
            .into_iter()
            .filter(|&at| self.rkey(at, 1).is_none())
            .collect();
        unknown.sort_unstable();
        unknown.dedup();
        unknown
    }

    /// Asks the node at `endpoint` (showing `ticket`, for wire `wire`) for the runs holding
    /// those of `offsets` no known run holds; offsets of no run of the instance stay
    /// unknown, and so do those answered a run that does not hold them or ends past the
    /// region's `region_len` bytes (a node's answer is not trusted).
    pub(crate) fn learn(
        &mut self,
        (endpoint, wire, ticket): (SocketAddr, u8, &Ticket),
        (offsets, region_len): (impl IntoIterator<Item = u64>, u64),
        timeout: Duration,
    ) -> Result<(), String> {
        let unknown = self.unknown(offsets);
        for batch in unknown.chunks(MAX_RUN_QUERIES) {
            let batch: Vec<u64> = batch
                .iter()
                .copied()
                .filter(|&at| self.rkey(at, 1).is_none())
                .collect();
            if batch.is_empty() {
                continue;
            }
            let answered = ask(endpoint, (wire, ticket), &batch, timeout)?;
            for (asked, RunKey { offset, len, rkey }) in batch.iter().zip(answered) {
                let end = offset.checked_add(len).filter(|&end| end <= region_len);
                if len > 0 && offset <= *asked && end.is_some_and(|end| *asked < end) {
                    self.runs.insert(offset, (len, rkey));
                }
            }
        }
        Ok(())
    }
}

/// One runs request: per offset, its run (bytes 0: none).
fn ask(
    endpoint: SocketAddr,
    (wire, ticket): (u8, &Ticket),
    offsets: &[u64],
    timeout: Duration,
) -> Result<Vec<RunKey>, String> {
    let io = |e: std::io::Error| format!("asking pool node {endpoint} for run keys: {e}");
    let mut stream = TcpStream::connect_timeout(&endpoint, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    let _ = stream.set_nodelay(true);
    let mut request = RUNS.to_vec();
    request.push(wire);
    request.extend_from_slice(ticket);
    request.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
    for offset in offsets {
        request.extend_from_slice(&offset.to_le_bytes());
    }
    stream.write_all(&request).map_err(io)?;
    let mut count = [0u8; 4];
    stream.read_exact(&mut count).map_err(io)?;
    if u32::from_le_bytes(count) as usize != offsets.len() {
        return Err(format!(
            "pool node {endpoint} answered another count of runs"
        ));
    }
    let mut answer = vec![0u8; offsets.len() * RUN_ENTRY];
    stream.read_exact(&mut answer).map_err(io)?;
    Ok(answer
        .chunks_exact(RUN_ENTRY)
        .filter_map(|entry| Some(RunKey::decode(entry.try_into().ok()?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_holds_only_what_lies_wholly_inside_it() {
        let mut keys = RunKeys::default();
        keys.runs.insert(4096, (4096, 7));
        keys.runs.insert(16384, (8192, 9));
        assert_eq!(keys.rkey(4096, 4096), Some(7));
        assert_eq!(keys.rkey(5000, 100), Some(7));
        assert_eq!(keys.rkey(8000, 200), None, "crosses the end of the run");
        assert_eq!(keys.rkey(10000, 1), None, "between runs");
        assert_eq!(keys.rkey(0, 1), None, "before every run");
        assert_eq!(keys.rkey(20000, 4576), Some(9));
        assert_eq!(keys.rkey(u64::MAX, 2), None, "overflow");
    }
}
