//! Redis Cluster: the slot of a hash tag, the owner of a slot from `CLUSTER SLOTS`, and the
//! `MOVED` / `ASK` redirections.
//!
//! Every Redis key of one namespace carries the hash tag `{<ns>}` (see `layout`), so an index
//! talks to exactly one slot: it learns the slot's owner once, follows `MOVED` (updating the
//! owner) and `ASK` (one command on the other node, preceded by `ASKING`) when the slot moves.
//! Invariants: nothing here panics on a malformed reply (it is an error); a node listed with an
//! empty address is the node that answered.

use super::resp::Reply;

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum Redis Cluster uses.
pub fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

/// The slot of every key whose hash tag is `tag`.
pub fn tag_slot(tag: &str) -> u16 {
    crc16(tag.as_bytes()) % SLOTS
}

/// A redirection a cluster node answered instead of running a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// The slot lives elsewhere now: update the owner.
    Moved(String),
    /// The slot is migrating: ask that node once, after `ASKING`.
    Ask(String),
}

/// The redirection an error reply carries, if any (`MOVED <slot> <host:port>`).
pub fn redirect(error: &str) -> Option<Redirect> {
    let mut words = error.split_whitespace();
    let kind = words.next()?;
    let _slot = words.next()?;
    let addr = words.next()?.to_owned();
    match kind {
        "MOVED" => Some(Redirect::Moved(addr)),
        "ASK" => Some(Redirect::Ask(addr)),
        _ => None,
    }
}

/// From a `CLUSTER SLOTS` reply, the `host:port` of the master of `slot`; `seed_host` stands
/// for an empty host. `Ok(None)` when no node serves the slot.
pub fn slot_owner(reply: &Reply, slot: u16, seed_host: &str) -> Result<Option<String>, String> {
    let Reply::Array(Some(ranges)) = reply else {
        return Err(format!("CLUSTER SLOTS answered {reply:?}"));
    };
    for range in ranges {
        let Reply::Array(Some(fields)) = range else {
            return Err(format!("CLUSTER SLOTS range {range:?}"));
        };
        let (start, end, master) = match fields.as_slice() {
            [Reply::Int(start), Reply::Int(end), master, ..] => (*start, *end, master),
            _ => return Err(format!("CLUSTER SLOTS range {fields:?}")),
        };
        if (start..=end).contains(&i64::from(slot)) {
            return node_address(master, seed_host).map(Some);
        }
    }
    Ok(None)
}

fn node_address(node: &Reply, seed_host: &str) -> Result<String, String> {
    let Reply::Array(Some(fields)) = node else {
        return Err(format!("CLUSTER SLOTS node {node:?}"));
    };
    match fields.as_slice() {
        [Reply::Bulk(Some(host)), Reply::Int(port), ..] => {
            let host = String::from_utf8_lossy(host);
            let host = if host.is_empty() || host == "?" {
                seed_host
            } else {
                &host
            };
            match host.contains(':') {
                true => Ok(format!("[{host}]:{port}")),
                false => Ok(format!("{host}:{port}")),
            }
        }
        _ => Err(format!("CLUSTER SLOTS node {fields:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_redis_cluster_spec() {
        // The Redis Cluster specification: CRC16 of "123456789" is 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(tag_slot("123456789"), 0x31C3 % SLOTS);
        // Known slots (`CLUSTER KEYSLOT foo` = 12182, `bar` = 5061).
        assert_eq!(tag_slot("foo"), 12182);
        assert_eq!(tag_slot("bar"), 5061);
    }

    #[test]
    fn redirects_are_recognised() {
        assert_eq!(
            redirect("MOVED 3999 127.0.0.1:6381"),
            Some(Redirect::Moved("127.0.0.1:6381".into()))
        );
        assert_eq!(redirect("ASK 1 h:2"), Some(Redirect::Ask("h:2".into())));
        assert_eq!(redirect("ERR unknown command"), None);
        assert_eq!(redirect("MOVED"), None);
    }

    #[test]
    fn slot_owner_reads_the_master_and_refuses_junk() {
        let node = |host: &str, port| {
            Reply::Array(Some(vec![Reply::Bulk(Some(host.into())), Reply::Int(port)]))
        };
        let reply = Reply::Array(Some(vec![
            Reply::Array(Some(vec![Reply::Int(0), Reply::Int(99), node("a", 1)])),
            Reply::Array(Some(vec![Reply::Int(100), Reply::Int(16383), node("", 2)])),
        ]));
        assert_eq!(slot_owner(&reply, 5, "s"), Ok(Some("a:1".into())));
        assert_eq!(slot_owner(&reply, 100, "s"), Ok(Some("s:2".into())));
        let partial = Reply::Array(Some(vec![Reply::Array(Some(vec![
            Reply::Int(0),
            Reply::Int(1),
            node("a", 1),
        ]))]));
        assert_eq!(slot_owner(&partial, 7, "s"), Ok(None));
        assert!(slot_owner(&Reply::Int(1), 0, "s").is_err());
        let junk = Reply::Array(Some(vec![Reply::Array(Some(vec![Reply::Int(0)]))]));
        assert!(slot_owner(&junk, 0, "s").is_err());
    }
}
