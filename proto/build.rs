//! Compiles the `.proto` contracts, with a vendored `protoc` unless `$PROTOC` names one, so
//! no system package is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "plinth/catalog/v1/adapters.proto",
        "plinth/catalog/v1/brain.proto",
        "plinth/catalog/v1/catalog.proto",
        "plinth/catalog/v1/collection.proto",
        "plinth/catalog/v1/harnesses.proto",
        "plinth/catalog/v1/quotas.proto",
        "plinth/catalog/v1/request_keys.proto",
        "plinth/catalog/v1/sessions.proto",
        "plinth/node/v1/node.proto",
        "plinth/node/v1/workspace.proto",
        "plinth/source/v1/source.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = prost_build::Config::new();
    // File contents travel as `bytes::Bytes`, so chunks move between HTTP, gRPC and the blob
    // store without copies.
    config.bytes(["."]);
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("plinth_descriptor.bin"))
        .compile_with_config(config, &protos, &["."])?;
    public(&out_dir)
}

/// The tenant API (`plinth.v1`): its descriptor set, which the gateway serves by reading its
/// `google.api.http` options, and client types for Rust callers (benchmarks, tests).
fn public(out_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "plinth/v1/environments.proto",
        "plinth/v1/sessions.proto",
        "plinth/v1/harnesses.proto",
    ];
    for proto in protos
        .iter()
        .chain(&["google/api/http.proto", "google/api/annotations.proto"])
    {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut config = prost_build::Config::new();
    config.bytes(["."]);
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    let well_known = protoc_bin_vendored::include_path()?;
    let well_known = well_known
        .to_str()
        .ok_or("protoc's include path is not UTF-8")?;
    tonic_prost_build::configure()
        .build_server(false)
        .file_descriptor_set_path(out_dir.join("plinth_public_descriptor.bin"))
        .compile_with_config(config, &protos, &[".", well_known])?;
    Ok(())
}
