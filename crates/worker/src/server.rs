//! The Cap'n Proto front door: serves `Executor` and `Cas` over Cap'n Proto
//! RPC, running builds through the shared [`Runner`].
//!
//! All RPC runs on one thread (capnp-rpc is single-threaded); everything that
//! touches the disk — store writes, hashing, the builds themselves — runs on
//! blocking threads, so a slow upload or a long build never stalls another
//! client. Slots, cancellation and the call into the executor are the
//! runner's (`runner`), shared with the REAPI bot (`reapi`).
//!
//! Uploads are deduplicated across clients: an object being written by one
//! connection is *claimed*, and another connection offering the same object
//! waits for that write instead of sending the bytes again.
//!
//! What one connection may make the worker hold, each bound checked by a
//! hostile test in `crates/fhsx/tests/worker.rs` that also sees another
//! client served: at most [`MAX_CONNECTIONS`] (256) connections, handshakes
//! included, one more closed at accept (at up to 512 KiB of TLS buffers
//! each, 128 MiB in all); per connection, transfer turns (`transfers`: a
//! download holds two chunks and no thread, an upload stream a blocking
//! thread and a queue of eight chunks) and the caps on calls and answers
//! (`inflight`). Up to 256 × 8 upload writers may wait, so the blocking
//! pool is sized for them ([`BLOCKING_THREADS`], 2,048 plus tokio's 512).
//! Every method runs in `Calls::serve`, which counts the call and its
//! answer however it ends, a cancelled call too
//! (`every_method_counts_its_call_and_its_answer` checks all 17); calls
//! whose answers carry what they read wait for room first
//! (`Calls::answer_room`), a directory read off the event loop above 64
//! KiB. A client leaving mid-download is an error on its connection: only
//! commands holding no socket (`Command::holds_no_socket`) reset SIGPIPE,
//! since rustls's vectored writes carry no `MSG_NOSIGNAL`; the RPC bridge
//! and the proxy's TLS send with it, the proxy's plain-HTTP body writes end
//! at the first error.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capnp_rpc::{rpc_twoparty_capnp::Side, twoparty, RpcSystem};
use castore::store::{DirectoryStore, LocalStore, ObjectKind};
use castore::{CheckedBlob, Digest, Directory, Node};
use executor_core::{Action, CachePolicy, ExitClass};
use fhs_executor::FhsExecutor;
use futures::AsyncReadExt;
use rayon::prelude::*;
use tokio::sync::{mpsc, watch};

use crate::inflight::{Call, Calls, Counted, Gated};
use crate::runner::{Job, JobResult, Runner};
use crate::transfers::{Turn, Turns};

use crate::worker_capnp::{
    blob_upload, byte_sink, cas, executor, gate, CachePolicy as WirePolicy, ExitClass as WireClass,
};
use crate::{digest_from, reader_options, ChannelReader, Error, PROTOCOL_VERSION};

/// How the worker is run.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub store: LocalStore,
    /// Builds run at once; the rest queue.
    pub jobs: usize,
    /// On SIGTERM/SIGINT, how long running builds may go on before they
    /// are cancelled.
    pub shutdown_grace: Duration,
    /// The access token a client must present (`Gate.login`). Required to
    /// listen on anything but loopback or a UNIX socket.
    pub token: Option<Vec<u8>>,
    pub builds: crate::runner::BuildOptions,
    /// How long a blob transfer may go without progress before it is
    /// ended (see `transfers`).
    pub stall_timeout: Duration,
}

/// The shortest access token accepted: guessing must not be an option.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Connections served at once; more are closed as they arrive.
pub const MAX_CONNECTIONS: usize = 256;
/// The worker's blocking threads at most: one for every upload stream
/// that may wait on its client (its store writer; stalled, until the stall
/// timeout), on every connection, and tokio's default 512 on top for
/// everything else (hashing, store writes, a download's reads, a build's
/// stages). With the default alone, 65 connections of stalled uploads held
/// the whole pool and another client's build waited for their timeout. A
/// parked thread costs its touched stack, a few KiB.
pub const BLOCKING_THREADS: usize =
    MAX_CONNECTIONS * crate::transfers::UPLOADS_PER_CONNECTION + 512;

/// Where to listen.
#[derive(Debug, Clone)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

fn fail(msg: impl Into<String>) -> capnp::Error {
    capnp::Error::failed(msg.into())
}

fn store_err(e: castore::Error) -> capnp::Error {
    fail(castore::Chain(&e).to_string())
}

fn join_err(e: tokio::task::JoinError) -> capnp::Error {
    fail(format!("worker task failed: {e}"))
}

/// Counters shared with blocking threads.
#[derive(Default)]
struct Counters {
    blobs_written: AtomicU64,
    blob_bytes_written: AtomicU64,
    directories_written: AtomicU64,
    bytes_received: AtomicU64,
}

/// What is being written: an object of the store.
type ClaimKey = (ObjectKind, Digest);

/// What [`Shared::reserve_absent`] found for one object.
enum Reserved {
    /// Claimed for the caller: the store lacks it and nobody else was
    /// writing it.
    Mine(Claim),
    /// The store has it.
    Here,
    /// Another connection is writing it.
    Busy,
}

/// Fewer lookups than this are made on the event loop; more are handed
/// to rayon's threads, so that one request does not hold every other
/// connection's reads and answers. Handing off makes the caller wait
/// longer, so it pays only where the loop's time matters: on a warm store
/// (medians of 400, release, 2 cores) 64 lookups hold the loop 30–38 µs,
/// against 72–78 µs for the caller handed off (8: 4–7 against 21–23 µs;
/// 256: 150 against 250–273 µs).
const PRESENT_ON_LOOP: usize = 64;

/// The worker's state, shared by every connection.
struct Shared {
    store: LocalStore,
    runner: Arc<Runner>,
    public_key: String,
    /// The record key's signature binding this worker's TLS certificate
    /// (empty without TLS).
    tls_binding: Vec<u8>,
    counters: Arc<Counters>,
    shutting_down: Cell<bool>,
    /// Objects being written right now, and a receiver that sees `true`
    /// once the write is over (committed or not).
    claims: RefCell<HashMap<ClaimKey, watch::Receiver<bool>>>,
    /// `WorkerConfig::stall_timeout`.
    stall_timeout: Duration,
}

/// A claim on an object being written; released (and waiters woken) on drop.
struct Claim {
    shared: Rc<Shared>,
    key: ClaimKey,
    done: watch::Sender<bool>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.shared.claims.borrow_mut().remove(&self.key);
        let _ = self.done.send(true);
    }
}

