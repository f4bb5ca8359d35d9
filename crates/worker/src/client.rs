//! The client side: `fhsx build --remote ADDR ACTION.toml`.
//!
//! [`Client`] is a blocking handle on one connection (its own single-thread
//! runtime drives the RPC while a call is waited on). [`Client::build`]
//! does the whole remote build: ask which input objects the worker lacks
//! (level by level, so a tree the worker has is never walked), upload those
//! (small blobs batched, large ones streamed, directories children-first),
//! run the build with the log streamed to the caller, then download the
//! record, the output tree, the view's directories and the log, read-set
//! and manifest blobs into the local store, and verify the record against
//! the worker's key.
//!
//! **Uploads.** The client walks its inputs level by level, claiming each
//! level's files as soon as read (two claims in flight, no `findMissing`
//! for blobs) and putting what is claimed straight into batches, which may
//! span levels; the stages pass digests, never bytes. The worker looks up
//! many objects on rayon's threads (`LocalStore::has_each`), takes claims
//! before looking and drops them for what is there, so nothing lands
//! between a look and its claim (`Shared::reserve_absent`), names every
//! claimed blob in its unsynced log in one write, and hashes each blob once
//! (`CheckedBlob`: the check is the hash the store files it under). Blobs
//! go in 960 KiB batches, eight in flight, each filled when its turn comes;
//! a blob no batch holds is streamed in 960 KiB chunks (`CHUNK`) beside
//! them. No message reaches 1 MiB (`HEAP_MESSAGE_MAX`, each blob's entry
//! counted as 96 bytes), so glibc serves it from the heap, not as a fresh
//! mapping faulted in page by page. Directories follow, children first, in
//! calls of at most 960 KiB, and are linked in place a level at a time on
//! rayon's threads. A directory no message can carry is refused as bad
//! input by the client, or — a build's output — by the worker's
//! `getDirectory`, saying to split it (exit 1; both ask
//! `too_big_for_a_message`).
//!
//! **Downloads.** The client checks the record's digest and signature and
//! fetches every object it names that it lacks, each hashed on arrival (a
//! mismatch or wrong size is a record that does not verify, exit 3, and
//! nothing is kept): directories a level at a time, eight calls in flight;
//! small blobs in `getBlobs` batches (960 KiB with entries, checked against
//! the sizes and digests the directories name; the worker takes a download
//! turn, checks sizes before reading, refuses more than a batch); big blobs
//! one at a time (more at once made stalled clients cost the worker more).
//! It then checks only presence (`sign::Depth::Present`): its store hashed
//! every object on the way in, and re-hashing the whole view was most of a
//! small remote action; `fhsx record verify` re-hashes all
//! (`Depth::Rehash`). `--json`'s `remote.upload_seconds` runs from the
//! client's first question about the inputs to the worker's answer to the
//! last upload.
//!
//! **Transport.** Over a UNIX socket the client widens its send buffer to
//! 4 MiB (a stream socket holds at most its sender's buffer in flight, and
//! the two event loops took turns waking each other); TCP keeps the
//! kernel's autotuning, which a set size turns off. TLS reads through a 256
//! KiB buffer (rustls takes one 16 KiB record per call) and writes
//! unbuffered (all pending records, up to 256 KiB, in one vectored write: a
//! buffer would copy every byte again), so a TCP connection costs up to 512
//! KiB from its handshake. The worker and a remote build's client keep 16
//! MiB of heap top (`M_TOP_PAD`, not process-wide: keeping freed heap
//! slowed `fhsx store import`), since returning it made every batch fault
//! in and zero fresh pages; and one allocator arena per core
//! (`M_ARENA_MAX`), since hundreds of blocking threads each took an arena
//! that kept what it freed.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::Path;
use std::rc::Rc;

use capnp_rpc::{rpc_twoparty_capnp::Side, twoparty, RpcSystem};
use castore::store::{DirectoryStore, LocalStore, ObjectKind};
use castore::{Digest, Directory, Node};
use executor_core::{Action, CachePolicy, CheckReport, ExitClass, NetworkMode, SignedRecord};
use futures::channel::mpsc;
use futures::{AsyncReadExt, StreamExt, TryStreamExt};

use crate::worker_capnp::{
    blob_upload, byte_sink, cas, executor, gate, log_sink, CachePolicy as WirePolicy,
    ExitClass as WireClass,
};
use crate::{reader_options, Endpoint, Error, BATCH_BYTES, CHUNK, PROTOCOL_VERSION};

/// What one blob adds to a `putBlobs` message besides its bytes, counted
/// against [`BATCH_BYTES`] so that a batch of many tiny blobs stays under
/// [`crate::HEAP_MESSAGE_MAX`] too: its list entry (two pointers), its digest,
/// the padding of its data to a word and, where the builder starts a new
/// segment, a far pointer (72 bytes for a 1-byte blob, measured by
/// `no_upload_message_reaches_the_heap_limit`; counted as 64, 15,123
/// such blobs made a message of 1,088,912 bytes).
const BLOB_ENTRY_BYTES: usize = 96;
/// What one directory adds to a `putDirectories` message besides its
/// encoding: its list entry (a pointer) and the padding to a word.
const DIR_ENTRY_BYTES: usize = 16;
/// Digests per `findMissing` call.
const FIND_BATCH: usize = 50_000;
/// Upload calls in flight at once, batches and streams each.
const IN_FLIGHT: usize = 8;

/// What moved over the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Transfer {
    pub blobs: u64,
    pub bytes: u64,
    pub directories: u64,
}

/// What an upload's concurrent stages learn as they go.
#[derive(Default)]
struct UploadState {
    /// The directories the worker lacks, read from the local store.
    missing_dirs: RefCell<HashMap<Digest, Directory>>,
    /// Each file's size, as its directory names it.
    blob_sizes: RefCell<HashMap<Digest, u64>>,
    /// Blobs another client was uploading when claimed.
    others: RefCell<Vec<Digest>>,
    transfer: RefCell<Transfer>,
}

impl UploadState {
    /// The size of blob `d`, as its directory named it or else as the
    /// local store has it; counted as sent.
    fn size_of(&self, store: &LocalStore, d: Digest) -> Result<u64, Upload> {
        let named = self.blob_sizes.borrow().get(&d).copied();
        let size = named
            .or_else(|| store.object_len(ObjectKind::Blob, &d))
            .ok_or(castore::Error::Missing {
                digest: d,
                path: None,
            })?;
        let mut t = self.transfer.borrow_mut();
        t.blobs += 1;
        t.bytes += size;
        Ok(size)
    }
}

/// Why an upload stopped: the call or the connection failed, or this side
/// could not go on (its store, a directory too big for any message),
/// reported as itself.
enum Upload {
    Rpc(capnp::Error),
    Local(Error),
}

impl From<capnp::Error> for Upload {
    fn from(e: capnp::Error) -> Self {
        Upload::Rpc(e)
    }
}

impl From<castore::Error> for Upload {
    fn from(e: castore::Error) -> Self {
        Upload::Local(Error::Store(e))
    }
}

/// Objects gathered into one call of at most [`BATCH_BYTES`], each
/// counted with what its entry adds. One that no batch can hold still goes,
/// alone.
struct Batch<T> {
    items: Vec<T>,
    bytes: usize,
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            bytes: 0,
        }
    }
}

impl<T> Batch<T> {
    /// Add an object taking `cost` bytes; the batch before it, if it would
    /// not fit.
    fn push(&mut self, item: T, cost: usize) -> Option<Vec<T>> {
        let full = (self.bytes + cost > BATCH_BYTES && !self.items.is_empty())
            .then(|| std::mem::take(self).items);
        self.bytes += cost;
        self.items.push(item);
        full
    }
}

/// Small blobs for one `putBlobs` call. A blob no batch can hold
/// ([`holds`](Self::holds)) is streamed instead.
impl Batch<(Digest, u64)> {
    /// What a blob of `size` bytes takes of a batch.
    fn cost(size: u64) -> u64 {
        size + BLOB_ENTRY_BYTES as u64
    }

    /// Whether a batch can hold a blob of `size` bytes at all.
    fn holds(size: u64) -> bool {
        Self::cost(size) <= BATCH_BYTES as u64
    }

