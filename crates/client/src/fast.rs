//! The fast path: GetCacheLocation answered from an instance's published table with
//! one-sided READs — one round trip for the availability block and every key's two
//! candidate buckets, and one more only for URI templates not yet cached.
//!
//! The answer is computed exactly as the server computes it (wire fact sheet §11): the
//! readable locations of a key are its published (SERVING) locations whose storage weighs
//! more than 0; one is drawn in proportion to its weight; prefix match, batch get and
//! sliding window use the manager's own query functions; misses render as the same
//! placeholders. Whatever the fast path cannot answer exactly (an overflowed key, a query
//! the server refuses, no storage available) is left to the server.

use std::borrow::Cow;
use std::collections::HashMap;

use kvcm::lookup::{BootstrapAnswer, WireAnswer};
use kvcm::proto::meta;
use kvcm::service::convert::{mask_from_wire, query_kind};
use kvcm_lookup::avail::Availability;
use kvcm_lookup::header::{candidates, Header, FORMAT_VERSION, HEADER_BLOCK};
use kvcm_lookup::reader::{self, Copy};
use kvcm_lookup::slot::Slot;
use kvcm_lookup::strings::{self, Entry, Template, ENTRY_HEAD};
use kvcm_manager::keys::block_keys_from_tokens;
use kvcm_manager::query::{self, QueryKind};
use kvcm_transport::soft::Wire;

use crate::connection::{CallError, Connection, Read};
use crate::error::FastError;
use crate::metrics::Metrics;
use kvcm::lookup::messages::{self, Op, Reply, Request};

/// Attempts at a consistent copy before the server is asked instead.
const MAX_ATTEMPTS: usize = 16;
/// Bytes read per cold template (a longer entry costs one more read).
const TEMPLATE_READ: usize = 256;

/// A connection to one instance's table.
pub(crate) struct FastPath {
    connection: Connection,
    bootstrap: BootstrapAnswer,
    wire: WireAnswer,
    header: Header,
    specs: Vec<(String, i64)>,
    templates: HashMap<u32, Template>,
    /// Id of the last write-path message.
    next_id: u32,
}

/// The copied state of one query's keys.
struct Copied {
    availability: Availability,
    /// Per position, the location drawn among the key's readable ones.
    drawn: Vec<Draw>,
}

/// The readable location drawn for a key (§11) as its slots are read: among its slots of
/// positive weight, one at random in proportion to its weight (weighted reservoir sampling,
/// as the server draws); an overflowed key must be asked of the server.
#[derive(Default)]
struct Draw {
    chosen: Option<Slot>,
    total: u32,
    overflow: bool,
}

impl Draw {
    fn offer(&mut self, slot: Slot, availability: &Availability) {
        if slot.is_overflow() {
            self.overflow = true;
            return;
        }
        let weight = u32::from(availability.get(slot.head.storage).weight);
        if weight == 0 {
            return;
        }
        self.total += weight;
        if fastrand::u32(..self.total) < weight {
            self.chosen = Some(slot);
        }
    }

    fn finish(self) -> Result<Option<Slot>, FastError> {
        if self.overflow {
            return Err(FastError::AskServer(
                "a key has more locations than its buckets hold",
            ));
        }
        Ok(self.chosen)
    }
}

impl FastPath {
    /// Bootstraps and connects over `wire`.
    pub(crate) fn connect(bootstrap: BootstrapAnswer, wire: Wire) -> Result<FastPath, FastError> {
        if bootstrap.format_version != FORMAT_VERSION {
            return Err(FastError::Broken(format!(
                "the server writes table format {}, this client reads {FORMAT_VERSION}",
                bootstrap.format_version
            )));
        }
        let name = match wire {
            Wire::Tcp => "soft-tcp",
            Wire::Shm => "soft-shm",
        };
        let wire_answer = bootstrap
            .wires
            .iter()
            .find(|w| w.name == name)
            .cloned()
            .ok_or_else(|| FastError::Broken(format!("the server does not serve {name}")))?;
        let connect = bootstrap
            .connect
            .parse()
            .map_err(|_| FastError::Broken("bad connect address".into()))?;
        let connection = Connection::open(connect, wire, wire_answer.wire)?;
        let mut fast = FastPath {
            connection,
            bootstrap,
            wire: wire_answer,
            header: bytemuck::Zeroable::zeroed(), // epoch 0: no table has it
            specs: Vec::new(),
            templates: HashMap::new(),
            next_id: 0,
        };
        fast.load_header()?;
        Ok(fast)
    }

