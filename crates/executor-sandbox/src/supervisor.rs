//! The embedded static `fhsx-supervisor` executable (see build.rs and
//! `supervisor/main.rs`).

/// The supervisor's bytes: a statically linked executable for the target
/// this crate was built for.
pub static SUPERVISOR_BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fhsx-supervisor"));