    /// Add a blob; the batch before it, if it would not fit.
    fn add(&mut self, d: Digest, size: u64) -> Option<Vec<(Digest, u64)>> {
        self.push((d, size), Self::cost(size) as usize)
    }
}

/// Why a download stopped: the call or the connection failed, the local
/// store could not take an object, or the worker sent something other
/// than what was asked for (refused: an integrity failure).
enum Download {
    Rpc(capnp::Error),
    Store(castore::Error),
    Refused(String),
}

impl From<capnp::Error> for Download {
    fn from(e: capnp::Error) -> Self {
        Download::Rpc(e)
    }
}

impl From<castore::Error> for Download {
    fn from(e: castore::Error) -> Self {
        Download::Store(e)
    }
}

/// How a stage's failure is reported ([`Client::run_stage`]).
trait StageError {
    fn into_error(self, client: &Client) -> Error;
}

impl StageError for Download {
    /// Bytes that are not what was asked for make the record's outputs
    /// unverifiable (exit 3), not a failed call.
    fn into_error(self, client: &Client) -> Error {
        match self {
            Download::Rpc(e) => client.rpc_error(e),
            Download::Store(e) => Error::Store(e),
            Download::Refused(reason) => Error::BadRecord {
                endpoint: client.endpoint.clone(),
                reason: format!("its outputs: {reason}: refused"),
            },
        }
    }
}

impl StageError for Upload {
    fn into_error(self, client: &Client) -> Error {
        match self {
            Upload::Rpc(e) => client.rpc_error(e),
            Upload::Local(e) => e,
        }
    }
}

/// A finished remote build.
#[derive(Debug, Clone)]
pub struct RemoteOutcome {
    pub record_digest: Digest,
    pub record: SignedRecord,
    /// Answered from a cache (the client's or the worker's): nothing ran.
    pub cached: bool,
    /// With [`CachePolicy::Check`]: the worker's comparison.
    pub check: Option<CheckReport>,
    /// The key the worker reported, which signed the record.
    pub worker_key: String,
    pub uploaded: Transfer,
    /// From the first question about the inputs to the worker's answer to
    /// the last upload: what [`Self::uploaded`] took.
    pub upload_time: std::time::Duration,
    pub downloaded: Transfer,
}

/// The worker's counters (`Executor.stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub blobs_written: u64,
    pub blob_bytes_written: u64,
    pub directories_written: u64,
    pub bytes_received: u64,
    pub builds_started: u64,
    pub builds_running: u32,
    pub builds_queued: u32,
    pub max_concurrent_builds: u32,
    pub jobs: u32,
}

/// One connection to a worker.
pub struct Client {
    rt: tokio::runtime::Runtime,
    local: tokio::task::LocalSet,
    endpoint: String,
    executor: executor::Client,
    cas: cas::Client,
    /// The worker's protocol version, name and signing key.
    pub protocol: u32,
    pub executor_name: String,
    pub public_key: String,
}

struct LogSinkImpl(Rc<RefCell<Box<dyn Write>>>);

impl log_sink::Server for LogSinkImpl {
    async fn write(self: Rc<Self>, params: log_sink::WriteParams) -> Result<(), capnp::Error> {
        let chunk = params.get()?.get_chunk()?;
        let mut w = self.0.borrow_mut();
        // A closed terminal is not a reason to fail the build.
        let _ = w.write_all(chunk).and_then(|_| w.flush());
        Ok(())
    }
}

/// Receives a blob into an unnamed temporary file: bounded memory for any
/// size.
struct ByteSinkImpl {
    file: Rc<RefCell<std::fs::File>>,
    written: std::cell::Cell<u64>,
    limit: u64,
}

impl byte_sink::Server for ByteSinkImpl {
    async fn write(self: Rc<Self>, params: byte_sink::WriteParams) -> Result<(), capnp::Error> {
        let chunk = params.get()?.get_chunk()?;
        let n = self.written.get() + chunk.len() as u64;
        if n > self.limit {
            return Err(capnp::Error::failed(format!(
                "the worker sent more than the {} bytes the tree names",
                self.limit
            )));
        }
        self.written.set(n);
        self.file
            .borrow_mut()
            .write_all(chunk)
            .map_err(|e| capnp::Error::failed(format!("writing a downloaded blob: {e}")))
    }
}

/// What [`Client::ask_raw`] asks for.
pub enum Ask {
    /// `getDirectory` of this digest.
    Directory(Digest),
    /// `getBlobs` of these digests.
    Blobs(Vec<Digest>),
    /// The worker's counters, a small answer.
    Stats,
}

/// What [`Client::stall_transfers_raw`] saw.
#[derive(Debug, Default, Clone)]
pub struct StalledTransfers {
    pub opened_at_probe: usize,
    pub begun_at_probe: usize,
    pub opened_at_hold: usize,
    pub begun_at_hold: usize,
    /// Finishes at `hold` that the worker refused, and the last refusal.
    pub finishes_refused: usize,
    pub refusal: String,
}

/// A download's sink that counts its first chunk and never takes it.
struct StallingSink {
    begun: Rc<std::cell::Cell<usize>>,
}

impl byte_sink::Server for StallingSink {
    async fn write(self: Rc<Self>, _: byte_sink::WriteParams) -> Result<(), capnp::Error> {
        self.begun.set(self.begun.get() + 1);
        futures::future::pending().await
    }
}

fn raw_list(mut l: capnp::data_list::Builder, items: &[&[u8]]) {
    for (i, d) in items.iter().enumerate() {
        l.set(i as u32, d);
    }
}

/// What a UNIX socket's send buffer is widened to: a few upload batches.
const UNIX_SEND_BUFFER: libc::c_int = 4 << 20;

/// Widen the send buffer of the connection to a worker over a UNIX socket.
/// A stream socket there holds at most its sender's buffer in flight —
/// 208 KiB by default, a fifth of one upload batch — so each batch went
/// over in a dozen rounds of the two event loops waking each other; 4 MiB
/// took a tenth off the hello toolchain's upload (interleaved runs). As
/// root past `net.core.wmem_max`; otherwise up to it. TCP keeps the
/// kernel's autotuning, which setting a size would turn off. Best effort.
fn widen_send_buffer(s: &tokio::net::UnixStream) {
    use std::os::fd::AsRawFd;
    let size = UNIX_SEND_BUFFER;
    let set = |opt| {
        // SAFETY: a valid socket and an int-sized option value.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if set(libc::SO_SNDBUFFORCE) != 0 {
        set(libc::SO_SNDBUF);
    }
}

