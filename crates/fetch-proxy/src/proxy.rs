//! The proxy itself: request routing, CONNECT termination, replay serving,
//! and recording.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::io::{self, Read};
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use castore::{BlobStore, Digest, LocalStore};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{mpsc, OnceCell};

use crate::lock::{Entry, Key, Lock};
use crate::url::{sanitize_location, split_authority, NormUrl, Scheme};
use crate::{CertAuthority, Error};

/// Record (impure, writes the lock) or replay (pure, serves only the lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Record,
    Replay,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Record => "record",
            Mode::Replay => "replay",
        }
    }
}

/// Receives every structured event (refusals, recordings, failures).
pub type EventSink = Arc<dyn Fn(&Event) + Send + Sync>;

/// A structured log event. Serialises to one JSON object.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// A request was refused (`403`).
    Refused {
        mode: &'static str,
        method: String,
        url: String,
        reason: String,
        /// The nearest recorded entry, `METHOD URL`.
        #[serde(skip_serializing_if = "Option::is_none")]
        nearest: Option<String>,
        /// Which parts of the request differ from `nearest`.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        differs: Vec<&'static str>,
    },
    /// A response was recorded (or re-recorded identically).
    Recorded {
        method: String,
        url: String,
        status: u16,
        size: u64,
        blake3: String,
    },
    /// Recording one request failed (upstream unreachable, 5xx, store error).
    RecordFailed {
        method: String,
        url: String,
        error: String,
    },
    /// A blob the lock names is missing or corrupt.
    BlobError { url: String, error: String },
}

/// What the proxy needs to run.
pub struct ProxyConfig {
    pub mode: Mode,
    /// The lock file: read in both modes, rewritten after each recording.
    pub lock_path: PathBuf,
    pub store: LocalStore,
    pub ca: Arc<CertAuthority>,
    /// Trust the host's CA certificates for upstream TLS (record mode).
    pub system_roots: bool,
    /// Extra PEM CA files trusted for upstream TLS (record mode).
    pub upstream_ca_files: Vec<PathBuf>,
    /// Where events go; default: one JSON line each on stderr.
    pub events: Option<EventSink>,
    /// The most one response body may store (record mode, after decoding);
    /// default [`DEFAULT_MAX_BODY_BYTES`]. Past it the recording is aborted
    /// ([`Abort::Limit`]) and nothing of that body is kept.
    pub max_body_bytes: u64,
    /// The most all bodies of one recording (one proxy run) may store
    /// together; default [`DEFAULT_MAX_RECORD_BYTES`]. Past it, as above.
    pub max_record_bytes: u64,
    /// Temporary gc roots to add every blob this proxy records or serves
    /// to (the caller's build-wide guard, so they outlive the proxy). None:
    /// the proxy holds its own for as long as it runs.
    pub temp_roots: Option<Arc<castore::TempRoots>>,
}

/// Default [`ProxyConfig::max_body_bytes`]: 4 GiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 4 << 30;
/// Default [`ProxyConfig::max_record_bytes`]: 16 GiB.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 16 << 30;

/// Which recording limit was hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RecordLimit {
    /// [`ProxyConfig::max_body_bytes`].
    BodyBytes,
    /// [`ProxyConfig::max_record_bytes`].
    RecordBytes,
}

impl RecordLimit {
    /// The limit's name as configured (`max_body_bytes`, `max_record_bytes`).
    pub fn name(self) -> &'static str {
        match self {
            RecordLimit::BodyBytes => "max_body_bytes",
            RecordLimit::RecordBytes => "max_record_bytes",
        }
    }
}

/// Why a recording was aborted. Every request after an abort is refused,
/// and [`RunningProxy::shutdown`](crate::RunningProxy::shutdown) fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Abort {
    /// The same key got a different answer.
    NonDeterministic(String),
    /// A body, or the recording as a whole, outgrew a limit.
    Limit {
        limit: RecordLimit,
        /// The limit's value in bytes.
        max: u64,
        /// The request that crossed it, `METHOD URL`.
        request: String,
    },
}

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Abort::NonDeterministic(why) => f.write_str(why),
            Abort::Limit {
                limit: RecordLimit::BodyBytes,
                max,
                request,
            } => write!(
                f,
                "limit exceeded: the response to {request} is larger than max_body_bytes = {max} bytes; nothing of it was stored"
            ),
            Abort::Limit {
                limit: RecordLimit::RecordBytes,
                max,
                request,
            } => write!(
                f,
                "limit exceeded: the recording outgrew max_record_bytes = {max} bytes at {request}; nothing of that response was stored"
            ),
        }
    }
}

impl ProxyConfig {
    /// A configuration with the store's CA (created on first use), system
    /// roots trusted upstream, and events on stderr.
    pub fn new(mode: Mode, lock_path: PathBuf, store: LocalStore) -> Result<Self, Error> {
        let ca = Arc::new(CertAuthority::load_or_create(store.root())?);
        Ok(ProxyConfig {
            mode,
            lock_path,
            store,
            ca,
            system_roots: true,
            upstream_ca_files: Vec::new(),
            events: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            temp_roots: None,
        })
    }
}

pub(crate) struct Counters {
    pub served: AtomicU64,
    pub refused: AtomicU64,
    pub recorded: AtomicU64,
    pub upstream_connects: AtomicU64,
}

