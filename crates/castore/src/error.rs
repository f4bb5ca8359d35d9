//! castore's one error type. Every variant names what went wrong and where,
//! and [`Error::exit_class`] says which of DESIGN.md's exit codes it maps to.

use std::path::PathBuf;

use crate::Digest;

/// The broad class of an [`Error`]: what the caller did wrong, what the
/// environment did wrong, or what must never happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed, hostile or absent input: the user can fix it.
    Input,
    /// The store holds bytes that do not match their name.
    Integrity,
    /// The operating system refused an operation.
    Io,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A digest string could not be parsed.
    #[error("invalid digest {0:?}: expected `b3:` followed by 64 lowercase hex digits")]
    BadDigest(String),

    /// Bytes claiming to be a Directory are not a valid, canonical encoding.
    #[error("invalid directory: {0}")]
    InvalidDirectory(String),

    /// A stored object's bytes do not hash to its name.
    #[error("integrity error: object {digest} is corrupt in the store (its bytes hash to {actual}){}; run `fhsx store verify` and re-import the affected atoms", fmt_path(.path))]
    Corrupt {
        digest: Digest,
        actual: Digest,
        path: Option<String>,
    },

    /// A referenced object is absent.
    #[error("object {digest} is not in the store{}; import it first (`fhsx store import`)", fmt_path(.path))]
    Missing {
        digest: Digest,
        path: Option<String>,
    },

    /// A path inside a tree does not exist or has the wrong kind.
    #[error("{path}: {reason}")]
    BadTreePath { path: String, reason: String },

    /// An archive or directory being imported is malformed or hostile.
    #[error("refusing to import {source_path}: {reason}")]
    HostileInput {
        source_path: PathBuf,
        reason: String,
    },

    /// The input format is not one castore can import.
    #[error("cannot import {0}: not a directory, .tar, .tar.gz, .tgz, .tar.xz, .tar.zst, .tar.bz2 or .deb (zip, 7z, lzip and .Z are not supported: repack as .tar.*)")]
    UnknownFormat(PathBuf),

    /// Composing atoms hit two different entries at one path.
    #[error("compose clash at /{}: atom {} has {}, atom {} has {}; atoms must agree on every shared path (drop one of them)", .0.path, .0.first, .0.first_kind, .0.second, .0.second_kind)]
    ComposeClash(Box<Clash>),

    /// An export destination is unusable.
    #[error(
        "cannot export to {0}: it already exists and is not an empty directory; choose a new path"
    )]
    DestinationExists(PathBuf),

    /// A persistent root name that is not allowed.
    #[error("invalid root name {0:?}: use 1-200 characters of A-Z a-z 0-9 . _ + @ = - (not starting with `.`)")]
    BadRootName(String),

    /// A root file that does not hold one digest per line.
    #[error("gc root file {} holds {line:?}, which is not a digest; fix or remove the file", .path.display())]
    BadRootFile { path: PathBuf, line: String },

    /// Any other I/O failure, with the path it happened on.
    #[error("refusing to import {}: directories nest more than {limit} deep below it (at {prefix}); the store takes trees at most {limit} deep: make the tree shallower, or pack it as a tarball", .root.display())]
    TooDeep {
        root: PathBuf,
        /// The first directory too deep, escaped and shortened.
        prefix: String,
        limit: usize,
    },

    #[error("tree {root} nests directories more than {limit} deep; the store takes trees at most {limit} deep: make it shallower")]
    TreeTooDeep { root: Digest, limit: usize },

    /// Its path may hold names a build chose: shown escaped.
    #[error("{op} {}", crate::shown::escaped(.path.as_os_str().as_encoded_bytes()))]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The two sides of a compose clash.
#[derive(Debug)]
pub struct Clash {
    pub path: String,
    pub first: Digest,
    pub first_kind: String,
    pub second: Digest,
    pub second_kind: String,
}

fn fmt_path(p: &Option<String>) -> String {
    match p {
        Some(p) => format!(" (used at /{p})"),
        None => String::new(),
    }
}

impl Error {
    /// What kind of failure this is, so a CLI can pick its exit code.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Corrupt { .. } => ErrorKind::Integrity,
            Error::Io { .. } => ErrorKind::Io,
            _ => ErrorKind::Input,
        }
    }

    /// Attach the tree path at which a missing or corrupt object was met.
    pub fn at_path(self, p: &str) -> Self {
        match self {
            Error::Corrupt {
                digest,
                actual,
                path: None,
            } => Error::Corrupt {
                digest,
                actual,
                path: Some(p.to_owned()),
            },
            Error::Missing { digest, path: None } => Error::Missing {
                digest,
                path: Some(p.to_owned()),
            },
            other => other,
        }
    }
}

/// An error and its causes on one line, `what: why: why`, each cause
/// once: for where an error is shown as a single string (a worker's
/// answer, a lease's status, a log line). Every error type of fhsx's
/// crates either names its cause in its own message or returns it from
/// `source()`, never both; a cause whose text the line already holds is
/// left out all the same.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&line)
    }
}

/// Shorthand for wrapping an `io::Error` with the operation and path.
pub(crate) fn io(
    op: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
