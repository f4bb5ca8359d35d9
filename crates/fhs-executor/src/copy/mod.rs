//! `fhsx store copy`: records and everything they name, moved to another
//! store or through a bundle file (to a machine with no network).
//!
//! A module of its own because receiving is a trust decision made at the
//! store's door: a cache hit reads records its own store indexed, while a
//! copy takes records and trees from elsewhere and must leave the receiving
//! store as a trusted build there would have — or, refused, as it was. So
//! what a record's closure is, and the checks on the way in, live together
//! here, with the bundle format next to them ([`bundle`]).
//!
//! A record's closure: the record blob; every object of every output tree,
//! all required (a source lacking one is refused); and every other blob it
//! names ([`BuildRecord::named_blobs`](executor_core::BuildRecord::named_blobs):
//! log, stderr, read set, interface manifest, fetch lock, the action it was
//! built from — stored under the action digest, the command index needs it
//! — and `check_of`, `reused`, `pruned_from`, `diffoscope`), each sent only
//! where the source holds it and skipped silently where it does not: a
//! record whose log or action is gone still copies, without them (and,
//! without its action, is not indexed by command). Not the view: it would
//! carry whole toolchains, and a cache hit never reads it.
//!
//! Sending ([`send`]) walks each closure with its own stack, every
//! directory before the children it names, and hands each object to a
//! [`Sink`]: a bundle writer, or a [`Receiver`] on the receiving store,
//! which is sent nothing that store already has. The receiver checks, as
//! each object arrives:
//!
//! - a record: at most [`MAX_RECORD_BYTES`], its bytes hash to its name, it
//!   is of the current format, it is signed by the receiving store's own
//!   key or a `--trust`ed one, and the signature is that key's — before
//!   anything it names is read;
//! - any other object: a record or a directory received before it names it,
//!   its bytes hash to its digest, and a file's blob has the size its
//!   directory gives;
//!
//! and at the end, that every object below every output was received or is
//! already in the store, and that no output nests deeper than the store
//! takes, counting what it names that the store already has. Everything is
//! staged in one transaction, committed only then, so a refused or
//! interrupted copy leaves nothing visible. Each record is then indexed as
//! a build indexes its own ([`crate::cache::index`], and
//! [`crate::cache::index_command`] for a successful build that is neither a
//! check nor a reuse), so a build of its action there is a cache hit (with
//! `--trust` of its signer, as for any record not signed by that store).

pub mod bundle;
mod receive;

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::Path;

use castore::store::{DirectoryStore, LocalStore, ObjectKind};
use castore::{Digest, Node};
use executor_core::{ExitClass, SignedRecord};

pub use receive::Receiver;

use crate::sign::{self, StoredRecord};
use crate::Error;

/// The largest record blob a copy takes: a record is a few KiB of JSON,
/// and one from elsewhere is parsed before its signature can be checked
/// (the key it names is inside it).
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

/// The largest directory object a copy takes: the worker's message bound,
/// some 200,000 entries.
pub const MAX_DIRECTORY_BYTES: u64 = 64 << 20;

/// What a copy moved.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Moved {
    /// The records copied, in the order they came.
    pub records: Vec<Digest>,
    /// Objects written (new to the receiving store, or into the bundle).
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Objects the receiving store had already: not sent, or not written
    /// twice.
    pub present: u64,
}

/// Why a copy was refused. Each names what and where, and the fix.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("record {record} is signed by {signer}, a key {store} does not trust; if you trust the machine that built it, pass --trust {signer} (what `fhsx key show` prints there)")]
    Untrusted {
        record: Digest,
        signer: String,
        store: String,
    },
    #[error("record {record} from {from} is not signed by the key it names ({signer}): it was altered; make the copy again from the store that built it")]
    BadSignature {
        record: Digest,
        signer: String,
        from: String,
    },
    #[error("the {kind} {digest} from {from} hashes to {actual}: {from} was altered or damaged; make the copy again from a sound store (`fhsx store verify` there)")]
    Altered {
        kind: &'static str,
        digest: Digest,
        actual: Digest,
        from: String,
    },
    #[error("{from} holds the {kind} {digest}, which no record or directory before it names: objects were swapped in or reordered; make the copy again from the store that built it")]
    Unnamed {
        kind: &'static str,
        digest: Digest,
        from: String,
    },
    #[error("the blob {digest} from {from} is {got} bytes where its directory says {expected}: it was altered; make the copy again from a sound store")]
    WrongSize {
        digest: Digest,
        expected: u64,
        got: u64,
        from: String,
    },
    #[error("record {record}'s output {output} is incomplete: {from} lacks the {kind} {digest} and this store has none; make the copy again from a store where `fhsx store verify` is clean")]
    Incomplete {
        record: Digest,
        output: String,
        kind: &'static str,
        digest: Digest,
        from: String,
    },
    #[error("record {record} names the {kind} {digest}{at}, which the store at {store} lacks: it cannot be sent whole; rebuild it there (`fhsx build --rebuild`) or check the store (`fhsx store verify`)")]
    SourceIncomplete {
        record: Digest,
        kind: &'static str,
        digest: Digest,
        at: String,
        store: String,
    },
    #[error("record {record} is not in {from}")]
    NotInSource { record: Digest, from: String },
    #[error("{from} is cut short: it ends {at}; copy the whole file again")]
    Truncated { from: String, at: String },
    #[error("{from} is not a bundle this fhsx reads: {why}")]
    Malformed { from: String, why: String },
}

