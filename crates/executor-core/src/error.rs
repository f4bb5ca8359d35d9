//! Errors shared across the stack and the exit codes they map to.

use std::path::PathBuf;
use std::time::Duration;

/// How a failure is reported to a user or a script: the process exit code.
///
/// docs/DESIGN.md fixes these: 0 success, 1 the build failed, 2 usage or
/// input error, 3 a containment or integrity violation, 4 a `--check`
/// rebuild that differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// The build (or contained command) itself failed.
    BuildFailed,
    /// The user asked for something malformed or absent.
    Usage,
    /// Something that must never happen was caught: corruption, escape, tampering.
    Integrity,
    /// A `--check` rebuild made different outputs: the build is not
    /// reproducible (or its inputs do not say everything it depends on).
    CheckMismatch,
}

impl ExitClass {
    /// The process exit code for this class.
    pub fn code(self) -> i32 {
        match self {
            ExitClass::BuildFailed => 1,
            ExitClass::Usage => 2,
            ExitClass::Integrity => 3,
            ExitClass::CheckMismatch => 4,
        }
    }
}

/// Why a sandboxed run could not be set up or did not end normally.
///
/// One variant per cause; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("bubblewrap (bwrap) was not found on PATH: install it (`apt-get install bubblewrap`)")]
    BwrapMissing,
    #[error("could not read the host mount table {path} (is /proc mounted?)")]
    MountProbe {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("path {path} does not exist or is not usable as {role}: {reason}")]
    BadPath {
        path: PathBuf,
        role: &'static str,
        reason: String,
    },
    #[error("could not start the sandbox ({what})")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the command ran past its timeout of {} and was stopped; raise the timeout if the work is legitimately slow", seconds(*.0))]
    Timeout(Duration),
    #[error("the command was {}", crate::ExitStatus::Signaled { signal: *.0 })]
    KilledBySignal(i32),
    #[error("the run was cancelled (interrupted, or its client went away) and stopped{}; nothing of it is kept — start it again to retry", if *.killed { " (it ignored SIGTERM and was killed after the grace period)" } else { "" })]
    Cancelled { killed: bool },
    #[error("RPC frame of {len} bytes exceeds the {max}-byte limit; send smaller messages")]
    FrameTooLarge { len: u64, max: u64 },
    #[error("RPC protocol error: {0}")]
    Protocol(String),
    #[error("bubblewrap exited with status {status} before the command could start: {message}; fix the mount or namespace it names (are user namespaces enabled? check `sysctl user.max_user_namespaces`)")]
    BwrapFailed { status: i32, message: String },
    #[error("environment variable {name:?} cannot cross into the sandbox: {reason}; remove it from the allow/set lists")]
    BadEnv { name: String, reason: String },
    #[error("the sandbox supervisor ended without reporting the command's status ({detail}); this is a bug or the supervisor was killed from outside: rerun, and report it if it repeats")]
    SupervisorLost { detail: String },
    #[error("FHSX_BUILD_UIDS={value} is not a usable range of build users: {reason}; give FHSX_BUILD_UIDS=START:COUNT, e.g. 872415232:65536 (the default)")]
    BadBuildUsers { value: String, reason: String },
    #[error("no build user could be had for this build: {reason}")]
    NoBuildUser { reason: String },
    #[error("what the sandbox binds was not made ready, so it was not started")]
    NotReady,
    #[error("I/O error while {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// `90s`, `1.5s`: a timeout as a user wrote it.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

impl SandboxError {
    /// The exit class a CLI should use for this error.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            SandboxError::BwrapMissing
            | SandboxError::BadPath { .. }
            | SandboxError::MountProbe { .. } => ExitClass::Usage,
            SandboxError::Timeout(_)
            | SandboxError::KilledBySignal(_)
            | SandboxError::Cancelled { .. } => ExitClass::BuildFailed,
            SandboxError::FrameTooLarge { .. } | SandboxError::Protocol(_) => ExitClass::Integrity,
            SandboxError::BadEnv { .. } | SandboxError::BadBuildUsers { .. } => ExitClass::Usage,
            SandboxError::NoBuildUser { .. } => ExitClass::BuildFailed,
            SandboxError::Spawn { .. }
            | SandboxError::NotReady
            | SandboxError::Io { .. }
            | SandboxError::BwrapFailed { .. }
            | SandboxError::SupervisorLost { .. } => ExitClass::BuildFailed,
        }
    }
}