#[derive(Clone, Debug)]
enum RecordError {
    /// Upstream trouble or a local failure: 502, not recorded.
    Failed(String),
    /// Same key, different answer: the recording is aborted.
    NonDeterministic(String),
    /// A limit was hit: the recording is aborted.
    Limit(Abort),
}

/// How storing a body failed.
enum StoreFail {
    /// Before the lock was consulted (the body, the store): 502.
    Failed(String),
    /// The lock or a limit said no.
    Record(RecordError),
}

#[derive(Clone, Debug)]
struct Recorded {
    entry: Entry,
    /// The upstream's own `Location`, when the lock holds a sanitised one:
    /// the live client must follow the real (signed) URL.
    live_location: Option<String>,
}

type Inflight = HashMap<Key, Arc<OnceCell<Result<Recorded, RecordError>>>>;

pub(crate) struct Shared {
    pub mode: Mode,
    store: Arc<LocalStore>,
    ca: Arc<CertAuthority>,
    lock: Mutex<Lock>,
    lock_path: PathBuf,
    /// Upstream TLS trust. `None` in replay: replay has no way to connect.
    upstream: Option<Arc<rustls::ClientConfig>>,
    inflight: Mutex<Inflight>,
    pub aborted: Mutex<Option<Abort>>,
    verified: Mutex<HashSet<Digest>>,
    events: EventSink,
    pub counters: Counters,
    max_body: u64,
    max_record: u64,
    /// Bytes of bodies stored or being stored by this recording.
    record_bytes: AtomicU64,
    /// None only in replay on a store where temp roots cannot be created
    /// (read-only): nothing is written there, and gc is not ours to run.
    roots: Option<Arc<castore::TempRoots>>,
    /// Storing threads still running (waited for at shutdown).
    pub writers: Arc<Writers>,
}

/// Counts the blocking threads that stream bodies into the store, so a
/// stopping proxy can wait until every unfinished body has been discarded.
#[derive(Default)]
pub(crate) struct Writers {
    n: Mutex<usize>,
    idle: std::sync::Condvar,
}

impl Writers {
    fn enter(self: &Arc<Self>) -> WriterGuard {
        *lk(&self.n) += 1;
        WriterGuard(self.clone())
    }

    /// Wait (up to `limit`) until no writer is running; whether none is.
    pub(crate) fn wait_idle(&self, limit: std::time::Duration) -> bool {
        let n = lk(&self.n);
        let (n, _) = self
            .idle
            .wait_timeout_while(n, limit, |n| *n > 0)
            .unwrap_or_else(|p| p.into_inner());
        *n == 0
    }
}

struct WriterGuard(Arc<Writers>);

impl Drop for WriterGuard {
    fn drop(&mut self) {
        let mut n = lk(&self.0.n);
        *n = n.saturating_sub(1);
        self.0.idle.notify_all();
    }
}

fn lk<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(crate) fn new(cfg: ProxyConfig) -> Result<Self, Error> {
        let lock = crate::Lock::load_or_empty(&cfg.lock_path)?;
        if cfg.mode == Mode::Record {
            // Fail now, not at the first response, if the lock is not
            // writable; and a session that fetched nothing still leaves a
            // (canonical, empty) lock behind.
            lock.save(&cfg.lock_path)?;
        }
        let upstream = match cfg.mode {
            Mode::Replay => None,
            Mode::Record => Some(Arc::new(client_config(
                cfg.system_roots,
                &cfg.upstream_ca_files,
            )?)),
        };
        let roots = match (cfg.temp_roots, cfg.mode) {
            (Some(r), _) => Some(r),
            (None, Mode::Record) => Some(Arc::new(cfg.store.temp_roots(&[])?)),
            (None, Mode::Replay) => cfg.store.temp_roots(&[]).ok().map(Arc::new),
        };
        let events = cfg.events.unwrap_or_else(|| {
            Arc::new(|e: &Event| {
                if let Ok(line) = serde_json::to_string(e) {
                    eprintln!("{line}");
                }
            })
        });
        Ok(Shared {
            mode: cfg.mode,
            store: Arc::new(cfg.store),
            ca: cfg.ca,
            lock: Mutex::new(lock),
            lock_path: cfg.lock_path,
            upstream,
            inflight: Mutex::new(HashMap::new()),
            aborted: Mutex::new(None),
            verified: Mutex::new(HashSet::new()),
            events,
            max_body: cfg.max_body_bytes,
            max_record: cfg.max_record_bytes,
            record_bytes: AtomicU64::new(0),
            roots,
            writers: Arc::new(Writers::default()),
            counters: Counters {
                served: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                recorded: AtomicU64::new(0),
                upstream_connects: AtomicU64::new(0),
            },
        })
    }

    fn emit(&self, e: Event) {
        (self.events)(&e);
    }

    /// Abort the recording (the first reason wins); returns the reason in
    /// force.
    fn abort(&self, why: Abort) -> Abort {
        lk(&self.aborted).get_or_insert(why).clone()
    }
}

fn client_config(system_roots: bool, files: &[PathBuf]) -> Result<rustls::ClientConfig, Error> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    if system_roots {
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(c);
        }
    }
    for f in files {
        let bad = |reason: String| Error::UpstreamCa {
            path: f.clone(),
            reason,
        };
        let mut n = 0;
        for c in CertificateDer::pem_file_iter(f).map_err(|e| bad(e.to_string()))? {
            let c = c.map_err(|e| bad(e.to_string()))?;
            roots.add(c).map_err(|e| bad(e.to_string()))?;
            n += 1;
        }
        if n == 0 {
            return Err(bad("no certificates in it".into()));
        }
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

// ---------------------------------------------------------------------------
// Bodies

pub(crate) type RespBody = BoxBody<Bytes, io::Error>;

fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

fn empty() -> RespBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// A body fed by a blocking reader thread.
struct ChanBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    remaining: u64,
}

