//! Compiles the keeper's program (`reaper/main.rs`: no libc, a few hundred bytes) for the
//! crate's target, so `keeper.rs` can include it: a sandbox's keeper runs it instead of
//! staying a process of the node's.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=reaper/main.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut command = Command::new(rustc);
    command
        .args([
            "--edition",
            "2024",
            "--crate-type",
            "bin",
            "--crate-name",
            "plinth_keeper",
        ])
        .args(["--target", &target])
        .args([
            "-C",
            "panic=abort",
            "-C",
            "opt-level=s",
            "-C",
            "debuginfo=0",
        ])
        .args(["-C", "relocation-model=static", "-C", "strip=symbols"])
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib"])
        .args([
            "-C",
            "link-arg=-static",
            "-C",
            "link-arg=-Wl,--build-id=none",
        ]);
    let linker_variable = format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_uppercase().replace(['-', '.'], "_")
    );
    println!("cargo::rerun-if-env-changed={linker_variable}");
    if let Some(linker) = std::env::var_os(&linker_variable) {
        let mut flag = std::ffi::OsString::from("linker=");
        flag.push(linker);
        command.arg("-C").arg(flag);
    }
    command
        .arg("-o")
        .arg(out.join("plinth-keeper"))
        .arg("reaper/main.rs");
    let status = command
        .status()
        .expect("running rustc for the keeper's program");
    assert!(
        status.success(),
        "compiling the keeper's program (reaper/main.rs) failed: {status}"
    );
}
