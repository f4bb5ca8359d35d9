//! Realising a stored tree outside the store, for uses other than builds.
//!
//! DESIGN.md names three tiers over one composed tree. *Observe* (the FUSE
//! view in `castore-fuse`) logs and verifies every read, which a build needs
//! and a deployed program does not. This module owns the other two:
//!
//! - [`fast`]: a read-only hard-link (or reflink, or copy) farm made from
//!   the local store — a runnable root that costs one `link(2)` per file,
//!   for production runtime and for `fhsx run --view`;
//! - [`export`]: a deterministic tarball or a one-layer OCI image layout,
//!   for tools that know nothing of castore.
//!
//! Both read only what the store already holds; neither adds objects to it.

pub mod export;
pub mod fast;

use std::path::PathBuf;

/// What can go wrong realising a tier. Store failures keep castore's own
/// [`crate::Error`] (and so its exit class); the rest say what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] crate::Error),

    /// The destination holds something this tier did not make.
    #[error("{path} already exists and is not a tree fhsx materialized (no {marker} next to it); choose a new path or remove it")]
    DestinationExists { path: PathBuf, marker: PathBuf },

    /// `--check` (or a replacement) met a destination without a valid marker.
    #[error("{path} is not a Fast-tier tree: {reason}")]
    NotMaterialized { path: PathBuf, reason: String },

    /// The requested output path or option cannot work.
    #[error("{0}")]
    BadRequest(String),

    /// The operating system refused an operation.
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether the failure is the caller's to fix (a usage error) rather
    /// than the environment's.
    pub fn is_input(&self) -> bool {
        match self {
            Error::Store(e) => e.kind() == crate::ErrorKind::Input,
            Error::DestinationExists { .. }
            | Error::NotMaterialized { .. }
            | Error::BadRequest(_) => true,
            Error::Io { .. } => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(
    op: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}