impl Client {
    /// Connect (TLS on TCP), check the protocol version and, on TCP, that
    /// the TLS certificate is bound to the worker's record key — and that
    /// key is in `trust` when that is not empty — and only then present
    /// `token` (the worker's access token; empty for a worker that has
    /// none).
    pub fn connect(endpoint: &Endpoint, token: &[u8], trust: &[String]) -> Result<Client, Error> {
        use tokio_util::compat::TokioAsyncReadCompatExt;
        let ep = endpoint.to_string();
        let io = |what: &'static str| {
            let ep = ep.clone();
            move |source| Error::Io {
                what,
                endpoint: ep,
                source,
            }
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(io("start a runtime to reach"))?;
        let local = tokio::task::LocalSet::new();
        let mut tls_cert: Option<Vec<u8>> = None;
        let connected = local.block_on(&rt, async {
            let (r, w): (
                Box<dyn futures::AsyncRead + Unpin>,
                Box<dyn futures::AsyncWrite + Unpin>,
            ) = match endpoint {
                Endpoint::Tcp(a) => {
                    let s = tokio::net::TcpStream::connect(a)
                        .await
                        .map_err(io("connect to the worker at"))?;
                    let _ = s.set_nodelay(true);
                    let (cfg, seen) = crate::tls::client_config().map_err(Error::Usage)?;
                    let name = rustls::pki_types::ServerName::try_from(crate::tls::SERVER_NAME)
                        .map_err(|e| Error::Usage(e.to_string()))?;
                    let mut t = tokio_rustls::TlsConnector::from(cfg)
                        .connect(name, crate::tls::buffered(s))
                        .await
                        .map_err(io("finish the TLS handshake with the worker at"))?;
                    crate::tls::widen_sends(t.get_mut().1);
                    tls_cert = seen.lock().unwrap_or_else(|p| p.into_inner()).take();
                    let (r, w) = crate::tls::CleanEof(t.compat()).split();
                    (Box::new(r), Box::new(w))
                }
                Endpoint::Unix(p) => {
                    let s = tokio::net::UnixStream::connect(p)
                        .await
                        .map_err(io("connect to the worker at"))?;
                    widen_send_buffer(&s);
                    let (r, w) = s.compat().split();
                    (Box::new(r), Box::new(w))
                }
            };
            let network = twoparty::VatNetwork::new(
                futures::io::BufReader::with_capacity(256 << 10, r),
                futures::io::BufWriter::with_capacity(256 << 10, w),
                Side::Client,
                reader_options(),
            );
            let mut rpc = RpcSystem::new(Box::new(network), None);
            let gate: gate::Client = rpc.bootstrap(Side::Server);
            tokio::task::spawn_local(async move {
                let _ = rpc.await;
            });
            let rpc_err = |source| Error::Rpc {
                endpoint: ep.clone(),
                source,
            };
            let v = gate
                .version_request()
                .send()
                .promise
                .await
                .map_err(rpc_err)?;
            let v = v.get().map_err(rpc_err)?;
            let text = |t: capnp::Result<capnp::text::Reader>| -> Result<String, capnp::Error> {
                Ok(t?.to_string()?)
            };
            let name = text(v.get_executor()).map_err(rpc_err)?;
            let key = text(v.get_public_key()).map_err(rpc_err)?;
            let protocol = v.get_protocol();
            if protocol != PROTOCOL_VERSION {
                return Err(Error::Version {
                    endpoint: ep.clone(),
                    worker: protocol,
                    client: PROTOCOL_VERSION,
                });
            }
            // Whom did we reach? Settle it before the token leaves.
            if let Some(cert) = &tls_cert {
                let binding = v.get_tls_binding().map_err(rpc_err)?;
                if !fhs_executor::sign::verify_tls_binding(&key, cert, binding) {
                    return Err(Error::Untrusted {
                        endpoint: ep.clone(),
                        reason: format!(
                            "its TLS certificate is not bound to the key {key} it names: something between us and the worker answered"
                        ),
                    });
                }
            }
            if !trust.is_empty() && !trust.iter().any(|k| k.trim() == key) {
                return Err(Error::Untrusted {
                    endpoint: ep.clone(),
                    reason: format!("its key {key} is not in --trust; nothing was sent to it"),
                });
            }
            let mut login = gate.login_request();
            login.get().set_protocol(PROTOCOL_VERSION);
            login.get().set_token(token);
            let logged_in = login.send().promise.await.map_err(|e| {
                if e.extra.contains("access denied") {
                    Error::Denied {
                        endpoint: ep.clone(),
                    }
                } else {
                    rpc_err(e)
                }
            })?;
            let executor = logged_in
                .get()
                .and_then(|r| r.get_executor())
                .map_err(rpc_err)?;
            let cas = executor.cas_request().send().pipeline.get_cas();
            Ok::<_, Error>((executor, protocol, name, key, cas))
        })?;
        let (executor, protocol, name, key, cas) = connected;
        let c = Client {
            rt,
            local,
            endpoint: ep,
            cas,
            executor,
            protocol,
            executor_name: name,
            public_key: key,
        };
        Ok(c)
    }

    fn rpc_error(&self, e: capnp::Error) -> Error {
        if e.kind == capnp::ErrorKind::Disconnected {
            Error::Rpc {
                endpoint: self.endpoint.clone(),
                source: capnp::Error::disconnected(format!(
                    "the connection was lost ({}); the worker went away and the build did not finish, retry it",
                    e.extra
                )),
            }
        } else {
            Error::Rpc {
                endpoint: self.endpoint.clone(),
                source: e,
            }
        }
    }

