//! The engine's CAS as the local store sees it. The wire speaks SHA-256,
//! the store BLAKE3; a persistent map between the two
//! (`ROOT/reapi/sha256/…` and `ROOT/reapi/b3/…`, one small file per
//! object) lets a blob cross the wire once per worker, in either
//! direction, and an input directory be converted once: a REAPI directory
//! digest names the castore tree it became, so a tree or subtree seen
//! before is neither fetched nor hashed nor imported again.
//!
//! The map is a memo (see `castore::store::memo`): only ever a shortcut.
//! An entry names its own key, so a torn or misplaced one is no entry; what
//! it names must be in the store; and a directory entry is taken only for a
//! tree found whole — every directory and blob below it present — once per
//! process ([`Index::whole`]: a gc or a crash that lost part of a tree
//! since makes it converted again, never built on with a hole). A lost
//! entry costs the work again, never a wrong tree.
//!
//! Downloads: directories breadth-first in batches, skipping every subtree
//! the map already knows; then the missing files — those that fit the
//! engine's batch limit in `BatchReadBlobs`, each batch committed to the
//! store as it arrives, larger ones streamed through ByteStream `Read` into
//! the store with the SHA-256 checked on the way, never whole in memory,
//! and resumed from the offset reached when the connection breaks.
//! Uploads: `FindMissingBlobs` first, then small blobs in
//! `BatchUpdateBlobs` and large ones streamed from the store through
//! ByteStream `Write`. A few batches or streams are in flight at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use castore::store::{BlobStore, DirectoryStore, LocalStore, ObjectKind};
use castore::{Digest, Directory, Name, Node};
use futures::StreamExt;
use prost::Message;
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::mapping::{self, hex, Refusal};
use super::proto::{bs, re, Code};
use bazel_remote_apis::build::bazel::remote::execution::v2::content_addressable_storage_client::ContentAddressableStorageClient;
use bazel_remote_apis::google::bytestream::byte_stream_client::ByteStreamClient;

/// Batches or streams in flight at once.
const PARALLEL: usize = 4;
/// What one blob adds to a batch request beside its bytes (its digest,
/// the framing): engines cap the whole message, not just the data.
const PER_BLOB: i64 = 160;
// ByteStream chunks are the Cap'n Proto door's chunks, read the same way.
use crate::{ChannelReader, CHUNK};

/// What can go wrong talking to the CAS.
#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// Shown flat (a lease's status): the status is in the message, not
    /// a `source()`.
    #[error("the engine's CAS: {0}")]
    Rpc(tonic::Status),
    #[error(transparent)]
    Store(#[from] castore::Error),
    #[error("{0}")]
    Refused(Refusal),
    #[error("{0}")]
    Other(String),
}

impl CasError {
    /// The status a lease reports for this error.
    pub fn code(&self) -> Code {
        match self {
            CasError::Refused(r) => r.code,
            // A blob the engine no longer has: the client re-uploads and retries.
            CasError::Rpc(s) if s.code() == tonic::Code::NotFound => Code::FailedPrecondition,
            _ => Code::Unavailable,
        }
    }
}

impl From<tonic::Status> for CasError {
    fn from(s: tonic::Status) -> Self {
        CasError::Rpc(s)
    }
}

impl From<Refusal> for CasError {
    fn from(r: Refusal) -> Self {
        CasError::Refused(r)
    }
}

fn blocking_err(e: tokio::task::JoinError) -> CasError {
    CasError::Other(format!("a worker thread failed: {e}"))
}

/// The persistent SHA-256 ↔ BLAKE3 map.
#[derive(Clone)]
pub struct Index {
    root: PathBuf,
    /// Directories found whole in this process (every object below them
    /// present when looked at): a tree is walked once per process, then
    /// taken on its map entry alone.
    whole: Arc<Mutex<HashSet<Digest>>>,
}

/// Directories [`Index::whole`] remembers at most; past that it forgets
/// them all and walks again (a 10,000-file sysroot has ~1,000).
const WHOLE_MAX: usize = 1 << 20;

/// What a SHA-256 digest is in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    Blob(Digest),
    /// A directory: its castore digest.
    Dir(Digest),
}

/// `HASH/SIZE`, how an entry names its key.
fn key(d: &re::Digest) -> String {
    format!("{}/{}", d.hash, d.size_bytes)
}

impl Index {
    pub fn open(store: &LocalStore) -> Index {
        Index {
            root: store.root().join("reapi"),
            whole: Arc::default(),
        }
    }

    fn sha_path(&self, d: &re::Digest) -> PathBuf {
        let h = &d.hash;
        // Checked digests only reach here; anything else shards apart.
        self.root
            .join("sha256")
            .join(h.get(..2).unwrap_or("_"))
            .join(format!("{h}-{}", d.size_bytes))
    }

    fn b3_path(&self, d: &Digest) -> PathBuf {
        let h = d.hex();
        self.root.join("b3").join(&h[..2]).join(h)
    }

