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

use std::collections::HashMap;

use rustc_hash::FxHashMap;

use kvcm::lookup::{BootstrapAnswer, WireAnswer};
use kvcm::proto::meta;
use kvcm::service::convert::{mask_from_wire, query_kind};
use kvcm_lookup::avail::Availability;
use kvcm_lookup::header::{
    candidates, layout_version, Header, FORMAT_VERSION, HEADER_BLOCK, OLDEST_READABLE_VERSION,
};
use kvcm_lookup::reader::{self, Copy};
use kvcm_lookup::slot::SlotRef;
use kvcm_lookup::strings::{self, Entry, Template, ENTRY_HEAD};
use kvcm_manager::keys::block_keys_from_tokens;
use kvcm_manager::query::{self, QueryKind};

use crate::connection::{CallError, Connection, Read};
use crate::error::FastError;
use crate::metrics::Metrics;
use crate::Wire;
use kvcm::lookup::messages::{self, Reply, Request};

/// Attempts at a consistent copy before the server is asked instead.
const MAX_ATTEMPTS: usize = 16;
/// Bytes read per cold template (a longer entry costs one more read).
const TEMPLATE_READ: usize = 256;
/// Longest string entry a reader takes (the longest a server writes — a spec list of 64
/// names of 255 bytes, a template of two long paths — is far below): a longer one is a
/// broken table, not a reason to read gigabytes.
const MAX_ENTRY_BYTES: usize = 256 << 10;

/// A connection to one instance's table.
pub(crate) struct FastPath {
    connection: Connection,
    bootstrap: BootstrapAnswer,
    wire: WireAnswer,
    header: Header,
    specs: Vec<(String, i64)>,
    /// URI templates read so far, by string id (a fast hash: ids are the server's).
    templates: FxHashMap<u32, Template>,
    /// Id of the last write-path message.
    next_id: u32,
    /// The READs of the current copy (kept to reuse their allocation).
    reads: Vec<Read>,
    /// The bytes of the last copy (kept to reuse their allocation).
    bytes: Vec<u8>,
    /// The availability block of the last copy.
    availability: Availability,
}

/// A GetCacheLocation query as the fast path takes it: the request's fields, borrowed
/// (so a lookup by block keys copies nothing of the caller's).
pub(crate) struct Query<'a> {
    pub block_keys: &'a [i64],
    pub token_ids: &'a [i64],
    pub query_type: i32,
    pub sw_size: i32,
    pub block_mask: Option<&'a meta::BlockMask>,
    pub location_spec_names: &'a [String],
}

impl<'a> Query<'a> {
    /// The query of a request.
    pub(crate) fn of(request: &'a meta::GetCacheLocationRequest) -> Query<'a> {
        Query {
            block_keys: &request.block_keys,
            token_ids: &request.token_ids,
            query_type: request.query_type,
            sw_size: request.sw_size,
            block_mask: request.block_mask.as_ref(),
            location_spec_names: &request.location_spec_names,
        }
    }

    /// A query of `kind` over block keys, every spec, no mask.
    pub(crate) fn over_keys(kind: meta::QueryType, keys: &'a [i64], sw_size: i32) -> Query<'a> {
        Query {
            block_keys: keys,
            token_ids: &[],
            query_type: kind as i32,
            sw_size,
            block_mask: None,
            location_spec_names: &[],
        }
    }

    /// The request the server is asked when the fast path cannot answer.
    pub(crate) fn to_request(&self, instance_id: &str) -> meta::GetCacheLocationRequest {
        meta::GetCacheLocationRequest {
            instance_id: instance_id.to_string(),
            query_type: self.query_type,
            block_keys: self.block_keys.to_vec(),
            token_ids: self.token_ids.to_vec(),
            block_mask: self.block_mask.cloned(),
            sw_size: self.sw_size,
            location_spec_names: self.location_spec_names.to_vec(),
            ..Default::default()
        }
    }
}

/// The readable location drawn for a key (§11) as its slots are read: among its slots of
/// positive weight, one at random in proportion to its weight (weighted reservoir sampling,
/// as the server draws); an overflowed key must be asked of the server.
#[derive(Default)]
struct Draw<'a> {
    chosen: Option<SlotRef<'a>>,
    total: u32,
    overflow: bool,
}

impl<'a> Draw<'a> {
    fn offer(&mut self, slot: SlotRef<'a>, availability: &Availability) {
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
}

impl FastPath {
    /// Bootstraps and connects over `wire`.
    pub(crate) fn connect(bootstrap: BootstrapAnswer, wire: Wire) -> Result<FastPath, FastError> {
        if !kvcm_lookup::header::readable(bootstrap.format_version) {
            return Err(FastError::Broken(format!(
                "the server writes table format {}, this client reads {OLDEST_READABLE_VERSION} to \
                 {FORMAT_VERSION}",
                bootstrap.format_version
            )));
        }
        let name = wire.name();
        let wire_answer = bootstrap
            .wires
            .iter()
            .find(|w| w.name == name)
            .cloned()
            .ok_or_else(|| FastError::Broken(format!("the server does not serve {name}")))?;
        if wire_answer.wire != wire.index() {
            return Err(FastError::Broken(format!(
                "the server numbers {name} {}, this client {}",
                wire_answer.wire,
                wire.index()
            )));
        }
        let connect = bootstrap
            .connect
            .parse()
            .map_err(|_| FastError::Broken("bad connect address".into()))?;
        let token = kvcm::lookup::grants::parse_token(&bootstrap.qp_token).ok_or_else(|| {
            FastError::Broken("the bootstrap answered no queue-pair token".into())
        })?;
        let connection = Connection::open(connect, wire, &token)?;
        let mut fast = FastPath {
            connection,
            bootstrap,
            wire: wire_answer,
            header: bytemuck::Zeroable::zeroed(), // epoch 0: no table has it
            specs: Vec::new(),
            templates: FxHashMap::default(),
            next_id: 0,
            reads: Vec::new(),
            bytes: Vec::new(),
            availability: Availability::default(),
        };
        fast.load_header()?;
        Ok(fast)
    }

