//! `mooncake` URIs, unsupported kinds and config errors through `open`.

use kvcm_storage::{
    open, AllocationRequest, BlockSpec, BlockToAllocate, StorageConfig, StorageError, StorageKind,
    StorageSpec,
};

fn config(spec: StorageSpec) -> StorageConfig {
    StorageConfig {
        global_unique_name: "mc".to_string(),
        spec,
        check_storage_available_when_open: true,
    }
}

fn mooncake() -> StorageSpec {
    StorageSpec::Mooncake {
        local_hostname: "127.0.0.1:17812".to_string(),
        metadata_connstring: "http://127.0.0.1:8080/metadata".to_string(),
        protocol: "tcp".to_string(),
        rdma_device: String::new(),
        master_service_entry: "127.0.0.1:50051".to_string(),
    }
}

#[test]
fn mooncake_allocates_uris_only() {
    let storage = open(config(mooncake())).expect("open");
    assert_eq!(storage.kind(), StorageKind::Mooncake);
    let specs = [
        BlockSpec {
            name: "tp0".to_string(),
            size: 1024,
        },
        BlockSpec {
            name: "tp1".to_string(),
            size: 2048,
        },
    ];
    let blocks = [
        BlockToAllocate {
            key: 123,
            spec_indexes: vec![0, 1],
        },
        BlockToAllocate {
            key: -1,
            spec_indexes: vec![1],
        },
    ];
    let request = AllocationRequest {
        instance_id: "instance1",
        specs: &specs,
        blocks: &blocks,
    };
    let placed = storage.allocate(&request).expect("allocate");
    let uris: Vec<Vec<(&str, &str)>> = placed
        .iter()
        .map(|parts| {
            parts
                .iter()
                .map(|part| (part.name.as_str(), part.uri.as_str()))
                .collect()
        })
        .collect();
    assert_eq!(
        uris,
        vec![
            vec![
                ("tp0", "mooncake://mc/?key=instance1/tp0/7b&size=1024"),
                ("tp1", "mooncake://mc/?key=instance1/tp1/7b&size=2048"),
            ],
            vec![(
                "tp1",
                "mooncake://mc/?key=instance1/tp1/ffffffffffffffff&size=2048"
            )],
        ]
    );
    let all: Vec<String> = placed.into_iter().flatten().map(|part| part.uri).collect();
    storage.delete(&all).expect("delete own uris");
    for foreign in [
        "mooncake://other/?key=a&size=1",
        "file://mc/x?size=1",
        "mooncake://mc/?size=1",
    ] {
        let result = storage.delete(&[foreign.to_string()]);
        assert!(
            matches!(result, Err(StorageError::InvalidUri { .. })),
            "{foreign}: {result:?}"
        );
    }
}

#[test]
fn vcns_is_unsupported_and_a_tair_mempool_opens_as_an_empty_pool() {
    let vcns = StorageSpec::VcnsThreeFs {
        mountpoint: "/mnt/3fs".to_string(),
        root_dir: "kv".to_string(),
        remote_host: "h".to_string(),
        remote_port: 9000,
        meta_storage_uri: "meta://x".to_string(),
    };
    let result = open(config(vcns));
    assert!(
        matches!(
            result,
            Err(StorageError::Unsupported(StorageKind::VcnsThreeFs))
        ),
        "{result:?}"
    );
    let pace = StorageSpec::TairMemPool {
        domain: "pool".to_string(),
        timeout: 10,
        enable_vipserver: false,
        service_discovery_url: String::new(),
        media_type: 0,
    };
    let pool = open(config(pace)).expect("a memory pool opens");
    assert_eq!(pool.kind(), StorageKind::TairMemPool);
    let members = pool.as_pool().expect("a pool backend").nodes();
    assert!(members.is_empty());
    assert!(
        matches!(pool.check_health(), Err(StorageError::Unavailable(_))),
        "no live node yet"
    );
}

#[test]
fn invalid_configs_are_refused_by_open() {
    let mut bad = config(mooncake());
    bad.global_unique_name = String::new();
    let result = open(bad);
    assert!(
        matches!(result, Err(StorageError::InvalidConfig(ref m)) if m.contains("global_unique_name")),
        "{result:?}"
    );
}