impl Shared {
    /// Claim `key` for writing. `None` once the store has it (possibly
    /// after waiting for another connection that was writing it).
    async fn claim(self: &Rc<Self>, key: ClaimKey) -> Option<Claim> {
        loop {
            if self.store.has(key.0, &key.1) {
                return None;
            }
            let waiting = self.claims.borrow().get(&key).cloned();
            match waiting {
                Some(mut rx) => {
                    let _ = rx.wait_for(|d| *d).await;
                }
                None => return Some(self.reserve(key)),
            }
        }
    }

    /// Claim `key` unless another writer holds it (`None`), without
    /// looking at the store (see [`reserve_absent`](Self::reserve_absent)).
    fn try_reserve(self: &Rc<Self>, key: ClaimKey) -> Option<Claim> {
        if self.claims.borrow().contains_key(&key) {
            return None;
        }
        Some(self.reserve(key))
    }

    /// The claim on `key`, which nobody holds.
    fn reserve(self: &Rc<Self>, key: ClaimKey) -> Claim {
        let (tx, rx) = watch::channel(false);
        self.claims.borrow_mut().insert(key, rx);
        Claim {
            shared: self.clone(),
            key,
            done: tx,
        }
    }

    /// Claim each of `digests` (distinct) that the store lacks and nobody
    /// is writing; in order, what was found for each. Claimed first (in
    /// memory), then looked for all at once ([`present`](Self::present)),
    /// and the claims on what is there dropped: while a claim is held
    /// nobody else writes its object, so nothing lands between the look
    /// and the claim (looking first let two clients each write a
    /// directory both lacked).
    async fn reserve_absent(
        self: &Rc<Self>,
        kind: ObjectKind,
        digests: &[Digest],
    ) -> Result<Vec<Reserved>, capnp::Error> {
        let mut found: Vec<Reserved> = digests
            .iter()
            .map(|d| match self.try_reserve((kind, *d)) {
                Some(c) => Reserved::Mine(c),
                None => Reserved::Busy,
            })
            .collect();
        let reserved: Vec<Digest> = digests
            .iter()
            .zip(&found)
            .filter(|(_, f)| matches!(f, Reserved::Mine(_)))
            .map(|(d, _)| *d)
            .collect();
        let present = self.present(kind, &reserved).await?;
        let mine = found.iter_mut().filter(|f| matches!(f, Reserved::Mine(_)));
        for (f, is_here) in mine.zip(present) {
            if is_here {
                *f = Reserved::Here;
            }
        }
        Ok(found)
    }

    /// Which of `digests` the store has, in order. Many at once (a fresh
    /// worker's first upload asks about thousands) are looked up off the
    /// event loop, on rayon's threads: one by one on the loop, each a
    /// negative lookup of a few microseconds, they held everything else
    /// the worker reads and answers.
    async fn present(
        &self,
        kind: ObjectKind,
        digests: &[Digest],
    ) -> Result<Vec<bool>, capnp::Error> {
        if digests.len() < PRESENT_ON_LOOP {
            return Ok(digests.iter().map(|d| self.store.has(kind, d)).collect());
        }
        let store = self.store.clone();
        let digests = digests.to_vec();
        tokio::task::spawn_blocking(move || store.has_each(kind, &digests))
            .await
            .map_err(join_err)
    }

    /// Wait until nobody is writing `key`.
    async fn settled(&self, key: ClaimKey) {
        let waiting = self.claims.borrow().get(&key).cloned();
        if let Some(mut rx) = waiting {
            let _ = rx.wait_for(|d| *d).await;
        }
    }
}

/// Run the worker until SIGTERM or SIGINT. `ready` is called once with the
/// address actually bound (useful with port 0) before the first accept.
pub fn serve(config: WorkerConfig, listen: Listen, ready: impl FnOnce(&str)) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
        .map_err(|source| Error::Io {
            what: "start the worker runtime for",
            endpoint: format!("{listen:?}"),
            source,
        })?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, serve_async(config, listen, ready))
}

enum Listener {
    /// TCP carries TLS (see `tls`).
    Tcp(tokio::net::TcpListener, tokio_rustls::TlsAcceptor),
    Unix(tokio::net::UnixListener, PathBuf),
}