    fn run<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, capnp::Error>>,
    ) -> Result<T, Error> {
        self.local
            .block_on(&self.rt, f)
            .map_err(|e| self.rpc_error(e))
    }

    /// As [`Client::run`], for a stage whose failures are not all the
    /// call's: a download's refused bytes, an upload's local store.
    fn run_stage<T, E: StageError>(
        &self,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, Error> {
        self.local
            .block_on(&self.rt, f)
            .map_err(|e| e.into_error(self))
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The worker's counters.
    pub fn stats(&self) -> Result<Stats, Error> {
        self.run(async {
            let r = self.executor.stats_request().send().promise.await?;
            let s = r.get()?.get_stats()?;
            Ok(Stats {
                blobs_written: s.get_blobs_written(),
                blob_bytes_written: s.get_blob_bytes_written(),
                directories_written: s.get_directories_written(),
                bytes_received: s.get_bytes_received(),
                builds_started: s.get_builds_started(),
                builds_running: s.get_builds_running(),
                builds_queued: s.get_builds_queued(),
                max_concurrent_builds: s.get_max_concurrent_builds(),
                jobs: s.get_jobs(),
            })
        })
    }

    /// Which of these objects the worker lacks.
    pub fn find_missing(
        &self,
        blobs: &[Digest],
        dirs: &[Digest],
    ) -> Result<(Vec<Digest>, Vec<Digest>), Error> {
        self.run(self.find_missing_async(blobs, dirs))
    }

    async fn find_missing_async(
        &self,
        blobs: &[Digest],
        dirs: &[Digest],
    ) -> Result<(Vec<Digest>, Vec<Digest>), capnp::Error> {
        let mut mb = Vec::new();
        let mut md = Vec::new();
        let n = blobs.len().max(dirs.len());
        let mut i = 0;
        while i < n.max(1) {
            let b = &blobs[i.min(blobs.len())..(i + FIND_BATCH).min(blobs.len())];
            let d = &dirs[i.min(dirs.len())..(i + FIND_BATCH).min(dirs.len())];
            let mut req = self.cas.find_missing_request();
            {
                let mut p = req.get();
                crate::set_digest_list(p.reborrow().init_blobs(b.len() as u32), b);
                crate::set_digest_list(p.init_directories(d.len() as u32), d);
            }
            let r = req.send().promise.await?;
            let r = r.get()?;
            mb.extend(crate::digest_list(r.get_blobs()?)?);
            md.extend(crate::digest_list(r.get_directories()?)?);
            i += FIND_BATCH;
        }
        Ok((mb, md))
    }

    /// `findMissing` of one blob digest given as raw bytes (for tests of
    /// hostile input).
    pub fn find_missing_raw_digest(&self, digest: &[u8]) -> Result<(), Error> {
        self.run(async {
            let mut req = self.cas.find_missing_request();
            raw_list(req.get().init_blobs(1), &[digest]);
            req.send().promise.await?;
            Ok(())
        })
    }

    /// `putBlobs` with digests as given (for tests of hostile input).
    pub fn put_blobs_raw(&self, blobs: &[(&[u8], &[u8])]) -> Result<(), Error> {
        self.run(async {
            let mut req = self.cas.put_blobs_request();
            let mut l = req.get().init_blobs(blobs.len() as u32);
            for (i, (d, data)) in blobs.iter().enumerate() {
                let mut b = l.reborrow().get(i as u32);
                b.set_digest(d);
                b.set_data(data);
            }
            req.send().promise.await?;
            Ok(())
        })
    }

    /// For tests of hostile input: on this one connection, begin an upload
    /// of `data` and stall it (so the worker's claim on it is held), then
    /// send `calls` batches of `data` at once, each of which waits for that
    /// claim; how many were answered within `hold`.
    pub fn batches_behind_a_claim_raw(
        &self,
        data: &[u8],
        calls: usize,
        hold: std::time::Duration,
    ) -> Result<usize, Error> {
        let d = Digest::of(data);
        let answered = std::cell::Cell::new(0);
        self.run(async {
            let up = self.begin_upload(d.as_bytes(), data.len() as u64).await?;
            let up = up.ok_or_else(|| capnp::Error::failed("the worker had the blob".into()))?;
            send_chunk(&up, &data[..1024.min(data.len())]).await?;
            let batches = (0..calls).map(|_| async {
                let mut req = self.cas.put_blobs_request();
                let mut b = req.get().init_blobs(1).get(0);
                b.set_digest(d.as_bytes());
                b.set_data(data);
                if req.send().promise.await.is_ok() {
                    answered.set(answered.get() + 1);
                }
            });
            let _ = tokio::time::timeout(hold, futures::future::join_all(batches)).await;
            drop(up);
            Ok(answered.get())
        })
    }

    /// For tests of hostile input: on this one connection, stall `stalled`
    /// downloads of `blob` (bigger than two chunks) into sinks that never
    /// take a chunk, and once the worker has begun them all, ask for
    /// `batch` in one `getBlobs`; how long its answer took, if it came
    /// within `hold`.
    pub fn batch_behind_stalled_downloads_raw(
        &self,
        blob: Digest,
        stalled: usize,
        batch: &[Digest],
        hold: std::time::Duration,
    ) -> Result<Option<std::time::Duration>, Error> {
        self.run(async {
            // Held in flight to the end of this block: dropping them would
            // give their turns back.
            let _stalled = self.stall_downloads(blob, stalled, hold).await?;
            let asked = std::time::Instant::now();
            let mut req = self.cas.get_blobs_request();
            crate::set_digest_list(req.get().init_digests(batch.len() as u32), batch);
            match tokio::time::timeout(hold, req.send().promise).await {
                Ok(got) => {
                    got?;
                    Ok(Some(asked.elapsed()))
                }
                Err(_) => Ok(None),
            }
        })
    }

    /// For tests of hostile input: on this one connection, hold the
    /// download turns with stalled downloads of `blob` (bigger than two
    /// chunks), then send `n` more `getBlob`s, each of which waits for a
    /// turn, and cancel them, a round at a time of as many as the
    /// connection's call cap leaves open beside the stalled ones; then ask
    /// for the counters, which must come back within `hold`.
    pub fn cancel_calls_raw(
        &self,
        blob: Digest,
        n: usize,
        hold: std::time::Duration,
    ) -> Result<(), Error> {
        self.run(async {
            let turns = crate::transfers::DOWNLOADS_PER_CONNECTION;
            let _stalled = self.stall_downloads(blob, turns, hold).await?;
            let mut left = n;
            while left > 0 {
                // One below the cap, so that the worker still reads the
                // cancellations: at the cap it reads nothing until a call ends.
                let round = left.min(crate::inflight::CALLS_PER_CONNECTION - turns - 1);
                let waiting: Vec<_> = (0..round)
                    .map(|_| self.stalled_get_blob(blob, Rc::default()))
                    .collect();
                tokio::task::yield_now().await;
                drop(waiting);
                left -= round;
            }
            // Every cancellation read: the counters answered after them.
            let stats = self.executor.stats_request().send().promise;
            match tokio::time::timeout(hold, stats).await {
                Ok(got) => got.map(drop),
                Err(_) => Err(capnp::Error::failed(format!(
                    "no answer within {hold:?} after {n} cancelled calls"
                ))),
            }
        })
    }

    /// A `getBlob` of `blob` into a sink that never takes a chunk, counting
    /// in `begun` the chunks the worker began to send.
    fn stalled_get_blob(
        &self,
        blob: Digest,
        begun: Rc<std::cell::Cell<usize>>,
    ) -> capnp::capability::Promise<
        capnp::capability::Response<cas::get_blob_results::Owned>,
        capnp::Error,
    > {
        let mut req = self.cas.get_blob_request();
        req.get().set_digest(blob.as_bytes());
        req.get()
            .set_sink(capnp_rpc::new_client(StallingSink { begun }));
        req.send().promise
    }

    /// `n` downloads of `blob` into sinks that never take a chunk, once the
    /// worker has begun them all (within `hold`); they stay in flight while
    /// the returned future is held.
    async fn stall_downloads(
        &self,
        blob: Digest,
        n: usize,
        hold: std::time::Duration,
    ) -> Result<impl std::future::Future + '_, capnp::Error> {
        let begun = Rc::new(std::cell::Cell::new(0));
        let gets = (0..n).map(|_| self.stalled_get_blob(blob, begun.clone()));
        let gets = futures::future::join_all(gets);
        let _ = tokio::time::timeout(hold, async {
            while begun.get() < n {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
        if begun.get() < n {
            return Err(capnp::Error::failed(format!(
                "the worker began {} of {n} downloads",
                begun.get()
            )));
        }
        Ok(gets)
    }

    /// `putBlob` streamed in the given chunks, announcing `size`. False if
    /// the worker already had it (nothing was sent).
    pub fn put_blob_raw(&self, digest: &[u8], size: u64, chunks: &[&[u8]]) -> Result<bool, Error> {
        self.run(async {
            let Some(up) = self.begin_upload(digest, size).await? else {
                return Ok(false);
            };
            for c in chunks {
                send_chunk(&up, c).await?;
            }
            up.finish_request().send().promise.await?;
            Ok(true)
        })
    }

    /// For tests of hostile input: on this one connection, ask at once for
    /// `uploads` upload streams of made-up blobs, writing one small chunk
    /// to each the worker opens, and for `downloads` downloads of `blob`
    /// (bigger than two chunks) into sinks that never take a chunk; then
    /// hold everything, counting what the worker has opened and begun at
    /// `probe` and at `hold`. At `hold`, with `finish`, every stream
    /// opened by then is finished.
    pub fn stall_transfers_raw(
        &self,
        uploads: usize,
        blob: Digest,
        downloads: usize,
        probe: std::time::Duration,
        hold: std::time::Duration,
        finish: bool,
    ) -> Result<StalledTransfers, Error> {
        let opened: RefCell<Vec<blob_upload::Client>> = RefCell::default();
        let begun = Rc::new(std::cell::Cell::new(0));
        self.run(async {
            // Made up anew by every call, so that stalled uploads on other
            // connections are not waiting on each other's claims.
            static MADE_UP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let asks = (0..uploads).map(|_| {
                let opened = &opened;
                let n = MADE_UP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async move {
                    let made_up = Digest::of(
                        format!("stalled upload {n} of process {}", std::process::id()).as_bytes(),
                    );
                    let up = self.begin_upload(made_up.as_bytes(), 1 << 20).await?;
                    let up = up.ok_or_else(|| capnp::Error::failed("the worker had it".into()))?;
                    send_chunk(&up, &[0; 1024]).await?;
                    opened.borrow_mut().push(up);
                    futures::future::pending::<()>().await;
                    Ok::<(), capnp::Error>(())
                }
            });
            let gets = (0..downloads).map(|_| {
                let begun = begun.clone();
                async move {
                    // Ended by the worker, or never: either way held.
                    let _ = self.stalled_get_blob(blob, begun).await;
                    futures::future::pending::<()>().await;
                    Ok::<(), capnp::Error>(())
                }
            });
            let all = futures::future::try_join(
                futures::future::try_join_all(asks),
                futures::future::try_join_all(gets),
            );
            futures::pin_mut!(all);
            let mut seen = StalledTransfers::default();
            // Ends only by an error: everything else is held.
            if let Ok(r) = tokio::time::timeout(probe, all.as_mut()).await {
                r?;
            }
            seen.opened_at_probe = opened.borrow().len();
            seen.begun_at_probe = begun.get();
            if let Ok(r) = tokio::time::timeout(hold.saturating_sub(probe), all.as_mut()).await {
                r?;
            }
            seen.opened_at_hold = opened.borrow().len();
            seen.begun_at_hold = begun.get();
            let streams = if finish {
                opened.borrow().clone()
            } else {
                Vec::new()
            };
            for up in streams {
                if let Err(e) = up.finish_request().send().promise.await {
                    seen.finishes_refused += 1;
                    seen.refusal = e.to_string();
                }
            }
            Ok(seen)
        })
    }

    /// For tests of hostile input: ask `n` times at once for what `ask`
    /// names and wait up to `hold` for the answers; how many came. Behind
    /// a peer that stops reading, as a client that never reads its answers.
    pub fn ask_raw(&self, ask: &Ask, n: usize, hold: std::time::Duration) -> Result<usize, Error> {
        let answered = std::cell::Cell::new(0);
        self.run(async {
            let asks = (0..n).map(|_| async {
                let got = match ask {
                    Ask::Directory(d) => {
                        let mut req = self.cas.get_directory_request();
                        req.get().set_digest(d.as_bytes());
                        req.send().promise.await.map(drop)
                    }
                    Ask::Blobs(ds) => {
                        let mut req = self.cas.get_blobs_request();
                        crate::set_digest_list(req.get().init_digests(ds.len() as u32), ds);
                        req.send().promise.await.map(drop)
                    }
                    Ask::Stats => self.executor.stats_request().send().promise.await.map(drop),
                };
                if got.is_ok() {
                    answered.set(answered.get() + 1);
                }
            });
            let _ = tokio::time::timeout(hold, futures::future::join_all(asks)).await;
            Ok(answered.get())
        })
    }

    /// `getBlobs` as given, the answer unchecked (for tests of what a
    /// worker refuses).
    pub fn get_blobs_raw(&self, digests: &[Digest]) -> Result<Vec<Vec<u8>>, Error> {
        self.run(async {
            let mut req = self.cas.get_blobs_request();
            crate::set_digest_list(req.get().init_digests(digests.len() as u32), digests);
            let r = req.send().promise.await?;
            let got = r.get()?.get_blobs()?;
            got.iter()
                .map(|b| Ok(b?.to_vec()))
                .collect::<Result<Vec<_>, capnp::Error>>()
        })
    }

    /// `putDirectory` of raw bytes (for tests of hostile input).
    pub fn put_directory_raw(&self, bytes: &[u8]) -> Result<Digest, Error> {
        self.run(async {
            let mut req = self.cas.put_directory_request();
            req.get().set_directory(bytes);
            let r = req.send().promise.await?;
            crate::digest_from(r.get()?.get_digest()?)
        })
    }

    /// `putDirectories` of raw bytes, in the order given (for tests of
    /// hostile input).
    pub fn put_directories_raw(&self, dirs: &[&[u8]]) -> Result<(), Error> {
        self.run(async {
            let mut req = self.cas.put_directories_request();
            raw_list(req.get().init_directories(dirs.len() as u32), dirs);
            req.send().promise.await?;
            Ok(())
        })
    }

    /// A blob's bytes, checked against its digest.
    pub fn get_blob(&self, digest: &Digest, limit: u64) -> Result<Vec<u8>, Error> {
        self.run(self.get_blob_async(*digest, limit))
    }

    async fn get_blob_async(&self, digest: Digest, limit: u64) -> Result<Vec<u8>, capnp::Error> {
        let mut f = self.get_blob_file(digest, limit).await?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)
            .map_err(|e| capnp::Error::failed(format!("reading a downloaded blob: {e}")))?;
        let got = Digest::of(&bytes);
        if got != digest {
            return Err(capnp::Error::failed(format!(
                "blob {digest} from the worker hashes to {got}: refused"
            )));
        }
        Ok(bytes)
    }

    /// Download a blob into a temporary file, rewound. Not yet checked
    /// against `digest`: the caller hashes it as it stores it.
    async fn get_blob_file(
        &self,
        digest: Digest,
        limit: u64,
    ) -> Result<std::fs::File, capnp::Error> {
        use std::io::Seek;
        let io = |e: std::io::Error| {
            capnp::Error::failed(format!("a temporary file for a download: {e}"))
        };
        let file = Rc::new(RefCell::new(tempfile::tempfile().map_err(io)?));
        let sink: byte_sink::Client = capnp_rpc::new_client(ByteSinkImpl {
            file: file.clone(),
            written: std::cell::Cell::new(0),
            limit,
        });
        let mut req = self.cas.get_blob_request();
        req.get().set_digest(digest.as_bytes());
        req.get().set_sink(sink);
        req.send().promise.await?;
        let mut f = file.borrow().try_clone().map_err(io)?;
        f.rewind().map_err(io)?;
        Ok(f)
    }

    /// Send `Executor.build` as given — any protocol number, the action's
    /// text unchecked, log discarded — and return the worker's answer: the
    /// record digest, or its failure. For tests of what a worker refuses.
    pub fn build_raw(
        &self,
        protocol: u32,
        action: &str,
        lock: &[u8],
    ) -> Result<Result<Digest, (ExitClass, String)>, Error> {
        let sink: log_sink::Client = capnp_rpc::new_client(LogSinkImpl(Rc::new(RefCell::new(
            Box::new(std::io::sink()),
        ))));
        self.run(async {
            let mut req = self.executor.build_request();
            {
                let mut p = req.get();
                p.set_protocol(protocol);
                p.set_action(action);
                p.set_lock(lock);
                p.set_log_sink(sink);
            }
            let r = req.send().promise.await?;
            let r = r.get()?;
            if r.has_failure() {
                let f = r.get_failure()?;
                let class = match f.get_class() {
                    Ok(WireClass::Usage) => ExitClass::Usage,
                    Ok(WireClass::Integrity) => ExitClass::Integrity,
                    _ => ExitClass::BuildFailed,
                };
                return Ok(Err((class, f.get_message()?.to_string()?)));
            }
            Ok(Ok(crate::digest_from(r.get_record_digest()?)?))
        })
    }

    /// Upload every object of the trees at `roots` (and the `blobs`) the
    /// worker lacks. Three stages run at once: the walk asks, level by
    /// level, which directories the worker lacks and reads those; each
    /// level's files are claimed as soon as it is read; what is claimed is
    /// sent at once. Run one after the other, on a fresh worker, the walk
    /// and the claims of the hello toolchain took 70 ms before its first
    /// byte was sent.
    pub fn upload(
        &self,
        store: &LocalStore,
        roots: &[Digest],
        blobs: &[Digest],
    ) -> Result<Transfer, Error> {
        let st = UploadState::default();
        let (levels, found) = mpsc::unbounded();
        let walked = self.walk(store, roots, blobs, &st, levels);
        let claimed = found.map(|chunk| self.claim_chunk(chunk, &st)).buffered(2);
        let sent = self.send_lists(store, claimed, &st);
        self.run_stage(async { futures::future::try_join(walked, sent).await.map(|_| ()) })?;
        // Reserved by another client when asked: waited for, and sent
        // after all if its uploader failed.
        let others = st.others.take();
        let left = self.await_blobs(&others)?;
        self.run_stage(self.send_lists(store, futures::stream::iter([Ok(left)]), &st))?;

        // Directories, children before parents.
        let missing_dirs = st.missing_dirs.take();
        let order = post_order(roots, &missing_dirs);
        let mut t = st.transfer.take();
        t.directories = order.len() as u64;
        self.send_directories(&order, &missing_dirs)?;
        Ok(t)
    }

    /// `putDirectories` of `order` (children before parents), in batches
    /// bounded by bytes, each encoded as its turn comes: a count would let
    /// a tree of big directories make a message past what the worker reads
    /// ([`crate::MAX_MESSAGE_BYTES`]). A directory no message can carry
    /// ends the upload, naming it.
    fn send_directories(
        &self,
        order: &[Digest],
        dirs: &HashMap<Digest, Directory>,
    ) -> Result<(), Error> {
        self.run_stage(async {
            let mut batch = Batch::default();
            for d in order {
                let Some(dir) = dirs.get(d) else { continue };
                let encoded = dir.encode();
                if let Some(why) = crate::too_big_for_a_message(d, dir.len(), encoded.len()) {
                    return Err(Upload::Local(Error::Usage(why)));
                }
                let cost = encoded.len() + DIR_ENTRY_BYTES;
                if let Some(full) = batch.push(encoded, cost) {
                    self.put_directories(&full).await?;
                }
            }
            if !batch.items.is_empty() {
                self.put_directories(&batch.items).await?;
            }
            Ok(())
        })
    }

    async fn put_directories(&self, encoded: &[Vec<u8>]) -> Result<(), capnp::Error> {
        let mut req = self.cas.put_directories_request();
        let refs: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        raw_list(req.get().init_directories(refs.len() as u32), &refs);
        req.send().promise.await.map(|_| ())
    }

    /// Walk the trees at `roots` down through the directories the worker
    /// lacks (only those), sending each level's files, and the `extra`
    /// blobs first, to `levels`.
    async fn walk(
        &self,
        store: &LocalStore,
        roots: &[Digest],
        extra: &[Digest],
        st: &UploadState,
        levels: mpsc::UnboundedSender<Vec<Digest>>,
    ) -> Result<(), Upload> {
        let mut seen: HashSet<Digest> = HashSet::new();
        let mut found: Vec<Digest> = extra.iter().copied().filter(|d| seen.insert(*d)).collect();
        let mut frontier: Vec<Digest> = roots.iter().copied().filter(|d| seen.insert(*d)).collect();
        loop {
            for chunk in found.chunks(FIND_BATCH) {
                // The receiver goes only with the whole upload.
                let _ = levels.unbounded_send(chunk.to_vec());
            }
            found.clear();
            if frontier.is_empty() {
                return Ok(());
            }
            let (_, md) = self.find_missing_async(&[], &frontier).await?;
            let mut next = Vec::new();
            for d in md {
                let dir = store.get_directory(&d)?;
                for (_, node) in dir.entries() {
                    match node {
                        Node::Directory { digest, .. } if seen.insert(*digest) => {
                            next.push(*digest)
                        }
                        Node::File { digest, size, .. } if seen.insert(*digest) => {
                            found.push(*digest);
                            st.blob_sizes.borrow_mut().insert(*digest, *size);
                        }
                        _ => {}
                    }
                }
                st.missing_dirs.borrow_mut().insert(d, dir);
            }
            frontier = next;
        }
    }

    /// Reserve these blobs before sending their bytes (a blob another
    /// client is sending right now is waited for, not sent twice); the
    /// claim also tells which the worker has, and holds those for us.
    /// Returns this client's to send; another's go to `st.others`.
    async fn claim_chunk(
        &self,
        blobs: Vec<Digest>,
        st: &UploadState,
    ) -> Result<Vec<Digest>, Upload> {
        let mut req = self.cas.claim_blobs_request();
        crate::set_digest_list(req.get().init_digests(blobs.len() as u32), &blobs);
        let r = req.send().promise.await?;
        let r = r.get()?;
        st.others
            .borrow_mut()
            .extend(crate::digest_list(r.get_others()?)?);
        Ok(crate::digest_list(r.get_mine()?)?)
    }

    fn await_blobs(&self, blobs: &[Digest]) -> Result<Vec<Digest>, Error> {
        self.run(async {
            let mut missing = Vec::new();
            for chunk in blobs.chunks(FIND_BATCH) {
                let mut req = self.cas.await_blobs_request();
                crate::set_digest_list(req.get().init_digests(chunk.len() as u32), chunk);
                let r = req.send().promise.await?;
                missing.extend(crate::digest_list(r.get()?.get_missing()?)?);
            }
            Ok(missing)
        })
    }

    /// Send the blobs of each list from `store` as the lists come: big
    /// ones streamed, small ones batched (a batch may span lists), a few
    /// calls of each kind in flight.
    async fn send_lists(
        &self,
        store: &LocalStore,
        lists: impl futures::Stream<Item = Result<Vec<Digest>, Upload>>,
        st: &UploadState,
    ) -> Result<(), Upload> {
        let (batch_tx, batch_rx) = mpsc::unbounded::<Vec<(Digest, u64)>>();
        let (big_tx, big_rx) = mpsc::unbounded::<(Digest, u64)>();
        let plan = async move {
            futures::pin_mut!(lists);
            let mut batch = Batch::<(Digest, u64)>::default();
            while let Some(list) = lists.next().await {
                for d in list? {
                    let size = st.size_of(store, d)?;
                    if !Batch::holds(size) {
                        let _ = big_tx.unbounded_send((d, size));
                    } else if let Some(full) = batch.add(d, size) {
                        let _ = batch_tx.unbounded_send(full);
                    }
                }
            }
            if !batch.items.is_empty() {
                let _ = batch_tx.unbounded_send(batch.items);
            }
            Ok::<(), Upload>(())
        };
        let batches = batch_rx
            .map(|batch| self.put_batch(store, batch))
            .buffer_unordered(IN_FLIGHT)
            .try_for_each(|()| async { Ok(()) });
        // Streamed beside the batches and each other, not after them: both
        // sides keep working through the last big blob.
        let streams = big_rx
            .map(|(d, size)| async move { self.stream_blob(store, &d, size).await })
            .buffer_unordered(IN_FLIGHT)
            .try_for_each(|()| async { Ok(()) });
        futures::future::try_join3(plan, batches, streams)
            .await
            .map(|_| ())
    }

    /// One `putBlobs` call: the blobs read straight into the message (no
    /// copy in between), filled only when it is its turn to go.
    async fn put_batch(&self, store: &LocalStore, batch: Vec<(Digest, u64)>) -> Result<(), Upload> {
        let mut req = self.cas.put_blobs_request();
        lay_out_batch(req.get(), &batch, |d, data| {
            open_local_blob(store, d)?
                .read_exact(data)
                .map_err(|e| local_read_error(store, d, e))
        })?;
        req.send().promise.await?;
        Ok(())
    }

    /// One big blob, in [`CHUNK`]s, if the worker still wants it.
    async fn stream_blob(&self, store: &LocalStore, d: &Digest, size: u64) -> Result<(), Upload> {
        let Some(up) = self.begin_upload(d.as_bytes(), size).await? else {
            return Ok(());
        };
        let mut f = open_local_blob(store, d)?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = f
                .read(&mut buf)
                .map_err(|e| local_read_error(store, d, e))?;
            if n == 0 {
                break;
            }
            send_chunk(&up, &buf[..n]).await?;
        }
        up.finish_request().send().promise.await?;
        Ok(())
    }

    /// `putBlob` of `digest`, announcing `size`: the stream to send it
    /// down, or none if the worker has it already.
    async fn begin_upload(
        &self,
        digest: &[u8],
        size: u64,
    ) -> Result<Option<blob_upload::Client>, capnp::Error> {
        let mut req = self.cas.put_blob_request();
        req.get().set_digest(digest);
        req.get().set_size(size);
        let r = req.send().promise.await?;
        let r = r.get()?;
        Ok(if r.has_upload() {
            Some(r.get_upload()?)
        } else {
            None
        })
    }

    /// The trees at `roots` as far as `store` lacks them (a directory
    /// present locally is complete): their directories, parents first,
    /// and the blobs they name that `store` lacks. A level at a time, its
    /// directories asked for [`IN_FLIGHT`] at once: one after another, each
    /// a round trip, an output of 1,500 directories took ~0.1 s more
    /// (medians 0.43 against 0.33 s from the build's end to the record).
    async fn fetch_trees(
        &self,
        store: &LocalStore,
        roots: impl Iterator<Item = Digest>,
        seen: &mut HashSet<Digest>,
    ) -> Result<(Vec<Directory>, Vec<(Digest, u64)>), Download> {
        let (mut dirs, mut blobs) = (Vec::new(), Vec::new());
        let mut wanted = |d: &Digest, kind| seen.insert(*d) && !store.has(kind, d);
        let mut level: Vec<Digest> = roots.filter(|d| wanted(d, ObjectKind::Directory)).collect();
        while !level.is_empty() {
            let got: Vec<Directory> = futures::stream::iter(&level)
                .map(|d| self.get_directory(*d))
                .buffered(IN_FLIGHT)
                .try_collect()
                .await?;
            let mut next = Vec::new();
            for dir in got {
                for (_, n) in dir.entries() {
                    match n {
                        Node::Directory { digest, .. } if wanted(digest, ObjectKind::Directory) => {
                            next.push(*digest)
                        }
                        Node::File { digest, size, .. } if wanted(digest, ObjectKind::Blob) => {
                            blobs.push((*digest, *size))
                        }
                        _ => {}
                    }
                }
                dirs.push(dir);
            }
            level = next;
        }
        Ok((dirs, blobs))
    }

    /// The blobs `asked` (digest, size) in one `getBlobs` call, each
    /// checked against its digest and size and staged in `txn`; their bytes.
    async fn get_blobs(
        &self,
        txn: &castore::store::Txn<'_>,
        asked: &[(Digest, u64)],
    ) -> Result<u64, Download> {
        let mut req = self.cas.get_blobs_request();
        crate::set_digest_list(
            req.get().init_digests(asked.len() as u32),
            asked.iter().map(|(d, _)| d),
        );
        let r = req.send().promise.await?;
        let got = r.get()?.get_blobs()?;
        if got.len() as usize != asked.len() {
            return Err(Download::Refused(format!(
                "the worker answered {} blobs for {} asked",
                got.len(),
                asked.len()
            )));
        }
        let mut bytes = 0;
        for ((d, size), data) in asked.iter().zip(got.iter()) {
            let data = data?;
            if data.len() as u64 != *size {
                return Err(Download::Refused(format!(
                    "blob {d} from the worker has {} bytes, its directory says {size}",
                    data.len()
                )));
            }
            let stored = txn.put_blob(data)?;
            if stored != *d {
                return Err(Download::Refused(format!(
                    "blob {d} from the worker hashes to {stored}"
                )));
            }
            bytes += *size;
        }
        Ok(bytes)
    }

    /// Directory `d` from the worker, checked against its digest.
    async fn get_directory(&self, d: Digest) -> Result<Directory, Download> {
        let mut req = self.cas.get_directory_request();
        req.get().set_digest(d.as_bytes());
        let r = req.send().promise.await?;
        let bytes = r.get()?.get_directory()?;
        let got = Digest::of(bytes);
        if got != d {
            return Err(Download::Refused(format!(
                "directory {d} from the worker hashes to {got}"
            )));
        }
        Directory::decode(bytes)
            .map_err(|e| Download::Refused(format!("directory {d} from the worker: {e}")))
    }

    /// Run `action` (resolved: every input a digest) on the worker, or
    /// take it from the local action cache. `lock_path` is its fetch lock
    /// (replay); `trust`, when not empty, lists the worker keys
    /// (`ed25519:<hex>`) accepted as signers. See the module doc for the
    /// steps.
    pub fn build(
        &self,
        store: &LocalStore,
        action: &Action,
        lock_path: Option<&Path>,
        mut log: Box<dyn Write>,
        trust: &[String],
        cache: CachePolicy,
    ) -> Result<RemoteOutcome, Error> {
        if action.network.mode == NetworkMode::Record {
            return Err(Error::Usage(
                "network mode \"record\" cannot run remotely: it is the one impure mode (it fetches upstream and writes the lock). Record locally with `fhsx build --record`, then build the replay remotely".into(),
            ));
        }
        if !trust.is_empty() && !trust.iter().any(|k| k.trim() == self.public_key) {
            return Err(Error::BadRecord {
                endpoint: self.endpoint.clone(),
                reason: format!("the worker's key {} is not in --trust", self.public_key),
            });
        }
        let (lock, lock_blobs) = match (&action.network.mode, lock_path) {
            (NetworkMode::Replay, Some(p)) => {
                let bytes = std::fs::read(p).map_err(|e| {
                    Error::Usage(format!("reading the fetch lock {}: {e}", p.display()))
                })?;
                let text = String::from_utf8_lossy(&bytes);
                let l = fetch_proxy::Lock::parse(&text)
                    .map_err(|e| Error::Usage(format!("the fetch lock {}: {e}", p.display())))?;
                let blobs: Vec<Digest> = l.entries().map(|e| e.blake3).collect();
                (bytes, blobs)
            }
            _ => (Vec::new(), Vec::new()),
        };
        if cache == CachePolicy::Use {
            if let Some(hit) = self.local_hit(store, action, &lock, trust, &mut *log)? {
                return Ok(hit);
            }
        }
        let text = action.to_toml();
        let mut roots = action.inputs.closure.clone();
        roots.extend_from_slice(&action.inputs.toolchain);
        roots.extend(action.inputs.source);
        for r in &roots {
            if !store.has(ObjectKind::Directory, r) {
                return Err(Error::Store(castore::Error::Missing {
                    digest: *r,
                    path: None,
                }));
            }
        }
        let started = std::time::Instant::now();
        let uploaded = self.upload(store, &roots, &lock_blobs)?;
        let upload_time = started.elapsed();

        let sink: log_sink::Client = capnp_rpc::new_client(LogSinkImpl(Rc::new(RefCell::new(log))));
        let reply = self.run(async {
            let mut req = self.executor.build_request();
            {
                let mut p = req.get();
                p.set_protocol(PROTOCOL_VERSION);
                p.set_action(text.as_str());
                p.set_lock(&lock);
                p.set_log_sink(sink);
                p.set_cache(match cache {
                    CachePolicy::Use => WirePolicy::Use,
                    CachePolicy::Rebuild => WirePolicy::Rebuild,
                    CachePolicy::Check => WirePolicy::Check,
                });
            }
            let r = req.send().promise.await?;
            let r = r.get()?;
            if r.has_failure() {
                let f = r.get_failure()?;
                let class = match f.get_class() {
                    Ok(WireClass::Usage) => ExitClass::Usage,
                    Ok(WireClass::Integrity) => ExitClass::Integrity,
                    _ => ExitClass::BuildFailed,
                };
                return Ok(Err((class, f.get_message()?.to_string()?)));
            }
            let d = crate::digest_from(r.get_record_digest()?)?;
            Ok(Ok((
                d,
                r.get_record()?.to_vec(),
                r.get_cached(),
                r.get_check()?.to_vec(),
            )))
        })?;
        let (record_digest, bytes, cached, check) =
            reply.map_err(|(class, message)| Error::Remote {
                endpoint: self.endpoint.clone(),
                class,
                message,
            })?;
        let bad = |reason: String| Error::BadRecord {
            endpoint: self.endpoint.clone(),
            reason,
        };
        if Digest::of(&bytes) != record_digest {
            return Err(bad(format!(
                "its bytes do not hash to the digest {record_digest} the worker named"
            )));
        }
        let record: SignedRecord =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a BuildRecord: {e}")))?;
        if record.public_key != self.public_key {
            return Err(bad(format!(
                "it is signed by {}, not by the worker's key {}",
                record.public_key, self.public_key
            )));
        }

        // Download what the record names.
        let rec = &record.record;
        let txn = store.txn()?;
        let t = self.run_stage(async {
            let mut seen = HashSet::new();
            let roots = rec.outputs.values().copied().chain([rec.view_digest]);
            let (dirs, mut blobs) = self.fetch_trees(store, roots, &mut seen).await?;
            for d in [
                Some(rec.log_digest),
                rec.stderr_digest,
                Some(rec.observed_read_set_digest),
                rec.interface_manifest_digest,
            ]
            .into_iter()
            .flatten()
            {
                if !store.has(ObjectKind::Blob, &d) && seen.insert(d) {
                    blobs.push((d, u64::MAX));
                }
            }
            let mut t = Transfer::default();
            // Small blobs in `getBlobs` batches, one after another: one at
            // a time, each a `getBlob` and a sink's write, 1,500 small
            // files took ~0.55 s.
            let (small, big): (Vec<_>, Vec<_>) = blobs
                .into_iter()
                .partition(|(_, size)| *size != u64::MAX && Batch::holds(*size));
            let mut batch = Batch::default();
            let mut batches = Vec::new();
            for (d, size) in small {
                batches.extend(batch.add(d, size));
            }
            batches.push(batch.items);
            for asked in batches.iter().filter(|b| !b.is_empty()) {
                t.bytes += self.get_blobs(&txn, asked).await?;
                t.blobs += asked.len() as u64;
            }
            // Big ones one at a time: the worker reads each a chunk ahead
            // (it read four ahead then), and three clients stalled mid-download grew
            // it by ~5 MiB (mostly; `stalled_downloads_…`) one at a time,
            // by 7-14 MiB two or eight at a time.
            for (d, size) in big {
                let mut f = self.get_blob_file(d, size).await?;
                let (got, n) = txn.put_blob_reader(&mut f)?;
                if got != d {
                    return Err(Download::Refused(format!(
                        "blob {d} from the worker hashes to {got}"
                    )));
                }
                t.blobs += 1;
                t.bytes += n;
            }
            for d in &dirs {
                txn.put_directory(d)?;
            }
            t.directories = dirs.len() as u64;
            Ok(t)
        })?;
        if !lock.is_empty() {
            // The record names the lock by digest: keep the bytes sent.
            txn.put_blob(&lock)?;
        }
        txn.put_blob(&bytes)?;
        txn.commit()?;

        let key = fhs_executor::keys::parse_public_key(&self.public_key)?;
        let v =
            fhs_executor::sign::verify(store, &record, &[key], fhs_executor::sign::Depth::Present)?;
        if !v.ok() {
            return Err(bad(v.problems.join("; ")));
        }
        let check = if check.is_empty() {
            None
        } else {
            Some(
                serde_json::from_slice(&check)
                    .map_err(|e| bad(format!("its check report is not one: {e}")))?,
            )
        };
        // Indexed here too, so the next build of this action is a local hit.
        fhs_executor::cache::index(store, &record.record.action_digest, &record_digest)?;
        Ok(RemoteOutcome {
            record_digest,
            record,
            worker_key: self.public_key.clone(),
            uploaded,
            upload_time,
            downloaded: t,
            cached,
            check,
        })
    }
}

impl Client {
    /// A record in the local store's action cache that answers `action`,
    /// signed by the worker (or a `--trust`ed key): the build needs no
    /// upload and no worker.
    fn local_hit(
        &self,
        store: &LocalStore,
        action: &Action,
        lock: &[u8],
        trust: &[String],
        log: &mut dyn Write,
    ) -> Result<Option<RemoteOutcome>, Error> {
        let lock_digest = (action.network.mode == NetworkMode::Replay).then(|| Digest::of(lock));
        let digest = action.digest(lock_digest.as_ref());
        let worker = fhs_executor::keys::parse_public_key(&self.public_key)?;
        let cache = fhs_executor::cache::ActionCache::new(store, worker, trust)?;
        let Some(hit) = cache.lookup(&digest)?.hit else {
            return Ok(None);
        };
        let _ = writeln!(
            log,
            "fhsx: cached: action {digest} → record {} (signed by {}); nothing sent to the worker (--rebuild sends it)",
            hit.digest, hit.record.public_key
        );
        Ok(Some(RemoteOutcome {
            record_digest: hit.digest,
            worker_key: hit.record.public_key.clone(),
            record: hit.record,
            uploaded: Transfer::default(),
            upload_time: std::time::Duration::ZERO,
            downloaded: Transfer::default(),
            cached: true,
            check: None,
        }))
    }
}

/// A blob's file in the local store, to send. Not verified as
/// `BlobStore::open_blob` would: the worker hashes every byte it receives,
/// and hashing here too would double the upload's hashing.
/// One chunk down an upload stream, when the stream's flow control lets it
/// go.
async fn send_chunk(up: &blob_upload::Client, chunk: &[u8]) -> Result<(), capnp::Error> {
    let mut w = up.write_request();
    w.get().set_chunk(chunk);
    w.send().await
}

/// Blob `d` of this client's store, opened to be sent (the worker checks
/// its bytes).
fn open_local_blob(store: &LocalStore, d: &Digest) -> Result<std::fs::File, Upload> {
    std::fs::File::open(store.object_path(ObjectKind::Blob, d)).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => castore::Error::Missing {
            digest: *d,
            path: None,
        }
        .into(),
        _ => local_read_error(store, d, e),
    })
}