    /// Sends a write-path request as a message; the server's reply.
    pub(crate) fn call(&mut self, request: &Request) -> Result<Reply, CallError> {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let op = request.op();
        let message = messages::encode_request(id, request).ok_or(CallError::NotSent(
            FastError::AskServer("request too large"),
        ))?;
        let reply = self.connection.call(&message)?;
        messages::decode_reply(&reply, id, op)
            .ok_or_else(|| CallError::Lost(FastError::Broken("a malformed reply".into())))
    }

    /// Bytes of the header page and the current generation.
    pub(crate) fn table_bytes(&self) -> u64 {
        self.header.generation_len.saturating_add(4096)
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
                    // As many specs as the header's slots have parts, in the layout it says.
                    Some(Entry::Specs(specs))
                        if (1..=header.max_parts as usize).contains(&specs.len())
                            && layout_version(&specs) == header.layout_version =>
                    {
                        specs
                    }
                    _ => return Err(FastError::Broken("the spec list entry is missing".into())),
                };
            }
            self.header = header;
            return Ok(());
        }
        Err(FastError::Broken("the header stayed torn".into()))
    }

    /// GetCacheLocation's locations for `query`, written into `out` (whose locations,
    /// vectors and strings are reused: with the same vector passed again, a lookup by
    /// block keys allocates only its per-key choice vector), or why the server must answer
    /// it (`out` is then unspecified).
    pub(crate) fn lookup(
        &mut self,
        query: &Query<'_>,
        out: &mut Vec<meta::CacheLocation>,
        metrics: &Metrics,
    ) -> Result<(), FastError> {
        let ask = FastError::AskServer;
        let from_tokens;
        let keys: &[i64] = if !query.block_keys.is_empty() {
            query.block_keys
        } else if !query.token_ids.is_empty() && self.header.block_size > 0 {
            from_tokens = block_keys_from_tokens(query.token_ids, self.header.block_size as usize);
            &from_tokens
        } else {
            return Err(ask("no keys, or token ids without a block size"));
        };
        let limit = self.bootstrap.max_keys_per_request;
        if limit.is_some_and(|limit| keys.len() as u64 > limit) {
            // The server refuses it (INVALID_ARGUMENT): its answer is the answer.
            return Err(ask(
                "more keys than the server's kvcm.service.max_keys_per_request",
            ));
        }
        let kind = query_kind(query.query_type, query.sw_size).map_err(|_| ask("query type"))?;
        let mask = mask_from_wire(query.block_mask, "block_mask").map_err(|_| ask("mask"))?;
        if let QueryKind::SlidingWindow { sw_size } = kind {
            if sw_size == 0 || sw_size > keys.len() {
                return Err(ask("sw_size"));
            }
        }
        let unmasked: Vec<i64>;
        let queried: &[i64] = match kind {
            QueryKind::PrefixMatch if !mask.is_empty() => {
                unmasked = keys
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !mask.contains(*i))
                    .map(|(_, k)| *k)
                    .collect();
                &unmasked
            }
            _ => keys,
        };
        let mut bytes = std::mem::take(&mut self.bytes);
        let answered = self.answer(
            queried,
            kind,
            query.location_spec_names,
            &mut bytes,
            out,
            metrics,
        );
        self.bytes = bytes;
        answered
    }

    /// Copies the availability block and every key's buckets into `bytes` until the copy
    /// is consistent, draws each key's location, applies the query and renders the answer.
    fn answer(
        &mut self,
        keys: &[i64],
        kind: QueryKind,
        spec_names: &[String],
        bytes: &mut Vec<u8>,
        out: &mut Vec<meta::CacheLocation>,
        metrics: &Metrics,
    ) -> Result<(), FastError> {
        for _ in 0..MAX_ATTEMPTS {
            let header = self.header;
            self.plan_reads(keys);
            match self.connection.read_into(&self.reads, bytes) {
                Ok(()) => {}
                // A retired generation's registration is gone after the grace period.
                Err(_) if self.reload()? => continue,
                Err(error) => return Err(error),
            }
            let (avail, buckets) = bytes.split_at(header.avail_bytes as usize);
            let mut outcome = reader::availability(avail, &mut self.availability)?;
            let geometry = header.geometry();
            let bucket = header.bucket_bytes as usize;
            // Per position, the location drawn among the key's readable ones.
            let mut chosen: Vec<Option<SlotRef<'_>>> = Vec::with_capacity(keys.len());
            let mut overflow = false;
            if outcome == Copy::Good(()) {
                for (key, pair) in keys.iter().zip(buckets.chunks_exact(2 * bucket)) {
                    let mut draw = Draw::default();
                    for block in pair.chunks_exact(bucket) {
                        match reader::key_slots(block, &geometry, *key) {
                            Copy::Good(mine) => {
                                mine.for_each(|s| draw.offer(s, &self.availability))
                            }
                            Copy::Torn => outcome = Copy::Torn,
                            Copy::Retired => outcome = Copy::Retired,
                        }
                    }
                    overflow |= draw.overflow;
                    chosen.push(draw.chosen);
                }
            }
            match outcome {
                Copy::Good(()) => {}
                Copy::Torn => {
                    metrics.retry();
                    continue;
                }
                Copy::Retired => {
                    self.load_header()?;
                    metrics.retry();
                    continue;
                }
            }
            if self.availability.no_storage {
                return Err(FastError::AskServer("no storage is available"));
            }
            if self.availability.reported {
                return Err(FastError::AskServer(
                    "reported locations are answered by the server",
                ));
            }
            if overflow {
                return Err(FastError::AskServer(
                    "a key has more locations than its buckets hold",
                ));
            }
            match kind {
                QueryKind::PrefixMatch => chosen.truncate(query::prefix_len(&chosen)),
                QueryKind::BatchGet => {}
                QueryKind::SlidingWindow { sw_size } => {
                    chosen = query::sliding_window(chosen, sw_size)
                }
            }
            return self.render(&chosen, spec_names, out, metrics);
        }
        Err(FastError::AskServer("the table stayed torn"))
    }

    /// Plans the READs of one copy into `self.reads`: the availability block, then each
    /// key's two candidate buckets. First candidate before second: the publisher moves
    /// slots only forward, so a slot moved while the batch runs is seen in one of the two
    /// (the READs of one queue pair execute in order).
    fn plan_reads(&mut self, keys: &[i64]) {
        let header = self.header;
        let rkey = header.generation_rkeys[self.wire.wire];
        let at = |offset: u64| header.generation_addr + offset;
        self.reads.clear();
        self.reads.push(Read {
            addr: at(0),
            rkey,
            len: header.avail_bytes as usize,
        });
        for key in keys {
            for index in candidates(*key, header.hash_seed, header.bucket_count) {
                self.reads.push(Read {
                    addr: at(header.bucket_at(index)),
                    rkey,
                    len: header.bucket_bytes as usize,
                });
            }
        }
    }

    /// After a failed read: whether a newer header explains it (then read again).
    fn reload(&mut self) -> Result<bool, FastError> {
        let epoch = self.header.epoch;
        self.load_header()?;
        Ok(self.header.epoch != epoch)
    }

    /// Writes the answered slots into `out` as wire locations (a miss as the server's
    /// placeholder), reusing the vectors and strings `out` already holds; templates not
    /// cached yet are read first (one extra round trip).
    fn render(
        &mut self,
        answered: &[Option<SlotRef<'_>>],
        spec_names: &[String],
        out: &mut Vec<meta::CacheLocation>,
        metrics: &Metrics,
    ) -> Result<(), FastError> {
        if self.render_cached(answered, spec_names, out) {
            return Ok(());
        }
        self.fetch_missing_templates(answered, metrics)?;
        match self.render_cached(answered, spec_names, out) {
            true => Ok(()),
            false => Err(FastError::Broken("a template entry is missing".into())),
        }
    }

    /// [`FastPath::render`] from the cached templates alone: false (`out` half written) when
    /// a part's template is not cached.
    fn render_cached(
        &self,
        answered: &[Option<SlotRef<'_>>],
        spec_names: &[String],
        out: &mut Vec<meta::CacheLocation>,
    ) -> bool {
        let specs = &self.specs;
        let kept = |spec: usize| spec_names.is_empty() || spec_names.contains(&specs[spec].0);
        out.resize_with(answered.len(), Default::default);
        for (slot, location) in answered.iter().zip(out.iter_mut()) {
            let mut filled = 0;
            let Some(slot) = slot else {
                location.r#type = 0;
                location.spec_size = specs.len() as i32;
                for (index, (name, _)) in specs.iter().enumerate() {
                    if !kept(index) {
                        continue;
                    }
                    let spec = next_spec(&mut location.location_specs, &mut filled);
                    set(&mut spec.name, name);
                    spec.uri.clear();
                    spec.checksum = None;
                }
                location.location_specs.truncate(filled);
                continue;
            };
            for (i, part) in slot.parts().enumerate() {
                let Some(template) = self.templates.get(&part.template) else {
                    return false;
                };
                let spec_index = usize::from(template.spec);
                if spec_index >= specs.len() || !kept(spec_index) {
                    continue;
                }
                let spec = next_spec(&mut location.location_specs, &mut filled);
                set(&mut spec.name, &specs[spec_index].0);
                spec.uri.clear();
                template.render(part.block, &mut spec.uri);
                spec.checksum = slot.checksum(i);
            }
            location.location_specs.truncate(filled);
            location.r#type = i32::from(self.availability.get(slot.head.storage).storage_type);
            location.spec_size = slot.parts().len() as i32;
        }
        true
    }

    /// Reads the templates of `answered`'s parts this client has not cached (one extra round
    /// trip when any is missing; none, and no allocation, when all are cached).
    fn fetch_missing_templates(
        &mut self,
        answered: &[Option<SlotRef<'_>>],
        metrics: &Metrics,
    ) -> Result<(), FastError> {
        let templates = &self.templates;
        let mut parts = answered.iter().flatten().flat_map(|slot| slot.parts());
        let Some(first) = parts.find(|part| !templates.contains_key(&part.template)) else {
            return Ok(());
        };
        let mut missing = vec![first.template];
        missing.extend(
            parts
                .map(|part| part.template)
                .filter(|id| !templates.contains_key(id)),
        );
        metrics.extra_round_trip();
        for (id, entry) in self.fetch_entries(&missing)? {
            if let Entry::Template(template) = entry {
                self.templates.insert(id, template);
            }
        }
        Ok(())
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
            if len > MAX_ENTRY_BYTES {
                return Err(FastError::Broken(format!(
                    "string entry {id} claims {len} bytes"
                )));
            }
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

/// The next location spec of a location being filled in place: the one at `filled` (an
/// earlier answer's, reused) or a new one.
fn next_spec<'a>(
    specs: &'a mut Vec<meta::LocationSpec>,
    filled: &mut usize,
) -> &'a mut meta::LocationSpec {
    if *filled == specs.len() {
        specs.push(meta::LocationSpec::default());
    }
    *filled += 1;
    &mut specs[*filled - 1]
}

/// Sets `to` to `value`, keeping its allocation.
fn set(to: &mut String, value: &str) {
    to.clear();
    to.push_str(value);
}
