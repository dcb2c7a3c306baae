//! Reporter rules at the manager level: what the stored URIs carry (the wire does not show
//! them yet), and a torture run of concurrent deltas and snapshots on one reporter.

use std::sync::Arc;

use kvcm_index::BlockKey;
use kvcm_storage::{ReportTier, ReportTimings, StorageConfig, StorageSpec};

use super::reporter::ReporterState;
use super::*;
use crate::tests::{group, instance_info, test_deps, PREFER_3FS};
use crate::{Instance, Manager};

/// A manager with an L1.5 event-report storage `er` (no snapshot cooldown) listed by group
/// `g`, and instance `i` (spec `tp0`).
fn reporting_manager() -> (Arc<Manager>, Arc<Instance>) {
    reporting_manager_with(ReportTimings {
        snapshot_min_interval_ms: 1,
        ..ReportTimings::default()
    })
}

/// [`reporting_manager`] with `er`'s timings.
fn reporting_manager_with(timings: ReportTimings) -> (Arc<Manager>, Arc<Instance>) {
    let manager = Manager::new(test_deps()).expect("manager");
    manager
        .add_storage(StorageConfig {
            global_unique_name: "er".into(),
            spec: StorageSpec::EventReport {
                tier: ReportTier::L1p5,
                timings,
            },
            check_storage_available_when_open: false,
        })
        .expect("storage");
    let mut group = group(1 << 30, PREFER_3FS);
    group.event_report_storage_candidates = vec!["er".into()];
    manager.create_group(group).expect("group");
    manager
        .register_instance(instance_info())
        .expect("register");
    let instance = manager.instance("i").expect("registered");
    (manager, instance)
}

fn block(key: BlockKey, uri: &str) -> ReportedBlock {
    ReportedBlock {
        key,
        medium: "gpu".into(),
        specs: vec![ReportedSpec {
            name: "tp0".into(),
            uri: uri.into(),
        }],
    }
}

fn request(host: &str, events: Vec<ReportEvent>) -> ReportRequest {
    ReportRequest {
        tier: ReportTier::L1p5,
        host: host.into(),
        events,
    }
}

/// Every stored URI of the reporter, with the reporter's generation.
fn stored(manager: &Manager, host: &str) -> (Option<u128>, Vec<String>) {
    let reporter = manager
        .reports
        .reporter(&Arc::from("i"), ReportTier::L1p5, host, 1)
        .expect("known")
        .0;
    let state = crate::sync::lock(&reporter.state);
    let mut uris: Vec<String> = state
        .blocks
        .values()
        .flatten()
        .flat_map(|medium| medium.specs.iter().map(|spec| spec.uri.clone()))
        .collect();
    uris.sort();
    (state.generation, uris)
}

/// Every stored spec carries exactly one `s_version`, the reporter's current generation.
fn assert_one_current_version(state: (Option<u128>, Vec<String>)) {
    let (generation, uris) = state;
    for uri in &uris {
        let versions: Vec<&str> = uri.matches("s_version=").collect();
        assert_eq!(versions.len(), 1, "{uri}");
        let expected = format!("s_version={:032x}", generation.expect("a generation"));
        assert!(uri.ends_with(&expected), "{uri} carries {expected}");
    }
}

#[test]
fn stored_uris_keep_the_reporters_text_and_carry_the_generation() {
    let (manager, instance) = reporting_manager();
    let add = ReportEvent::Add(block(7, "event_report://h:1/gpu/7?size=64"));
    let outcome = manager
        .report_event(&instance, &request("h:1", vec![add]))
        .expect("report");
    assert_eq!(outcome.results, [ItemResult::Ok]);
    let (generation, uris) = stored(&manager, "h:1");
    assert_eq!(generation, outcome.generation);
    let hex = format!("{:032x}", generation.expect("created"));
    assert_eq!(
        uris,
        [format!("event_report://h:1/gpu/7?size=64&s_version={hex}")]
    );
    // A snapshot stores everything under a new generation.
    let snapshot = ReportEvent::Snapshot(vec![
        block(7, "vineyard://h:1/gpu/7"),
        block(8, "vineyard://h:1/gpu/8"),
    ]);
    let replaced = manager
        .report_event(&instance, &request("h:1", vec![snapshot]))
        .expect("report");
    assert_eq!(replaced.results, [ItemResult::Ok]);
    assert_ne!(replaced.generation, generation);
    assert_one_current_version(stored(&manager, "h:1"));
    assert_eq!(stored(&manager, "h:1").1.len(), 2);
}

#[test]
fn mediums_beyond_the_limit_are_refused_and_change_nothing() {
    let (manager, instance) = reporting_manager();
    let on = |key: BlockKey, medium: String| ReportedBlock {
        medium,
        ..block(key, "e://h/1")
    };
    let mediums = |range: std::ops::Range<usize>| range.map(|m| format!("m{m}")).collect();
    let report = |events| {
        manager
            .report_event(&instance, &request("h:1", events))
            .expect("report")
            .results
    };
    // Registration: 64 are fine (repeats count once); a 65th is refused.
    let register = |mediums| ReportEvent::Register { mediums };
    assert_eq!(report(vec![register(mediums(0..64))]), [ItemResult::Ok]);
    assert_eq!(report(vec![register(mediums(0..64))]), [ItemResult::Ok]);
    assert!(matches!(
        report(vec![register(mediums(60..65))])[..],
        [ItemResult::Invalid(ref why)] if why.contains("64 mediums")
    ));
    // One block on 64 mediums; a 65th ADD is refused, an ADD on a known medium is not.
    let adds = (0..64)
        .map(|m| ReportEvent::Add(on(5, format!("m{m}"))))
        .collect();
    assert!(report(adds).iter().all(|r| *r == ItemResult::Ok));
    assert!(matches!(
        report(vec![ReportEvent::Add(on(5, "m64".into()))])[..],
        [ItemResult::Invalid(ref why)] if why.contains("64 mediums already")
    ));
    assert_eq!(
        report(vec![ReportEvent::Add(on(5, "m3".into()))]),
        [ItemResult::Ok]
    );
    let reporter = manager
        .reports
        .reporter(&Arc::from("i"), ReportTier::L1p5, "h:1", 1)
        .expect("known")
        .0;
    assert_eq!(crate::sync::lock(&reporter.state).blocks[&5].len(), 64);
    // A snapshot listing one block on 65 mediums is refused whole.
    let snapshot = (0..65).map(|m| on(6, format!("m{m}"))).collect();
    assert!(matches!(
        report(vec![ReportEvent::Snapshot(snapshot)])[..],
        [ItemResult::Invalid(ref why)] if why.contains("more than 64 mediums")
    ));
    assert!(crate::sync::lock(&reporter.state).blocks.contains_key(&5));
}

