//! castore: fhsx's content-addressed store.
//!
//! It owns the data model — [`Digest`] (BLAKE3, printed `b3:<hex>`), the
//! three [`Node`] kinds and the canonical [`Directory`] encoding (the snix
//! castore protobuf layout) — and everything that moves trees in and out of
//! a store: [`import`] from directories, tarballs and `.deb`s, [`export`] back
//! to a directory, [`compose`] atoms into one FHS tree, [`verify`] and [`gc`].
//!
//! Validation lives at the type boundary: a [`Name`] cannot contain `/`, a
//! [`Directory`] cannot hold two entries of one name, and
//! [`Directory::decode`] accepts only the canonical encoding of a valid
//! directory. So a store never holds an invalid tree, and code that walks one
//! never re-checks.
//!
//! It also owns what keeps objects alive: [`gc`] deletes whatever no root
//! reaches, and [`roots`] defines the roots — persistent ones named by the
//! user (`ROOT/roots/`) and temporary ones held by running processes
//! (`ROOT/temproots/`, flocked while alive) for what they read and write, so
//! a gc running next to a build never deletes what the build holds. A blob
//! that arrives as a stream of unknown length (a build log) is written with
//! [`BlobWriter`]: hashed as written, invisible until finished, gone if
//! dropped; [`CappedWriter`] bounds how much of a stream reaches it.
//!
//! Its [`Error`] names what went wrong and where, and returns an operating
//! system's reason from `source()` rather than repeating it; [`Chain`]
//! shows an error with its causes on one line where it must travel as a
//! string (a worker's answer, a lease's status).
//!
//! It does not own how a tree is served to a build (the FUSE view lives in
//! `castore-fuse`) nor anything about sandboxes or build records.

pub mod alternatives;
pub mod compose;
pub mod diff;
mod digest;
mod directory;
mod error;
pub mod export;
pub mod fs_tree;
pub mod gc;
pub mod import;
mod nodes;
pub mod roots;
pub mod shown;
pub mod store;
pub mod tier;
pub mod tree;
pub mod verify;
pub mod walk;

pub use compose::{compose, Composition, CompositionMap};
pub use digest::{CheckedBlob, Digest};
pub use directory::Directory;
pub use error::{Chain, Clash, Error, ErrorKind, Result};
pub use nodes::{Name, Node, SymlinkTarget};
pub use roots::{GcHold, Root, TempRoots};
pub use store::{BlobStore, BlobWriter, CappedWriter, DirectoryStore, LocalStore};

/// Progress reporting for long operations. The library only counts; how (and
/// whether) to draw a bar is the caller's business.
pub trait Progress: Sync {
    fn advance(&self, _entries: u64, _bytes: u64) {}
}

/// No progress reporting.
impl Progress for () {}
