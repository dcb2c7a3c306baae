//! The client's queue pair to a server's lookup tables: one domain on the chosen wire,
//! one registered buffer, batches of one-sided READs posted at once and awaited by busy
//! polling (one round trip per batch). A write-path message waits for manager work on the
//! server, so its reply is awaited by polling that yields the CPU, then by sleeping on the
//! completion queue's event descriptor.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kvcm::lookup::grants::Token;
use kvcm::lookup::messages::MAX_MESSAGE;
use kvcm_transport::any::{AnyCq, AnyDomain, AnyQp, AnyRegion};
use kvcm_transport::soft::SoftConfig;
use kvcm_transport::{
    exchange_endpoints, Access, CompletionQueue, Domain, HostMemory, Memory, QpConfig, QpState,
    QueuePair, RecvWr, Region, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

use crate::error::FastError;
use crate::Wire;

/// Most READs posted at once (within the queue depth).
const BATCH: usize = 512;
/// Most bytes one call reads (a prefix-128 lookup reads well under 1 MiB; each read's length
/// is bounded by the header's checks, so only the number of keys asked can reach this):
/// beyond, the lookup is asked over gRPC, and no buffer grows for it.
const MAX_READ_BYTES: usize = 64 << 20;
/// How long a batch may take before the connection is given up.
const DEADLINE: Duration = Duration::from_secs(2);
/// How long a message call polls for its reply, yielding the CPU between polls, before it
/// sleeps on the completion queue's event descriptor. The reply waits for manager work on
/// the server (often a journal sync, a few hundred µs): polling without yielding would
/// take a core from the server on a small machine (a write pair then took 2.3 ms instead
/// of 0.2), and sleeping at once would add a wake-up to every call.
const CALL_SPIN: Duration = Duration::from_millis(1);
/// Longest single sleep of a message call (it re-checks its deadline after it).
const CALL_SLEEP_MS: i32 = 10;

/// One READ: `len` bytes at `addr` under `rkey`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Read {
    pub addr: u64,
    pub rkey: u32,
    pub len: usize,
}

/// A connected queue pair and its buffers.
pub(crate) struct Connection {
    qp: AnyQp,
    cq: AnyCq,
    region: AnyRegion,
    buffer: HostMemory,
    /// Message buffers: the reply's receive buffer, then the request's send buffer.
    messages: (HostMemory, AnyRegion),
    domain: AnyDomain,
    /// The wire: on shared memory, reads are direct memory reads of the peer's regions.
    wire: Wire,
    /// The direct reads of the current call (kept to reuse its allocation).
    direct: Vec<(RemoteAddr, usize)>,
    /// The local buffers of the current batch's READs (kept to reuse their allocation).
    sges: Vec<Sge>,
    /// Round trips made (batches posted).
    pub round_trips: u64,
    /// Whether a batch was given up on while still posted: its completion may come at any
    /// later wait, so the queue pair can no longer tell its completions apart and serves
    /// nothing more.
    gave_up: bool,
    /// On verbs, the handshake connection, kept open: its closing (this connection
    /// dropped, or the process gone) tells the server to tear its queue pair down.
    _hangup: Option<TcpStream>,
}

/// How a message exchange failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The request never left (nothing was applied).
    NotSent(FastError),
    /// The request was sent but no reply came (its outcome is unknown).
    Lost(FastError),
}

