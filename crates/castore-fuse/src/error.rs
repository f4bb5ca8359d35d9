//! castore-fuse's error type.

use std::path::PathBuf;

use castore::{Digest, ErrorKind};

/// A blob whose bytes did not match its digest when the view first served it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IntegrityFailure {
    /// The path in the view (absolute, escaped like read-set paths).
    pub path: String,
    /// The digest the tree names.
    pub digest: Digest,
    /// What the stored bytes hash to (absent if they could not be read).
    pub actual: Option<Digest>,
}

impl std::fmt::Display for IntegrityFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.actual {
            Some(a) => write!(f, "{} (blob {} hashes to {a})", self.path, self.digest),
            None => write!(f, "{} (blob {} is unreadable)", self.path, self.digest),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store refused or holds something wrong.
    #[error(transparent)]
    Store(Box<castore::Error>),

    /// This machine cannot mount FUSE file systems.
    #[error("FUSE is not usable here: {0}; install it with `apt-get install fuse3` and make sure /dev/fuse exists (modprobe fuse)")]
    FuseUnavailable(String),

    /// The mount point is unusable.
    #[error("cannot mount on {path}: {reason}")]
    BadMountpoint { path: PathBuf, reason: String },

    /// The kernel refused the mount or the session could not start.
    #[error("mounting the view on {path} failed")]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Unmounting failed.
    #[error("unmounting the view at {path} failed")]
    Unmount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The registry of live mounts could not be read or written.
    #[error("mount registry {path}")]
    Registry {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The view served no corrupt byte, but found corrupt blobs and refused them.
    #[error("integrity error: the view refused {} corrupt blob(s): {}; run `fhsx store verify` and re-import the affected atoms", .0.len(), list(.0))]
    Integrity(Vec<IntegrityFailure>),

    /// The read set reached its cap: it is incomplete, and a build on this
    /// mount must fail as a limit failure, never be recorded as complete.
    #[error("limit exceeded: {0}; the build cannot be recorded (raise max_read_set_entries if it is legitimate)")]
    ReadSetIncomplete(crate::ReadSetOverflow),

    /// A read-set entry the declared view does not hold as recorded: the
    /// view served something it should not have (never expected).
    #[error("the build observed {path} as {observed}, which the declared view does not hold")]
    OutsideView { path: String, observed: String },

    /// A read set that does not parse or is not canonical.
    #[error("invalid read set: {0}")]
    BadReadSet(String),

    /// Closure bloat needs a composition map for the view.
    #[error("view {0} has no composition record in this store: closure bloat needs a view made by `fhsx compose`")]
    NotComposed(Digest),
}

impl From<castore::Error> for Error {
    fn from(e: castore::Error) -> Self {
        Error::Store(Box::new(e))
    }
}

fn list(f: &[IntegrityFailure]) -> String {
    f.iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Error {
    /// The exit-code class, in castore's terms: integrity failures are
    /// `Integrity` (exit 3), environment failures `Io`, the rest `Input`.
    /// The store error inside, if this is one (so a CLI can classify it as castore's).
    pub fn as_store_error(&self) -> Option<&castore::Error> {
        match self {
            Error::Store(e) => Some(e),
            _ => None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Store(e) => e.kind(),
            Error::Integrity(_) | Error::OutsideView { .. } => ErrorKind::Integrity,
            Error::FuseUnavailable(_)
            | Error::Mount { .. }
            | Error::Unmount { .. }
            | Error::Registry { .. } => ErrorKind::Io,
            Error::BadMountpoint { .. }
            | Error::BadReadSet(_)
            | Error::NotComposed(_)
            | Error::ReadSetIncomplete(_) => ErrorKind::Input,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