impl Body for ChanBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.remaining = self.remaining.saturating_sub(b.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

const CHUNK: usize = 256 * 1024;
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
const SMALL_BODY: u64 = 64 * 1024;

fn file_body(path: PathBuf, start: u64, len: u64) -> RespBody {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(8);
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        let mut off = start;
        let end = start + len;
        while off < end {
            let n = ((end - off) as usize).min(CHUNK);
            let mut buf = vec![0u8; n];
            match f.read_exact_at(&mut buf, off) {
                Ok(()) => {}
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
            off += n as u64;
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return;
            }
        }
    });
    ChanBody { rx, remaining: len }.boxed()
}

/// What the async side sends the storing thread.
enum Chunk {
    Data(Bytes),
    /// The upstream body ended, whole.
    End,
    Err(io::Error),
}

/// A blocking `Read` over body chunks sent from async code. Only an
/// explicit [`Chunk::End`] is the end of the body: a sender that goes away
/// without one (the request was cancelled, the proxy is stopping) is an
/// error, so a partial body is never taken for a whole one.
struct ChanReader {
    rx: mpsc::Receiver<Chunk>,
    cur: Bytes,
    ended: bool,
}

impl Read for ChanReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(b)) => self.cur = b,
                Some(Chunk::End) => self.ended = true,
                Some(Chunk::Err(e)) => return Err(e),
                None => {
                    return Err(io::Error::other(
                        "the body was cut short (the request was cancelled or the proxy stopped)",
                    ))
                }
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

/// Counts what is stored of one body against the per-body and the
/// recording's limits; past either it fails the read (and says which).
struct Limited<'a, R> {
    inner: R,
    shared: &'a Shared,
    body: u64,
    hit: Option<(RecordLimit, u64)>,
    /// The body was stored: its bytes stay counted.
    keep: bool,
}

impl<R: Read> Read for Limited<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.body += n as u64;
        let total = self
            .shared
            .record_bytes
            .fetch_add(n as u64, Ordering::Relaxed)
            + n as u64;
        if self.body > self.shared.max_body {
            self.hit = Some((RecordLimit::BodyBytes, self.shared.max_body));
        } else if total > self.shared.max_record {
            self.hit = Some((RecordLimit::RecordBytes, self.shared.max_record));
        }
        if let Some((l, _)) = self.hit {
            return Err(io::Error::other(format!("{} exceeded", l.name())));
        }
        Ok(n)
    }
}

impl<R> Drop for Limited<'_, R> {
    fn drop(&mut self) {
        if !self.keep {
            // Not stored: it does not count against the recording.
            self.shared
                .record_bytes
                .fetch_sub(self.body, Ordering::Relaxed);
        }
    }
}

/// Stream one body into a store transaction and make it a blob only if it
/// arrived whole, within the limits, and its lock entry was written (or
/// matches the entry already there). Anything else drops the transaction,
/// and with it every byte of the body: a partial, oversized or rejected
/// body never becomes a store object. The blob is added to the proxy's temp
/// roots before the transaction (which holds the store lock) commits, so no
/// gc can come between the two.
fn store_and_enter(
    s: &Shared,
    mut entry: Entry,
    decode: Decode,
    declared: Option<u64>,
    rx: mpsc::Receiver<Chunk>,
    request: String,
) -> Result<Entry, StoreFail> {
    let reader = ChanReader {
        rx,
        cur: Bytes::new(),
        ended: false,
    };
    let decoded: Box<dyn Read> = match decode {
        Decode::None => Box::new(reader),
        Decode::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Decode::Deflate => Box::new(flate2::read::ZlibDecoder::new(reader)),
    };
    let mut limited = Limited {
        inner: decoded,
        shared: s,
        body: 0,
        hit: None,
        keep: false,
    };
    let txn = s
        .store
        .txn()
        .map_err(|e| StoreFail::Failed(castore::Chain(&e).to_string()))?;
    let mut tee = ShaTee {
        inner: &mut limited,
        sha: sha2::Sha256::new(),
    };
    let put = txn.put_blob_reader(&mut tee);
    let sha256 = hex::encode(tee.sha.finalize());
    if let Some((limit, max)) = limited.hit {
        drop(txn);
        let why = s.abort(Abort::Limit {
            limit,
            max,
            request,
        });
        return Err(StoreFail::Record(RecordError::Limit(why)));
    }
    let (digest, size) = put.map_err(|e| StoreFail::Failed(format!("storing the body: {e}")))?;
    if let Some(n) = declared {
        if n != size {
            return Err(StoreFail::Failed(format!(
                "the body has {size} bytes where Content-Length said {n}; not recorded"
            )));
        }
    }
    entry.size = size;
    entry.blake3 = digest;
    entry.sha256 = sha256;
    let rejected = |e: RecordError| StoreFail::Record(e);
    if let Some(why) = lk(&s.aborted).clone() {
        return Err(rejected(match why {
            Abort::Limit { .. } => RecordError::Limit(why),
            other => RecordError::NonDeterministic(format!("recording aborted: {other}")),
        }));
    }
    let key = entry.key();
    let mut lock = lk(&s.lock);
    let fresh = match lock.get(&key) {
        // Same answer: keep the recorded entry as it is, even if
        // validators (etag, last-modified, content-type) drifted.
        Some(old)
            if old.status == entry.status
                && old.blake3 == entry.blake3
                && old.size == entry.size
                && old.headers.get("location") == entry.headers.get("location") =>
        {
            false
        }
        Some(old) => {
            let why = format!(
                "{key} answered differently: recorded status {} {} ({} bytes), now status {} {} ({} bytes)",
                old.status, old.blake3, old.size, entry.status, entry.blake3, entry.size
            );
            s.abort(Abort::NonDeterministic(why.clone()));
            return Err(rejected(RecordError::NonDeterministic(why)));
        }
        None => true,
    };
    if fresh {
        lock.insert(entry.clone());
        if let Err(e) = lock.save(&s.lock_path) {
            lock.remove(&key);
            return Err(rejected(RecordError::Failed(
                castore::Chain(&e).to_string(),
            )));
        }
    }
    let undo = |lock: &mut Lock| {
        if fresh {
            lock.remove(&key);
            let _ = lock.save(&s.lock_path);
        }
    };
    if let Err(e) = s.roots.as_ref().map_or(Ok(()), |r| r.add(&[digest])) {
        undo(&mut lock);
        return Err(rejected(RecordError::Failed(
            castore::Chain(&e).to_string(),
        )));
    }
    if let Err(e) = txn.commit() {
        undo(&mut lock);
        return Err(rejected(RecordError::Failed(format!(
            "committing the body: {}",
            castore::Chain(&e)
        ))));
    }
    drop(lock);
    limited.keep = true;
    lk(&s.verified).insert(digest);
    Ok(entry)
}

