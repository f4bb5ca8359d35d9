//! The embedded static `fhsx-supervisor` executable (see build.rs and
//! `supervisor/main.rs`).

/// The supervisor's bytes: a statically linked executable for the target
/// this crate was built for.
pub static SUPERVISOR_BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fhsx-supervisor"));

/// A content tag of [`SUPERVISOR_BYTES`] (hash and length), computed at
/// build time; names the installed copy.
pub static SUPERVISOR_TAG: &str = include_str!(concat!(env!("OUT_DIR"), "/fhsx-supervisor.tag"));