impl Connection {
    /// Connects to the server's queue-pair listener at `connect`, speaking `wire`, with the
    /// bootstrap's queue-pair `token`.
    pub(crate) fn open(connect: SocketAddr, wire: Wire, token: &Token) -> Result<Self, FastError> {
        let domain = wire.open_domain(SoftConfig::default().response_timeout)?;
        let cq = domain.create_cq()?;
        let qp = domain.create_qp(&cq, &cq, QpConfig::default())?;
        let io = |e: std::io::Error| FastError::Broken(format!("lookup connect: {e}"));
        let mut stream = TcpStream::connect_timeout(&connect, DEADLINE).map_err(io)?;
        stream.set_read_timeout(Some(DEADLINE)).map_err(io)?;
        let _ = stream.set_nodelay(true);
        let hello = kvcm::lookup::qp_hello(wire.index() as u8, token);
        stream.write_all(&hello).map_err(io)?;
        let remote = exchange_endpoints(&mut stream, &qp.endpoint())?;
        qp.connect(&remote)?;
        let buffer = domain.alloc(64 << 10)?;
        let region = domain.register(&buffer, 0, buffer.len(), Access::LOCAL_WRITE)?;
        let message_memory = domain.alloc(2 * MAX_MESSAGE)?;
        let message_region = domain.register(
            &message_memory,
            0,
            message_memory.len(),
            Access::LOCAL_WRITE,
        )?;
        Ok(Connection {
            qp,
            cq,
            region,
            buffer,
            messages: (message_memory, message_region),
            domain,
            wire,
            direct: Vec::new(),
            sges: Vec::new(),
            round_trips: 0,
            gave_up: false,
            _hangup: (wire == Wire::Verbs).then_some(stream),
        })
    }

