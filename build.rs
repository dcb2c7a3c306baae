//! Compiles proto/*.proto with protox (no system protoc): prost messages, tonic services and
//! pbjson serde impls (protobuf canonical JSON with the reference server's options).
//!
//! pbjson turns an enum number without a name into the zero value; protobuf's JSON parser
//! keeps it (proto3 enums are open), and so does gRPC. So every enum field read of the
//! generated serde code is rewritten to read through `crate::proto::json::OpenEnum`, which
//! keeps numbers as sent. The build fails unless exactly one read per enum field of the
//! descriptors was rewritten (a pbjson change of shape cannot pass silently).
//!
//! The reference prints every field, defaults included, and so does kvcm (pbjson's
//! `emit_fields`). A field upstream trunk added to a 2026-02 message is the exception: it is
//! printed only when set ([`TRUNK_FIELDS`]), so an answer to a 2026-02 client stays byte for
//! byte what it was, and a trunk client reads an absent field as its default, as protobuf's
//! JSON parser does. The build fails unless each listed field's print was found once.

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
        .filter(|file| file.package().starts_with("kv_cache_manager"))
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
    for (package, message, field, is_set) in TRUNK_FIELDS {
        print_when_set(&out_dir, package, message, field, is_set)?;
    }
    Ok(())
}

/// Upstream trunk fields of 2026-02 messages, printed only when set: package, message,
/// field, and the condition (on `self`) under which it is printed.
const TRUNK_FIELDS: [(&str, &str, &str, &str); 11] = [
    (
        "kv_cache_manager.proto.meta",
        "InstanceInfo",
        "default_query_type",
        "self.default_query_type != 0",
    ),
    (
        "kv_cache_manager.proto.admin",
        "InstanceInfo",
        "default_query_type",
        "self.default_query_type != 0",
    ),
    (
        "kv_cache_manager.proto.meta",
        "RegisterInstanceResponse",
        "extra_info",
        "!self.extra_info.is_empty()",
    ),
    (
        "kv_cache_manager.proto.admin",
        "InstanceGroup",
        "event_report_storage_candidates",
        "!self.event_report_storage_candidates.is_empty()",
    ),
    (
        "kv_cache_manager.proto.admin",
        "StorageConfig",
        "storage_type",
        "self.storage_type != 0",
    ),
    (
        "kv_cache_manager.proto.meta",
        "ModelDeployment",
        "use_eagle_pop",
        "self.use_eagle_pop",
    ),
    (
        "kv_cache_manager.proto.admin",
        "ModelDeployment",
        "use_eagle_pop",
        "self.use_eagle_pop",
    ),
    (
        "kv_cache_manager.proto.meta",
        "TairMemPoolStorageSpec",
        "service_discovery_url",
        "!self.service_discovery_url.is_empty()",
    ),
    (
        "kv_cache_manager.proto.meta",
        "TairMemPoolStorageSpec",
        "media_type",
        "self.media_type != 0",
    ),
    (
        "kv_cache_manager.proto.admin",
        "TairMemPoolStorageSpec",
        "service_discovery_url",
        "!self.service_discovery_url.is_empty()",
    ),
    (
        "kv_cache_manager.proto.admin",
        "TairMemPoolStorageSpec",
        "media_type",
        "self.media_type != 0",
    ),
];

/// Makes the print of `message.field` in `package`'s serde code conditional on `is_set`
/// (pbjson's `emit_fields` guards every print with `if true {`).
fn print_when_set(
    out_dir: &Path,
    package: &str,
    message: &str,
    field: &str,
    is_set: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let path = out_dir.join(format!("{package}.serde.rs"));
    let code = std::fs::read_to_string(&path)?;
    let not_found = || format!("no print of {message}.{field} in {}", path.display());
    let impl_at = code
        .find(&format!("impl serde::Serialize for {message} {{"))
        .ok_or_else(not_found)?;
    let print_at = impl_at
        + code[impl_at..]
            .find(&format!("struct_ser.serialize_field(\"{field}\""))
            .ok_or_else(not_found)?;
    let guard_at = code[..print_at].rfind("if true {").ok_or_else(not_found)?;
    // The guard is this print's own: no other print lies between them.
    if code[guard_at..print_at].contains("serialize_field") || guard_at < impl_at {
        return Err(not_found().into());
    }
    let rewritten = format!(
        "{}if {is_set} {{{}",
        &code[..guard_at],
        &code[guard_at + "if true {".len()..]
    );
    std::fs::write(&path, rewritten)?;
    Ok(())
}

/// `FieldDescriptorProto.Type.TYPE_ENUM`.
const TYPE_ENUM: i32 = 14;

/// How pbjson's generated code reads an enum field, `<prefix>Enum<suffix>`, and the open read
/// that replaces it, `<prefix'>OpenEnum<Enum><suffix'>`: a singular field, then a repeated one.
const ENUM_READS: [[&str; 4]; 2] = [
    [
        "map_.next_value::<",
        ">()? as i32",
        "map_.next_value::<",
        ">()?.0",
    ],
    [
        "map_.next_value::<Vec<",
        ">>()?.into_iter().map(|x| x as i32).collect()",
        "map_.next_value::<Vec<",
        ">>()?.into_iter().map(|x| x.0).collect()",
    ],
];

/// Rewrites the enum field reads of `package`'s serde code; `expected` is its enum fields.
fn open_enums(
    out_dir: &Path,
    package: &str,
    expected: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let path = out_dir.join(format!("{package}.serde.rs"));
    let mut code = std::fs::read_to_string(&path)?;
    let mut rewritten = 0;
    for shape in ENUM_READS {
        let count;
        (code, count) = open_enum_reads(&code, shape);
        rewritten += count;
    }
    if rewritten != expected {
        let found = format!("{rewritten} enum field reads in {}", path.display());
        return Err(format!("{found}, {expected} enum fields in {package}").into());
    }
    std::fs::write(&path, code)?;
    Ok(())
}

/// `code` with every read of `shape` (e.g. `next_value::<E>()? as i32`) made its open form
/// (`next_value::<OpenEnum<E>>()?.0`), and how many were rewritten.
fn open_enum_reads(code: &str, shape: [&str; 4]) -> (String, usize) {
    let [prefix, suffix, open_prefix, open_suffix] = shape;
    let (mut out, mut rest, mut rewritten) = (String::with_capacity(code.len()), code, 0);
    while let Some(at) = rest.find(prefix) {
        let (before, after) = rest.split_at(at + prefix.len());
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let (name, tail) = after.split_at(name_len);
        if name.is_empty() || !tail.starts_with(suffix) {
            out.push_str(before);
            rest = after;
            continue;
        }
        out.push_str(&before[..at]);
        out.push_str(&format!(
            "{open_prefix}crate::proto::json::OpenEnum<{name}>{open_suffix}"
        ));
        rest = &tail[suffix.len()..];
        rewritten += 1;
    }
    out.push_str(rest);
    (out, rewritten)
}