impl CopyError {
    pub fn exit_class(&self) -> ExitClass {
        match self {
            CopyError::Untrusted { .. }
            | CopyError::BadSignature { .. }
            | CopyError::Altered { .. }
            | CopyError::Unnamed { .. }
            | CopyError::WrongSize { .. }
            | CopyError::Incomplete { .. } => ExitClass::Integrity,
            CopyError::SourceIncomplete { .. }
            | CopyError::NotInSource { .. }
            | CopyError::Truncated { .. }
            | CopyError::Malformed { .. } => ExitClass::Usage,
        }
    }
}

/// What receives a closure, object by object, parents first.
pub trait Sink {
    /// Whether to send the object at all (false: the other side has it;
    /// a directory refused is not walked).
    fn wants(&mut self, kind: ObjectKind, digest: &Digest) -> bool;
    fn record(&mut self, digest: &Digest, bytes: &[u8]) -> Result<(), Error>;
    fn directory(&mut self, digest: &Digest, bytes: &[u8]) -> Result<(), Error>;
    /// `len` bytes of the blob `digest`, read from `r`.
    fn blob(&mut self, digest: &Digest, len: u64, r: &mut dyn BufRead) -> Result<(), Error>;
}

/// How a store is named in messages.
pub fn store_name(store: &LocalStore) -> String {
    format!("the store at {}", shown_path(store.root()))
}

/// A path as a message may show it.
pub(crate) fn shown_path(p: &Path) -> String {
    castore::shown::escaped(p.as_os_str().as_encoded_bytes())
}

/// Open the store at `dir` to receive into: made if absent, but never
/// laid over a directory that holds anything but a store (a mistyped
/// `--to ~` must not fill a home directory with shards).
pub fn open_receiving_store(dir: &Path) -> Result<LocalStore, Error> {
    match fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(Error::Usage(format!(
                "{} is a file, not a store directory; to write a bundle there, give file:{}",
                shown_path(dir),
                shown_path(dir)
            )))
        }
        Ok(_) if !is_store(dir) => {
            let empty = fs::read_dir(dir)
                .map_err(|e| Error::io("read", dir, e))?
                .next()
                .is_none();
            if !empty {
                return Err(Error::Usage(format!(
                    "{} is neither an fhsx store nor empty; give a store's directory, a new one, or file:PATH for a bundle",
                    shown_path(dir)
                )));
            }
        }
        _ => {}
    }
    Ok(LocalStore::open(dir)?)
}

/// Open the existing store at `dir` to copy from.
pub fn open_source_store(dir: &Path) -> Result<LocalStore, Error> {
    if dir.is_file() {
        return Err(Error::Usage(format!(
            "{} is a file, not a store directory; to read a bundle, give file:{}",
            shown_path(dir),
            shown_path(dir)
        )));
    }
    if !is_store(dir) {
        return Err(Error::Usage(format!(
            "{} is not an fhsx store (it has no blobs/ and dirs/); give a store's directory, or file:PATH for a bundle",
            shown_path(dir)
        )));
    }
    Ok(LocalStore::open(dir)?)
}

fn is_store(dir: &Path) -> bool {
    dir.join("blobs").is_dir() && dir.join("dirs").is_dir()
}

/// Copy `records` with their closures from `source` into the store `dest`,
/// trusting `dest`'s own key and `trust`.
pub fn to_store(
    source: &LocalStore,
    dest: &LocalStore,
    records: &[Digest],
    trust: &[String],
) -> Result<Moved, Error> {
    let mut rx = Receiver::new(dest, trust, store_name(source))?;
    send(source, records, &mut rx)?;
    rx.finish(&[])
}

/// Write `records` with their closures from `source` into a new bundle at
/// `path` (replaced whole, by a rename, if it exists).
pub fn to_bundle(source: &LocalStore, records: &[Digest], path: &Path) -> Result<Moved, Error> {
    let mut w = bundle::Writer::create(path)?;
    send(source, records, &mut w)?;
    w.finish(path)
}

/// Receive every record of the bundle at `path` into `dest`, trusting
/// `dest`'s own key and `trust`; each of `want` must be among them.
pub fn from_bundle(
    path: &Path,
    dest: &LocalStore,
    want: &[Digest],
    trust: &[String],
) -> Result<Moved, Error> {
    let mut rx = Receiver::new(dest, trust, format!("the bundle {}", shown_path(path)))?;
    bundle::read(path, &mut rx)?;
    rx.finish(want)
}

