//! One test per rule of `StorageConfig::validate`.

use crate::test_support::{config, nfs};
use crate::{StorageConfig, StorageError, StorageSpec};

fn three_fs(mountpoint: &str, root_dir: &str) -> StorageSpec {
    StorageSpec::ThreeFs {
        cluster_name: String::new(),
        mountpoint: mountpoint.to_string(),
        root_dir: root_dir.to_string(),
        key_count_per_file: 8,
        touch_file_when_create: false,
    }
}

fn mooncake(protocol: &str, rdma_device: &str, master: &str) -> StorageSpec {
    StorageSpec::Mooncake {
        local_hostname: "host:1".to_string(),
        metadata_connstring: "http://meta".to_string(),
        protocol: protocol.to_string(),
        rdma_device: rdma_device.to_string(),
        master_service_entry: master.to_string(),
    }
}

fn vcns(remote_port: i32, meta_storage_uri: &str) -> StorageSpec {
    StorageSpec::VcnsThreeFs {
        mountpoint: "/mnt/3fs".to_string(),
        root_dir: "kv".to_string(),
        remote_host: "h".to_string(),
        remote_port,
        meta_storage_uri: meta_storage_uri.to_string(),
    }
}

/// Asserts `config` is refused with a message naming `field`.
fn assert_refused(config: StorageConfig, field: &str) {
    match config.validate() {
        Err(StorageError::InvalidConfig(message)) => {
            assert!(message.contains(field), "{message:?} should name {field}")
        }
        other => panic!("{config:?} should be refused naming {field}, got {other:?}"),
    }
}

#[test]
fn valid_configs_pass() {
    for spec in [
        nfs("/tmp/nfs/"),
        three_fs("/mnt/3fs", "kvcache/data"),
        three_fs("/mnt/3fs/", "/kv/"),
        mooncake("tcp", "", "m:50051"),
        mooncake("rdma", "mlx5_0", "m:50051"),
        vcns(9000, "meta://x"),
        StorageSpec::TairMemPool {
            domain: "pool".to_string(),
            timeout: 10,
            enable_vipserver: false,
            service_discovery_url: String::new(),
            media_type: 0,
        },
    ] {
        let config = config(spec);
        assert!(config.validate().is_ok(), "{config:?}");
    }
}

#[test]
fn bad_storage_names_are_refused() {
    for name in ["", "a/b", "a?b", "with space"] {
        let mut bad = config(nfs("/tmp/nfs/"));
        bad.global_unique_name = name.to_string();
        assert_refused(bad, "global_unique_name");
    }
}

#[test]
fn nfs_needs_an_absolute_root_path() {
    assert_refused(config(nfs("")), "root_path");
    assert_refused(config(nfs("relative/dir/")), "root_path");
    assert_refused(config(nfs("/tmp/../etc/")), "root_path");
    assert_refused(config(nfs("/tmp/a?b/")), "root_path");
    assert_refused(config(nfs("/tmp/a b/")), "root_path");
}

#[test]
fn three_fs_needs_mountpoint_and_root_dir() {
    assert_refused(config(three_fs("", "kv")), "mountpoint");
    assert_refused(config(three_fs("mnt", "kv")), "mountpoint");
    assert_refused(config(three_fs("/mnt/3fs", "")), "root_dir");
    assert_refused(config(three_fs("/mnt/3fs", "../escape")), "root_dir");
}

#[test]
fn mooncake_needs_its_fields_and_a_known_protocol() {
    assert_refused(config(mooncake("tcp", "", "")), "master_service_entry");
    assert_refused(config(mooncake("rdma", "", "m:1")), "rdma_device");
    assert_refused(config(mooncake("udp", "", "m:1")), "protocol");
    let mut spec = mooncake("tcp", "", "m:1");
    if let StorageSpec::Mooncake { local_hostname, .. } = &mut spec {
        local_hostname.clear();
    }
    assert_refused(config(spec), "local_hostname");
}

#[test]
fn vcns_and_pace_need_their_fields() {
    assert_refused(config(vcns(0, "meta://x")), "remote_port");
    assert_refused(config(vcns(70_000, "meta://x")), "remote_port");
    assert_refused(config(vcns(9000, "")), "meta_storage_uri");
    let pace = StorageSpec::TairMemPool {
        domain: " ".to_string(),
        timeout: 10,
        enable_vipserver: false,
        service_discovery_url: String::new(),
        media_type: 0,
    };
    assert_refused(config(pace), "domain");
}

fn pool(url: &str, media_type: i32) -> StorageSpec {
    StorageSpec::TairMemPool {
        domain: "pool".to_string(),
        timeout: 10,
        enable_vipserver: false,
        service_discovery_url: url.to_string(),
        media_type,
    }
}

#[test]
fn pool_discovery_urls_and_media_types_are_checked() {
    for (url, media_type) in [
        ("", 0),
        ("vipserver://kvcm.pool", 2),
        ("spectrum://svc/pool", 0),
        ("static://10.0.0.1:7000,h2:7001", 2),
    ] {
        let checked = config(pool(url, media_type)).validate();
        assert!(checked.is_ok(), "{url} {media_type}: {checked:?}");
    }
    for url in [
        "http://x",
        "static://",
        "static://h",
        "static://h:99999",
        "vipserver:// ",
    ] {
        assert_refused(config(pool(url, 0)), "service_discovery_url");
    }
    for media_type in [1, 5, -1] {
        assert_refused(config(pool("", media_type)), "media_type");
    }
}

#[test]
fn storage_roots_in_system_directories_are_refused() {
    for root in [
        "/",
        "//",
        "/./",
        "/proc/",
        "/sys/x/",
        "/dev/",
        "/etc/passwd",
        "/etc/kvcm/",
        "/boot/",
        "/bin/",
        "/sbin/",
        "/lib/",
        "/lib64/x/",
        "/usr/",
        "/usr/local/kvcm/",
        "//etc/",
    ] {
        assert_refused(config(nfs(root)), "root_path");
    }
    assert_refused(config(three_fs("/", "etc")), "mountpoint");
    assert_refused(config(three_fs("/mnt/3fs/../../etc", "kv")), "mountpoint");
    for root in [
        "/tmp/nfs/",
        "/var/tmp/kvcm/",
        "/data/kvcm/",
        "/mnt/etc/",
        "/home/u/usr/",
    ] {
        assert_eq!(
            config(nfs(root)).validate().map_err(|e| e.to_string()),
            Ok(()),
            "{root}"
        );
    }
}

#[test]
fn names_longer_than_one_path_component_are_refused() {
    let mut bad = config(nfs("/tmp/nfs/"));
    bad.global_unique_name = "s".repeat(crate::MAX_NAME_BYTES + 1);
    assert_refused(bad, "global_unique_name");
}

#[test]
fn an_nfs_prefix_root_is_checked_on_the_directory_its_files_land_in() {
    for root in ["/e", "/us", "/data"] {
        let config = config(nfs(root));
        assert_eq!(
            config.validate().map_err(|e| e.to_string()),
            Ok(()),
            "{root}"
        );
        let error = config.validate_files_dir().unwrap_err().to_string();
        assert!(error.contains("trailing '/'"), "{root}: {error}");
    }
    for root in ["/tmp/nfs/prefix_", "/data/kvcm", "/tmp/nfs/", "/e/"] {
        assert!(config(nfs(root)).validate_files_dir().is_ok(), "{root}");
    }
}