fn local_read_error(store: &LocalStore, d: &Digest, source: std::io::Error) -> Upload {
    castore::Error::Io {
        op: "read",
        path: store.object_path(ObjectKind::Blob, d),
        source,
    }
    .into()
}

/// `dirs` ordered children before parents, reachable from `roots`.
fn post_order(roots: &[Digest], dirs: &HashMap<Digest, Directory>) -> Vec<Digest> {
    let mut out = Vec::with_capacity(dirs.len());
    let mut done: HashSet<Digest> = HashSet::new();
    // (digest, children pushed?)
    let mut stack: Vec<(Digest, bool)> = roots.iter().rev().map(|d| (*d, false)).collect();
    while let Some((d, expanded)) = stack.pop() {
        let Some(dir) = dirs.get(&d) else { continue };
        if done.contains(&d) {
            continue;
        }
        if expanded {
            done.insert(d);
            out.push(d);
            continue;
        }
        stack.push((d, true));
        for (_, n) in dir.entries() {
            if let Node::Directory { digest, .. } = n {
                if !done.contains(digest) && dirs.contains_key(digest) {
                    stack.push((*digest, false));
                }
            }
        }
    }
    out
}

/// `batch` laid out in a `putBlobs` request: each blob's digest, and its
/// bytes written in place by `fill`.
fn lay_out_batch<E>(
    params: cas::put_blobs_params::Builder<'_>,
    batch: &[(Digest, u64)],
    mut fill: impl FnMut(&Digest, &mut [u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut l = params.init_blobs(batch.len() as u32);
    for (i, (d, size)) in batch.iter().enumerate() {
        let mut b = l.reborrow().get(i as u32);
        b.set_digest(d.as_bytes());
        // A batch holds it (`Batch::holds`), so it fits a u32.
        fill(d, b.init_data(*size as u32))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HEAP_MESSAGE_MAX;

    /// A batch is sent when the next blob would take it past
    /// `BATCH_BYTES`; a blob bigger than that goes alone.
    #[test]
    fn batches_fill_up_to_their_bytes_and_a_big_blob_goes_alone() {
        let d = |i: u8| Digest::of(&[i]);
        let half = (BATCH_BYTES / 2 - BLOB_ENTRY_BYTES) as u64;
        let mut batch = Batch::default();
        assert_eq!(batch.add(d(1), half), None);
        assert_eq!(batch.add(d(2), half), None);
        assert_eq!(batch.add(d(3), 1), Some(vec![(d(1), half), (d(2), half)]));
        let big = BATCH_BYTES as u64 + 1;
        assert_eq!(batch.add(d(4), big), Some(vec![(d(3), 1)]));
        assert_eq!(batch.add(d(5), 1), Some(vec![(d(4), big)]));
        assert_eq!(batch.items, vec![(d(5), 1)]);
    }

    /// The bytes a message takes on the wire, header included.
    fn wire_bytes(m: &capnp::message::Builder<capnp::message::HeapAllocator>) -> usize {
        capnp::serialize::compute_serialized_size_in_words(m) * 8
    }

    /// What `put_batch` sends for `batch`, laid out the same way.
    fn put_blobs_message(batch: &[(Digest, u64)]) -> usize {
        let mut m = capnp::message::Builder::new_default();
        lay_out_batch(m.init_root(), batch, |_, _| Ok::<(), ()>(())).unwrap();
        wire_bytes(&m)
    }

    /// Every upload message stays under `HEAP_MESSAGE_MAX`, so the worker
    /// takes it from its heap: the fullest batch of tiny blobs, a batch of
    /// one blob as big as a batch may hold, and a chunk of a streamed one.
    #[test]
    fn no_upload_message_reaches_the_heap_limit() {
        let mut batch = Batch::default();
        let tiny = (0u32..)
            .map(|i| batch.add(Digest::of(&i.to_le_bytes()), 1))
            .find_map(|full| full)
            .unwrap_or_default();
        assert!(tiny.len() > 5_000, "{} tiny blobs", tiny.len());
        let largest = (BATCH_BYTES - BLOB_ENTRY_BYTES) as u64;
        assert!(Batch::holds(largest) && !Batch::holds(largest + 1));
        let one = vec![(Digest::of(b"one"), largest)];
        let mut m = capnp::message::Builder::new_default();
        m.init_root::<blob_upload::write_params::Builder>()
            .init_chunk(CHUNK as u32);
        for (what, bytes) in [
            ("the fullest batch of tiny blobs", put_blobs_message(&tiny)),
            ("a batch of one blob", put_blobs_message(&one)),
            ("a chunk", wire_bytes(&m)),
        ] {
            assert!(
                bytes < HEAP_MESSAGE_MAX,
                "{what}: {bytes} bytes on the wire, not under {HEAP_MESSAGE_MAX}"
            );
        }
    }
}