/// Computes SHA-256 of what passes through.
struct ShaTee<R> {
    inner: R,
    sha: sha2::Sha256,
}

impl<R: Read> Read for ShaTee<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }
}

// ---------------------------------------------------------------------------
// Refusals

fn refuse(
    shared: &Shared,
    method: &str,
    url: &str,
    reason: &str,
    code: &'static str,
) -> Response<RespBody> {
    refuse_with(shared, method, url, reason, code, None, Vec::new())
}

fn refuse_with(
    shared: &Shared,
    method: &str,
    url: &str,
    reason: &str,
    code: &'static str,
    nearest: Option<String>,
    differs: Vec<&'static str>,
) -> Response<RespBody> {
    shared.counters.refused.fetch_add(1, Ordering::Relaxed);
    let mut body = format!(
        "fhsx fetch-proxy ({}) refused {method} {url}: {reason}\n",
        shared.mode.as_str()
    );
    if let Some(n) = &nearest {
        body.push_str(&format!(
            "nearest recorded entry: {n} (differs in: {})\n",
            differs.join(", ")
        ));
    }
    shared.emit(Event::Refused {
        mode: shared.mode.as_str(),
        method: method.to_string(),
        url: url.to_string(),
        reason: reason.to_string(),
        nearest,
        differs,
    });
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::FORBIDDEN;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        HeaderName::from_static("x-fhsx-refused"),
        HeaderValue::from_static(code),
    );
    r
}

fn failure(status: StatusCode, msg: String) -> Response<RespBody> {
    let mut r = Response::new(full(format!("fhsx fetch-proxy: {msg}\n")));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        HeaderName::from_static("x-fhsx-error"),
        HeaderValue::from_static("1"),
    );
    r
}

/// How alike an entry is to a request: host, path, port, scheme, query,
/// method equal (in that priority), then the common URL prefix length.
type Score = (bool, bool, bool, bool, bool, bool, usize);

