//! Verbs completion queue with a completion channel (the awaitable file descriptor).
//!
//! Invariant: the hardware queue has at least as many entries as the queue pairs using it
//! can have outstanding (the sum of their configured depths, a queue pair counted once per
//! queue it completes here), up to the device's largest queue (`max_cqe`): a queue pair
//! reserves its depth when it is created, and the queue is grown (`ibv_resize_cq`) before
//! that reservation succeeds, so it never overruns while the reservations fit the device.
//! Beyond `max_cqe` (rxe: 32 767; hardware NICs: millions) the queue stays at the device's
//! maximum and the application must keep fewer requests outstanding than it reserved.

use super::device::DeviceContext;
use super::ledger::Ledgers;
use crate::sys::set_nonblocking;
use crate::{CompletionQueue, Result, TransportError, WcOpcode, WcStatus, WorkCompletion};
use rdma_sys::*;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

/// Entries a verbs completion queue starts with (it grows as queue pairs reserve more).
const CQ_DEPTH: i32 = 4096;
const POLL_BATCH: usize = 32;

#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) raw: NonNull<ibv_cq>,
    channel: NonNull<ibv_comp_channel>,
    /// Completions taken from the hardware queue by `arm` or `poll` and not yet handed out.
    buffered: Mutex<VecDeque<WorkCompletion>>,
    /// The outstanding-request ledgers of the queue pairs completing here.
    pub(crate) ledgers: Ledgers,
    /// Entries the queue pairs using this queue reserved.
    reserved: Mutex<usize>,
    /// The device's largest completion queue.
    max_entries: usize,
    _context: Arc<DeviceContext>,
}

impl CqInner {
    /// Reserves `entries` for a queue pair, growing the hardware queue first if needed;
    /// refused (nothing reserved) when the device cannot grow it.
    pub(crate) fn reserve(&self, entries: usize) -> Result<()> {
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        let wanted = reserved.saturating_add(entries);
        // SAFETY: live CQ; `cqe` is the current size (the device may round it up).
        let capacity = unsafe { self.raw.as_ref() }.cqe.max(0) as usize;
        if wanted > capacity && capacity < self.max_entries {
            let size = wanted.next_power_of_two().min(self.max_entries);
            let size = i32::try_from(size)
                .map_err(|_| TransportError::Exhausted("completion queue entries"))?;
            // Our own polls hold `buffered`: none runs while the queue is resized.
            let _polls = self.buffered.lock().unwrap_or_else(PoisonError::into_inner);
            // SAFETY: live CQ; no poll of ours runs meanwhile.
            let rc = unsafe { ibv_resize_cq(self.raw.as_ptr(), size) };
            if rc != 0 {
                let why = std::io::Error::from_raw_os_error(rc);
                return Err(TransportError::io(
                    "grow the completion queue (ibv_resize_cq)",
                    why,
                ));
            }
        }
        *reserved = wanted;
        Ok(())
    }

    /// Gives back what [`CqInner::reserve`] reserved (the queue keeps its size).
    pub(crate) fn release(&self, entries: usize) {
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        *reserved = reserved.saturating_sub(entries);
    }
}

// SAFETY: verbs objects are thread safe; pointers are owned and freed once in `Drop`.
unsafe impl Send for CqInner {}
// SAFETY: see `Send`; `ibv_poll_cq` may be called concurrently.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created in `VerbsCq::create`; QPs using the CQ hold an `Arc` to it, so
        // none is left; the channel is destroyed after its CQ, as verbs requires.
        unsafe {
            ibv_destroy_cq(self.raw.as_ptr());
            ibv_destroy_comp_channel(self.channel.as_ptr());
        }
    }
}

/// A completion queue of the verbs provider.
#[derive(Clone, Debug)]
pub struct VerbsCq {
    pub(crate) inner: Arc<CqInner>,
}

impl VerbsCq {
    pub(crate) fn create(context: &Arc<DeviceContext>) -> Result<Self> {
        // SAFETY: the context is live.
        let channel = unsafe { ibv_create_comp_channel(context.raw.as_ptr()) };
        let channel = NonNull::new(channel)
            .ok_or_else(|| TransportError::last_os("ibv_create_comp_channel"))?;
        // SAFETY: the channel is live; `fd` is a plain field.
        if let Err(err) = set_nonblocking(unsafe { (*channel.as_ptr()).fd }) {
            // SAFETY: the channel was just created and has no CQ.
            unsafe { ibv_destroy_comp_channel(channel.as_ptr()) };
            return Err(err);
        }
        // SAFETY: live context and channel; no CQ context pointer is used.
        let raw = unsafe {
            ibv_create_cq(
                context.raw.as_ptr(),
                CQ_DEPTH,
                std::ptr::null_mut(),
                channel.as_ptr(),
                0,
            )
        };
        let Some(raw) = NonNull::new(raw) else {
            let err = TransportError::last_os("ibv_create_cq");
            // SAFETY: the channel was just created and has no CQ.
            unsafe { ibv_destroy_comp_channel(channel.as_ptr()) };
            return Err(err);
        };
        let inner = CqInner {
            raw,
            channel,
            buffered: Mutex::default(),
            ledgers: Ledgers::default(),
            reserved: Mutex::new(0),
            max_entries: max_cq_entries(context),
            _context: Arc::clone(context),
        };
        Ok(VerbsCq {
            inner: Arc::new(inner),
        })
    }

