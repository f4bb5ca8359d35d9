//! The shared vocabulary of fhsx: the types every other crate speaks.
//!
//! This crate owns the names — [`Action`] (what a build may depend on,
//! parsed strictly), [`BuildRecord`] (what it did, in the canonical form that
//! is signed), [`SandboxError`] and [`ExitClass`] — and nothing that touches
//! the outside world beyond reading an action file. A type here can be built
//! and inspected in a unit test without a store, a mount or a sandbox.
//!
//! It does not own digests or trees (that is `castore`), how a sandbox is
//! assembled (`executor-sandbox`), nor how a record is signed
//! (`fhs-executor`).

pub mod action;
mod error;
pub mod record;

pub use action::{Action, ActionError, NetworkMode};
pub use error::{ExitClass, SandboxError};
pub use record::{BuildRecord, ExitStatus, ResourceUse, SignedRecord};

/// What a caller hands an executor: the action, and where its fetch lock
/// lives (read in replay mode, written in record mode).
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub action: Action,
    pub lock_path: Option<std::path::PathBuf>,
    /// Permit `network.mode = "record"`, the one impure mode.
    pub allow_record: bool,
    /// Extra CA certificates (PEM files) trusted for upstream TLS while
    /// recording, beyond the host's.
    pub upstream_ca: Vec<std::path::PathBuf>,
}

/// What a finished build returns.
#[derive(Debug, Clone)]
pub struct BuildOutcome {
    /// The stored, signed record's digest.
    pub record_digest: castore::Digest,
    pub record: SignedRecord,
}

/// An executor: `build(atom_closure, toolchain_composition, action_params)
/// → output tree`, with the proof in the record. The scheduler above holds
/// no opinion on how an implementation isolates the build.
pub trait Executor {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Run one build; `log` receives its output as it happens.
    fn build(
        &self,
        request: &BuildRequest,
        log: &mut (dyn std::io::Write + Send),
    ) -> Result<BuildOutcome, Self::Error>;
}