/// The recorded entry nearest to a request, and which parts differ.
fn nearest(lock: &Lock, method: &str, url: &NormUrl) -> Option<(String, Vec<&'static str>)> {
    let want = url.to_string();
    let mut best: Option<(Score, String, Vec<&'static str>)> = None;
    for e in lock.entries() {
        let Ok(eu) = NormUrl::parse(&e.url) else {
            continue;
        };
        let host = eu.host == url.host;
        let path = eu.path == url.path;
        let port = eu.port == url.port;
        let scheme = eu.scheme == url.scheme;
        let query = eu.query == url.query;
        let m = e.method == method;
        let prefix = e
            .url
            .bytes()
            .zip(want.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let score = (host, path, port, scheme, query, m, prefix);
        if best.as_ref().is_none_or(|b| score > b.0) {
            let mut differs = Vec::new();
            for (same, name) in [
                (m, "method"),
                (scheme, "scheme"),
                (host, "host"),
                (port, "port"),
                (path, "path"),
                (query, "query"),
            ] {
                if !same {
                    differs.push(name);
                }
            }
            best = Some((score, format!("{} {}", e.method, e.url), differs));
        }
    }
    best.map(|(_, n, d)| (n, d))
}

// ---------------------------------------------------------------------------
// Connections

/// Serve one client connection (TCP or UNIX) speaking HTTP/1.1 proxy.
pub(crate) async fn serve_client<IO>(shared: Arc<Shared>, io: IO)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let s = shared.clone();
        async move { Ok::<_, Infallible>(outer(s, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades()
        .await;
}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
}

async fn outer(shared: Arc<Shared>, req: Request<Incoming>) -> Response<RespBody> {
    if req.method() == Method::CONNECT {
        let Some(auth) = req.uri().authority().map(|a| a.as_str().to_string()) else {
            return refuse(
                &shared,
                "CONNECT",
                &req.uri().to_string(),
                "CONNECT without host:port",
                "bad-request",
            );
        };
        let (host, port) = match split_authority(&auth, Scheme::Https) {
            Ok(hp) => hp,
            Err(e) => return refuse(&shared, "CONNECT", &auth, &e.to_string(), "bad-request"),
        };
        let s = shared.clone();
        tokio::spawn(async move {
            if let Ok(up) = hyper::upgrade::on(req).await {
                tunnel(s, TokioIo::new(up), host, port).await;
            }
        });
        return Response::new(empty());
    }
    let uri = req.uri().clone();
    let scheme = uri.scheme_str().and_then(Scheme::parse);
    match (scheme, uri.authority()) {
        (Some(scheme), Some(auth)) => {
            let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            handle(shared, scheme, auth.as_str(), pq, req).await
        }
        _ => refuse(
            &shared,
            req.method().as_str(),
            &uri.to_string(),
            "not a proxy request (absolute http:// URL or CONNECT expected; set http_proxy/https_proxy)",
            "not-proxy-request",
        ),
    }
}

/// Yields one already-read byte before the rest of the stream.
struct Prefixed<IO> {
    prefix: Option<u8>,
    inner: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() > 0 {
            if let Some(b) = self.prefix.take() {
                buf.put_slice(&[b]);
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Terminate TLS inside a CONNECT tunnel and serve the requests in it.
async fn tunnel<IO>(shared: Arc<Shared>, mut io: IO, host: String, port: u16)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let target = format!("https://{}:{port}", bracket(&host));
    let mut first = [0u8; 1];
    match io.read(&mut first).await {
        Ok(1) => {}
        _ => return,
    }
    if first[0] != 0x16 {
        let resp = refuse(
            &shared,
            "CONNECT",
            &target,
            "plain bytes after CONNECT (only TLS is accepted in a tunnel; nothing is tunnelled)",
            "not-tls",
        );
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let head = format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain; charset=utf-8\r\nx-fhsx-refused: not-tls\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = io.write_all(head.as_bytes()).await;
        let _ = io.write_all(&body).await;
        let _ = io.shutdown().await;
        // Lingering close: read what the client already sent, so closing
        // with unread input does not turn into a RST that destroys the 403
        // before the client reads it.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            let mut sink = [0u8; 4096];
            while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
        return;
    }
    let io = Prefixed {
        prefix: Some(first[0]),
        inner: io,
    };
    let start = match tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
        .await
    {
        Ok(s) => s,
        Err(_) => return,
    };
    let sni = start
        .client_hello()
        .server_name()
        .map(|s| s.to_ascii_lowercase());
    let host_is_ip = host.parse::<IpAddr>().is_ok();
    match &sni {
        None if !host_is_ip => {
            refuse(
                &shared,
                "CONNECT",
                &target,
                "TLS ClientHello without SNI for a host name",
                "no-sni",
            );
            return;
        }
        Some(s) if *s != host => {
            refuse(
                &shared,
                "CONNECT",
                &target,
                &format!("TLS SNI {s:?} differs from the CONNECT target"),
                "sni-mismatch",
            );
            return;
        }
        _ => {}
    }
    let cfg = match shared.ca.server_config(&host) {
        Ok(c) => c,
        Err(e) => {
            shared.emit(Event::BlobError {
                url: target.clone(),
                error: e.to_string(),
            });
            return;
        }
    };
    let tls = match start.into_stream(cfg).await {
        Ok(t) => t,
        Err(_) => return,
    };
    let svc = service_fn(move |req: Request<Incoming>| {
        let s = shared.clone();
        let host = host.clone();
        async move { Ok::<_, Infallible>(inner(s, host, port, req).await) }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), svc)
        .await;
}

/// A request inside a CONNECT tunnel.
async fn inner(
    shared: Arc<Shared>,
    host: String,
    port: u16,
    req: Request<Incoming>,
) -> Response<RespBody> {
    let authority = format!("{}:{port}", bracket(&host));
    let given = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        });
    if let Some(g) = given {
        match split_authority(&g, Scheme::Https) {
            Ok((h, p)) if h == host && p == port => {}
            _ => {
                return refuse(
                    &shared,
                    req.method().as_str(),
                    &format!("https://{authority}"),
                    &format!("Host {g:?} differs from the CONNECT target {authority}"),
                    "host-mismatch",
                )
            }
        }
    }
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    handle(shared, Scheme::Https, &authority, &pq, req).await
}

/// Route one request: replay from the lock, or record.
async fn handle(
    shared: Arc<Shared>,
    scheme: Scheme,
    authority: &str,
    pq: &str,
    req: Request<Incoming>,
) -> Response<RespBody> {
    let method = req.method().as_str().to_string();
    let url = match NormUrl::from_parts(scheme, authority, pq) {
        Ok(u) => u,
        Err(e) => {
            return refuse(
                &shared,
                &method,
                &format!("{}://{authority}{pq}", scheme.as_str()),
                &e.to_string(),
                "bad-url",
            )
        }
    };
    let url_s = url.to_string();
    if is_upgrade(req.headers()) {
        return refuse(
            &shared,
            &method,
            &url_s,
            "protocol upgrade (e.g. WebSocket) requested; never tunnelled",
            "upgrade",
        );
    }
    let key_method = if req.method() == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    let key = Key {
        url: url_s.clone(),
        method: key_method.to_string(),
    };
    let head = req.method() == Method::HEAD;
    match shared.mode {
        Mode::Replay => {
            let (entry, near) = {
                let lock = lk(&shared.lock);
                match lock.get(&key) {
                    Some(e) => (Some(e.clone()), None),
                    None => (None, nearest(&lock, key_method, &url)),
                }
            };
            match entry {
                Some(e) => serve_entry(&shared, &e, head, req.headers(), None).await,
                None => {
                    let reason = if near.is_none() {
                        "the lock holds no entries"
                    } else {
                        "not in the lock"
                    };
                    let (n, d) = near
                        .map(|(n, d)| (Some(n), d))
                        .unwrap_or((None, Vec::new()));
                    refuse_with(&shared, &method, &url_s, reason, "not-in-lock", n, d)
                }
            }
        }
        Mode::Record => {
            if key_method != "GET" {
                return refuse(
                    &shared,
                    &method,
                    &url_s,
                    "only GET and HEAD requests are recorded",
                    "method-not-recordable",
                );
            }
            if let Some(why) = lk(&shared.aborted).clone() {
                return refuse(
                    &shared,
                    &method,
                    &url_s,
                    &format!("recording aborted: {why}"),
                    "aborted",
                );
            }
            match record(
                &shared,
                key,
                url,
                authority.to_string(),
                pq.to_string(),
                req.headers().clone(),
            )
            .await
            {
                Ok(rec) => {
                    serve_entry(&shared, &rec.entry, head, req.headers(), rec.live_location).await
                }
                Err(RecordError::Failed(msg)) => failure(StatusCode::BAD_GATEWAY, msg),
                Err(RecordError::NonDeterministic(msg)) => {
                    refuse(&shared, &method, &url_s, &msg, "non-deterministic")
                }
                Err(RecordError::Limit(why)) => {
                    refuse(&shared, &method, &url_s, &why.to_string(), "limit")
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Serving an entry

enum RangeAnswer {
    Whole,
    Part(u64, u64),
    Unsatisfiable,
}

fn parse_range(h: &HeaderMap, entry: &Entry) -> RangeAnswer {
    let Some(r) = h.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return RangeAnswer::Whole;
    };
    if let Some(ir) = h.get(header::IF_RANGE).and_then(|v| v.to_str().ok()) {
        let matches = entry.headers.get("etag").is_some_and(|e| e == ir)
            || entry.headers.get("last-modified").is_some_and(|l| l == ir);
        if !matches {
            return RangeAnswer::Whole;
        }
    }
    let size = entry.size;
    let Some(spec) = r.trim().strip_prefix("bytes=") else {
        return RangeAnswer::Whole;
    };
    if spec.contains(',') {
        // Multiple ranges: answer with the whole body, which HTTP allows.
        return RangeAnswer::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeAnswer::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let Ok(n) = b.parse::<u64>() else {
            return RangeAnswer::Whole;
        };
        if n == 0 {
            return RangeAnswer::Unsatisfiable;
        }
        (size.saturating_sub(n), size.saturating_sub(1))
    } else {
        let Ok(s) = a.parse::<u64>() else {
            return RangeAnswer::Whole;
        };
        let e = if b.is_empty() {
            size.saturating_sub(1)
        } else {
            match b.parse::<u64>() {
                Ok(e) if e >= s => e.min(size.saturating_sub(1)),
                _ => return RangeAnswer::Whole,
            }
        };
        (s, e)
    };
    if size == 0 || start >= size {
        return RangeAnswer::Unsatisfiable;
    }
    RangeAnswer::Part(start, end)
}

/// Check a blob once per proxy lifetime: present, right size, right BLAKE3.
async fn ensure_verified(shared: &Arc<Shared>, entry: &Entry) -> Result<PathBuf, String> {
    let path = shared
        .store
        .blob_path(&entry.blake3)
        .ok_or_else(|| format!("blob {} has no local path", entry.blake3))?;
    if lk(&shared.verified).contains(&entry.blake3) {
        return Ok(path);
    }
    let p = path.clone();
    let want = entry.blake3;
    let size = entry.size;
    let s = shared.clone();
    let res = tokio::task::spawn_blocking(move || -> Result<(), String> {
        // Rooted before it is checked: present now means present for as
        // long as the roots are held.
        if let Some(r) = &s.roots {
            r.add(&[want])
                .map_err(|e| format!("rooting blob {want}: {}", castore::Chain(&e)))?;
        }
        let md = std::fs::metadata(&p).map_err(|e| {
            format!("blob {want} is not in the store ({e}); re-record or import it")
        })?;
        if md.len() != size {
            return Err(format!(
                "blob {want} has {} bytes, the lock says {size}",
                md.len()
            ));
        }
        // Read, not mmap: a mapped 1 GiB blob would count as resident memory.
        let mut f = std::fs::File::open(&p).map_err(|e| format!("open blob {want}: {e}"))?;
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; 4 << 20];
        loop {
            let n = f
                .read(&mut buf)
                .map_err(|e| format!("read blob {want}: {e}"))?;
            if n == 0 {
                break;
            }
            h.update_rayon(&buf[..n]);
        }
        let got = Digest::from(h.finalize());
        if got != want {
            return Err(format!(
                "integrity error: blob {want} is corrupt (hashes to {got}); run `fhsx lock verify`"
            ));
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("verification task failed: {e}"))?;
    res?;
    lk(&shared.verified).insert(entry.blake3);
    Ok(path)
}

async fn serve_entry(
    shared: &Arc<Shared>,
    entry: &Entry,
    head: bool,
    req_headers: &HeaderMap,
    live_location: Option<String>,
) -> Response<RespBody> {
    let path = match ensure_verified(shared, entry).await {
        Ok(p) => p,
        Err(error) => {
            shared.emit(Event::BlobError {
                url: entry.url.clone(),
                error: error.clone(),
            });
            return failure(StatusCode::BAD_GATEWAY, error);
        }
    };
    let size = entry.size;
    let range = if entry.status == 200 {
        parse_range(req_headers, entry)
    } else {
        RangeAnswer::Whole
    };
    let mut builder = Response::builder();
    let (status, start, len) = match range {
        RangeAnswer::Whole => (entry.status, 0, size),
        RangeAnswer::Part(s, e) => {
            builder = builder.header(header::CONTENT_RANGE, format!("bytes {s}-{e}/{size}"));
            (206, s, e - s + 1)
        }
        RangeAnswer::Unsatisfiable => {
            builder = builder.header(header::CONTENT_RANGE, format!("bytes */{size}"));
            (416, 0, 0)
        }
    };
    for (k, v) in &entry.headers {
        let v = match (k.as_str(), &live_location) {
            ("location", Some(live)) => live.as_str(),
            _ => v.as_str(),
        };
        builder = builder.header(k.as_str(), v);
    }
    if entry.status == 200 {
        builder = builder.header(header::ACCEPT_RANGES, "bytes");
    }
    builder = builder.status(status).header(header::CONTENT_LENGTH, len);
    let body = if head || len == 0 {
        empty()
    } else if len <= SMALL_BODY {
        let p = path.clone();
        let read = tokio::task::spawn_blocking(move || -> io::Result<Vec<u8>> {
            use std::os::unix::fs::FileExt;
            let f = std::fs::File::open(&p)?;
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, start)?;
            Ok(buf)
        })
        .await;
        match read {
            Ok(Ok(b)) => full(b),
            Ok(Err(e)) => {
                return failure(
                    StatusCode::BAD_GATEWAY,
                    format!("read blob {}: {e}", entry.blake3),
                )
            }
            Err(e) => return failure(StatusCode::BAD_GATEWAY, format!("read task failed: {e}")),
        }
    } else {
        file_body(path, start, len)
    };
    shared.counters.served.fetch_add(1, Ordering::Relaxed);
    match builder.body(body) {
        Ok(r) => r,
        Err(e) => failure(
            StatusCode::BAD_GATEWAY,
            format!("recorded headers are not valid HTTP: {e}"),
        ),
    }
}

// ---------------------------------------------------------------------------
// Recording

async fn record(
    shared: &Arc<Shared>,
    key: Key,
    url: NormUrl,
    authority: String,
    pq: String,
    headers: HeaderMap,
) -> Result<Recorded, RecordError> {
    let cell = lk(&shared.inflight)
        .entry(key.clone())
        .or_insert_with(|| Arc::new(OnceCell::new()))
        .clone();
    let s = shared.clone();
    let k = key.clone();
    let res = cell
        .get_or_init(|| async move {
            // Its own task, so a client hanging up does not abandon a
            // recording other clients are waiting for.
            match tokio::spawn(fetch_and_store(s, k, url, authority, pq, headers)).await {
                Ok(r) => r,
                Err(e) => Err(RecordError::Failed(format!("recording task failed: {e}"))),
            }
        })
        .await
        .clone();
    let mut m = lk(&shared.inflight);
    if m.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
        m.remove(&key);
    }
    res
}

/// Hop-by-hop and proxy headers never forwarded, plus what record mode
/// rewrites itself (conditionals, ranges, encodings, host).
fn forwardable(name: &HeaderName) -> bool {
    let n = name.as_str();
    !(n.starts_with("if-")
        || n.starts_with("proxy-")
        || matches!(
            n,
            "connection"
                | "keep-alive"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "upgrade"
                | "host"
                | "range"
                | "accept-encoding"
                | "content-length"
                | "expect"
        ))
}

enum Decode {
    None,
    Gzip,
    Deflate,
}

async fn send_upstream<IO>(io: IO, req: Request<Empty<Bytes>>) -> Result<Response<Incoming>, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))
}

async fn fetch_and_store(
    shared: Arc<Shared>,
    key: Key,
    url: NormUrl,
    authority: String,
    pq: String,
    headers: HeaderMap,
) -> Result<Recorded, RecordError> {
    let fail = |error: String| {
        shared.emit(Event::RecordFailed {
            method: key.method.clone(),
            url: key.url.clone(),
            error: error.clone(),
        });
        RecordError::Failed(error)
    };
    let Some(client_cfg) = shared.upstream.clone() else {
        return Err(fail("no upstream in replay mode".into()));
    };
    // The Host header: the client's authority without userinfo.
    let host_hdr = match authority.rfind('@') {
        Some(i) => authority[i + 1..].to_string(),
        None => authority.clone(),
    };
    let host_hdr = {
        let default = format!(":{}", url.scheme.default_port());
        host_hdr
            .strip_suffix(&default)
            .map(String::from)
            .unwrap_or(host_hdr)
    };
    let mut rb = Request::builder().method(Method::GET).uri(pq.as_str());
    for (k, v) in headers.iter() {
        if forwardable(k) {
            rb = rb.header(k, v);
        }
    }
    rb = rb
        .header(header::HOST, host_hdr)
        .header(header::ACCEPT_ENCODING, "identity");
    let req = rb
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(format!("bad request: {e}")))?;

    shared
        .counters
        .upstream_connects
        .fetch_add(1, Ordering::Relaxed);
    let connect = tokio::net::TcpStream::connect((url.host.as_str(), url.port));
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(fail(format!("connect to {}: {e}", url.authority()))),
        Err(_) => {
            return Err(fail(format!(
                "connect to {}: no answer in {}s",
                url.authority(),
                CONNECT_TIMEOUT.as_secs()
            )))
        }
    };
    let _ = tcp.set_nodelay(true);
    let resp = match url.scheme {
        Scheme::Http => send_upstream(tcp, req).await.map_err(&fail)?,
        Scheme::Https => {
            let name = rustls_pki_types::ServerName::try_from(url.host.clone())
                .map_err(|e| fail(format!("bad TLS server name {}: {e}", url.host)))?;
            let tls = tokio_rustls::TlsConnector::from(client_cfg)
                .connect(name, tcp)
                .await
                .map_err(|e| fail(format!("TLS to {}: {e}", url.authority())))?;
            send_upstream(tls, req).await.map_err(&fail)?
        }
    };
    let status = resp.status();
    if status.is_server_error() {
        return Err(fail(format!(
            "upstream answered {status}; server errors are not recorded (retry later)"
        )));
    }
    let (parts, mut body) = resp.into_parts();
    let hget = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_string())
    };
    let mut rec_headers = BTreeMap::new();
    for n in ["content-type", "etag", "last-modified", "location"] {
        if let Some(v) = hget(n) {
            rec_headers.insert(n.to_string(), v);
        }
    }
    let mut live_location = None;
    if let Some(loc) = rec_headers.get("location").cloned() {
        let clean = sanitize_location(&loc);
        if clean != loc {
            live_location = Some(loc);
            rec_headers.insert("location".into(), clean);
        }
    }
    let ce = hget("content-encoding").map(|s| s.to_ascii_lowercase());
    let ctype = hget("content-type")
        .unwrap_or_default()
        .to_ascii_lowercase();
    let is_gz_file =
        ctype.contains("gzip") || url.path.ends_with(".gz") || url.path.ends_with(".tgz");
    let decode = match ce.as_deref() {
        None | Some("") | Some("identity") => Decode::None,
        // A .tar.gz labelled `Content-Encoding: gzip`: the file is the gzip.
        Some("gzip") | Some("x-gzip") if is_gz_file => Decode::None,
        Some("gzip") | Some("x-gzip") => Decode::Gzip,
        Some("deflate") => Decode::Deflate,
        Some(other) => {
            rec_headers.insert("content-encoding".into(), other.to_string());
            Decode::None
        }
    };

    let request = format!("{} {}", key.method, key.url);
    // A declared length past a limit aborts before a byte is stored.
    let declared = match decode {
        Decode::None => hget("content-length").and_then(|v| v.parse::<u64>().ok()),
        _ => None,
    };
    if let Some(n) = declared {
        let over = if n > shared.max_body {
            Some((RecordLimit::BodyBytes, shared.max_body))
        } else if shared.record_bytes.load(Ordering::Relaxed) + n > shared.max_record {
            Some((RecordLimit::RecordBytes, shared.max_record))
        } else {
            None
        };
        if let Some((limit, max)) = over {
            let why = shared.abort(Abort::Limit {
                limit,
                max,
                request: request.clone(),
            });
            return Err(RecordError::Limit(why));
        }
    }

    let (tx, rx) = mpsc::channel::<Chunk>(16);
    let entry = Entry {
        method: key.method.clone(),
        url: key.url.clone(),
        status: status.as_u16(),
        size: 0,
        blake3: Digest::of(b""),
        sha256: String::new(),
        headers: rec_headers,
    };
    let s = shared.clone();
    let guard = shared.writers.enter();
    let writer = tokio::task::spawn_blocking(move || {
        let _running = guard;
        store_and_enter(&s, entry, decode, declared, rx, request)
    });
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    if tx.send(Chunk::Data(data)).await.is_err() {
                        break;
                    }
                }
            }
            Some(Err(e)) => {
                let _ = tx
                    .send(Chunk::Err(io::Error::other(format!("upstream body: {e}"))))
                    .await;
                break;
            }
            None => {
                let _ = tx.send(Chunk::End).await;
                break;
            }
        }
    }
    drop(tx);
    let entry = match writer.await {
        Ok(Ok(e)) => e,
        Ok(Err(StoreFail::Failed(e))) => return Err(fail(e)),
        Ok(Err(StoreFail::Record(e))) => {
            if let RecordError::Failed(msg) = &e {
                shared.emit(Event::RecordFailed {
                    method: key.method.clone(),
                    url: key.url.clone(),
                    error: msg.clone(),
                });
            }
            return Err(e);
        }
        Err(e) => return Err(fail(format!("store task failed: {e}"))),
    };
    shared.counters.recorded.fetch_add(1, Ordering::Relaxed);
    shared.emit(Event::Recorded {
        method: entry.method.clone(),
        url: entry.url.clone(),
        status: entry.status,
        size: entry.size,
        blake3: entry.blake3.to_string(),
    });
    Ok(Recorded {
        entry,
        live_location,
    })
}