    /// Sends a write-path request as a message; the server's reply.
    pub(crate) fn call(&mut self, request: &Request) -> Result<Reply, CallError> {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let op = match request {
            Request::StartWrite(_) => Op::StartWrite,
            Request::FinishWrite(_) => Op::FinishWrite,
            Request::Remove(_) => Op::Remove,
        };
        let message = messages::encode_request(id, request).ok_or(CallError::NotSent(
            FastError::AskServer("request too large"),
        ))?;
        let reply = self.connection.call(&message)?;
        messages::decode_reply(&reply, id, op)
            .ok_or_else(|| CallError::Lost(FastError::Broken("a malformed reply".into())))
    }

    /// Bytes of the header page and the current generation.
    pub(crate) fn table_bytes(&self) -> u64 {
        4096 + self.header.generation_len
    }

    /// The epoch of the header last read.
    pub(crate) fn epoch(&self) -> u64 {
        self.header.epoch
    }

    /// Round trips made so far.
    pub(crate) fn round_trips(&self) -> u64 {
        self.connection.round_trips
    }

    /// Reads the header (again); a new epoch drops the template cache.
    fn load_header(&mut self) -> Result<(), FastError> {
        for _ in 0..MAX_ATTEMPTS {
            let block = self.connection.read(&[Read {
                addr: self.bootstrap.header_addr,
                rkey: self.wire.header_rkey,
                len: HEADER_BLOCK,
            }])?;
            let Some(header) = Header::open(&block)? else {
                continue;
            };
            if header.server_incarnation != self.bootstrap.server_incarnation {
                return Err(FastError::Broken(
                    "the table belongs to another server incarnation".into(),
                ));
            }
            if header.layout_version != self.bootstrap.layout_version {
                return Err(FastError::Broken(
                    "the instance's spec layout changed".into(),
                ));
            }
            if header.epoch != self.header.epoch || self.specs.is_empty() {
                self.templates.clear();
                self.header = header;
                self.specs = match self
                    .fetch_entries(&[header.spec_list])?
                    .remove(&header.spec_list)
                {
                    Some(Entry::Specs(specs)) => specs,
                    _ => return Err(FastError::Broken("the spec list entry is missing".into())),
                };
            }
            self.header = header;
            return Ok(());
        }
        Err(FastError::Broken("the header stayed torn".into()))
    }

