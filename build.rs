//! Compiles proto/*.proto with protox (no system protoc): prost messages, tonic services and
//! pbjson serde impls (protobuf canonical JSON with the reference server's options).
//!
//! pbjson turns an enum number without a name into the zero value; protobuf's JSON parser
//! keeps it (proto3 enums are open), and so does gRPC. So every enum field read of the
//! generated serde code is rewritten to read through `crate::proto::json::OpenEnum`, which
//! keeps numbers as sent. The build fails unless exactly one read per enum field of the
//! descriptors was rewritten (a pbjson change of shape cannot pass silently).

use std::path::{Path, PathBuf};

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
    let packages: Vec<(String, usize)> = descriptors
        .file
        .iter()
        .map(|file| {
            let mut messages: Vec<_> = file.message_type.iter().collect();
            let mut enum_fields = 0;
            while let Some(message) = messages.pop() {
                let fields = message.field.iter();
                enum_fields += fields.filter(|f| f.r#type == Some(TYPE_ENUM)).count();
                messages.extend(&message.nested_type);
            }
            (file.package().to_string(), enum_fields)
        })
        .collect();
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

    for (package, enum_fields) in packages {
        open_enums(&out_dir, &package, enum_fields)?;
    }
    Ok(())
}

/// `FieldDescriptorProto.Type.TYPE_ENUM`.
const TYPE_ENUM: i32 = 14;

/// How pbjson's generated code reads a singular enum field: `<prefix>Enum<suffix>`.
const ENUM_READ: (&str, &str) = ("map_.next_value::<", ">()? as i32");

/// Rewrites the enum field reads of `package`'s serde code; `expected` is its enum fields.
fn open_enums(
    out_dir: &Path,
    package: &str,
    expected: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let path = out_dir.join(format!("{package}.serde.rs"));
    let (code, rewritten) = open_enum_reads(&std::fs::read_to_string(&path)?);
    if rewritten != expected {
        let found = format!("{rewritten} enum field reads in {}", path.display());
        return Err(format!("{found}, {expected} enum fields in {package}").into());
    }
    std::fs::write(&path, code)?;
    Ok(())
}

/// `code` with every `next_value::<E>()? as i32` made `next_value::<OpenEnum<E>>()?.0`, and
/// how many were rewritten.
fn open_enum_reads(code: &str) -> (String, usize) {
    let (prefix, suffix) = ENUM_READ;
    let (mut out, mut rest, mut rewritten) = (String::with_capacity(code.len()), code, 0);
    while let Some(at) = rest.find(prefix) {
        let (before, after) = rest.split_at(at + prefix.len());
        out.push_str(before);
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let (name, tail) = after.split_at(name_len);
        if name.is_empty() || !tail.starts_with(suffix) {
            rest = after;
            continue;
        }
        out.push_str(&format!("crate::proto::json::OpenEnum<{name}>>()?.0"));
        rest = &tail[suffix.len()..];
        rewritten += 1;
    }
    out.push_str(rest);
    (out, rewritten)
}
