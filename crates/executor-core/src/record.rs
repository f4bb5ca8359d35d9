//! The BuildRecord: what a build was given, what it read, what it made.
//!
//! The record is encoded canonically (JSON, keys sorted, no whitespace) and
//! that byte string is what the executor signs. A [`SignedRecord`] carries
//! the record, the ed25519 public key and the signature; it is stored as a
//! CAS blob, and its digest is the record's name. Signing and checking live
//! in `fhs-executor`; this crate only fixes the shape.

use std::collections::BTreeMap;

use castore::Digest;
use serde::{Deserialize, Serialize};

use crate::action::OutputName;

/// Bumped whenever a field changes meaning. Format 2 names each output
/// atom (`outputs`) where format 1 had one `output_digest` tree holding
/// every declared path; a format-1 record is still checked by `record
/// verify` (signature and the digests it names) but is never a cache hit.
pub const RECORD_FORMAT: u32 = 2;

/// How the build's main process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExitStatus {
    Exited {
        code: i32,
    },
    Signaled {
        signal: i32,
    },
    TimedOut,
    /// fhsx stopped it: it went past one of the limits fhsx enforces
    /// itself (`[limits] log`), named here.
    LimitExceeded {
        limit: String,
    },
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        matches!(self, ExitStatus::Exited { code: 0 })
    }
}

/// How a user reads it: `exit code 2`, `killed by SIGKILL`, `timed out`,
/// `stopped by fhsx at [limits] log`.
impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Exited { code } => write!(f, "exit code {code}"),
            ExitStatus::Signaled { signal } => match signal_name(*signal) {
                Some(name) => write!(f, "killed by {name}"),
                None => write!(f, "killed by signal {signal}"),
            },
            ExitStatus::TimedOut => f.write_str("timed out"),
            ExitStatus::LimitExceeded { limit } => write!(f, "stopped by fhsx at {limit}"),
        }
    }
}

/// The name of a Linux signal (x86-64 and aarch64 numbering), if it has one.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(signal)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| NAMES.get(i).copied())
}

