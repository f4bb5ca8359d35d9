//! A remote cache, as the build pipeline sees it: a narrow interface the
//! pipeline asks for records and objects, and tells what to upload.
//!
//! The interface moves bytes; it decides nothing. What a record fetched
//! from a remote may answer is decided where a local record's is, by
//! [`crate::cache::ActionCache`]: the current format, a valid signature by
//! a trusted key, this action's digest, a successful build. A remote is
//! never trusted, so it needs no more than that. Objects are checked as
//! they arrive, each against the digest a signed record names (an
//! implementation must not put into the store an object it has not
//! verified against the tree or blob it was asked for).
//!
//! Build without the Bytes: a remote hit brings only its record. The
//! outputs it names are *held remotely* ([`RemoteCache::holds`]), which
//! makes the record answer a build as if they were here; they are fetched
//! when a build that must run needs them as inputs
//! ([`crate::FhsExecutor`]'s input stage), or when a person asks for them.
//!
//! Every failure of a remote — unreachable, slow, answering garbage — is a
//! [`RemoteError`], which the pipeline reports as a warning before going
//! on locally: a remote cache can make a build faster, never fail it.

use castore::Digest;

/// A remote cache the pipeline consults and feeds (the REAPI one lives in
/// the `worker` crate).
pub trait RemoteCache: Send + Sync {
    /// How messages name it (`grpc://host:port`).
    fn name(&self) -> &str;

    /// The records the remote holds under `key`, newest first, each record
    /// blob brought into the local store (checked against its digest on
    /// arrival); the outputs they name become [`RemoteCache::holds`].
    /// With [`Key::Command`], what validating them needs comes too: each
    /// record's read set (stored) and the directories its build listed
    /// (returned, never stored). Empty on a miss.
    fn records(&self, key: Key) -> Result<Records, RemoteError>;

    /// Whether the remote was seen holding the tree `output` (no round
    /// trip: what [`RemoteCache::records`] and [`RemoteCache::push`] saw).
    fn holds(&self, output: &Digest) -> bool;

    /// Bring the trees `outputs` (outputs named by signed records) into the
    /// local store, each object checked against the tree before it is
    /// stored, and the tree's directories stored only once its root is the
    /// digest asked for. What was already here is not fetched.
    fn fetch_trees(&self, outputs: &[Digest]) -> Result<Transfer, RemoteError>;

    /// Upload the record `record` and everything it names that a reader
    /// needs (its outputs, read set, logs, interface manifest, fetch lock,
    /// action), then file it under its action and, given one, its command.
    /// A remote that already holds an object is not sent it again.
    fn push(&self, record: &Digest, command: Option<&Digest>) -> Result<Transfer, RemoteError>;
}

/// What [`RemoteCache::records`] found.
#[derive(Debug, Default)]
pub struct Records {
    /// Record blobs now in the local store, newest first.
    pub records: Vec<Digest>,
    /// The directories the records' builds listed, each under the digest
    /// of its own encoding.
    pub listed: crate::validate::Listed,
}

/// What records are filed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// An action digest: exact hits.
    Action(Digest),
    /// A command digest: candidates for a read-set-validated hit.
    Command(Digest),
}

/// What crossed the wire.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Transfer {
    pub objects: u64,
    pub bytes: u64,
}

impl std::ops::AddAssign for Transfer {
    fn add_assign(&mut self, o: Transfer) {
        self.objects += o.objects;
        self.bytes += o.bytes;
    }
}

/// A remote that failed to answer, or answered what cannot be right.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Unreachable, refused, slow past its deadline: the remote is down
    /// for this build.
    #[error("{0}")]
    Unavailable(String),
    /// It answered, with something no honest cache holds: an object that
    /// does not match its digest, a tree that is not the record's.
    #[error("{0}")]
    Refused(String),
    /// Anything else: a local error while storing what arrived, say.
    #[error("{0}")]
    Other(String),
}

/// A remote cache an executor consults, and whether it uploads what it
/// builds there (a laptop's read-only configuration never does).
#[derive(Clone)]
pub struct Remote {
    pub cache: std::sync::Arc<dyn RemoteCache>,
    pub push: bool,
}