    /// Sends one request message and returns the reply message (one exchange at a time).
    pub(crate) fn call(&mut self, request: &[u8]) -> Result<Vec<u8>, CallError> {
        let (memory, region) = &self.messages;
        if request.len() > MAX_MESSAGE {
            return Err(CallError::NotSent(FastError::AskServer(
                "message too large",
            )));
        }
        if self.qp.state() != QpState::ReadyToSend || self.gave_up {
            return Err(CallError::NotSent(FastError::Broken(
                "the queue pair failed or gave up on a transfer".into(),
            )));
        }
        let not_sent = |e: kvcm_transport::TransportError| CallError::NotSent(e.into());
        memory.write(MAX_MESSAGE, request).map_err(not_sent)?;
        let reply_sge = region.sge(0, MAX_MESSAGE as u32);
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[reply_sge],
            }])
            .map_err(not_sent)?;
        let request_sge = region.sge(MAX_MESSAGE, request.len() as u32);
        self.qp
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::Send { imm: None },
                sg_list: &[request_sge],
                signaled: true,
            }])
            .map_err(not_sent)?;
        self.round_trips += 1;
        let mut reply_len = None;
        let mut sent = false;
        let begun = Instant::now();
        let deadline = begun + DEADLINE;
        while reply_len.is_none() || !sent {
            let mut completions = [WorkCompletion::EMPTY; 2];
            let count = self.cq.poll(&mut completions);
            for completion in &completions[..count] {
                // Posted, then failed: the server may have applied the request before the
                // link broke (a send completes only once the peer acknowledges it, and a
                // flushed one may have been delivered), so its outcome is unknown.
                if completion.status != WcStatus::Success {
                    return Err(CallError::Lost(FastError::Broken(format!(
                        "message failed: {:?}",
                        completion.status
                    ))));
                }
                match completion.opcode {
                    WcOpcode::Recv => reply_len = Some(completion.byte_len as usize),
                    _ => sent = true,
                }
            }
            if count > 0 {
                continue;
            }
            let now = Instant::now();
            if now > deadline {
                self.gave_up = true;
                return Err(CallError::Lost(FastError::Broken(
                    "no reply to a message".into(),
                )));
            }
            if now - begun < CALL_SPIN {
                std::thread::yield_now();
            } else {
                self.sleep_for_completion()
                    .map_err(|e| CallError::Lost(e.into()))?;
            }
        }
        let mut reply = vec![0u8; reply_len.unwrap_or(0)];
        memory
            .read(0, &mut reply)
            .map_err(|e| CallError::Lost(e.into()))?;
        Ok(reply)
    }

    /// Performs `reads` and returns their bytes, concatenated in order.
    pub(crate) fn read(&mut self, reads: &[Read]) -> Result<Vec<u8>, FastError> {
        let mut bytes = Vec::new();
        self.read_into(reads, &mut bytes)?;
        Ok(bytes)
    }

    /// Performs `reads` and leaves their bytes in `bytes`, concatenated in order (in that
    /// order: on shared memory as direct reads of the mapped regions, otherwise as one
    /// batch of one-sided READs per [`BATCH`]).
    pub(crate) fn read_into(
        &mut self,
        reads: &[Read],
        bytes: &mut Vec<u8>,
    ) -> Result<(), FastError> {
        let total = reads
            .iter()
            .try_fold(0usize, |sum, r| sum.checked_add(r.len))
            .filter(|&total| total <= MAX_READ_BYTES)
            .ok_or(FastError::AskServer(
                "a lookup this large would read more than 64 MiB",
            ))?;
        if self.gave_up {
            return Err(FastError::Broken(
                "this queue pair gave up on an earlier transfer".into(),
            ));
        }
        bytes.resize(total, 0);
        if let (Wire::Shm, Some(qp)) = (self.wire, self.qp.as_soft()) {
            let remote = |r: &Read| {
                (
                    RemoteAddr {
                        addr: r.addr,
                        rkey: r.rkey,
                    },
                    r.len,
                )
            };
            self.direct.clear();
            self.direct.extend(reads.iter().map(remote));
            qp.read_direct(&self.direct, bytes)?;
            self.round_trips += 1;
            return Ok(());
        }
        self.reserve(total)?;
        let mut offset = 0;
        for chunk in reads.chunks(BATCH) {
            self.sges.clear();
            self.sges.extend(chunk.iter().map(|read| {
                let sge = self.region.sge(offset, read.len as u32);
                offset += read.len;
                sge
            }));
            let wrs: Vec<SendWr<'_>> = chunk
                .iter()
                .zip(&self.sges)
                .enumerate()
                .map(|(i, (read, sge))| SendWr {
                    wr_id: i as u64,
                    op: SendOp::Read(RemoteAddr {
                        addr: read.addr,
                        rkey: read.rkey,
                    }),
                    sg_list: std::slice::from_ref(sge),
                    signaled: i + 1 == chunk.len(),
                })
                .collect();
            self.qp.post_send(&wrs)?;
            self.round_trips += 1;
            self.wait()?;
        }
        self.buffer.read(0, bytes)?;
        Ok(())
    }

    /// Sleeps until the completion queue has a completion (or [`CALL_SLEEP_MS`] passed).
    fn sleep_for_completion(&self) -> Result<(), kvcm_transport::TransportError> {
        if !self.cq.arm()? {
            kvcm_transport::poll_readable(&[self.cq.event_fd()], CALL_SLEEP_MS)?;
        }
        Ok(())
    }

    /// Busy-polls for the batch's one signaled completion; a batch given up on at the
    /// deadline leaves the connection unusable ([`Connection::gave_up`]).
    fn wait(&mut self) -> Result<(), FastError> {
        let deadline = Instant::now() + DEADLINE;
        let mut completions = [WorkCompletion::EMPTY; 4];
        loop {
            let count = self.cq.poll(&mut completions);
            if let Some(failed) = completions[..count]
                .iter()
                .find(|c| c.status != WcStatus::Success)
            {
                return Err(FastError::Broken(format!(
                    "lookup read failed: {:?}",
                    failed.status
                )));
            }
            if count > 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.gave_up = true;
                return Err(FastError::Broken("lookup read timed out".into()));
            }
            std::hint::spin_loop();
        }
    }

    /// Makes the registered buffer at least `len` bytes.
    fn reserve(&mut self, len: usize) -> Result<(), FastError> {
        if len <= self.buffer.len() {
            return Ok(());
        }
        let buffer = self.domain.alloc(len.next_power_of_two())?;
        let region = self
            .domain
            .register(&buffer, 0, buffer.len(), Access::LOCAL_WRITE)?;
        self.region = region;
        self.buffer = buffer;
        Ok(())
    }
}