/// Resources the build used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceUse {
    pub wall_ms: u64,
    pub user_ms: u64,
    pub system_ms: u64,
    pub max_rss_kib: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildRecord {
    pub format: u32,
    pub action_digest: Digest,
    /// Digest of the ordered closure atom list (canonical JSON).
    pub closure_digest: Digest,
    /// Digest of the ordered toolchain atom list (canonical JSON).
    pub toolchain_digest: Digest,
    /// Root of the composed FHS view the build ran on.
    pub view_digest: Digest,
    /// Digest of the fetch lock's bytes, if the build had network.
    pub fetch_lock_digest: Option<Digest>,
    /// Each declared output's atom, by name; empty when the build failed.
    pub outputs: BTreeMap<OutputName, Digest>,
    /// Over every output, paths prefixed by the output's name.
    pub interface_manifest_digest: Option<Digest>,
    pub observed_read_set_digest: Digest,
    pub read_set_size: u64,
    /// False when the build hit `[limits] reads`: the read set then holds
    /// only the paths observed before the cap, and the build failed.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub read_set_complete: bool,
    /// The full build log, a CAS blob: both streams in the order they
    /// came, or stdout alone when they were kept apart.
    pub log_digest: Digest,
    /// Set when the build's streams were kept apart (an REAPI action,
    /// whose client reads them apart): its stderr, with fhsx's own lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_digest: Option<Digest>,
    pub exit: ExitStatus,
    /// Containment violations caught at the boundary during the build (a
    /// refused fetch, a non-deterministic upstream). Non-empty means the
    /// build is not trusted, whatever its exit status.
    pub violations: Vec<String>,
    /// Why a build whose command succeeded still failed (an output was
    /// missing or refused at ingest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Set on the record of a `--check` rebuild: the record it was
    /// compared with. Such a record is never a cache hit itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_of: Option<Digest>,
    /// Set when nothing ran because an earlier record of the same command
    /// (all but the closure and toolchain) answered: its read set holds in
    /// this view. Its outputs, log and read set are that record's; `record
    /// verify` re-checks the read set against this view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reused: Option<Digest>,
    /// Set on the record of a pruned action proved against the record it
    /// was pruned from (`closure-bloat --prune --prove`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned_from: Option<Digest>,
    /// On a `--check --vary` record: what was varied (name → value used,
    /// the shuffle's seed included), so the run can be replayed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variations: BTreeMap<String, String>,
    /// On a check record: `diffoscope`'s report on the differing outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffoscope: Option<Digest>,
    pub resources: ResourceUse,
    /// Who ran it: `fhsx <version>` and the signing key's fingerprint.
    pub executor: String,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl BuildRecord {
    /// The command succeeded, nothing was violated and every output was
    /// ingested.
    pub fn succeeded(&self) -> bool {
        self.exit.success()
            && self.violations.is_empty()
            && self.failure.is_none()
            && self.read_set_complete
    }

    /// The bytes that are signed: canonical JSON.
    pub fn canonical(&self) -> Vec<u8> {
        let v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// Every digest the record names, with its field name, for verification.
    pub fn digests(&self) -> Vec<(&'static str, Digest)> {
        let mut v: Vec<_> = self
            .named()
            .into_iter()
            .filter(|(_, _, what)| *what != Named::Action)
            .filter_map(|(n, d, _)| d.map(|d| (n, d)))
            .collect();
        v.extend(self.outputs.values().map(|d| ("outputs", *d)));
        v
    }

    /// The blobs kept and carried with the record: its read set, log,
    /// fetch lock, stderr and interface manifest where it has them, and the
    /// action it was built from (stored under the action digest). Not its
    /// view (whole toolchains), its outputs (trees), nor the records it
    /// refers to. What gc keeps beside a kept record and a remote cache is
    /// sent with it.
    pub fn kept_blobs(&self) -> Vec<Digest> {
        self.blobs(|what| matches!(what, Named::Kept | Named::Action))
    }

    /// Every blob the record names but its view and outputs: the
    /// [`kept_blobs`](Self::kept_blobs), the records it refers to
    /// (`check_of`, `reused`, `pruned_from`) and a check's diffoscope
    /// report. What `fhsx store copy` carries, each where the source has
    /// it.
    pub fn named_blobs(&self) -> Vec<Digest> {
        self.blobs(|what| what != Named::View)
    }

    fn blobs(&self, take: impl Fn(Named) -> bool) -> Vec<Digest> {
        self.named()
            .into_iter()
            .filter(|(_, _, what)| take(*what))
            .filter_map(|(_, d, _)| d)
            .collect()
    }

    /// What the record names besides its outputs, listed once: each
    /// field's name, its digest where set, and what it is to the record.
    fn named(&self) -> [(&'static str, Option<Digest>, Named); 11] {
        use Named::*;
        [
            ("view_digest", Some(self.view_digest), View),
            (
                "observed_read_set_digest",
                Some(self.observed_read_set_digest),
                Kept,
            ),
            ("log_digest", Some(self.log_digest), Kept),
            ("fetch_lock_digest", self.fetch_lock_digest, Kept),
            ("stderr_digest", self.stderr_digest, Kept),
            (
                "interface_manifest_digest",
                self.interface_manifest_digest,
                Kept,
            ),
            ("check_of", self.check_of, Linked),
            ("reused", self.reused, Linked),
            ("pruned_from", self.pruned_from, Linked),
            ("diffoscope", self.diffoscope, Linked),
            ("action_digest", Some(self.action_digest), Action),
        ]
    }
}

/// What a digest a record names is to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    /// The view it ran in: verified, never kept or carried with it.
    View,
    /// Its own blobs: verified, kept and carried with it.
    Kept,
    /// The action, stored under its digest: kept and carried, not
    /// required by verification (not every store a record was made in
    /// kept its action).
    Action,
    /// Another record, or a check's report: verified and carried.
    Linked,
}

/// A record with its signature, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedRecord {
    pub record: BuildRecord,
    /// ed25519 public key, `ed25519:<hex>`.
    pub public_key: String,
    /// ed25519 signature over `record.canonical()`, hex.
    pub signature: String,
}

/// Digest of a list of digests, as the record names closures and toolchains.
pub fn list_digest(list: &[Digest]) -> Digest {
    Digest::of(&serde_json::to_vec(list).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_read_as_a_user_says_them() {
        let shown = |e: ExitStatus| e.to_string();
        assert_eq!(shown(ExitStatus::Exited { code: 2 }), "exit code 2");
        assert_eq!(
            shown(ExitStatus::Signaled { signal: 9 }),
            "killed by SIGKILL"
        );
        assert_eq!(
            shown(ExitStatus::Signaled { signal: 64 }),
            "killed by signal 64"
        );
        assert_eq!(shown(ExitStatus::TimedOut), "timed out");
        assert_eq!(
            shown(ExitStatus::LimitExceeded {
                limit: "[limits] log".into()
            }),
            "stopped by fhsx at [limits] log"
        );
    }
}