/// How long a TCP peer may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn serve_async(
    config: WorkerConfig,
    listen: Listen,
    ready: impl FnOnce(&str),
) -> Result<(), Error> {
    if let Some(t) = &config.token {
        if t.len() < MIN_TOKEN_BYTES {
            return Err(Error::Usage(format!(
                "the access token is {} bytes; use at least {MIN_TOKEN_BYTES} random ones (e.g. `head -c 32 /dev/urandom | base64 > token`)",
                t.len()
            )));
        }
    } else if let Listen::Tcp(a) = &listen {
        if !a.ip().is_loopback() {
            return Err(Error::Usage(format!(
                "{a} is reachable from other hosts and this worker has no access token: give it --token-file (and its clients the same file), or listen on loopback"
            )));
        }
    }
    // A killed predecessor may have left views and scratch file systems
    // mounted (anywhere: the registry names them), and working areas
    // behind: detach and remove them. A build does the first as part of
    // mounting its view, so only start-up needs it here.
    let _ = castore_fuse::cleanup_stale_mounts(&castore_fuse::default_registry());
    fhs_executor::scratch::sweep_abandoned(&std::env::temp_dir());
    let exec = FhsExecutor::open(config.store.clone())?;
    let io = |what: &'static str, ep: String| {
        move |source| Error::Io {
            what,
            endpoint: ep,
            source,
        }
    };
    let mut tls_cert = None;
    let listener = match &listen {
        Listen::Tcp(a) => {
            let (cfg, cert) = crate::tls::server_identity().map_err(Error::Usage)?;
            tls_cert = Some(cert);
            Listener::Tcp(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(io("listen on", a.to_string()))?,
                tokio_rustls::TlsAcceptor::from(cfg),
            )
        }
        Listen::Unix(p) => {
            // A socket file left by a killed worker refuses the bind.
            if std::os::unix::net::UnixStream::connect(p).is_err() {
                let _ = std::fs::remove_file(p);
            }
            Listener::Unix(
                tokio::net::UnixListener::bind(p)
                    .map_err(io("listen on", p.display().to_string()))?,
                p.clone(),
            )
        }
    };
    let bound = match &listener {
        Listener::Tcp(l, _) => l
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| format!("{listen:?}")),
        Listener::Unix(_, p) => format!("unix:{}", p.display()),
    };
    let shared = Rc::new(Shared {
        store: config.store.clone(),
        runner: Runner::new(config.store.clone(), config.jobs, config.builds)?,
        public_key: exec.public_key(),
        tls_binding: tls_cert
            .as_deref()
            .map(|c| exec.sign_tls_binding(c))
            .unwrap_or_default(),
        counters: Arc::new(Counters::default()),
        shutting_down: Cell::new(false),
        claims: RefCell::new(HashMap::new()),
        stall_timeout: config.stall_timeout,
    });
    drop(exec);
    // Each connection gets its own gate and executor, and so its own
    // transfer turns and count of calls.
    let token = config.token.as_deref().map(blake3::hash);
    let gate = || -> Connection {
        let calls = Rc::new(Calls::default());
        let executor: executor::Client = capnp_rpc::new_client(ExecutorImpl {
            shared: shared.clone(),
            turns: Rc::new(Turns::new()),
            calls: calls.clone(),
        });
        let gate = capnp_rpc::new_client(GateImpl {
            shared: shared.clone(),
            token,
            executor,
            calls: calls.clone(),
        });
        (gate, calls)
    };
    ready(&bound);
    let open = Rc::new(Cell::new(0usize));
    let flusher = tokio::task::spawn_local(flush_uploads(shared.clone()));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(io("install a SIGTERM handler for", bound.clone()))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(io("install a SIGINT handler for", bound.clone()))?;
    loop {
        let accepted: std::io::Result<Start> = tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            r = accept(&listener, gate()) => r,
        };
        match accepted {
            Ok(start) => {
                if open.get() >= MAX_CONNECTIONS {
                    // Dropping the stream closes it: bounded memory however
                    // many peers connect (each may hold a full message).
                    eprintln!("fhsx worker: refusing a connection: {MAX_CONNECTIONS} are open");
                    continue;
                }
                start(open.clone())
            }
            Err(e) => {
                eprintln!("fhsx worker: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    // Shutdown: accept nothing more, refuse queued and new builds, let the
    // running ones finish up to the deadline, then cancel them.
    drop(listener);
    if let Listen::Unix(p) = &listen {
        let _ = std::fs::remove_file(p);
    }
    shared.shutting_down.set(true);
    shared.runner.shut_down(config.shutdown_grace).await;
    // Let the last results reach their callers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    flusher.abort();
    flush_unsynced(&shared.store, "the next start re-checks them").await;
    Ok(())
}

/// Uploads are answered as soon as they are in the store, before they are
/// durable (`Txn::commit_unsynced`): waiting for the disk halved their
/// throughput, and a client can always send again what a crash lost. They
/// are made durable here once uploading pauses for a second (a `syncfs`
/// competing with the upload itself would only slow it), and at shutdown.
async fn flush_uploads(shared: Rc<Shared>) {
    let written = |c: &Counters| {
        c.blobs_written.load(Ordering::SeqCst) + c.directories_written.load(Ordering::SeqCst)
    };
    let mut seen = written(&shared.counters);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = written(&shared.counters);
        if now == seen && shared.store.has_unsynced() {
            flush_unsynced(&shared.store, "retrying in a second").await;
        }
        seen = now;
    }
}

/// `LocalStore::flush_unsynced` off the event loop; a failure is reported
/// with what happens next (`then`), never fatal: the uploads stay logged.
async fn flush_unsynced(store: &LocalStore, then: &str) {
    let store = store.clone();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.flush_unsynced()).await {
        eprintln!(
            "fhsx worker: could not make uploads durable: {}; {then}",
            castore::Chain(&e)
        );
    }
}

type Start = Box<dyn FnOnce(Rc<Cell<usize>>) + 'static>;

/// A connection's bootstrap capability and its count of calls in progress.
type Connection = (gate::Client, Rc<Calls>);

async fn accept(listener: &Listener, bootstrap: Connection) -> std::io::Result<Start> {
    use tokio_util::compat::TokioAsyncReadCompatExt;
    Ok(match listener {
        Listener::Tcp(l, tls) => {
            let (s, peer) = l.accept().await?;
            let _ = s.set_nodelay(true);
            let tls = tls.clone();
            Box::new(move |open| {
                // The handshake runs in its own task: a peer that stalls
                // it holds up nobody else, and gives up after a while.
                open.set(open.get() + 1);
                tokio::task::spawn_local(async move {
                    let shaken = tokio::time::timeout(
                        HANDSHAKE_TIMEOUT,
                        tls.accept(crate::tls::buffered(s)),
                    )
                    .await;
                    open.set(open.get().saturating_sub(1));
                    match shaken {
                        Ok(Ok(mut t)) => {
                            crate::tls::widen_sends(t.get_mut().1);
                            spawn_connection(crate::tls::CleanEof(t.compat()), bootstrap, open)
                        }
                        Ok(Err(e)) => {
                            eprintln!("fhsx worker: TLS handshake with {peer} failed: {e}")
                        }
                        Err(_) => eprintln!("fhsx worker: TLS handshake with {peer} timed out"),
                    }
                });
            })
        }
        Listener::Unix(l, _) => {
            let (s, _) = l.accept().await?;
            Box::new(move |open| spawn_connection(s.compat(), bootstrap, open))
        }
    })
}

/// A directory up to this size is read on the event loop (`getDirectory`).
const INLINE_DIRECTORY_BYTES: u64 = 64 << 10;

/// What a digest adds to a message's list: its 32 bytes and its pointer.
const DIGEST_IN_LIST_BYTES: usize = 40;
/// What a blob (or an encoded directory) adds to a message's list besides
/// its bytes: its pointer and the padding to a word.
const BLOB_IN_LIST_BYTES: usize = 16;

fn spawn_connection<S>(stream: S, (bootstrap, calls): Connection, open: Rc<Cell<usize>>)
where
    S: futures::AsyncRead + futures::AsyncWrite + Unpin + 'static,
{
    let (reader, writer) = stream.split();
    let network = twoparty::VatNetwork::new(
        Gated::new(
            futures::io::BufReader::with_capacity(256 << 10, reader),
            calls.clone(),
        ),
        Counted::new(
            futures::io::BufWriter::with_capacity(256 << 10, writer),
            calls,
        ),
        Side::Server,
        reader_options(),
    );
    let rpc = RpcSystem::new(Box::new(network), Some(bootstrap.client));
    open.set(open.get() + 1);
    tokio::task::spawn_local(async move {
        let r = rpc.await;
        open.set(open.get().saturating_sub(1));
        if let Err(e) = r {
            // A malformed or oversized message, or a peer that went away:
            // only this connection ends.
            if e.kind != capnp::ErrorKind::Disconnected {
                eprintln!("fhsx worker: connection closed: {e}");
            }
        }
    });
}

/// The bootstrap capability: the version for anyone, the executor for a
/// client holding the token.
struct GateImpl {
    shared: Rc<Shared>,
    /// BLAKE3 of the token: comparing hashes (constant time in `blake3`)
    /// leaks nothing of the token through timing.
    token: Option<blake3::Hash>,
    executor: executor::Client,
    /// This connection's.
    calls: Rc<Calls>,
}

