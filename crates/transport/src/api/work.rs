//! Work requests and work completions: what is posted and what comes back.

/// A local scatter-gather element: `len` bytes at `addr` inside the region keyed `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address inside a registered region of this process.
    pub addr: u64,
    /// Number of bytes (never zero).
    pub len: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// A remote address: `addr` inside the peer's region keyed `rkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Virtual address in the peer's registration.
    pub addr: u64,
    /// Remote key of the peer's region.
    pub rkey: u32,
}

/// The operation of a send-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Copy remote memory into the local scatter list.
    Read(RemoteAddr),
    /// Copy the local gather list into remote memory; with `imm`, also consume a receive at
    /// the peer and hand it the immediate value.
    Write {
        /// Destination.
        remote: RemoteAddr,
        /// Immediate data delivered in the peer's receive completion.
        imm: Option<u32>,
    },
    /// Deliver the gather list into the next receive buffer posted by the peer.
    Send {
        /// Immediate data delivered in the peer's receive completion.
        imm: Option<u32>,
    },
    /// 8-byte compare-and-swap on an 8-byte aligned remote word; the old value lands in the
    /// (single, 8-byte) local scatter element.
    CompareSwap {
        /// Target word.
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// Value stored when the word equals `compare`.
        swap: u64,
    },
    /// 8-byte fetch-and-add on an 8-byte aligned remote word; the old value lands locally.
    FetchAdd {
        /// Target word.
        remote: RemoteAddr,
        /// Added value (wrapping).
        add: u64,
    },
}

impl SendOp {
    /// The completion opcode this operation reports.
    pub fn completion_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Read(_) => WcOpcode::Read,
            SendOp::Write { .. } => WcOpcode::Write,
            SendOp::Send { .. } => WcOpcode::Send,
            SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    /// The remote word of an atomic, if this is one.
    pub fn atomic_target(&self) -> Option<RemoteAddr> {
        match self {
            SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } => Some(*remote),
            _ => None,
        }
    }
}

/// A send-queue work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local gather (WRITE / SEND) or scatter (READ / atomics) list.
    pub sg_list: &'a [Sge],
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

/// A receive-queue work request: a buffer for one incoming SEND or WRITE-with-immediate.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's payload is scattered.
    pub sg_list: &'a [Sge],
}

/// Hardware-like completion status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// The work request finished.
    Success,
    /// A local length did not fit (e.g. a SEND larger than the receive buffer).
    LocalLengthError,
    /// A local key, bound or access right was wrong.
    LocalProtectionError,
    /// The peer refused: bad rkey, out of bounds, or a missing access right.
    RemoteAccessError,
    /// The peer could not parse or execute the request.
    RemoteInvalidRequest,
    /// The peer stopped answering (connection lost).
    RetryExceeded,
    /// The queue pair entered the error state before this request ran.
    WrFlushError,
}

/// What a completion reports on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// RDMA READ.
    Read,
    /// RDMA WRITE (with or without immediate).
    Write,
    /// SEND.
    Send,
    /// Compare-and-swap.
    CompareSwap,
    /// Fetch-and-add.
    FetchAdd,
    /// A receive consumed by a SEND.
    Recv,
    /// A receive consumed by a WRITE with immediate.
    RecvRdmaWithImm,
}

/// One entry of a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data of a receive.
    pub imm: Option<u32>,
    /// Number of the local queue pair.
    pub qpn: u32,
}

impl WorkCompletion {
    /// A blank entry, to fill the buffer [`crate::CompletionQueue::poll`] writes into.
    pub const EMPTY: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qpn: 0,
    };
}

/// State of a reliable-connected queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, not yet connected: receives may be posted, sends may not.
    Init,
    /// Connected: ready to send.
    ReadyToSend,
    /// Broken (an error completion or a lost peer): every call is refused.
    Error,
}
