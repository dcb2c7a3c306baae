//! The window's bounds and the curve it gives, against the optimizer's on the same requests.

use std::sync::Arc;

use kvcm_optimizer::model::Workload;
use kvcm_optimizer::sim::LruCurve;
use kvcm_optimizer::trace::Request;

use super::LiveCurves;

#[test]
fn the_window_keeps_the_newest_whole_requests_within_its_accesses() {
    let curves = LiveCurves::new(10);
    let instance: Arc<str> = "i".into();
    for start in 0..5 {
        curves.record(
            &instance,
            16,
            &[start, start + 1, start + 2, start + 3],
            &[],
        );
    }
    let summary = curves.curve("i").expect("recorded");
    assert_eq!(
        summary.requests, 2,
        "8 of 10 accesses: two requests of four"
    );
    curves.record(&instance, 16, &(100..120).collect::<Vec<_>>(), &[]);
    curves.record(&instance, 16, &[], &[]);
    let window = curves.window(&instance);
    let window = super::lock(&window);
    assert_eq!(
        (window.requests.len(), window.accesses),
        (1, 20),
        "a request larger than the window stays alone; an empty one is not recorded"
    );
    assert!(LiveCurves::new(0).curve("i").is_none());
}

#[test]
fn the_curve_is_the_optimizers_lru_curve_of_the_same_requests() {
    let curves = LiveCurves::new(1 << 20);
    let instance: Arc<str> = "i".into();
    let mut rng = fastrand::Rng::with_seed(3);
    let mut requests = Vec::new();
    for _ in 0..400 {
        let start = rng.i64(0..60);
        let keys: Vec<i64> = (start..start + rng.i64(1..12)).collect();
        let tokens: Vec<i64> = vec![0; rng.usize(0..3) * 7];
        curves.record(&instance, 4, &keys, &tokens);
        let input_tokens = if tokens.is_empty() {
            keys.len() as u64 * 4
        } else {
            tokens.len() as u64
        };
        requests.push(Request::untimed(
            &keys.iter().map(|&k| k as u64).collect::<Vec<_>>(),
            input_tokens,
        ));
    }
    let expected = LruCurve::compute(&Workload::from_requests(&requests, 4).unwrap());
    let summary = curves.curve("i").expect("recorded");
    assert_eq!(summary.unique_blocks(), expected.max_capacity());
    for point in summary.points(50) {
        let capacity = point.capacity_blocks;
        assert_eq!(point.block_hit_rate, expected.block_hit_rate(capacity));
        assert_eq!(point.token_hit_rate, expected.token_hit_rate(capacity));
    }
    let achievable = expected.block_hit_rate(expected.max_capacity());
    for fraction in super::FRACTIONS {
        let capacity = summary.capacity_for(fraction);
        assert!(expected.block_hit_rate(capacity) >= fraction * achievable - 1e-12);
        assert!(capacity == 0 || expected.block_hit_rate(capacity - 1) < fraction * achievable);
    }
}
