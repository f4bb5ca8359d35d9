//! Where objects live. Two traits — [`BlobStore`] for file contents and
//! [`DirectoryStore`] for Directory objects — and the embedded default,
//! [`LocalStore`], a sharded directory on the local disk.
//!
//! Writes that must appear all-or-nothing (an import, a composition) go
//! through a [`Txn`]: objects are staged, made durable with one `syncfs`, and
//! only then renamed into place. A failed or killed writer leaves at most a
//! staging directory, which no reader ever looks at and the next writer
//! removes. A writer whose objects can be sent again (a worker receiving an
//! upload) may instead commit them visible before durable: `unsynced` logs
//! them so that after a crash the store forgets what it lost rather than
//! serving it. A blob that arrives as a stream of unknown length (a build log)
//! goes through a [`BlobWriter`] instead: hashed as written, invisible until
//! `finish`, removed if dropped unfinished.
//!
//! Nothing here keeps an object alive: `gc` deletes whatever no root
//! reaches. A process that reads or writes objects across a gc holds
//! [`TempRoots`](crate::roots::TempRoots) for them (see [`crate::roots`]).

mod local;
mod memo;
mod txn;
mod unsynced;
mod writer;

use std::io::Read;
use std::path::PathBuf;

pub use local::{LocalStore, ObjectKind};
pub(crate) use txn::{lock_exclusive, lock_shared};
pub use txn::{read_from_buffer, Txn};
pub use unsynced::Recovery;
pub use writer::{BlobWriter, CappedWriter};

use crate::{Digest, Directory, Result};

/// A name no other writer of this store uses: `PREFIX` + pid, clock and a
/// per-process counter (the clock tells a recycled pid's names apart).
pub(crate) fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// File contents addressed by their BLAKE3 digest.
pub trait BlobStore: Send + Sync {
    fn has_blob(&self, digest: &Digest) -> Result<bool>;
    /// A reader over the blob whose bytes have been checked against `digest`
    /// before the first byte is returned: corrupt content is never served.
    fn open_blob(&self, digest: &Digest) -> Result<Box<dyn Read + Send>>;
    /// Store bytes, returning their digest. Durable when this returns.
    fn put_blob(&self, bytes: &[u8]) -> Result<Digest>;
    /// The blob's file on local disk, if this store keeps one (hard links,
    /// reflinks and FUSE passthrough use it). Its bytes are not verified.
    fn blob_path(&self, digest: &Digest) -> Option<PathBuf>;
}

/// Directory objects addressed by the digest of their canonical encoding.
pub trait DirectoryStore: Send + Sync {
    fn has_directory(&self, digest: &Digest) -> Result<bool>;
    /// Fetch, verify against `digest` and decode (validating) a directory.
    fn get_directory(&self, digest: &Digest) -> Result<Directory>;
    fn put_directory(&self, dir: &Directory) -> Result<Digest>;
}