impl gate::Server for GateImpl {
    async fn version(
        self: Rc<Self>,
        _: gate::VersionParams,
        mut results: gate::VersionResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let mut r = results.get();
                r.set_protocol(PROTOCOL_VERSION);
                r.set_executor(format!("fhsx {}", env!("CARGO_PKG_VERSION")));
                r.set_public_key(&self.shared.public_key);
                r.set_tls_binding(&self.shared.tls_binding);
                call.answers(r.total_size());
                Ok(())
            })
            .await
    }

    async fn login(
        self: Rc<Self>,
        params: gate::LoginParams,
        mut results: gate::LoginResults,
    ) -> Result<(), capnp::Error> {
        self.calls.serve(async |call| {
            let p = params.get()?;
            if p.get_protocol() != PROTOCOL_VERSION {
                return Err(fail(format!(
                    "this worker speaks protocol {PROTOCOL_VERSION}, the client {}: upgrade the older of the two",
                    p.get_protocol()
                )));
            }
            if let Some(want) = &self.token {
                let token = p.get_token()?;
                call.holds(token.len());
                if blake3::hash(token) != *want {
                    return Err(fail(
                        "access denied: the worker refused the access token; pass the worker's --token-file to the client",
                    ));
                }
            }
            results.get().set_executor(self.executor.clone());
            Ok(())
        })
        .await
    }
}

struct ExecutorImpl {
    shared: Rc<Shared>,
    /// This connection's.
    turns: Rc<Turns>,
    calls: Rc<Calls>,
}

/// Sets a build's cancel flag when the call is dropped before it finished
/// (the client disconnected or gave up).
struct CancelOnDrop(Arc<AtomicBool>, bool);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

impl executor::Server for ExecutorImpl {
    async fn cas(
        self: Rc<Self>,
        _: executor::CasParams,
        mut results: executor::CasResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |_| {
                let roots = self.shared.store.temp_roots(&[]).map_err(store_err)?;
                results.get().set_cas(capnp_rpc::new_client(CasImpl {
                    shared: self.shared.clone(),
                    mine: RefCell::new(HashMap::new()),
                    roots: Arc::new(roots),
                    turns: self.turns.clone(),
                    calls: self.calls.clone(),
                }));
                Ok(())
            })
            .await
    }

    async fn stats(
        self: Rc<Self>,
        _: executor::StatsParams,
        mut results: executor::StatsResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let c = &self.shared.counters;
                let mut s = results.get().init_stats();
                s.set_blobs_written(c.blobs_written.load(Ordering::SeqCst));
                s.set_blob_bytes_written(c.blob_bytes_written.load(Ordering::SeqCst));
                s.set_directories_written(c.directories_written.load(Ordering::SeqCst));
                s.set_bytes_received(c.bytes_received.load(Ordering::SeqCst));
                let r = &self.shared.runner;
                s.set_builds_started(r.stats.builds_started.load(Ordering::SeqCst));
                s.set_builds_running(r.running_count() as u32);
                s.set_builds_queued(r.stats.queued.load(Ordering::SeqCst));
                s.set_max_concurrent_builds(r.stats.max_running.load(Ordering::SeqCst));
                s.set_jobs(r.jobs() as u32);
                call.answers(results.get().total_size());
                Ok(())
            })
            .await
    }

    async fn build(
        self: Rc<Self>,
        params: executor::BuildParams,
        mut results: executor::BuildResults,
    ) -> Result<(), capnp::Error> {
        self.calls.serve(async |call| {
            let p = params.get()?;
            let client = p.get_protocol();
            if client != PROTOCOL_VERSION {
                return Err(fail(format!(
                    "this worker speaks protocol {PROTOCOL_VERSION}, the client sent {client}{}: upgrade the client",
                    if client == 0 { " (or none)" } else { "" }
                )));
            }
            let sh = self.shared.clone();
            if sh.shutting_down.get() {
                return Err(fail(
                    "the worker is shutting down: send the build elsewhere",
                ));
            }
            let text = p.get_action()?.to_str()?.to_owned();
            let lock = p.get_lock()?.to_vec();
            call.holds(text.len() + lock.len());
            let sink = p.get_log_sink()?;
            let cache = match p.get_cache() {
                Ok(WirePolicy::Rebuild) => CachePolicy::Rebuild,
                Ok(WirePolicy::Check) => CachePolicy::Check,
                _ => CachePolicy::Use,
            };
            let set_failure = |results: &mut executor::BuildResults, class, msg: &str| {
                let mut f = results.get().init_failure();
                f.set_class(match class {
                    ExitClass::BuildFailed | ExitClass::CheckMismatch => WireClass::BuildFailed,
                    ExitClass::Usage => WireClass::Usage,
                    ExitClass::Integrity => WireClass::Integrity,
                });
                f.set_message(msg);
            };
            let action = match Action::parse(&text, Path::new("action.toml")) {
                Ok(a) => a,
                Err(e) => {
                    set_failure(&mut results, ExitClass::Usage, &e.to_string());
                    return Ok(());
                }
            };
            let cancel = Arc::new(AtomicBool::new(false));
            let mut guard = CancelOnDrop(cancel.clone(), false);
            let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
            let job = Job {
                action,
                lock,
                cache,
                cacheable: true,
                failed_outputs: false,
                split_streams: false,
            };
            let flag = cancel.clone();
            let forward = async move {
                while let Some(chunk) = rx.recv().await {
                    let mut req = sink.write_request();
                    req.get().set_chunk(&chunk);
                    if req.send().await.is_err() {
                        // The caller is gone: stop the build.
                        flag.store(true, Ordering::SeqCst);
                        break;
                    }
                }
            };
            let (r, ()) = futures::future::join(sh.runner.run(job, cancel, tx), forward).await;
            let Ok(r) = r else {
                return Err(fail(
                    "the worker is shutting down: send the build elsewhere",
                ));
            };
            guard.1 = true;
            match r {
                JobResult::Done {
                    digest,
                    bytes,
                    cached,
                    check,
                    ..
                } => {
                    let check = check
                        .map(|c| serde_json::to_vec(&c).unwrap_or_default())
                        .unwrap_or_default();
                    let mut b = results.get();
                    b.set_record_digest(digest.as_bytes());
                    b.set_record(&bytes);
                    b.set_cached(cached);
                    b.set_check(&check);
                }
                JobResult::Failed { class, message } => set_failure(&mut results, class, &message),
            }
            call.answers(results.get().total_size());
            Ok(())
        })
        .await
    }
}

struct CasImpl {
    shared: Rc<Shared>,
    /// Blobs this client reserved with `claimBlobs` and has not sent yet.
    mine: RefCell<HashMap<Digest, Claim>>,
    /// Everything this client was told the worker has, and everything it
    /// sent: a gc between its upload and its build must not take its
    /// inputs. Held while the client holds this capability (its connection).
    roots: Arc<castore::TempRoots>,
    /// The connection's transfer turns and count of calls.
    turns: Rc<Turns>,
    calls: Rc<Calls>,
}