#[test]
fn unregistering_forgets_blocks_mediums_and_generation() {
    let mut state = ReporterState::fresh();
    let now = std::time::Instant::now();
    state.register(now, &["gpu".to_string()]).unwrap();
    state.add(&block(1, "e://h/1")).unwrap();
    assert!(state.holds(1, &[]));
    assert!(!state.holds(1, &["disk".to_string()]));
    let epoch = state.epoch;
    state.unregister();
    assert!(!state.holds(1, &[]) && state.mediums.is_empty() && state.generation.is_none());
    assert!(
        !state.touch(now, true),
        "a tombstone is not revived by a heartbeat"
    );
    state.register(now, &[]).unwrap();
    assert!(
        state.epoch > epoch + 1,
        "unregister and revival each start a new lifecycle"
    );
    assert!(state.touch(now, false));
}

#[test]
fn concurrent_deltas_and_snapshots_leave_one_generation_on_every_spec() {
    let (manager, instance) = reporting_manager();
    let threads = 4;
    let rounds = 200;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (manager, instance) = (&manager, &instance);
            scope.spawn(move || {
                for round in 0..rounds {
                    let key = (thread * rounds + round) as BlockKey;
                    let uri = format!("event_report://h:1/gpu/{key}");
                    let event = match round % 10 {
                        0 => ReportEvent::Snapshot(vec![block(key, &uri)]),
                        3 => ReportEvent::Delete {
                            key: key - 1,
                            medium: "gpu".into(),
                            spec_names: vec!["tp0".into()],
                        },
                        _ => ReportEvent::Add(block(key, &uri)),
                    };
                    let outcome = manager
                        .report_event(instance, &request("h:1", vec![event]))
                        .expect("report");
                    let refused_snapshot = matches!(
                        outcome.results[0],
                        ItemResult::SnapshotInProgress | ItemResult::RateLimited { .. }
                    );
                    let ok = outcome.results[0] == ItemResult::Ok;
                    assert!(ok || refused_snapshot, "{:?}", outcome.results);
                }
            });
        }
    });
    assert_one_current_version(stored(&manager, "h:1"));
    // The last snapshot's block and every later add are there; a query sees them.
    let keys: Vec<BlockKey> = (0..(threads * rounds) as BlockKey).collect();
    let held = keys.iter().filter(|&&key| {
        let query = HostStateQuery {
            keys: &[key],
            mediums: &[],
            remote_hosts: 0,
            p2p: false,
            matching: HostMatch::Prefix,
        };
        !manager
            .host_cache_state(&instance, query)
            .expect("state")
            .is_empty()
    });
    assert_eq!(held.count(), stored(&manager, "h:1").1.len());
}

#[test]
fn the_sweep_unregisters_expired_reporters_nobody_asks_about() {
    let (manager, instance) = reporting_manager();
    let add = ReportEvent::Add(block(7, "event_report://h:1/gpu/7?size=64"));
    let report = |host: &str| {
        manager
            .report_event(&instance, &request(host, vec![add.clone()]))
            .expect("report")
    };
    assert_eq!(report("h:1").results, [ItemResult::Ok]);
    let now = std::time::Instant::now();
    assert_eq!(manager.sweep_reporters(now), 0, "within its timeout");
    let timings = ReportTimings::default();
    let past = now
        + std::time::Duration::from_millis(
            timings.heartbeat_timeout_ms + timings.cleanup_grace_ms + 1,
        );
    assert_eq!(manager.sweep_reporters(past), 1);
    assert_eq!(
        stored(&manager, "h:1"),
        (None, Vec::new()),
        "its blocks are freed"
    );
    assert_eq!(
        manager.sweep_reporters(past),
        0,
        "a tombstone is swept once"
    );
}

#[test]
fn the_sweeper_thread_runs_at_the_storages_interval() {
    let (manager, instance) = reporting_manager_with(ReportTimings {
        heartbeat_timeout_ms: 1,
        cleanup_grace_ms: 1,
        liveness_check_interval_ms: 10,
        ..ReportTimings::default()
    });
    let add = ReportEvent::Add(block(7, "event_report://h:1/gpu/7?size=64"));
    let outcome = manager
        .report_event(&instance, &request("h:1", vec![add]))
        .expect("report");
    assert_eq!(outcome.results, [ItemResult::Ok]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while stored(&manager, "h:1").1.len() == 1 {
        assert!(std::time::Instant::now() < deadline, "never swept");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let refused = manager
        .report_event(
            &instance,
            &request("h:1", vec![ReportEvent::Add(block(8, "e://h:1/gpu/8"))]),
        )
        .expect("report");
    assert_eq!(
        refused.results,
        [ItemResult::NotRegistered],
        "tombstoned by the sweep"
    );
}
