//! Compiles `supervisor/main.rs` into a static `fhsx-supervisor` executable
//! and leaves it in `OUT_DIR` for `include_bytes!`.
//!
//! Why `rustc` directly rather than a second crate: the supervisor runs as
//! PID 1 inside a root that holds no host libc, so it links none: it is
//! `no_std` with its own `_start` and raw system calls, linked static with
//! no start files and no default libraries. Those link flags for one
//! binary of a workspace are not expressible in Cargo without also
//! applying them to build scripts and proc-macros. The supervisor uses
//! only `core`, so one `rustc` invocation here builds it with exactly the
//! flags it needs.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = PathBuf::from("supervisor/main.rs");
    // The whole directory: main.rs pulls in its sibling modules.
    println!("cargo:rerun-if-changed=supervisor");
    println!("cargo:rerun-if-changed=build.rs");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let out = out_dir.join("fhsx-supervisor");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").expect("cargo sets TARGET");

    let status = Command::new(&rustc)
        .args([
            "--edition=2021",
            "--crate-type=bin",
            "--crate-name=fhsx_supervisor",
        ])
        .args(["--target", &target])
        .args(["-C", "opt-level=2"])
        .args(["-C", "panic=abort"])
        // Not position-independent: no self-relocation at every start.
        .args(["-C", "relocation-model=static"])
        .args(["-C", "link-arg=-nostartfiles"])
        .args(["-C", "link-arg=-nostdlib"])
        .args(["-C", "link-arg=-static"])
        .args(["-C", "strip=symbols"])
        .args(["-C", "codegen-units=1"])
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .unwrap_or_else(|e| panic!("could not run {rustc:?} to build the supervisor: {e}"));
    if !status.success() {
        panic!(
            "building the static fhsx-supervisor failed ({status}); it is linked by the C \
             compiler rustc uses (Debian: `apt-get install gcc`)"
        );
    }
    // A content tag for the installed copy's file name (FNV-1a 64), so a run
    // does not hash 1 MiB at start-up.
    let bytes = std::fs::read(&out).expect("read the supervisor just built");
    let mut h: u64 = 0xcbf29ce484222325;
    for b in &bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    std::fs::write(
        out_dir.join("fhsx-supervisor.tag"),
        format!("{h:016x}-{}", bytes.len()),
    )
    .expect("write the supervisor tag");
}