/// A blob being received in chunks, written by a blocking thread.
struct UploadImpl {
    shared: Rc<Shared>,
    digest: Digest,
    size: u64,
    received: Cell<u64>,
    writer: RefCell<Option<tokio::task::JoinHandle<Result<(), String>>>>,
    stream: Rc<UploadStream>,
    calls: Rc<Calls>,
}

/// What an upload holds while it is open; shared with the watch that ends
/// it when it stalls.
struct UploadStream {
    tx: RefCell<Option<mpsc::Sender<Vec<u8>>>>,
    claim: RefCell<Option<Claim>>,
    turn: RefCell<Option<Turn>>,
    /// When the last chunk arrived (or the stream opened).
    last: Cell<tokio::time::Instant>,
    stalled: Cell<bool>,
}

impl UploadStream {
    /// End the stream: its writer sees the end of its chunks and fails
    /// (fewer bytes than announced), the claim and the turn go back.
    fn end(&self) {
        self.tx.borrow_mut().take();
        self.claim.borrow_mut().take();
        self.turn.borrow_mut().take();
    }

    /// End the stream once no chunk has come for `timeout`; returns when
    /// it is ended or the upload is gone.
    async fn watch(stream: std::rc::Weak<UploadStream>, timeout: Duration) {
        loop {
            let Some(deadline) = stream.upgrade().map(|s| s.last.get() + timeout) else {
                return;
            };
            tokio::time::sleep_until(deadline).await;
            let Some(s) = stream.upgrade() else { return };
            if s.tx.borrow().is_none() {
                return; // finished or refused
            }
            if s.last.get() + timeout <= tokio::time::Instant::now() {
                s.stalled.set(true);
                s.end();
                return;
            }
        }
    }
}

impl blob_upload::Server for UploadImpl {
    async fn write(self: Rc<Self>, params: blob_upload::WriteParams) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let chunk = params.get()?.get_chunk()?;
                call.holds(chunk.len());
                let total = self.received.get() + chunk.len() as u64;
                self.shared
                    .counters
                    .bytes_received
                    .fetch_add(chunk.len() as u64, Ordering::SeqCst);
                if total > self.size {
                    self.stream.end();
                    return Err(fail(format!(
                        "blob {}: more bytes than the announced {}; upload refused",
                        self.digest, self.size
                    )));
                }
                self.received.set(total);
                self.stream.last.set(tokio::time::Instant::now());
                let tx = self.stream.tx.borrow().clone();
                match tx {
                    Some(tx) => tx.send(chunk.to_vec()).await.map_err(|_| {
                        fail(format!("blob {}: the store writer stopped", self.digest))
                    }),
                    None => Err(self.closed()),
                }
            })
            .await
    }

    async fn finish(
        self: Rc<Self>,
        _: blob_upload::FinishParams,
        _: blob_upload::FinishResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |_| {
                if self.stream.stalled.get() {
                    return Err(self.closed());
                }
                self.stream.tx.borrow_mut().take();
                let handle = self
                    .writer
                    .borrow_mut()
                    .take()
                    .ok_or_else(|| fail("upload already finished"))?;
                let r = handle.await.map_err(join_err)?;
                // Given back once the blob is in (or refused): a waiting upload of
                // the same blob then finds it.
                self.stream.end();
                r.map_err(fail)?;
                let c = &self.shared.counters;
                c.blobs_written.fetch_add(1, Ordering::SeqCst);
                c.blob_bytes_written.fetch_add(self.size, Ordering::SeqCst);
                Ok(())
            })
            .await
    }
}

impl UploadImpl {
    /// Why a chunk or the finish finds the stream closed.
    fn closed(&self) -> capnp::Error {
        if self.stream.stalled.get() {
            fail(format!(
                "blob {}: no chunk came for {:?}, so the worker ended the upload; send it again",
                self.digest, self.shared.stall_timeout
            ))
        } else {
            fail(format!(
                "blob {}: upload already finished or refused",
                self.digest
            ))
        }
    }
}

/// The digests of a call's list, counted as what its message holds.
fn held_digests(call: &Call, l: capnp::data_list::Reader) -> Result<Vec<Digest>, capnp::Error> {
    call.holds(l.len() as usize * DIGEST_IN_LIST_BYTES);
    crate::digest_list(l)
}

/// Check a decoded directory's children are in the store (or in `batch`,
/// which maps each directory of the same call to its place in it and its
/// size, before the directory's own place `at`) and that their sizes agree.
fn check_children(
    store: &LocalStore,
    digest: &Digest,
    dir: &Directory,
    batch: &HashMap<Digest, (usize, u64)>,
    at: usize,
) -> Result<(), String> {
    for (name, node) in dir.entries() {
        match node {
            Node::Directory { digest: d, size } => {
                let have = match batch.get(d).filter(|(i, _)| *i < at) {
                    Some((_, s)) => Some(*s),
                    None if store.has(ObjectKind::Directory, d) => {
                        Some(store.get_directory(d).map_err(|e| castore::Chain(&e).to_string())?.size())
                    }
                    None => None,
                };
                match have {
                    None => return Err(format!(
                        "directory {digest} refused: its entry {name:?} names directory {d}, which the worker does not have; upload children before parents"
                    )),
                    Some(s) if s != *size => return Err(format!(
                        "directory {digest} refused: its entry {name:?} says {size} entries below, directory {d} has {s}"
                    )),
                    Some(_) => {}
                }
            }
            Node::File {
                digest: d, size, ..
            } => {
                match store.object_len(ObjectKind::Blob, d) {
                    Some(len) if len == *size => {}
                    Some(len) => return Err(format!(
                        "directory {digest} refused: its file {name:?} says {size} bytes, blob {d} has {len}"
                    )),
                    None => return Err(format!(
                        "directory {digest} refused: its file {name:?} names blob {d}, which the worker does not have; upload blobs first"
                    )),
                }
            }
            Node::Symlink { .. } => {}
        }
    }
    Ok(())
}

impl CasImpl {
    /// Hold objects just found in the store for this client: rooted, then
    /// looked for again, so one a gc took in between is never promised.
    /// Returns those gone.
    async fn hold(&self, kind: ObjectKind, here: Vec<Digest>) -> Result<Vec<Digest>, capnp::Error> {
        if here.is_empty() {
            return Ok(here);
        }
        self.roots.add(&here).map_err(store_err)?;
        Ok(self.split_present(kind, here).await?.1)
    }

    /// `digests` split into those the store has and those it lacks.
    async fn split_present(
        &self,
        kind: ObjectKind,
        digests: Vec<Digest>,
    ) -> Result<(Vec<Digest>, Vec<Digest>), capnp::Error> {
        let present = self.shared.present(kind, &digests).await?;
        let (here, absent): (Vec<_>, Vec<_>) =
            digests.into_iter().zip(present).partition(|(_, p)| *p);
        Ok((
            here.into_iter().map(|(d, _)| d).collect(),
            absent.into_iter().map(|(d, _)| d).collect(),
        ))
    }