    fn poll_hardware(&self, into: &mut VecDeque<WorkCompletion>) -> usize {
        // SAFETY: ibv_wc is plain old data; all-zero is a valid value.
        let mut raw: [ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: the CQ is live and `raw` has room for POLL_BATCH entries.
        let count =
            unsafe { ibv_poll_cq(self.inner.raw.as_ptr(), POLL_BATCH as i32, raw.as_mut_ptr()) };
        let count = count.max(0) as usize;
        if count == 0 {
            return 0;
        }
        let start = into.len();
        into.extend(raw[..count].iter().map(convert));
        self.inner.ledgers.complete(into.range(start..));
        count
    }

    fn channel_fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is a plain field.
        unsafe { (*self.inner.channel.as_ptr()).fd }
    }

    /// Takes and acknowledges every event waiting on the (non-blocking) channel.
    fn ack_events(&self) {
        let mut cq = std::ptr::null_mut();
        let mut context = std::ptr::null_mut();
        // SAFETY: the channel is non-blocking, so this returns at once when it is empty;
        // the out-pointers are live.
        while unsafe { ibv_get_cq_event(self.inner.channel.as_ptr(), &mut cq, &mut context) } == 0 {
            // SAFETY: acknowledges the one event just taken from this CQ.
            unsafe { ibv_ack_cq_events(self.inner.raw.as_ptr(), 1) };
        }
    }
}

impl CompletionQueue for VerbsCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut buffered = self
            .inner
            .buffered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if buffered.len() < out.len() {
            self.poll_hardware(&mut buffered);
        }
        crate::api::drain_completions(&mut buffered, out)
    }

    fn arm(&self) -> Result<bool> {
        self.ack_events();
        // SAFETY: live CQ.
        if unsafe { ibv_req_notify_cq(self.inner.raw.as_ptr(), 0) } != 0 {
            return Err(TransportError::last_os("ibv_req_notify_cq"));
        }
        let mut buffered = self
            .inner
            .buffered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(!buffered.is_empty() || self.poll_hardware(&mut buffered) > 0)
    }

    fn event_fd(&self) -> RawFd {
        self.channel_fd()
    }
}

/// The device's largest completion queue (at least the initial size when it cannot say).
fn max_cq_entries(context: &DeviceContext) -> usize {
    // SAFETY: ibv_device_attr is plain old data; all-zero is valid.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: live context; `attr` is a live out-parameter.
    let rc = unsafe { ibv_query_device(context.raw.as_ptr(), &mut attr) };
    let max = if rc == 0 { attr.max_cqe } else { CQ_DEPTH };
    max.max(CQ_DEPTH) as usize
}

fn convert(wc: &ibv_wc) -> WorkCompletion {
    let imm = (wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
        // SAFETY: with IBV_WC_WITH_IMM set, the union holds immediate data.
        .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data }));
    WorkCompletion {
        wr_id: wc.wr_id,
        status: status(wc.status),
        opcode: opcode(wc.opcode),
        byte_len: wc.byte_len,
        imm,
        qpn: wc.qp_num,
    }
}

fn status(raw: ibv_wc_status::Type) -> WcStatus {
    use ibv_wc_status::*;
    match raw {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalProtectionError,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RetryExceeded,
        IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushError,
        // IBV_WC_REM_INV_REQ_ERR, and every status this API does not distinguish.
        _ => WcStatus::RemoteInvalidRequest,
    }
}

fn opcode(raw: ibv_wc_opcode::Type) -> WcOpcode {
    use ibv_wc_opcode::*;
    match raw {
        IBV_WC_RDMA_WRITE => WcOpcode::Write,
        IBV_WC_RDMA_READ => WcOpcode::Read,
        IBV_WC_COMP_SWAP => WcOpcode::CompareSwap,
        IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        IBV_WC_RECV => WcOpcode::Recv,
        IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}
