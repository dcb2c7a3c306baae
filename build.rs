//! Compiles proto/*.proto with protox (no system protoc): prost messages, tonic services and
//! pbjson serde impls (protobuf canonical JSON with the reference server's options).

use std::path::PathBuf;

use prost::Message;

const PROTOS: [&str; 3] = [
    "proto/meta_service.proto",
    "proto/admin_service.proto",
    "proto/debug_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_bytes = descriptors.encode_to_vec();
    std::fs::write(out_dir.join("kvcm_descriptor.bin"), &descriptor_bytes)?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .preserve_proto_field_names()
        .emit_fields()
        .ignore_unknown_fields()
        .ignore_unknown_enum_variants()
        .build(&[".kv_cache_manager"])?;
    Ok(())
}