/// Parse a record blob's bytes (already checked to hash to `digest`): a
/// current-format record, or [`Error::BadRecord`] saying why not.
pub(crate) fn parse_record(digest: &Digest, bytes: &[u8]) -> Result<SignedRecord, Error> {
    match sign::parse_any(digest, bytes)? {
        StoredRecord::Current(r) => Ok(*r),
        StoredRecord::Older { format, .. } => Err(Error::BadRecord(format!(
            "{digest} is a format-{format} record, which is never a cache hit: only current records are copied (rebuild the action for one)"
        ))),
    }
}

/// Send `records` and their closures from `source` to `sink`: each record
/// first, then its outputs' trees (a directory before what it names), then
/// its other blobs. An object is sent once however often it is named.
pub fn send(source: &LocalStore, records: &[Digest], sink: &mut dyn Sink) -> Result<(), Error> {
    // Kept from a gc of the source while they are read.
    let roots = source.temp_roots(records)?;
    let mut seen: HashSet<(ObjectKind, Digest)> = HashSet::new();
    let from = store_name(source);
    for record in records {
        let missing = || CopyError::NotInSource {
            record: *record,
            from: from.clone(),
        };
        if source.has(ObjectKind::Directory, record) {
            return Err(Error::Usage(format!(
                "{record} is a tree, not a record; copy the record that made it (`fhsx --json build` prints it as \"record\")"
            )));
        }
        let len = source
            .object_len(ObjectKind::Blob, record)
            .ok_or_else(missing)?;
        if len > MAX_RECORD_BYTES {
            return Err(Error::Usage(format!(
                "{record} is a blob of {len} bytes, more than the {MAX_RECORD_BYTES} a record copied may have"
            )));
        }
        let bytes = source.read_blob(record)?;
        // A blob of the user's own store named as a record: their mistake.
        let rec = parse_record(record, &bytes)
            .map_err(|e| Error::Usage(castore::Chain(&e).to_string()))?
            .record;
        let sides = rec.named_blobs();
        let outputs: Vec<Digest> = rec.outputs.values().copied().collect();
        roots.add(&outputs)?;
        roots.add(&sides)?;
        sink.record(record, &bytes)?;
        seen.insert((ObjectKind::Blob, *record));
        let incomplete =
            |kind: &'static str, digest: Digest, at: String| CopyError::SourceIncomplete {
                record: *record,
                kind,
                digest,
                at,
                store: shown_path(source.root()),
            };
        for (name, root) in &rec.outputs {
            let at = |path: &str| format!(" (output {name}, at /{path})");
            // (directory, its path for messages): a stack, so no depth of
            // tree costs this thread's stack.
            let mut stack = vec![(*root, String::new())];
            while let Some((d, path)) = stack.pop() {
                if !seen.insert((ObjectKind::Directory, d))
                    || !sink.wants(ObjectKind::Directory, &d)
                {
                    continue;
                }
                let dir = match source.get_directory(&d) {
                    Err(castore::Error::Missing { .. }) => {
                        return Err(incomplete("directory", d, at(&path)).into())
                    }
                    other => other.map_err(|e| e.at_path(&path))?,
                };
                sink.directory(&d, &dir.encode())?;
                for (n, node) in dir.entries() {
                    let child = || {
                        let n = castore::shown::escaped(n.as_bytes());
                        if path.is_empty() {
                            n
                        } else {
                            format!("{path}/{n}")
                        }
                    };
                    match node {
                        Node::Directory { digest, .. } => stack.push((*digest, child())),
                        Node::File { digest, size, .. } => {
                            if seen.insert((ObjectKind::Blob, *digest))
                                && sink.wants(ObjectKind::Blob, digest)
                            {
                                let Some(mut r) = open_blob(source, digest)? else {
                                    return Err(incomplete("blob", *digest, at(&child())).into());
                                };
                                sink.blob(digest, *size, &mut r)?;
                            }
                        }
                        Node::Symlink { .. } => {}
                    }
                }
            }
        }
        for d in sides {
            if seen.contains(&(ObjectKind::Blob, d)) {
                continue;
            }
            let Some(len) = source.object_len(ObjectKind::Blob, &d) else {
                continue;
            };
            seen.insert((ObjectKind::Blob, d));
            if !sink.wants(ObjectKind::Blob, &d) {
                continue;
            }
            if let Some(mut r) = open_blob(source, &d)? {
                sink.blob(&d, len, &mut r)?;
            }
        }
    }
    Ok(())
}

/// The blob's file in `store`, buffered; `None` if it is absent. Not
/// verified here: whoever takes the bytes hashes them as they pass (the
/// receiver before staging, the bundle writer as it writes), so each byte
/// is read once.
fn open_blob(store: &LocalStore, d: &Digest) -> Result<Option<BufReader<File>>, Error> {
    let path = store.object_path(ObjectKind::Blob, d);
    match File::open(&path) {
        Ok(f) => Ok(Some(BufReader::with_capacity(1 << 20, f))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("open", &path, e)),
    }
}
