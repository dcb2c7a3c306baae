//! Live capacity curves (docs/capacity.md "Live capacity curves"): per instance, the
//! GetCacheLocation requests of a sliding window of real traffic, from which the optimizer's
//! one-pass LRU stack-distance algorithm (`kvcm_optimizer::sim::LruCurve`, the one
//! `kvcm optimize` runs) computes on demand the prefix hit rate at every capacity and the
//! capacity that reaches 80 / 90 / 95 % of the hit rate the window allows.
//!
//! Invariants:
//! - a window holds whole requests in arrival order and at most `window_accesses` block
//!   accesses (a single larger request alone); the oldest requests leave first;
//! - a request is counted as the event log writes it (every key of the request; its tokens
//!   are `len(token_ids)`, else keys × block size), so a window that covers a whole replay
//!   gives `kvcm optimize`'s curve of the same requests;
//! - recording holds only its instance's window lock for a push; a computation copies the
//!   window first and runs without any lock; an answer is reused for [`REUSE_FOR`].

mod answer;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use kvcm_index::BlockKey;
use kvcm_optimizer::model::Workload;
use kvcm_optimizer::sim::LruCurve;
use kvcm_optimizer::trace::Request;

pub use answer::{CurvePoint, CurveSummary, FRACTIONS, MAX_POINTS};

/// How long a computed curve answers before it is computed again.
pub const REUSE_FOR: Duration = Duration::from_secs(5);

/// The windows of every instance that was looked up.
#[derive(Debug)]
pub struct LiveCurves {
    /// Block accesses a window keeps (0: no curves are kept).
    window_accesses: usize,
    windows: RwLock<HashMap<Arc<str>, Arc<Mutex<Window>>>>,
}

/// One instance's recent requests and its last computed curve.
#[derive(Debug, Default)]
struct Window {
    requests: VecDeque<Request>,
    accesses: usize,
    block_tokens: u32,
    /// The last curve: when, of how many requests.
    computed: Option<(Instant, Arc<LruCurve>, usize)>,
}

impl Default for LiveCurves {
    /// No windows kept.
    fn default() -> Self {
        LiveCurves::new(0)
    }
}

impl LiveCurves {
    /// Curves over windows of `window_accesses` block accesses (0: off).
    pub fn new(window_accesses: usize) -> LiveCurves {
        LiveCurves {
            window_accesses,
            windows: RwLock::default(),
        }
    }

    /// Whether windows are kept.
    pub fn is_enabled(&self) -> bool {
        self.window_accesses > 0
    }

    /// Records a served GetCacheLocation of `instance` (block size `block_tokens`).
    pub fn record(
        &self,
        instance: &Arc<str>,
        block_tokens: u32,
        keys: &[BlockKey],
        token_ids: &[i64],
    ) {
        if !self.is_enabled() || keys.is_empty() {
            return;
        }
        let input_tokens = match token_ids.len() {
            0 => keys.len() as u64 * u64::from(block_tokens),
            sent => sent as u64,
        };
        let request = Request {
            timestamp_us: 0,
            instance: String::new(),
            input_tokens,
            // The event log's key bits: a key keeps its identity as in a replay.
            blocks: keys.iter().map(|&key| key as u64).collect(),
        };
        let window = self.window(instance);
        let mut window = lock(&window);
        window.block_tokens = block_tokens;
        window.accesses += request.blocks.len();
        window.requests.push_back(request);
        while window.accesses > self.window_accesses && window.requests.len() > 1 {
            let oldest = window.requests.pop_front().map_or(0, |r| r.blocks.len());
            window.accesses -= oldest;
        }
    }

    /// The curve of `instance`'s window (reused while younger than [`REUSE_FOR`]; empty when
    /// nothing of it was recorded); `None` when no windows are kept (or, impossibly, the
    /// window does not compile).
    pub fn curve(&self, instance: &str) -> Option<CurveSummary> {
        if !self.is_enabled() {
            return None;
        }
        let Some(window) = read(&self.windows).get(instance).cloned() else {
            let empty = compute(&VecDeque::new(), 1)?;
            return Some(CurveSummary::of(&Arc::new(empty), 0));
        };
        let (requests, block_tokens) = {
            let guard = lock(&window);
            let fresh = guard
                .computed
                .as_ref()
                .filter(|(at, ..)| at.elapsed() < REUSE_FOR);
            if let Some((_, curve, requests)) = fresh {
                return Some(CurveSummary::of(curve, *requests));
            }
            (guard.requests.clone(), guard.block_tokens.max(1))
        };
        let curve = Arc::new(compute(&requests, block_tokens)?);
        lock(&window).computed = Some((Instant::now(), curve.clone(), requests.len()));
        Some(CurveSummary::of(&curve, requests.len()))
    }

    /// The instances with a window, sorted.
    pub fn instances(&self) -> Vec<Arc<str>> {
        let mut ids: Vec<Arc<str>> = read(&self.windows).keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Drops the windows of instances `registered` no longer knows.
    pub fn retain(&self, registered: impl Fn(&str) -> bool) {
        let mut windows = self.windows.write().unwrap_or_else(|p| p.into_inner());
        windows.retain(|id, _| registered(id));
    }

    fn window(&self, instance: &Arc<str>) -> Arc<Mutex<Window>> {
        if let Some(found) = read(&self.windows).get(instance) {
            return found.clone();
        }
        let mut windows = self.windows.write().unwrap_or_else(|p| p.into_inner());
        windows.entry(instance.clone()).or_default().clone()
    }
}

/// The LRU curve of `requests`, one instance's, in order (`None` past `u32::MAX` accesses,
/// which the configured window bound rules out).
fn compute(requests: &VecDeque<Request>, block_tokens: u32) -> Option<LruCurve> {
    let workload = Workload::from_requests(requests, block_tokens)?;
    Some(LruCurve::compute(&workload))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
