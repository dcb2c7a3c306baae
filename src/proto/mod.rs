//! Generated wire types, one module per reference package (types are never shared across
//! packages: the same names differ in shape), plus the JSON glue of the HTTP edge.
//!
//! Every message has prost (binary) and pbjson serde (protobuf canonical JSON) impls:
//! snake_case names out, defaults always printed, enums by name, int64 as strings; on input
//! both name styles, unknown fields and unknown enum names ignored, enum numbers kept as sent
//! (named or not, see [`json::OpenEnum`]), int64 from numbers or strings parsed exactly.

pub mod json;
pub mod storage;

/// `kv_cache_manager.proto.meta`: the engine-facing MetaService.
#[allow(missing_docs, clippy::all)]
pub mod meta {
    include!(concat!(env!("OUT_DIR"), "/kv_cache_manager.proto.meta.rs"));
    include!(concat!(
        env!("OUT_DIR"),
        "/kv_cache_manager.proto.meta.serde.rs"
    ));
}

/// `kv_cache_manager.proto.admin`: the operator-facing AdminService.
#[allow(missing_docs, clippy::all)]
pub mod admin {
    include!(concat!(env!("OUT_DIR"), "/kv_cache_manager.proto.admin.rs"));
    include!(concat!(
        env!("OUT_DIR"),
        "/kv_cache_manager.proto.admin.serde.rs"
    ));
}

/// `kv_cache_manager.proto.debug`: fault injection.
#[allow(missing_docs, clippy::all)]
pub mod debug {
    include!(concat!(env!("OUT_DIR"), "/kv_cache_manager.proto.debug.rs"));
    include!(concat!(
        env!("OUT_DIR"),
        "/kv_cache_manager.proto.debug.serde.rs"
    ));
}
