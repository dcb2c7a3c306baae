//! [`run_parallel`]: maps a function over items on scoped threads, results in item order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Applies `work` to every item on up to `threads` threads (at least one); `on_done(done,
/// total)` is called after each item. Results come back in the order of `items`.
pub fn run_parallel<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(&T) -> R + Sync,
    on_done: impl Fn(usize, usize) + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new(items.iter().map(|_| None).collect());
    let worker = || loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(index) else {
            break;
        };
        let result = work(item);
        lock(&results)[index] = Some(result);
        on_done(done.fetch_add(1, Ordering::Relaxed) + 1, items.len());
    };
    std::thread::scope(|scope| {
        for _ in 1..threads.clamp(1, items.len().max(1)) {
            scope.spawn(worker);
        }
        worker();
    });
    let results = results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    results.into_iter().flatten().collect()
}

/// Locks `mutex`, ignoring poisoning (a panicking worker already fails the scope).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_item_order_and_every_item_is_reported_done() {
        let items: Vec<u64> = (0..100).collect();
        let reported = AtomicUsize::new(0);
        let squares = run_parallel(
            &items,
            4,
            |x| x * x,
            |_, total| {
                assert_eq!(total, 100);
                reported.fetch_add(1, Ordering::Relaxed);
            },
        );
        assert_eq!(squares, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert_eq!(reported.load(Ordering::Relaxed), 100);
    }
}
