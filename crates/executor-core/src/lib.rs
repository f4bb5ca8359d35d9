//! The shared vocabulary of fhsx: the types every other crate speaks.
//!
//! This crate owns the names — [`Action`] (what a build may depend on,
//! parsed strictly), the [`ActionGraph`] of action files that name each
//! other's outputs and the order its ready actions run in
//! ([`schedule`]: slots on threads, no I/O of its own), [`BuildRecord`] (what it did, in the canonical form that
//! is signed, with its [`ExitStatus`]), [`SandboxError`] and [`ExitClass`] —
//! and nothing that touches the outside world beyond reading action files. A type here can be built
//! and inspected in a unit test without a store, a mount or a sandbox.
//!
//! It does not own digests or trees (that is `castore`), how a sandbox is
//! assembled (`executor-sandbox`), nor how a record is signed
//! (`fhs-executor`).

pub mod action;
mod error;
pub mod graph;
pub mod record;
pub mod schedule;
pub mod vary;

pub use action::{
    Action, ActionError, ActionFile, ActionOf, InputList, InputRef, NetworkMode, OutputName,
};
pub use error::{ExitClass, SandboxError};
pub use graph::{ActionGraph, GraphError, GraphNode};
pub use record::{BuildRecord, ExitStatus, ResourceUse, SignedRecord};

/// Whether a build may be answered from the action cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// A trusted, successful record of the same action digest whose
    /// outputs are all present answers the build; nothing runs.
    #[default]
    Use,
    /// Run even if a record exists (`--rebuild`).
    Rebuild,
    /// Run again and compare the outputs with the cached record's
    /// (`--check`); there must be one.
    Check,
}

/// What a caller hands an executor: the action, and where its fetch lock
/// lives (read in replay mode, rewritten in record mode).
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub action: Action,
    pub lock_path: Option<std::path::PathBuf>,
    /// Run in record mode (`--record`): the one impure mode. A `replay`
    /// action is recorded afresh and its lock rewritten when the build
    /// succeeds; a `record` action needs this to run at all.
    pub record: bool,
    /// Extra CA certificates (PEM files) trusted for upstream TLS while
    /// recording, beyond the host's.
    pub upstream_ca: Vec<std::path::PathBuf>,
    pub cache: CachePolicy,
    /// Signers (`ed25519:<hex>`) whose records are cache hits besides the
    /// executor's own.
    pub trust: Vec<String>,
    /// The caller's temporary gc roots: the build's outputs and record are
    /// added to them before the build's own roots go, so what a graph
    /// builds stays in the store until the graph is done with it.
    pub hold: Option<std::sync::Arc<castore::TempRoots>>,
    /// The record this action was pruned from (`closure-bloat --prune
    /// --prove`), named in the new record.
    pub pruned_from: Option<castore::Digest>,
    /// With [`CachePolicy::Check`]: vary these pinned things in the
    /// rebuild (`--check --vary`).
    pub vary: Option<vary::Variations>,
    /// With [`CachePolicy::Check`]: run `diffoscope` on differing outputs
    /// and keep its report.
    pub diffoscope: bool,
    /// Ingest the outputs of a command that ran to its end and failed (a
    /// non-zero exit, a signal) as well, as REAPI returns them (a failed
    /// test's logs): the record names them, and it is still a failed build
    /// that answers nothing from the cache. Outputs it did not make, or
    /// that break the ingest rules, are left out without a failure of
    /// their own: the command's is the one that counts.
    pub failed_outputs: bool,
    /// Keep stdout and stderr apart: the record's log is stdout alone and
    /// `stderr_digest` names stderr (REAPI's two fields), where otherwise
    /// one log keeps both in the order they came.
    pub split_streams: bool,
    /// Among builds waiting for a token of the executor's pool (see
    /// `fhs_executor::jobserver`), the highest goes first; a graph gives
    /// its remaining critical path in milliseconds.
    pub priority: u64,
}

impl BuildRequest {
    /// A request with the defaults: replay as the file says, use the cache,
    /// trust only the executor's own records.
    pub fn new(action: Action, lock_path: Option<std::path::PathBuf>) -> Self {
        BuildRequest {
            action,
            lock_path,
            record: false,
            upstream_ca: Vec::new(),
            cache: CachePolicy::Use,
            trust: Vec::new(),
            hold: None,
            pruned_from: None,
            vary: None,
            diffoscope: false,
            failed_outputs: false,
            split_streams: false,
            priority: 0,
        }
    }
}

/// What a finished build returns.
#[derive(Debug, Clone)]
pub struct BuildOutcome {
    /// The stored, signed record's digest.
    pub record_digest: castore::Digest,
    pub record: SignedRecord,
    /// Answered from the action cache: nothing ran (an exact hit, or an
    /// earlier record of the same command whose read set holds here, named
    /// in the record's `reused`).
    pub cached: bool,
    /// The remote cache whose record answered (its name), if one did.
    pub remote: Option<String>,
    /// With [`CachePolicy::Check`]: how the rebuild compares.
    pub check: Option<CheckReport>,
}

/// A `--check` rebuild compared with the record it checked.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckReport {
    /// The cached record the rebuild was compared with.
    pub against: castore::Digest,
    /// Every path whose content differs, per output; empty when the
    /// rebuild reproduced the outputs bit for bit.
    pub differences: Vec<OutputDifference>,
    /// What was varied in the rebuild (name → value used).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub variations: std::collections::BTreeMap<String, String>,
    /// With several variations and a difference: the smallest set of them
    /// found to reproduce it (bisection), each tried alone first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub culprits: Option<Vec<String>>,
    /// The check's record (also the outcome's), naming `diffoscope`'s
    /// report blob where one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffoscope: Option<castore::Digest>,
}

/// One differing path of one output.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OutputDifference {
    pub output: OutputName,
    #[serde(flatten)]
    pub difference: castore::diff::Difference,
    /// For a file on both sides: where they first differ and what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileDifference>,
}

/// What a differing file is, and where it first differs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FileDifference {
    /// `elf`, `archive`, `text` or `binary` (of the first side).
    pub kind: String,
    /// The first byte offset where the two differ (the shorter one's
    /// length if one is a prefix of the other).
    pub first_difference: u64,
}

/// An executor: `build(atom_closure, toolchain_composition, action_params)
/// → output tree`, with the proof in the record. The scheduler above holds
/// no opinion on how an implementation isolates the build.
pub trait Executor {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Run one build (or answer it from the cache); `log` receives its
    /// output as it happens.
    fn build(
        &self,
        request: &BuildRequest,
        log: &mut (dyn std::io::Write + Send),
    ) -> Result<BuildOutcome, Self::Error>;
}
