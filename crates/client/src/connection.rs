//! The client's queue pair to a server's lookup tables: one soft domain on the chosen wire,
//! one registered buffer, batches of one-sided READs posted at once and awaited by busy
//! polling (one round trip per batch).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kvcm_transport::soft::{SoftConfig, SoftCq, SoftDomain, SoftQp, SoftRegion, Wire};
use kvcm_transport::{
    exchange_endpoints, Access, CompletionQueue, Domain, HostMemory, Memory, QpConfig, QueuePair,
    Region, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::error::FastError;

/// Most READs posted at once (within the queue depth).
const BATCH: usize = 512;
/// How long a batch may take before the connection is given up.
const DEADLINE: Duration = Duration::from_secs(2);

/// One READ: `len` bytes at `addr` under `rkey`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Read {
    pub addr: u64,
    pub rkey: u32,
    pub len: usize,
}

/// A connected queue pair and its buffer.
pub(crate) struct Connection {
    qp: SoftQp,
    cq: SoftCq,
    region: SoftRegion,
    buffer: HostMemory,
    domain: SoftDomain,
    /// Round trips made (batches posted).
    pub round_trips: u64,
}

impl Connection {
    /// Connects to the server's queue-pair listener at `connect`, speaking `wire`.
    pub(crate) fn open(connect: SocketAddr, wire: Wire, wire_index: usize) -> Result<Self, FastError> {
        let domain = SoftDomain::open(SoftConfig::with_wire(wire))?;
        let cq = domain.create_cq()?;
        let qp = domain.create_qp(&cq, &cq, QpConfig::default())?;
        let io = |e: std::io::Error| FastError::Broken(format!("lookup connect: {e}"));
        let mut stream = TcpStream::connect_timeout(&connect, DEADLINE).map_err(io)?;
        stream.set_read_timeout(Some(DEADLINE)).map_err(io)?;
        let _ = stream.set_nodelay(true);
        let mut hello = kvcm::lookup::QP_HELLO.to_vec();
        hello.push(wire_index as u8);
        stream.write_all(&hello).map_err(io)?;
        let remote = exchange_endpoints(&mut stream, &qp.endpoint())?;
        qp.connect(&remote)?;
        let buffer = domain.alloc(64 << 10)?;
        let region = domain.register(&buffer, 0, buffer.len(), Access::LOCAL_WRITE)?;
        Ok(Connection {
            qp,
            cq,
            region,
            buffer,
            domain,
            round_trips: 0,
        })
    }

    /// Performs `reads` and returns their bytes, concatenated in order.
    pub(crate) fn read(&mut self, reads: &[Read]) -> Result<Vec<u8>, FastError> {
        let total: usize = reads.iter().map(|r| r.len).sum();
        self.reserve(total)?;
        let mut offset = 0;
        for chunk in reads.chunks(BATCH) {
            let mut wrs = Vec::with_capacity(chunk.len());
            let sges: Vec<_> = chunk
                .iter()
                .scan(offset, |at, read| {
                    let sge = self.region.sge(*at, read.len as u32);
                    *at += read.len;
                    Some(sge)
                })
                .collect();
            for (i, (read, sge)) in chunk.iter().zip(&sges).enumerate() {
                wrs.push(SendWr {
                    wr_id: i as u64,
                    op: SendOp::Read(RemoteAddr {
                        addr: read.addr,
                        rkey: read.rkey,
                    }),
                    sg_list: std::slice::from_ref(sge),
                    signaled: i + 1 == chunk.len(),
                });
            }
            self.qp.post_send(&wrs)?;
            self.round_trips += 1;
            self.wait()?;
            offset += chunk.iter().map(|r| r.len).sum::<usize>();
        }
        let mut bytes = vec![0u8; total];
        self.buffer.read(0, &mut bytes)?;
        Ok(bytes)
    }

    /// Busy-polls for the batch's one signaled completion.
    fn wait(&self) -> Result<(), FastError> {
        let deadline = Instant::now() + DEADLINE;
        let blank = WorkCompletion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Read,
            byte_len: 0,
            imm: None,
            qpn: 0,
        };
        let mut completions = [blank; 4];
        loop {
            let count = self.cq.poll(&mut completions);
            if let Some(failed) = completions[..count].iter().find(|c| c.status != WcStatus::Success) {
                return Err(FastError::Broken(format!("lookup read failed: {:?}", failed.status)));
            }
            if count > 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
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