    fn write(path: PathBuf, text: String) {
        // An entry is a shortcut: failing to write one costs the work later.
        let Some(dir) = path.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let tmp = dir.join(format!(
            ".tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// The entry for `d`, whole and its own (its last field is its key).
    fn read(path: &std::path::Path, key: &str) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut fields: Vec<String> = text
            .strip_suffix('\n')?
            .split(' ')
            .map(str::to_owned)
            .collect();
        (fields.pop()? == key).then_some(fields)
    }

    /// What `d` is, if the map knows and the store still has it. A
    /// directory's tree may be partly gone: see [`Index::known_whole`].
    pub fn get(&self, store: &LocalStore, d: &re::Digest) -> Option<Known> {
        let fields = Self::read(&self.sha_path(d), &key(d))?;
        let known = match fields.as_slice() {
            [kind, b3] if kind == "blob" => Known::Blob(b3.parse().ok()?),
            [kind, b3] if kind == "dir" => Known::Dir(b3.parse().ok()?),
            _ => return None,
        };
        let present = match known {
            Known::Blob(b) => store.has(ObjectKind::Blob, &b),
            Known::Dir(b) => store.has(ObjectKind::Directory, &b),
        };
        present.then_some(known)
    }

    /// The castore tree the input directory `d` became (digest, entry
    /// count), if the map knows it and the whole tree is in the store. The
    /// count is the stored directory's own, read again: one small read.
    pub fn known_whole(&self, store: &LocalStore, d: &re::Digest) -> Option<(Digest, u64)> {
        match self.get(store, d)? {
            Known::Dir(b3) if self.whole(store, &b3) => {
                Some((b3, store.get_directory(&b3).ok()?.size()))
            }
            _ => None,
        }
    }

    /// Whether every directory and blob of the tree `root` is in the store.
    /// Directories found so are remembered for this process, so a tree is
    /// walked once (a new tree over old subtrees walks only what is new).
    pub fn whole(&self, store: &LocalStore, root: &Digest) -> bool {
        let known = |d: &Digest| {
            self.whole
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(d)
        };
        if known(root) {
            return true;
        }
        let mut seen = HashSet::new();
        let mut stack = vec![*root];
        while let Some(d) = stack.pop() {
            if known(&d) || !seen.insert(d) {
                continue;
            }
            let Ok(dir) = store.get_directory(&d) else {
                return false;
            };
            for (_, node) in dir.entries() {
                match node {
                    Node::File { digest, .. } => {
                        if !store.has(ObjectKind::Blob, digest) {
                            return false;
                        }
                    }
                    Node::Directory { digest, .. } => stack.push(*digest),
                    Node::Symlink { .. } => {}
                }
            }
        }
        self.mark_whole(seen);
        true
    }

    /// Remember trees as whole (their objects were just stored or found).
    fn mark_whole(&self, dirs: impl IntoIterator<Item = Digest>) {
        let dirs: Vec<Digest> = dirs.into_iter().collect();
        let mut whole = self.whole.lock().unwrap_or_else(|p| p.into_inner());
        if whole.len() + dirs.len() > WHOLE_MAX {
            whole.clear();
        }
        whole.extend(dirs);
    }

    pub fn put_blob(&self, sha: &re::Digest, b3: &Digest) {
        Self::write(self.sha_path(sha), format!("blob {b3} {}\n", key(sha)));
        Self::write(
            self.b3_path(b3),
            format!("{} {} {b3}\n", sha.hash, sha.size_bytes),
        );
    }

    pub fn put_dir(&self, sha: &re::Digest, b3: &Digest) {
        Self::write(self.sha_path(sha), format!("dir {b3} {}\n", key(sha)));
    }

    /// The SHA-256 digest of blob `b3`, from the map or by hashing the
    /// stored blob (streamed) and remembering it.
    fn sha_of_blob(&self, store: &LocalStore, b3: &Digest) -> Result<re::Digest, CasError> {
        if let Some(fields) = Self::read(&self.b3_path(b3), &b3.to_string()) {
            if let [h, s] = fields.as_slice() {
                if let Ok(size_bytes) = s.parse() {
                    let d = re::Digest {
                        hash: h.to_owned(),
                        size_bytes,
                    };
                    if mapping::check_digest("map entry", &d).is_ok() {
                        return Ok(d);
                    }
                }
            }
        }
        let mut f = store.open_blob(b3)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut n = 0i64;
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => {
                    h.update(&buf[..k]);
                    n += k as i64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CasError::Other(format!("reading blob {b3}: {e}"))),
            }
        }
        let d = re::Digest {
            hash: hex(&h.finalize()),
            size_bytes: n,
        };
        self.put_blob(&d, b3);
        Ok(d)
    }
}