    /// This client's reservation of blob `d`, or a fresh claim (waiting for
    /// another writer); `None` once the store has it.
    async fn claim_blob(&self, d: Digest) -> Option<Claim> {
        let reserved = self.mine.borrow_mut().remove(&d);
        match reserved {
            Some(c) => Some(c),
            None => self.shared.claim((ObjectKind::Blob, d)).await,
        }
    }

    async fn put_dirs(&self, encoded: Vec<Vec<u8>>) -> Result<Vec<Digest>, capnp::Error> {
        let mut decoded = Vec::with_capacity(encoded.len());
        for bytes in &encoded {
            let dir =
                Directory::decode(bytes).map_err(|e| fail(format!("directory refused: {e}")))?;
            decoded.push((Digest::of(bytes), dir));
        }
        let digests: Vec<Digest> = decoded.iter().map(|(d, _)| *d).collect();
        // Rooted before the claims look at the store (see put_blobs).
        self.roots.add(&digests).map_err(store_err)?;
        let mut seen = HashSet::new();
        decoded.retain(|(d, _)| seen.insert(*d));
        let distinct: Vec<Digest> = decoded.iter().map(|(d, _)| *d).collect();
        let found = self
            .shared
            .reserve_absent(ObjectKind::Directory, &distinct)
            .await?;
        let mut claims = Vec::new();
        let mut todo = Vec::new();
        for ((d, dir), found) in decoded.into_iter().zip(found) {
            let claim = match found {
                Reserved::Mine(c) => Some(c),
                Reserved::Here => None,
                // Waited for: written by the other connection, or
                // claimed after all if it failed.
                Reserved::Busy => self.shared.claim((ObjectKind::Directory, d)).await,
            };
            if let Some(c) = claim {
                claims.push(c);
                todo.push((d, dir));
            }
        }
        let store = self.shared.store.clone();
        let n = todo.len() as u64;
        tokio::task::spawn_blocking(move || -> Result<(), String> {
            // Each directory may name those before it in the call; checked
            // on rayon's threads, thousands of children's lookups each.
            let batch: HashMap<Digest, (usize, u64)> = todo
                .iter()
                .enumerate()
                .map(|(i, (d, dir))| (*d, (i, dir.size())))
                .collect();
            todo.par_iter()
                .enumerate()
                .try_for_each(|(i, (d, dir))| check_children(&store, d, dir, &batch, i))?;
            let dirs: Vec<Directory> = todo.into_iter().map(|(_, dir)| dir).collect();
            // Answered before durable, as every upload (see `flush_uploads`).
            store
                .put_directories_unsynced(&dirs)
                .map_err(|e| castore::Chain(&e).to_string())
        })
        .await
        .map_err(join_err)?
        .map_err(fail)?;
        drop(claims);
        self.shared
            .counters
            .directories_written
            .fetch_add(n, Ordering::SeqCst);
        Ok(digests)
    }
}