    /// GetCacheLocation's locations for `request`, or why the server must answer it.
    pub(crate) fn lookup(
        &mut self,
        request: &meta::GetCacheLocationRequest,
        metrics: &Metrics,
    ) -> Result<Vec<meta::CacheLocation>, FastError> {
        let ask = FastError::AskServer;
        let keys: Cow<'_, [i64]> = if !request.block_keys.is_empty() {
            Cow::Borrowed(&request.block_keys)
        } else if !request.token_ids.is_empty() && self.header.block_size > 0 {
            Cow::Owned(block_keys_from_tokens(
                &request.token_ids,
                self.header.block_size as usize,
            ))
        } else {
            return Err(ask("no keys, or token ids without a block size"));
        };
        let kind =
            query_kind(request.query_type, request.sw_size).map_err(|_| ask("query type"))?;
        let mask =
            mask_from_wire(request.block_mask.as_ref(), "block_mask").map_err(|_| ask("mask"))?;
        if let QueryKind::SlidingWindow { sw_size } = kind {
            if sw_size == 0 || sw_size > keys.len() {
                return Err(ask("sw_size"));
            }
        }
        let queried: Cow<'_, [i64]> = match kind {
            QueryKind::PrefixMatch => keys
                .iter()
                .enumerate()
                .filter(|(i, _)| !mask.contains(*i))
                .map(|(_, k)| *k)
                .collect(),
            _ => keys,
        };
        let copied = self.copy(&queried, metrics)?;
        if copied.availability.no_storage {
            return Err(ask("no storage is available"));
        }
        let chosen: Vec<Option<Slot>> = copied
            .drawn
            .into_iter()
            .map(Draw::finish)
            .collect::<Result<_, _>>()?;
        let answered: Vec<Option<Slot>> = match kind {
            QueryKind::PrefixMatch => query::prefix_match(chosen).into_iter().map(Some).collect(),
            QueryKind::BatchGet => chosen,
            QueryKind::SlidingWindow { sw_size } => query::sliding_window(chosen, sw_size),
        };
        self.render(
            &answered,
            &copied.availability,
            &request.location_spec_names,
            metrics,
        )
    }

    /// One consistent copy of the availability block and every key's buckets.
    fn copy(&mut self, keys: &[i64], metrics: &Metrics) -> Result<Copied, FastError> {
        for _ in 0..MAX_ATTEMPTS {
            let header = self.header;
            let rkey = header.generation_rkeys[self.wire.wire];
            let at = |offset: u64| header.generation_addr + offset;
            let bucket = header.bucket_bytes as usize;
            let mut reads = Vec::with_capacity(1 + 2 * keys.len());
            reads.push(Read {
                addr: at(0),
                rkey,
                len: header.avail_bytes as usize,
            });
            for key in keys {
                // First candidate before second: the publisher moves slots only forward, so
                // a slot moved while this batch runs is seen in one of the two (the READs of
                // one queue pair execute in order).
                for index in candidates(*key, header.hash_seed, header.bucket_count) {
                    reads.push(Read {
                        addr: at(header.bucket_at(index)),
                        rkey,
                        len: bucket,
                    });
                }
            }
            let bytes = match self.connection.read(&reads) {
                Ok(bytes) => bytes,
                // A retired generation's registration is gone after the grace period.
                Err(_) if self.reload()? => continue,
                Err(error) => return Err(error),
            };
            let (avail, buckets) = bytes.split_at(header.avail_bytes as usize);
            let availability = match reader::availability(avail)? {
                Copy::Good(availability) => availability,
                Copy::Torn => {
                    metrics.retry();
                    continue;
                }
                Copy::Retired => {
                    self.load_header()?;
                    metrics.retry();
                    continue;
                }
            };
            let geometry = header.geometry();
            let mut drawn = Vec::with_capacity(keys.len());
            let mut outcome = Copy::Good(());
            for (key, pair) in keys.iter().zip(buckets.chunks_exact(2 * bucket)) {
                let mut draw = Draw::default();
                for block in pair.chunks_exact(bucket) {
                    match reader::key_slots(block, &geometry, *key) {
                        Copy::Good(mine) => {
                            mine.into_iter().for_each(|s| draw.offer(s, &availability))
                        }
                        Copy::Torn => outcome = Copy::Torn,
                        Copy::Retired => outcome = Copy::Retired,
                    }
                }
                drawn.push(draw);
            }
            match outcome {
                Copy::Good(()) => {
                    return Ok(Copied {
                        availability,
                        drawn,
                    })
                }
                Copy::Torn => metrics.retry(),
                Copy::Retired => {
                    self.load_header()?;
                    metrics.retry();
                }
            }
        }
        Err(FastError::AskServer("the table stayed torn"))
    }

    /// After a failed read: whether a newer header explains it (then read again).
    fn reload(&mut self) -> Result<bool, FastError> {
        let epoch = self.header.epoch;
        self.load_header()?;
        Ok(self.header.epoch != epoch)
    }

    /// The answered slots as wire locations.
    fn render(
        &mut self,
        answered: &[Option<Slot>],
        availability: &Availability,
        spec_names: &[String],
        metrics: &Metrics,
    ) -> Result<Vec<meta::CacheLocation>, FastError> {
        let missing: Vec<u32> = answered
            .iter()
            .flatten()
            .flat_map(|slot| slot.parts.iter().map(|p| p.template))
            .filter(|id| !self.templates.contains_key(id))
            .collect();
        if !missing.is_empty() {
            metrics.extra_round_trip();
            for (id, entry) in self.fetch_entries(&missing)? {
                if let Entry::Template(template) = entry {
                    self.templates.insert(id, template);
                }
            }
        }
        let kept = |spec: usize| spec_names.is_empty() || spec_names.contains(&self.specs[spec].0);
        let mut locations = Vec::with_capacity(answered.len());
        for slot in answered {
            let Some(slot) = slot else {
                locations.push(meta::CacheLocation {
                    r#type: 0,
                    spec_size: self.specs.len() as i32,
                    location_specs: (0..self.specs.len())
                        .filter(|&s| kept(s))
                        .map(|s| meta::LocationSpec {
                            name: self.specs[s].0.clone(),
                            uri: String::new(),
                            checksum: None,
                        })
                        .collect(),
                });
                continue;
            };
            let mut specs = Vec::with_capacity(slot.parts.len());
            for (i, part) in slot.parts.iter().enumerate() {
                let template = self
                    .templates
                    .get(&part.template)
                    .ok_or(FastError::Broken("a template entry is missing".into()))?;
                let spec = usize::from(template.spec);
                if spec >= self.specs.len() || !kept(spec) {
                    continue;
                }
                let mut uri = String::new();
                template.render(part.block, &mut uri);
                specs.push(meta::LocationSpec {
                    name: self.specs[spec].0.clone(),
                    uri,
                    checksum: slot.checksums.get(i).copied(),
                });
            }
            locations.push(meta::CacheLocation {
                r#type: i32::from(availability.get(slot.head.storage).storage_type),
                spec_size: slot.parts.len() as i32,
                location_specs: specs,
            });
        }
        Ok(locations)
    }

    /// Reads string entries by id (one round trip, plus one for entries longer than
    /// [`TEMPLATE_READ`]).
    fn fetch_entries(&mut self, ids: &[u32]) -> Result<HashMap<u32, Entry>, FastError> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let header = self.header;
        let heap_end = header.strings_len;
        let place = |id: u32, len: usize| -> Result<Read, FastError> {
            let offset = u64::from(id) * 8;
            if id == 0 || offset + ENTRY_HEAD as u64 > heap_end {
                return Err(FastError::Broken(format!(
                    "string id {id} is out of the heap"
                )));
            }
            let len = (len as u64).min(heap_end - offset) as usize;
            Ok(Read {
                addr: header.generation_addr + header.strings_offset + offset,
                rkey: header.generation_rkeys[self.wire.wire],
                len,
            })
        };
        let reads: Vec<Read> = ids
            .iter()
            .map(|&id| place(id, TEMPLATE_READ))
            .collect::<Result<_, _>>()?;
        let bytes = self.connection.read(&reads)?;
        let mut entries = HashMap::with_capacity(ids.len());
        let mut at = 0;
        for (&id, read) in ids.iter().zip(&reads) {
            let copy = &bytes[at..at + read.len];
            at += read.len;
            let len = strings::entry_len(copy)?;
            let entry = if len <= copy.len() {
                strings::decode(copy)?
            } else {
                let long = self.connection.read(&[place(id, len)?])?;
                strings::decode(&long)?
            };
            entries.insert(id, entry);
        }
        Ok(entries)
    }
}