/// A call's credentials: `authorization: Bearer TOKEN` on every request,
/// where a token was given (an engine or cache behind an authenticating
/// proxy, BuildGrid's JWT).
#[derive(Clone, Default)]
pub struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl Bearer {
    /// The header for `token` (one line of printable ASCII).
    pub fn new(token: &str) -> Result<Bearer, String> {
        format!("Bearer {token}")
            .parse()
            .map(|v| Bearer(Some(v)))
            .map_err(|_| "the token is not printable ASCII".to_owned())
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

/// A channel whose calls carry the [`Bearer`] credentials.
pub type Transport = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

/// The engine's CAS, for one instance.
#[derive(Clone)]
pub struct Cas {
    instance: String,
    cas: ContentAddressableStorageClient<Transport>,
    bytestream: ByteStreamClient<Transport>,
    store: LocalStore,
    index: Index,
    /// The engine's `max_batch_total_size_bytes`.
    max_batch: i64,
    /// How long a streamed read may go without data before it is taken
    /// as broken (and resumed); `None`: as long as it takes.
    stall: Option<Duration>,
}

/// What went over the wire, for the log and the bench.
#[derive(Debug, Default, Clone, Copy)]
pub struct Transfer {
    pub blobs: u64,
    pub bytes: u64,
}

/// Something to upload.
pub enum Upload {
    /// A blob of the local store.
    Stored(Digest),
    /// Bytes in memory (a `Tree`, a record's wire form) under their digest.
    Bytes(re::Digest, Vec<u8>),
}

impl Cas {
    pub fn new(channel: Channel, instance: String, store: LocalStore, max_batch: i64) -> Cas {
        Self::with_bearer(channel, Bearer::default(), instance, store, max_batch)
    }

    /// The CAS at `channel`, each call carrying `bearer`.
    pub fn with_bearer(
        channel: Channel,
        bearer: Bearer,
        instance: String,
        store: LocalStore,
        max_batch: i64,
    ) -> Cas {
        let limit = crate::MAX_MESSAGE_BYTES;
        Cas {
            instance,
            cas: ContentAddressableStorageClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            bytestream: ByteStreamClient::with_interceptor(channel, bearer)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            index: Index::open(&store),
            store,
            // Leave room for the request's own framing.
            max_batch: if max_batch <= 0 {
                4 << 20
            } else {
                (max_batch - (64 << 10)).max(64 << 10)
            },
            stall: None,
        }
    }

    /// The same CAS, a streamed read that goes `stall` without data taken
    /// as broken (and resumed where it stopped).
    pub fn with_stall(mut self, stall: Duration) -> Cas {
        self.stall = Some(stall);
        self
    }

    pub fn store(&self) -> &LocalStore {
        &self.store
    }

    fn resource(&self, tail: String) -> String {
        if self.instance.is_empty() {
            tail
        } else {
            format!("{}/{tail}", self.instance)
        }
    }

    /// Read small blobs into memory, checking each against its digest.
    pub async fn read_small(
        &self,
        digests: &[re::Digest],
    ) -> Result<HashMap<re::Digest, Vec<u8>>, CasError> {
        let mut out = HashMap::new();
        let mut big = Vec::new();
        let mut small = Vec::new();
        for d in digests {
            if d.size_bytes + PER_BLOB > self.max_batch {
                big.push(d.clone());
            } else {
                small.push(d.clone());
            }
        }
        let mut batches = futures::stream::iter(self.batches(small))
            .map(|b| self.read_batch(b))
            .buffer_unordered(PARALLEL);
        while let Some(got) = batches.next().await {
            out.extend(got?);
        }
        for d in big {
            if d.size_bytes as usize > crate::MAX_MESSAGE_BYTES {
                return Err(CasError::Refused(Refusal::new(
                    Code::InvalidArgument,
                    format!("message {}/{} is too large", d.hash, d.size_bytes),
                )));
            }
            let mut bytes = Vec::with_capacity(d.size_bytes as usize);
            let mut read = BlobRead::new(self, &d);
            while let Some(data) = read.next().await? {
                bytes.extend_from_slice(&data);
            }
            check(&d, &bytes)?;
            out.insert(d, bytes);
        }
        Ok(out)
    }

    /// Group digests into batches of at most `max_batch` bytes.
    fn batches(&self, digests: Vec<re::Digest>) -> Vec<Vec<re::Digest>> {
        let mut out = Vec::new();
        let mut batch: Vec<re::Digest> = Vec::new();
        let mut total = 0i64;
        for d in digests {
            let cost = d.size_bytes + PER_BLOB;
            if total + cost > self.max_batch && !batch.is_empty() {
                out.push(std::mem::take(&mut batch));
                total = 0;
            }
            total += cost;
            batch.push(d);
        }
        if !batch.is_empty() {
            out.push(batch);
        }
        out
    }

    async fn read_batch(
        &self,
        digests: Vec<re::Digest>,
    ) -> Result<Vec<(re::Digest, Vec<u8>)>, CasError> {
        let mut out = Vec::with_capacity(digests.len());
        let resp = self
            .cas
            .clone()
            .batch_read_blobs(re::BatchReadBlobsRequest {
                instance_name: self.instance.clone(),
                digests,
                acceptable_compressors: Vec::new(),
                digest_function: re::digest_function::Value::Sha256 as i32,
            })
            .await?
            .into_inner();
        for r in resp.responses {
            let d = r.digest.ok_or_else(|| {
                CasError::Other("BatchReadBlobs answered without a digest".into())
            })?;
            if let Some(s) = r.status.as_ref().filter(|s| s.code != 0) {
                return Err(CasError::Rpc(tonic::Status::new(
                    tonic::Code::from_i32(s.code),
                    format!("blob {}/{}: {}", d.hash, d.size_bytes, s.message),
                )));
            }
            check(&d, &r.data)?;
            out.push((d, r.data));
        }
        Ok(out)
    }

    /// Fetch small blobs into the store, a batch at a time (several in
    /// flight), each batch committed as it arrives.
    async fn fetch_small(
        &self,
        digests: Vec<re::Digest>,
        expect: &HashMap<re::Digest, Digest>,
        xfer: &mut Transfer,
    ) -> Result<Vec<(re::Digest, Digest)>, CasError> {
        let mut stored = Vec::with_capacity(digests.len());
        let mut batches = futures::stream::iter(self.batches(digests))
            .map(|b| async move {
                let expected: HashMap<re::Digest, Digest> = (b.iter())
                    .filter_map(|d| Some((d.clone(), *expect.get(d)?)))
                    .collect();
                let got = self.read_batch(b).await?;
                let store = self.store.clone();
                let index = self.index.clone();
                let bytes: u64 = got.iter().map(|(_, b)| b.len() as u64).sum();
                let n = got.len() as u64;
                let out = tokio::task::spawn_blocking(move || -> Result<_, CasError> {
                    let txn = store.txn()?;
                    let mut out = Vec::with_capacity(got.len());
                    for (d, data) in &got {
                        let b3 = txn.put_blob(data)?;
                        if let Some(e) = expected.get(d).filter(|e| **e != b3) {
                            // Dropping the transaction stores nothing.
                            return Err(not_named(d, e, &b3));
                        }
                        out.push((d.clone(), b3));
                    }
                    txn.commit()?;
                    for (d, b3) in &out {
                        index.put_blob(d, b3);
                    }
                    Ok(out)
                })
                .await
                .map_err(blocking_err)??;
                Ok::<_, CasError>((out, n, bytes))
            })
            .buffer_unordered(PARALLEL);
        while let Some(r) = batches.next().await {
            let (out, n, bytes) = r?;
            xfer.blobs += n;
            xfer.bytes += bytes;
            stored.extend(out);
        }
        Ok(stored)
    }

    async fn read_stream(
        &self,
        d: &re::Digest,
        offset: i64,
    ) -> Result<tonic::Streaming<bs::ReadResponse>, CasError> {
        Ok(self
            .bytestream
            .clone()
            .read(bs::ReadRequest {
                resource_name: self.resource(format!("blobs/{}/{}", d.hash, d.size_bytes)),
                read_offset: offset,
                read_limit: 0,
            })
            .await?
            .into_inner())
    }

    /// Fetch one message (an Action, a Command) by digest.
    pub async fn message<M: Message + Default>(&self, d: &re::Digest) -> Result<M, CasError> {
        mapping::check_digest("digest", d)?;
        let mut got = self.read_small(std::slice::from_ref(d)).await?;
        let bytes = got
            .remove(d)
            .ok_or_else(|| CasError::Other(format!("blob {} did not arrive", d.hash)))?;
        M::decode(&bytes[..]).map_err(|e| {
            Refusal::new(
                Code::InvalidArgument,
                format!("blob {}/{} does not decode: {e}", d.hash, d.size_bytes),
            )
            .into()
        })
    }

    /// Fetch the input root `root` into the store, every blob once; its
    /// castore digest.
    pub async fn fetch_tree(&self, root: &re::Digest) -> Result<(Digest, Transfer), CasError> {
        mapping::check_digest("input root", root)?;
        let mut xfer = Transfer::default();
        // Directories, breadth-first, skipping every tree the map knows
        // whole: a root converted before is this one lookup.
        let mut dirs: HashMap<re::Digest, re::Directory> = HashMap::new();
        let mut known_dirs: HashMap<re::Digest, (Digest, u64)> = HashMap::new();
        let mut level = vec![root.clone()];
        while !level.is_empty() {
            let mut ask = Vec::new();
            for d in level.drain(..) {
                if dirs.contains_key(&d) || known_dirs.contains_key(&d) {
                    continue;
                }
                mapping::check_digest("input directory", &d)?;
                ask.push(d);
            }
            let (index, store) = (self.index.clone(), self.store.clone());
            let looked = tokio::task::spawn_blocking(move || {
                ask.into_iter()
                    .map(|d| {
                        let known = index.known_whole(&store, &d);
                        (d, known)
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(blocking_err)?;
            let mut want = Vec::new();
            for (d, known) in looked {
                match known {
                    Some(k) => {
                        known_dirs.insert(d, k);
                    }
                    None => want.push(d),
                }
            }
            if let Some((b3, _)) = known_dirs.get(root) {
                return Ok((*b3, xfer));
            }
            want.sort_by(|a, b| a.hash.cmp(&b.hash));
            want.dedup();
            let got = self.read_small(&want).await?;
            xfer.blobs += got.len() as u64;
            for (d, bytes) in got {
                xfer.bytes += bytes.len() as u64;
                let dir = re::Directory::decode(&bytes[..]).map_err(|e| {
                    Refusal::new(
                        Code::InvalidArgument,
                        format!("input directory {} does not decode: {e}", d.hash),
                    )
                })?;
                for c in &dir.directories {
                    if let Some(cd) = &c.digest {
                        level.push(cd.clone());
                    }
                }
                dirs.insert(d, dir);
            }
        }
        // Files the store lacks.
        let mut blobs: HashMap<re::Digest, Digest> = HashMap::new();
        let mut missing: Vec<re::Digest> = Vec::new();
        let mut seen = HashSet::new();
        for dir in dirs.values() {
            for f in &dir.files {
                let Some(d) = &f.digest else { continue };
                if !seen.insert(d.clone()) {
                    continue;
                }
                mapping::check_digest("input file", d)?;
                match self.index.get(&self.store, d) {
                    Some(Known::Blob(b3)) => {
                        blobs.insert(d.clone(), b3);
                    }
                    _ if d.size_bytes == 0 => {
                        let b3 = self.store.put_blob(b"")?;
                        blobs.insert(d.clone(), b3);
                    }
                    _ => missing.push(d.clone()),
                }
            }
        }
        let unchecked = HashMap::new();
        blobs.extend(self.fetch_blobs(missing, &unchecked, &mut xfer).await?);
        // The castore tree, children before parents.
        let store = self.store.clone();
        let index = self.index.clone();
        let root = root.clone();
        let b3 = tokio::task::spawn_blocking(move || -> Result<Digest, CasError> {
            let mut done = known_dirs;
            let txn = store.txn()?;
            let mut stack = vec![(root.clone(), false)];
            let mut new = Vec::new();
            while let Some((d, expanded)) = stack.pop() {
                if done.contains_key(&d) {
                    continue;
                }
                let dir = dirs.get(&d).ok_or_else(|| {
                    CasError::Other(format!("input directory {} was not fetched", d.hash))
                })?;
                if !expanded {
                    stack.push((d.clone(), true));
                    for c in &dir.directories {
                        if let Some(cd) = &c.digest {
                            if !done.contains_key(cd) {
                                stack.push((cd.clone(), false));
                            }
                        }
                    }
                    continue;
                }
                let cdir = mapping::castore_directory(dir, &done, &blobs)?;
                let b3 = txn.put_directory(&cdir)?;
                done.insert(d.clone(), (b3, cdir.size()));
                new.push((d, b3));
            }
            txn.commit()?;
            for (d, b3) in &new {
                index.put_dir(d, b3);
            }
            // Every object below them was just stored or found present.
            index.mark_whole(new.iter().map(|(_, b3)| *b3));
            done.get(&root)
                .map(|(b3, _)| *b3)
                .ok_or_else(|| CasError::Other("the input root did not convert".into()))
        })
        .await
        .map_err(blocking_err)??;
        Ok((b3, xfer))
    }

    /// Fetch blobs into the store, each checked against its SHA-256 on
    /// arrival and against the BLAKE3 digest a signed record's tree gives
    /// it before it is committed: a blob that is not what the tree names
    /// never enters the store.
    pub async fn fetch_expecting(
        &self,
        wanted: Vec<(re::Digest, Digest)>,
    ) -> Result<Transfer, CasError> {
        let mut xfer = Transfer::default();
        let shas = wanted.iter().map(|(d, _)| d.clone()).collect();
        let expect: HashMap<re::Digest, Digest> = wanted.into_iter().collect();
        self.fetch_blobs(shas, &expect, &mut xfer).await?;
        Ok(xfer)
    }

    /// Fetch blobs into the store: those that fit a batch in batches,
    /// larger ones streamed, several in flight; each checked against its
    /// SHA-256 and, where `expect` names one, its BLAKE3 digest. What each
    /// became in the store.
    async fn fetch_blobs(
        &self,
        wanted: Vec<re::Digest>,
        expect: &HashMap<re::Digest, Digest>,
        xfer: &mut Transfer,
    ) -> Result<Vec<(re::Digest, Digest)>, CasError> {
        let (small, large): (Vec<_>, Vec<_>) = wanted
            .into_iter()
            .partition(|d| d.size_bytes + PER_BLOB <= self.max_batch);
        let mut stored = self.fetch_small(small, expect, xfer).await?;
        let mut downloads = futures::stream::iter(large)
            .map(|d| async move {
                let b3 = self.download_large(&d, expect.get(&d).copied()).await?;
                Ok::<_, CasError>((d, b3))
            })
            .buffer_unordered(PARALLEL);
        while let Some(r) = downloads.next().await {
            let (d, b3) = r?;
            xfer.blobs += 1;
            xfer.bytes += d.size_bytes as u64;
            stored.push((d, b3));
        }
        Ok(stored)
    }

    /// Stream one large blob into the store, checking its SHA-256 (and,
    /// given one, its BLAKE3 digest).
    async fn download_large(
        &self,
        d: &re::Digest,
        expect_b3: Option<Digest>,
    ) -> Result<Digest, CasError> {
        let mut read = BlobRead::new(self, d);
        let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
        let store = self.store.clone();
        let index = self.index.clone();
        let want = d.clone();
        let writer = tokio::task::spawn_blocking(move || -> Result<Digest, CasError> {
            let txn = store.txn()?;
            let mut r = HashingReader {
                inner: ChannelReader::new(rx),
                sha: Sha256::new(),
                n: 0,
            };
            let (got_b3, _) = txn.put_blob_buffered(&mut r)?;
            let got = re::Digest {
                hash: hex(&r.sha.finalize()),
                size_bytes: r.n,
            };
            if got != want {
                // Dropping the transaction stores nothing.
                return Err(CasError::Other(format!(
                    "blob {}/{} arrived as {}/{}: refused",
                    want.hash, want.size_bytes, got.hash, got.size_bytes
                )));
            }
            if let Some(expected) = expect_b3.filter(|e| *e != got_b3) {
                return Err(not_named(&want, &expected, &got_b3));
            }
            txn.commit()?;
            index.put_blob(&want, &got_b3);
            Ok(got_b3)
        });
        let mut failed = None;
        loop {
            match read.next().await {
                Ok(Some(data)) => {
                    if tx.send(data).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let r = writer.await.map_err(blocking_err)?;
        if let Some(e) = failed {
            return Err(e);
        }
        r
    }

    /// The SHA-256 digests of stored blobs (index, else hashed).
    pub async fn sha_of_blobs(
        &self,
        b3s: Vec<Digest>,
    ) -> Result<HashMap<Digest, re::Digest>, CasError> {
        let store = self.store.clone();
        let index = self.index.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = HashMap::new();
            for b in b3s {
                if let std::collections::hash_map::Entry::Vacant(v) = out.entry(b) {
                    v.insert(index.sha_of_blob(&store, &b)?);
                }
            }
            Ok(out)
        })
        .await
        .map_err(blocking_err)?
    }

    /// Upload what the engine lacks.
    pub async fn upload(&self, items: Vec<Upload>) -> Result<Transfer, CasError> {
        let mut xfer = Transfer::default();
        let stored: Vec<Digest> = items
            .iter()
            .filter_map(|u| match u {
                Upload::Stored(b) => Some(*b),
                Upload::Bytes(..) => None,
            })
            .collect();
        let shas = self.sha_of_blobs(stored).await?;
        let mut all: BTreeMap<(String, i64), Upload> = BTreeMap::new();
        for u in items {
            let d = match &u {
                Upload::Stored(b) => shas[b].clone(),
                Upload::Bytes(d, _) => d.clone(),
            };
            all.entry((d.hash, d.size_bytes)).or_insert(u);
        }
        let mut missing = HashSet::new();
        let keys: Vec<re::Digest> = all
            .keys()
            .map(|(h, s)| re::Digest {
                hash: h.clone(),
                size_bytes: *s,
            })
            .collect();
        for chunk in keys.chunks(4096) {
            let resp = self
                .cas
                .clone()
                .find_missing_blobs(re::FindMissingBlobsRequest {
                    instance_name: self.instance.clone(),
                    blob_digests: chunk.to_vec(),
                    digest_function: re::digest_function::Value::Sha256 as i32,
                })
                .await?
                .into_inner();
            for d in resp.missing_blob_digests {
                missing.insert((d.hash, d.size_bytes));
            }
        }
        let mut small = Vec::new();
        let mut large = Vec::new();
        for ((hash, size), u) in all {
            if !missing.contains(&(hash.clone(), size)) {
                continue;
            }
            let d = re::Digest {
                hash,
                size_bytes: size,
            };
            xfer.blobs += 1;
            xfer.bytes += size as u64;
            if size + PER_BLOB <= self.max_batch {
                small.push((d, u));
            } else {
                large.push((d, u));
            }
        }
        // Small ones in batches of at most max_batch bytes, read from the
        // store only when their batch is sent.
        let mut batches: Vec<Vec<(re::Digest, Upload)>> = Vec::new();
        let mut total = 0i64;
        for (d, u) in small {
            let cost = d.size_bytes + PER_BLOB;
            if batches.is_empty() || total + cost > self.max_batch {
                batches.push(Vec::new());
                total = 0;
            }
            total += cost;
            if let Some(b) = batches.last_mut() {
                b.push((d, u));
            }
        }
        let mut sends = futures::stream::iter(batches)
            .map(|b| async move {
                let store = self.store.clone();
                let requests = tokio::task::spawn_blocking(move || -> Result<_, CasError> {
                    let mut v = Vec::with_capacity(b.len());
                    for (d, u) in b {
                        let data = match u {
                            Upload::Bytes(_, b) => b,
                            Upload::Stored(b3) => store.read_blob(&b3)?,
                        };
                        v.push(re::batch_update_blobs_request::Request {
                            digest: Some(d),
                            data,
                            compressor: 0,
                        });
                    }
                    Ok(v)
                })
                .await
                .map_err(blocking_err)??;
                self.update_batch(requests).await
            })
            .buffer_unordered(PARALLEL);
        while let Some(r) = sends.next().await {
            r?;
        }
        let mut writes = futures::stream::iter(large)
            .map(|(d, u)| self.write_large(d, u))
            .buffer_unordered(PARALLEL);
        while let Some(r) = writes.next().await {
            r?;
        }
        Ok(xfer)
    }

    async fn update_batch(
        &self,
        requests: Vec<re::batch_update_blobs_request::Request>,
    ) -> Result<(), CasError> {
        let resp = self
            .cas
            .clone()
            .batch_update_blobs(re::BatchUpdateBlobsRequest {
                instance_name: self.instance.clone(),
                requests,
                digest_function: re::digest_function::Value::Sha256 as i32,
            })
            .await?
            .into_inner();
        for r in resp.responses {
            if let Some(s) = r.status.filter(|s| s.code != 0) {
                let d = r.digest.unwrap_or_default();
                return Err(CasError::Rpc(tonic::Status::new(
                    tonic::Code::from_i32(s.code),
                    format!("uploading blob {}/{}: {}", d.hash, d.size_bytes, s.message),
                )));
            }
        }
        Ok(())
    }

    /// Stream one large blob to the engine.
    async fn write_large(&self, d: re::Digest, u: Upload) -> Result<(), CasError> {
        let name = self.resource(format!(
            "uploads/{}/blobs/{}/{}",
            upload_id(),
            d.hash,
            d.size_bytes
        ));
        let (tx, rx) = mpsc::channel::<Result<Vec<u8>, String>>(4);
        let store = self.store.clone();
        let reader = tokio::task::spawn_blocking(move || match u {
            Upload::Bytes(_, b) => {
                for c in b.chunks(CHUNK) {
                    if tx.blocking_send(Ok(c.to_vec())).is_err() {
                        return;
                    }
                }
            }
            Upload::Stored(b3) => {
                crate::send_blob(&store, &b3, &tx);
            }
        });
        let size = d.size_bytes;
        let state = (rx, 0i64, Some(name), false);
        let requests =
            futures::stream::unfold(state, move |(mut rx, offset, name, done)| async move {
                if done {
                    return None;
                }
                let resource_name = name.clone().unwrap_or_default();
                match rx.recv().await {
                    Some(Ok(data)) => {
                        let next = offset + data.len() as i64;
                        let req = bs::WriteRequest {
                            resource_name,
                            write_offset: offset,
                            finish_write: next >= size,
                            data,
                        };
                        // Only the first request need carry the name.
                        Some((req, (rx, next, Some(String::new()), next >= size)))
                    }
                    // A read error ends the stream short: the engine refuses
                    // the incomplete blob.
                    Some(Err(_)) | None => None,
                }
            });
        let resp = self.bytestream.clone().write(requests).await;
        let _ = reader.await;
        let committed = resp?.into_inner().committed_size;
        if committed != size {
            return Err(CasError::Other(format!(
                "uploading blob {}/{}: the engine committed {committed} bytes",
                d.hash, size
            )));
        }
        Ok(())
    }
}

/// How many times one streamed read is resumed after its connection broke.
const RESUMES: u32 = 3;

/// A ByteStream read of one blob that outlives a broken connection: on a
/// transport error, or `stall` without data, it asks again from the
/// offset reached (ByteStream's `read_offset`), at most [`RESUMES`] times,
/// so a large download interrupted near its end costs its tail, not its
/// whole. What arrives is checked by the caller as one stream (a server
/// that ignored the offset fails the digest).
struct BlobRead<'c> {
    cas: &'c Cas,
    digest: re::Digest,
    received: i64,
    resumes: u32,
    stream: Option<tonic::Streaming<bs::ReadResponse>>,
}

impl<'c> BlobRead<'c> {
    fn new(cas: &'c Cas, digest: &re::Digest) -> Self {
        BlobRead {
            cas,
            digest: digest.clone(),
            received: 0,
            resumes: 0,
            stream: None,
        }
    }

    async fn next(&mut self) -> Result<Option<Vec<u8>>, CasError> {
        loop {
            if self.stream.is_none() {
                match self.cas.read_stream(&self.digest, self.received).await {
                    Ok(s) => self.stream = Some(s),
                    Err(CasError::Rpc(e)) if self.may_resume(&e) => {
                        self.resume().await;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let Some(stream) = self.stream.as_mut() else {
                continue;
            };
            let got = match self.cas.stall {
                Some(t) => tokio::time::timeout(t, stream.message())
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::deadline_exceeded(format!(
                            "no data for {t:?} in the middle of a read"
                        )))
                    }),
                None => stream.message().await,
            };
            match got {
                Ok(Some(m)) => {
                    self.received += m.data.len() as i64;
                    return Ok(Some(m.data));
                }
                Ok(None) => return Ok(None),
                Err(e) if self.may_resume(&e) => {
                    self.stream = None;
                    self.resume().await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn may_resume(&self, e: &tonic::Status) -> bool {
        broken(e) && self.resumes < RESUMES && self.received < self.digest.size_bytes
    }

    /// Count a resumption, and give the channel a moment to reconnect.
    async fn resume(&mut self) {
        self.resumes += 1;
        tokio::time::sleep(Duration::from_millis(100 << self.resumes)).await;
    }
}

/// A status that says the connection, not the request, failed.
fn broken(s: &tonic::Status) -> bool {
    use tonic::Code as C;
    matches!(
        s.code(),
        C::Unavailable | C::Unknown | C::Internal | C::Aborted | C::Cancelled | C::DeadlineExceeded
    )
}

/// A blob whose SHA-256 is right but which is not the file a signed tree
/// names (a remote that swapped what a digest pair says).
fn not_named(d: &re::Digest, expected: &Digest, got: &Digest) -> CasError {
    CasError::Refused(Refusal::new(
        Code::FailedPrecondition,
        format!(
            "blob {}/{} is {got}, not {expected} as the record's tree names it: refused",
            d.hash, d.size_bytes
        ),
    ))
}

fn check(d: &re::Digest, bytes: &[u8]) -> Result<(), CasError> {
    let got = mapping::sha256_digest(bytes);
    if got != *d {
        return Err(CasError::Other(format!(
            "blob {}/{} arrived as {}/{}: refused",
            d.hash, d.size_bytes, got.hash, got.size_bytes
        )));
    }
    Ok(())
}

/// A fresh upload id, formatted as a UUID (v4 layout) from the clock, the
/// pid and a counter: unique per upload, which is all the name needs.
fn upload_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let seed = format!(
        "{t}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    let h = blake3::hash(seed.as_bytes());
    let b = h.as_bytes();
    let x = hex(&b[..16]);
    format!(
        "{}-{}-4{}-8{}-{}",
        &x[..8],
        &x[8..12],
        &x[13..16],
        &x[17..20],
        &x[20..32]
    )
}

/// SHA-256 and length of what passes through, hashed from the inner
/// reader's own buffer as it is consumed: the store writer takes each
/// chunk as it arrived (`Txn::put_blob_buffered`), with no copy.
struct HashingReader<R> {
    inner: R,
    sha: Sha256,
    n: i64,
}

impl<R: BufRead> Read for HashingReader<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        castore::store::read_from_buffer(self, out)
    }
}

impl<R: BufRead> BufRead for HashingReader<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        // What `fill_buf` returned is still the inner buffer's head (it
        // fills only when empty), so this returns it again without reading.
        // Were it ever not, the hash would be wrong and the blob refused.
        if let Ok(held) = self.inner.fill_buf() {
            let n = n.min(held.len());
            self.sha.update(&held[..n]);
            self.n += n as i64;
        }
        self.inner.consume(n);
    }
}

/// `root` with every directory in `paths` (relative to it, `/`-separated)
/// and every directory leading up to each present, made empty where
/// missing. A path through a file or symlink is refused: the action could
/// not create its output there.
///
/// The paths become a trie, one node per directory, held flat (an index
/// per node, no recursion), so a path thousands of components deep costs
/// its length: walked down once to load what the input root has, then
/// written back up, children before parents.
pub fn with_dirs(store: &LocalStore, root: &Digest, paths: &[String]) -> Result<Digest, CasError> {
    if paths.is_empty() {
        return Ok(*root);
    }
    struct Dir {
        /// Its parent's index and its name there (the root: none).
        up: Option<(usize, String)>,
        children: BTreeMap<String, usize>,
        /// What the input root has here (the root: the whole tree).
        old: Option<Digest>,
    }
    let mut trie = vec![Dir {
        up: None,
        children: BTreeMap::new(),
        old: Some(*root),
    }];
    for p in paths {
        let mut at = 0;
        for c in p.split('/') {
            at = match trie[at].children.get(c) {
                Some(&i) => i,
                None => {
                    let i = trie.len();
                    trie.push(Dir {
                        up: Some((at, c.to_owned())),
                        children: BTreeMap::new(),
                        old: None,
                    });
                    trie[at].children.insert(c.to_owned(), i);
                    i
                }
            };
        }
    }
    // Where a node is, for a refusal.
    let path_of = |trie: &[Dir], mut i: usize| {
        let mut parts = Vec::new();
        while let Some((up, name)) = &trie[i].up {
            parts.push(name.as_str());
            i = *up;
        }
        parts.reverse();
        parts.join("/")
    };
    // Down: each node in the order made (a parent before its children),
    // its directory loaded and its children's found in it.
    let mut loaded: Vec<Directory> = Vec::with_capacity(trie.len());
    for i in 0..trie.len() {
        let dir = match trie[i].old {
            Some(d) => store.get_directory(&d)?,
            None => Directory::new(),
        };
        let found: Vec<(usize, Option<Digest>)> = trie[i]
            .children
            .iter()
            .map(|(name, &child)| match dir.get(name.as_bytes()) {
                None => Ok((child, None)),
                Some(Node::Directory { digest, .. }) => Ok((child, Some(*digest))),
                Some(other) => Err(Refusal::new(
                    Code::InvalidArgument,
                    format!(
                        "{} is {} in the input root, but an output or the working directory lies below it",
                        path_of(&trie, child),
                        other.kind()
                    ),
                )),
            })
            .collect::<Result<_, _>>()?;
        for (child, old) in found {
            trie[child].old = old;
        }
        loaded.push(dir);
    }
    // Up: children (made after their parents) first, each written into
    // its parent's directory.
    let txn = store.txn()?;
    let mut made: Vec<Option<(Digest, u64)>> = vec![None; trie.len()];
    for i in (0..trie.len()).rev() {
        let old = std::mem::take(&mut loaded[i]);
        let mut dir = Directory::new();
        for (name, node) in old.entries() {
            let replaced = std::str::from_utf8(name.as_bytes())
                .is_ok_and(|n| trie[i].children.contains_key(n));
            if !replaced {
                dir.insert(name.clone(), node.clone())?;
            }
        }
        for (name, &child) in &trie[i].children {
            let Some((digest, size)) = made[child] else {
                return Err(CasError::Other(format!(
                    "directory {} was not made before its parent",
                    path_of(&trie, child)
                )));
            };
            let name = Name::new(name.as_bytes())
                .map_err(|e| Refusal::new(Code::InvalidArgument, format!("{name:?}: {e}")))?;
            dir.insert(name, Node::Directory { digest, size })?;
        }
        let size = dir.size();
        made[i] = Some((txn.put_directory(&dir)?, size));
    }
    txn.commit()?;
    match made[0] {
        Some((d, _)) => Ok(d),
        None => Err(CasError::Other("the input root was not made".into())),
    }
}

/// What a path of the tree `root` is: a node, or nothing (a missing
/// component, or one that is not a directory). `""` is the root itself.
pub fn find(store: &LocalStore, root: &Digest, path: &str) -> Result<Option<Node>, CasError> {
    let mut node = Node::Directory {
        digest: *root,
        size: 0,
    };
    if path.is_empty() {
        return Ok(Some(node));
    }
    for c in path.split('/') {
        let Node::Directory { digest, .. } = &node else {
            return Ok(None);
        };
        let dir = store.get_directory(digest)?;
        match dir.get(c.as_bytes()) {
            Some(n) => node = n.clone(),
            None => return Ok(None),
        }
    }
    Ok(Some(node))
}

/// Every directory below (and including) `root`, and every blob they name.
pub fn subtree(
    store: &LocalStore,
    root: &Digest,
) -> Result<(HashMap<Digest, Directory>, Vec<Digest>), CasError> {
    let mut dirs = HashMap::new();
    let mut blobs = Vec::new();
    let mut stack = vec![*root];
    while let Some(d) = stack.pop() {
        if dirs.contains_key(&d) {
            continue;
        }
        let dir = store.get_directory(&d)?;
        for (_, n) in dir.entries() {
            match n {
                Node::Directory { digest, .. } => stack.push(*digest),
                Node::File { digest, .. } => blobs.push(*digest),
                Node::Symlink { .. } => {}
            }
        }
        dirs.insert(d, dir);
    }
    blobs.sort();
    blobs.dedup();
    Ok((dirs, blobs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use castore::SymlinkTarget;

    fn name(n: &str) -> Name {
        Name::new(n.as_bytes()).unwrap()
    }

    /// A real store holding `{a/{f}, f, l -> a}`.
    fn input_root() -> (tempfile::TempDir, LocalStore, Digest) {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let blob = store.put_blob(b"x").unwrap();
        let file = Node::File {
            digest: blob,
            size: 1,
            executable: false,
        };
        let mut a = Directory::new();
        a.insert(name("f"), file.clone()).unwrap();
        let a_d = store.put_directory(&a).unwrap();
        let mut root = Directory::new();
        root.insert(
            name("a"),
            Node::Directory {
                digest: a_d,
                size: a.size(),
            },
        )
        .unwrap();
        root.insert(name("f"), file).unwrap();
        root.insert(
            name("l"),
            Node::Symlink {
                target: SymlinkTarget::new("a").unwrap(),
            },
        )
        .unwrap();
        let root_d = store.put_directory(&root).unwrap();
        (t, store, root_d)
    }

    fn kind(store: &LocalStore, root: &Digest, path: &str) -> Option<&'static str> {
        find(store, root, path).unwrap().map(|n| match n {
            Node::File { .. } => "file",
            Node::Directory { .. } => "directory",
            Node::Symlink { .. } => "symlink",
        })
    }

    #[test]
    fn directories_are_made_where_missing_and_inputs_kept() {
        let (_t, store, root) = input_root();
        let dirs = ["a/b/c".to_owned(), "x/y".to_owned(), "a".to_owned()];
        let made = with_dirs(&store, &root, &dirs).unwrap();
        for (path, want) in [
            ("", Some("directory")),
            ("a", Some("directory")),
            ("a/f", Some("file")),
            ("a/b/c", Some("directory")),
            ("x/y", Some("directory")),
            ("f", Some("file")),
            ("l", Some("symlink")),
            // Not followed: a path through a symlink or a file is missing.
            ("l/f", None),
            ("f/g", None),
            ("nothing", None),
        ] {
            assert_eq!(kind(&store, &made, path), want, "{path}");
        }
        // Nothing to make: the same tree; already there: the same digest.
        assert_eq!(with_dirs(&store, &root, &[]).unwrap(), root);
        assert_eq!(with_dirs(&store, &made, &dirs).unwrap(), made);
        let sizes = store.get_directory(&made).unwrap().size();
        assert_eq!(sizes, 8, "a, a/f, a/b, a/b/c, f, l, x and x/y");
    }

    #[test]
    fn a_directory_through_a_file_or_symlink_is_refused_naming_it() {
        let (_t, store, root) = input_root();
        for (path, says) in [("f/out", "f is a file"), ("l/out", "l is a symlink")] {
            let e = with_dirs(&store, &root, &[path.to_owned()]).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e}");
            assert!(e.to_string().contains(says), "{path}: {e}");
        }
    }

    #[test]
    fn the_map_names_a_converted_tree_and_is_only_ever_a_shortcut() {
        let (_t, store, root) = input_root();
        let n = store.get_directory(&root).unwrap().size();
        let sha = mapping::sha256_digest(b"the REAPI form of the input root");
        let index = Index::open(&store);
        assert_eq!(index.known_whole(&store, &sha), None, "nothing yet");
        index.put_dir(&sha, &root);
        assert_eq!(index.known_whole(&store, &sha), Some((root, n)));
        // Another process (a new handle) finds it too, after one walk.
        assert_eq!(
            Index::open(&store).known_whole(&store, &sha),
            Some((root, n))
        );

        // An entry torn (written without a sync), in the form before keys,
        // or under another key is no entry: the work is done again.
        let path = index.sha_path(&sha);
        let entry = std::fs::read_to_string(&path).unwrap();
        let other = mapping::sha256_digest(b"another directory");
        for (what, at, text) in [
            ("no newline", &path, entry.trim_end().to_owned()),
            ("half", &path, entry[..entry.len() / 2].to_owned()),
            ("empty", &path, String::new()),
            ("keyless", &path, format!("dir {root}\n")),
            ("another key", &path, entry.replace(&sha.hash, &other.hash)),
            ("misplaced", &index.sha_path(&other), entry.clone()),
        ] {
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(at, &text).unwrap();
            let key = if what == "misplaced" { &other } else { &sha };
            let got = Index::open(&store).known_whole(&store, key);
            assert_eq!(got, None, "{what}: {text:?}");
        }
        std::fs::write(&path, &entry).unwrap();

        // A tree with a hole (a blob lost since, as a gc killed between its
        // sweeps of blobs and of directories would leave) is not taken.
        let blob = store.put_blob(b"x").unwrap();
        let at = store.object_path(ObjectKind::Blob, &blob);
        let kept = std::fs::read(&at).unwrap();
        std::fs::remove_file(&at).unwrap();
        assert!(store.has(ObjectKind::Directory, &root));
        assert_eq!(Index::open(&store).known_whole(&store, &sha), None);
        // This handle found it whole before: it walks no more (once per
        // process), and the tree it names is still the store's.
        assert_eq!(index.known_whole(&store, &sha), Some((root, n)));
        std::fs::write(&at, kept).unwrap();
        assert_eq!(
            Index::open(&store).known_whole(&store, &sha),
            Some((root, n))
        );
        // The tree gone: no entry, whoever asks.
        std::fs::remove_file(store.object_path(ObjectKind::Directory, &root)).unwrap();
        assert_eq!(index.known_whole(&store, &sha), None);

        // Blobs both ways, each entry naming its key.
        let bsha = mapping::sha256_digest(b"x");
        index.put_blob(&bsha, &blob);
        assert_eq!(index.get(&store, &bsha), Some(Known::Blob(blob)));
        assert_eq!(index.sha_of_blob(&store, &blob).unwrap(), bsha);
        std::fs::write(index.b3_path(&blob), format!("{} 1\n", "0".repeat(64))).unwrap();
        assert_eq!(
            index.sha_of_blob(&store, &blob).unwrap(),
            bsha,
            "a keyless reverse entry is hashed again"
        );
    }

    #[test]
    fn a_deep_path_is_made_without_recursion() {
        // Deeper than a recursive walk's stack would allow on a test thread.
        let (_t, store, root) = input_root();
        let deep = vec!["d"; 20_000].join("/");
        let made = with_dirs(&store, &root, std::slice::from_ref(&deep)).unwrap();
        assert_eq!(kind(&store, &made, &deep), Some("directory"));
        assert_eq!(kind(&store, &made, "a/f"), Some("file"));
    }
}