impl cas::Server for CasImpl {
    async fn find_missing(
        self: Rc<Self>,
        params: cas::FindMissingParams,
        mut results: cas::FindMissingResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let p = params.get()?;
                let blobs = held_digests(call, p.get_blobs()?)?;
                let dirs = held_digests(call, p.get_directories()?)?;
                // What is here is held (see `hold`); what was absent is reported
                // missing without a second look.
                let (blobs_here, mut mb) = self.split_present(ObjectKind::Blob, blobs).await?;
                let (dirs_here, mut md) = self.split_present(ObjectKind::Directory, dirs).await?;
                mb.extend(self.hold(ObjectKind::Blob, blobs_here).await?);
                md.extend(self.hold(ObjectKind::Directory, dirs_here).await?);
                let mut r = results.get();
                crate::set_digest_list(r.reborrow().init_blobs(mb.len() as u32), &mb);
                crate::set_digest_list(r.init_directories(md.len() as u32), &md);
                call.answers(results.get().total_size());
                Ok(())
            })
            .await
    }

    async fn put_blob(
        self: Rc<Self>,
        params: cas::PutBlobParams,
        mut results: cas::PutBlobResults,
    ) -> Result<(), capnp::Error> {
        self.calls.serve(async |_| {
            let p = params.get()?;
            let digest = digest_from(p.get_digest()?)?;
            let size = p.get_size();
            let turn = self.turns.upload().await;
            let claim = loop {
                if let Some(claim) = self.claim_blob(digest).await {
                    break claim; // ours to write: rooted just before its commit
                }
                // Already here: rooted, then looked for again (a gc may have
                // taken it in between). Only what the store holds is rooted, so
                // a client naming made-up digests grows nothing.
                self.roots.add(&[digest]).map_err(store_err)?;
                if self.shared.store.has(ObjectKind::Blob, &digest) {
                    return Ok(()); // no upload capability: send nothing
                }
            };
            let roots = self.roots.clone();
            let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
            let store = self.shared.store.clone();
            let writer = tokio::task::spawn_blocking(move || -> Result<(), String> {
                let txn = store.txn().map_err(|e| castore::Chain(&e).to_string())?;
                let mut r = ChannelReader::new(rx);
                let (got, n) = txn.put_blob_buffered(&mut r).map_err(|e| castore::Chain(&e).to_string())?;
                if n != size {
                    return Err(format!(
                        "blob {digest} refused: {n} bytes arrived, {size} were announced; nothing was stored"
                    ));
                }
                if got != digest {
                    return Err(format!(
                        "blob {digest} refused: the uploaded bytes hash to {got}; nothing was stored"
                    ));
                }
                // The transaction holds gc off until it commits.
                roots.add(&[digest]).map_err(|e| castore::Chain(&e).to_string())?;
                txn.commit_unsynced().map_err(|e| castore::Chain(&e).to_string())
            });
            let stream = Rc::new(UploadStream {
                tx: RefCell::new(Some(tx)),
                claim: RefCell::new(Some(claim)),
                turn: RefCell::new(Some(turn)),
                last: Cell::new(tokio::time::Instant::now()),
                stalled: Cell::new(false),
            });
            tokio::task::spawn_local(UploadStream::watch(
                Rc::downgrade(&stream),
                self.shared.stall_timeout,
            ));
            results.get().set_upload(capnp_rpc::new_client(UploadImpl {
                shared: self.shared.clone(),
                digest,
                size,
                received: Cell::new(0),
                writer: RefCell::new(Some(writer)),
                stream,
                calls: self.calls.clone(),
            }));
            Ok(())
        })
        .await
    }

    async fn put_blobs(
        self: Rc<Self>,
        params: cas::PutBlobsParams,
        _: cas::PutBlobsResults,
    ) -> Result<(), capnp::Error> {
        self.calls.serve(async |call| {
            let list = params.get()?.get_blobs()?;
            let mut blobs = Vec::with_capacity(list.len() as usize);
            let mut received = 0u64;
            for b in list.iter() {
                let d = digest_from(b.get_digest()?)?;
                let data = b.get_data()?;
                received += data.len() as u64;
                blobs.push((d, data.to_vec()));
            }
            call.holds(received as usize + blobs.len() * (DIGEST_IN_LIST_BYTES + BLOB_IN_LIST_BYTES));
            self.shared
                .counters
                .bytes_received
                .fetch_add(received, Ordering::SeqCst);
            // Each blob is hashed once, here, off the event loop: what the
            // check found is what the store files it under.
            let checked = tokio::task::spawn_blocking(move || {
                blobs
                    .into_iter()
                    .map(|(d, data)| {
                        CheckedBlob::expecting(&d, data).map_err(|got| {
                            format!(
                                "blob {d} refused: its bytes hash to {got}; nothing of this batch was stored"
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()
            })
            .await
            .map_err(join_err)?
            .map_err(fail)?;
            // Rooted before the claims look at the store: each is written
            // below or already there, and stays for this client either way.
            let sent: Vec<Digest> = checked.iter().map(|b| *b.digest()).collect();
            self.roots.add(&sent).map_err(store_err)?;
            let mut claims = Vec::new();
            let mut todo = Vec::new();
            let mut seen = HashSet::new();
            for blob in checked {
                let d = *blob.digest();
                if !seen.insert(d) {
                    continue;
                }
                if let Some(c) = self.claim_blob(d).await {
                    claims.push(c);
                    todo.push(blob);
                }
            }
            let store = self.shared.store.clone();
            let n = todo.len() as u64;
            let bytes: u64 = todo.iter().map(|b| b.bytes().len() as u64).sum();
            tokio::task::spawn_blocking(move || store.put_blobs_unsynced(&todo))
                .await
                .map_err(join_err)?
                .map_err(store_err)?;
            drop(claims);
            let c = &self.shared.counters;
            c.blobs_written.fetch_add(n, Ordering::SeqCst);
            c.blob_bytes_written.fetch_add(bytes, Ordering::SeqCst);
            Ok(())
        })
        .await
    }

    async fn put_directory(
        self: Rc<Self>,
        params: cas::PutDirectoryParams,
        mut results: cas::PutDirectoryResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let bytes = params.get()?.get_directory()?.to_vec();
                call.holds(bytes.len());
                let d = self.put_dirs(vec![bytes]).await?;
                if let Some(d) = d.first() {
                    results.get().set_digest(d.as_bytes());
                }
                call.answers(results.get().total_size());
                Ok(())
            })
            .await
    }

    async fn put_directories(
        self: Rc<Self>,
        params: cas::PutDirectoriesParams,
        _: cas::PutDirectoriesResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let list = params.get()?.get_directories()?;
                let mut v = Vec::with_capacity(list.len() as usize);
                for d in list.iter() {
                    v.push(d?.to_vec());
                }
                call.holds(v.iter().map(|d| d.len() + BLOB_IN_LIST_BYTES).sum());
                self.put_dirs(v).await?;
                Ok(())
            })
            .await
    }

    async fn get_blob(
        self: Rc<Self>,
        params: cas::GetBlobParams,
        mut results: cas::GetBlobResults,
    ) -> Result<(), capnp::Error> {
        self.calls.serve(async |_| {
            let p = params.get()?;
            let digest = digest_from(p.get_digest()?)?;
            let sink: byte_sink::Client = p.get_sink()?;
            let _turn = self.turns.download().await;
            let stall = self.shared.stall_timeout;
            // Read a chunk at a time, the next one while this one goes out: a
            // stalled download holds two chunks and no thread. A reader thread
            // with a queue of four held the blob's first four chunks and its
            // thread (80 stalled downloads of a 3.75 MiB blob: ~300 MiB).
            let store = self.shared.store.clone();
            let blob =
                tokio::task::spawn_blocking(move || castore::BlobStore::open_blob(&store, &digest))
                    .await
                    .map_err(join_err)?
                    .map_err(store_err)?;
            let mut next = Some(tokio::task::spawn_blocking(move || crate::next_chunk(blob)));
            let mut size = 0u64;
            while let Some(reading) = next.take() {
                let (blob, chunk) = reading
                    .await
                    .map_err(join_err)?
                    .map_err(|e| fail(format!("reading blob {digest}: {e}")))?;
                if chunk.is_empty() {
                    break;
                }
                next = Some(tokio::task::spawn_blocking(move || crate::next_chunk(blob)));
                size += chunk.len() as u64;
                let mut req = sink.write_request();
                req.get().set_chunk(&chunk);
                drop(chunk); // the message holds its copy until the client takes it
                tokio::time::timeout(stall, req.send())
                    .await
                    .map_err(|_| {
                        fail(format!(
                            "blob {digest}: the client took no chunk for {stall:?}, so the worker ended the download"
                        ))
                    })??;
            }
            results.get().set_size(size);
            Ok(())
        })
        .await
    }

    async fn get_blobs(
        self: Rc<Self>,
        params: cas::GetBlobsParams,
        mut results: cas::GetBlobsResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let digests = held_digests(call, params.get()?.get_digests()?)?;
                // A download's turn: what it reads stays in memory until answered.
                let _turn = self.turns.download().await;
                self.calls.answer_room().await;
                let store = self.shared.store.clone();
                let blobs =
                    tokio::task::spawn_blocking(move || crate::read_blobs(&store, &digests))
                        .await
                        .map_err(join_err)?
                        .map_err(fail)?;
                let mut l = results.get().init_blobs(blobs.len() as u32);
                for (i, b) in blobs.iter().enumerate() {
                    l.set(i as u32, b);
                }
                call.answers(results.get().total_size());
                Ok(())
            })
            .await
    }

    async fn claim_blobs(
        self: Rc<Self>,
        params: cas::ClaimBlobsParams,
        mut results: cas::ClaimBlobsResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let digests = held_digests(call, params.get()?.get_digests()?)?;
                let (mut mine, asked): (Vec<Digest>, Vec<Digest>) = digests
                    .into_iter()
                    .partition(|d| self.mine.borrow().contains_key(d));
                let found = self.shared.reserve_absent(ObjectKind::Blob, &asked).await?;
                let (mut here, mut kept, mut others) = (Vec::new(), Vec::new(), Vec::new());
                for (d, found) in asked.into_iter().zip(found) {
                    match found {
                        Reserved::Mine(c) => kept.push((d, c)),
                        Reserved::Here => here.push(d),
                        Reserved::Busy => others.push(d),
                    }
                }
                // What is here is held for this client, as `find_missing` holds
                // it, and claimed after all if a gc took it in between.
                for d in self.hold(ObjectKind::Blob, here).await? {
                    match self.shared.try_reserve((ObjectKind::Blob, d)) {
                        Some(c) => kept.push((d, c)),
                        None => others.push(d),
                    }
                }
                let mut coming = Vec::new();
                for (d, c) in kept {
                    self.mine.borrow_mut().insert(d, c);
                    mine.push(d);
                    coming.push((ObjectKind::Blob, d));
                }
                // What this client will send, named in the unsynced log now in
                // one write: each batch's commit then waits for no disk.
                if !coming.is_empty() {
                    let store = self.shared.store.clone();
                    tokio::task::spawn_blocking(move || store.intend_unsynced(&coming))
                        .await
                        .map_err(join_err)?
                        .map_err(store_err)?;
                }
                let mut r = results.get();
                crate::set_digest_list(r.reborrow().init_mine(mine.len() as u32), &mine);
                crate::set_digest_list(r.init_others(others.len() as u32), &others);
                call.answers(results.get().total_size());
                Ok(())
            })
            .await
    }

    async fn await_blobs(
        self: Rc<Self>,
        params: cas::AwaitBlobsParams,
        mut results: cas::AwaitBlobsResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let digests = held_digests(call, params.get()?.get_digests()?)?;
                let mut missing = Vec::new();
                for d in digests {
                    self.shared.settled((ObjectKind::Blob, d)).await;
                    if !self.shared.store.has(ObjectKind::Blob, &d) {
                        missing.push(d);
                    }
                }
                crate::set_digest_list(results.get().init_missing(missing.len() as u32), &missing);
                call.answers(results.get().total_size());
                Ok(())
            })
            .await
    }

    async fn get_directory(
        self: Rc<Self>,
        params: cas::GetDirectoryParams,
        mut results: cas::GetDirectoryResults,
    ) -> Result<(), capnp::Error> {
        self.calls
            .serve(async |call| {
                let digest = digest_from(params.get()?.get_digest()?)?;
                let _turn = self.calls.big_answer_turn().await;
                let store = self.shared.store.clone();
                let read = move || {
                    store
                        .get_directory(&digest)
                        .map(|dir| (dir.len(), dir.encode()))
                };
                // A big one is read, checked and encoded off the event loop, which
                // serves every connection (~8 MB took 43-62 ms); a small one on it,
                // as a thread's round trip made an output of 1,500 directories
                // download ~15% slower.
                let small = match self.shared.store.object_len(ObjectKind::Directory, &digest) {
                    Some(len) => len <= INLINE_DIRECTORY_BYTES,
                    None => true, // absent: the read says so
                };
                let (entries, encoded) = if small {
                    read()
                } else {
                    tokio::task::spawn_blocking(read).await.map_err(join_err)?
                }
                .map_err(store_err)?;
                if let Some(why) = crate::too_big_for_a_message(&digest, entries, encoded.len()) {
                    return Err(capnp::Error::failed(format!("the build's output {why}")));
                }
                results.get().set_directory(&encoded);
                call.answers(results.get().total_size());
                Ok(())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    fn shared(store: LocalStore) -> Rc<Shared> {
        Rc::new(Shared {
            runner: Runner::new(store.clone(), 1, crate::runner::BuildOptions::default()).unwrap(),
            store,
            public_key: String::new(),
            tls_binding: Vec::new(),
            counters: Arc::default(),
            shutting_down: Cell::new(false),
            claims: RefCell::default(),
            stall_timeout: crate::transfers::DEFAULT_STALL_TIMEOUT,
        })
    }

    fn is_mine(r: &Reserved) -> bool {
        matches!(r, Reserved::Mine(_))
    }

    /// `reserve_absent` claims before it looks, so a second reservation
    /// made while the first is between its claim and its look finds the
    /// object busy. Deterministic: the first asks about `PRESENT_ON_LOOP`
    /// objects, so its look goes off the loop, and it is polled once, up
    /// to that look; the second asks about one, looked up on the loop
    /// without yielding. Looking first (the old order) gives the second
    /// the object too, and both wrote it.
    #[test]
    fn a_reservation_between_anothers_claim_and_look_finds_the_object_busy() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path().join("store")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = shared(store.clone());
            let blobs: Vec<Vec<u8>> = (0..PRESENT_ON_LOOP as u32)
                .map(|i| format!("blob {i}").into_bytes())
                .collect();
            let digests: Vec<Digest> = blobs.iter().map(|b| Digest::of(b)).collect();
            let mut first = Box::pin(s.reserve_absent(ObjectKind::Blob, &digests));
            let first_waits = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(first.as_mut().poll(cx).is_pending())
            })
            .await;
            assert!(
                first_waits,
                "the first reservation did not wait for its look"
            );

            let second = s
                .reserve_absent(ObjectKind::Blob, &digests[..1])
                .await
                .unwrap();
            assert!(
                matches!(second[0], Reserved::Busy),
                "a reservation while another was looking got the object too"
            );

            let first = first.await.unwrap();
            assert!(first.iter().all(is_mine));
            drop(first);
            // Given back unwritten: the next reservation gets it.
            let third = s
                .reserve_absent(ObjectKind::Blob, &digests[..1])
                .await
                .unwrap();
            assert!(is_mine(&third[0]));
            store
                .put_blobs_unsynced(&[CheckedBlob::new(blobs[0].as_slice())])
                .unwrap();
            drop(third);
            // Written: here, claimed by nobody.
            let fourth = s
                .reserve_absent(ObjectKind::Blob, &digests[..1])
                .await
                .unwrap();
            assert!(matches!(fourth[0], Reserved::Here));
            assert!(s.claims.borrow().is_empty());
        });
    }

    /// Every method a client can call runs its body through
    /// `Calls::serve`: one that did not would have its
    /// answers never counted against the backlog (`inflight`), so a client
    /// could leave any number of them unread. Read from this file's own
    /// text, so that a method added later is checked too.
    #[test]
    fn every_method_counts_its_call_and_its_answer() {
        let source = include_str!("server.rs");
        let mut methods = 0;
        let mut in_server = false;
        let mut lines = source.lines();
        while let Some(line) = lines.next() {
            if line.starts_with("impl ") {
                in_server = line.contains("::Server for ");
            }
            if !(in_server && line.starts_with("    async fn ")) {
                continue;
            }
            let name = line
                .trim_start_matches("    async fn ")
                .split('(')
                .next()
                .unwrap_or_default()
                .to_owned();
            let mut signature = line;
            while !signature.ends_with('{') {
                signature = lines.next().unwrap_or("{");
            }
            // rustfmt may put `.serve(` on the line after `self.calls`.
            let head: String = lines.by_ref().take(2).map(str::trim).collect();
            assert!(
                head.starts_with("self.calls.serve(async |"),
                "the method {name} does not begin by counting its call and its answer: {head}"
            );
            methods += 1;
        }
        assert_eq!(methods, 17, "the worker's methods were not all found");
    }
}
