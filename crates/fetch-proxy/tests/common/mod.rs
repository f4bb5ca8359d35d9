//! Test fixtures: loopback upstream servers (HTTP, and HTTPS with a test CA),
//! a canary that counts connections, real clients (curl, Python urllib, a
//! raw socket client), and a proxy harness. Everything listens on 127.0.0.1.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fetch_proxy::{Event, Mode, ProxyConfig, RunningProxy};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};

pub type B = BoxBody<Bytes, std::io::Error>;

pub fn full(b: impl Into<Bytes>) -> B {
    Full::new(b.into()).map_err(|n| match n {}).boxed()
}

/// A streamed body; `exact` = Some(n) gives a Content-Length, None chunked.
struct ChanBody {
    rx: mpsc::Receiver<Bytes>,
    exact: Option<u64>,
}

impl Body for ChanBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
    fn size_hint(&self) -> SizeHint {
        match self.exact {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// The deterministic content of `/big/N`.
pub fn big_chunk(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = offset + i;
            ((x.wrapping_mul(31) ^ (x >> 9)) % 251) as u8
        })
        .collect()
}

pub fn big_body(n: u64) -> Vec<u8> {
    big_chunk(0, n as usize)
}

pub const HELLO: &[u8] = b"hello, world\n";
pub const GZ_TEXT: &str =
    "this text was gzipped by an upstream that ignores Accept-Encoding: identity\n";
pub const SECRET_TOKEN: &str = "SECRET-TOKEN-1f3a";
pub const SECRET_COOKIE: &str = "SECRET-COOKIE-9c2e";
pub const SECRET_PASS: &str = "SECRET-PASS-77ab";
pub const SECRET_SIG: &str = "SECRETSIG0123456789abcdef";
pub const SECRET_CRED: &str = "SECRETCREDAKIA42";

/// (method, path and query, headers) of one request an upstream saw.
pub type SeenRequest = (String, String, HashMap<String, String>);

/// What an upstream saw.
#[derive(Default)]
pub struct Seen {
    pub conns: AtomicU64,
    pub requests: Mutex<Vec<SeenRequest>>,
    pub counter: AtomicU64,
}

impl Seen {
    pub fn paths(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.1.clone())
            .collect()
    }
    pub fn count(&self, pq: &str) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.1 == pq)
            .count()
    }
}

async fn route(seen: Arc<Seen>, scheme: &'static str, req: Request<Incoming>) -> Response<B> {
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let path = req.uri().path().to_string();
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let host = headers.get("host").cloned().unwrap_or_default();
    seen.requests
        .lock()
        .unwrap()
        .push((req.method().to_string(), pq.clone(), headers.clone()));
    let n = seen.counter.fetch_add(1, Ordering::SeqCst);
    let mut b = Response::builder().status(200);
    let body = match path.as_str() {
        "/hello" => {
            b = b
                .header("content-type", "text/plain")
                .header("etag", "\"v1\"")
                .header("last-modified", "Mon, 02 Jan 2023 00:00:00 GMT")
                .header("set-cookie", "tracking=should-not-be-recorded");
            full(HELLO)
        }
        p if p.starts_with("/big/") => {
            let size: u64 = p[5..].parse().unwrap_or(0);
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                let mut off = 0u64;
                while off < size {
                    let len = (size - off).min(64 * 1024) as usize;
                    if tx.send(Bytes::from(big_chunk(off, len))).await.is_err() {
                        return;
                    }
                    off += len as u64;
                }
            });
            b = b.header("content-type", "application/octet-stream");
            ChanBody {
                rx,
                exact: Some(size),
            }
            .boxed()
        }
        "/chunked" => {
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                for i in 0..50 {
                    let piece = format!("chunk {i:02} {}\n", "x".repeat(i * 3));
                    if tx.send(Bytes::from(piece)).await.is_err() {
                        return;
                    }
                }
            });
            ChanBody { rx, exact: None }.boxed()
        }
        "/gzip" => {
            let mut enc = flate2::GzBuilder::new()
                .mtime(1_000_000 + n as u32)
                .write(Vec::new(), flate2::Compression::new((n % 9) as u32 + 1));
            enc.write_all(GZ_TEXT.repeat(50).as_bytes()).unwrap();
            let gz = enc.finish().unwrap();
            b = b
                .header("content-encoding", "gzip")
                .header("content-type", "text/plain");
            full(gz)
        }
        "/r1" => {
            b = b.status(302).header("location", "/r2");
            full("moved 1\n")
        }
        "/r2" => {
            b = b
                .status(302)
                .header("location", format!("{scheme}://{host}/final"));
            full("moved 2\n")
        }
        "/final" => full("final destination\n"),
        "/missing" => {
            b = b.status(404);
            full("not here\n")
        }
        "/private" => {
            let auth_ok = headers
                .get("authorization")
                .is_some_and(|a| a.contains(SECRET_TOKEN) || a.starts_with("Basic "));
            let cookie_ok = headers
                .get("cookie")
                .is_some_and(|c| c.contains(SECRET_COOKIE));
            if auth_ok && cookie_ok {
                full("private data\n")
            } else {
                b = b.status(401);
                full("who are you\n")
            }
        }
        "/signed" => {
            if pq.contains("X-Amz-Signature=") {
                full("signed data\n")
            } else {
                b = b.status(403);
                full("unsigned\n")
            }
        }
        "/counter" => full(format!("count {n}\n")),
        "/drift" => {
            b = b.header("etag", format!("\"e{n}\""));
            full("same body, new etag\n")
        }
        "/error" => {
            b = b.status(503);
            full("try later\n")
        }
        "/presign" => {
            b = b.status(302).header(
                "location",
                format!("{scheme}://{host}/signed?v=1&X-Amz-Credential={SECRET_CRED}&X-Amz-Date=20260101T000000Z&X-Amz-Signature={SECRET_SIG}"),
            );
            full("go sign\n")
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(400)).await;
            full("slow body\n")
        }
        "/stall" | "/stall-chunked" => {
            let exact = (path == "/stall").then_some(1 << 30);
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                for i in 0..64u64 {
                    if tx
                        .send(Bytes::from(big_chunk(i * 65536, 65536)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                // Then never finish; hold the sender open.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                drop(tx);
            });
            ChanBody { rx, exact }.boxed()
        }
        "/endless" => {
            // Chunked and never ending: until the reader goes away.
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                let mut off = 0u64;
                loop {
                    if tx.send(Bytes::from(big_chunk(off, 65536))).await.is_err() {
                        return;
                    }
                    off += 65536;
                }
            });
            ChanBody { rx, exact: None }.boxed()
        }
        "/cut" => {
            // Promises 1 MiB, sends 300 KiB, then the body ends: the
            // server has to drop the connection mid-body.
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                for i in 0..5u64 {
                    if tx
                        .send(Bytes::from(big_chunk(i * 61440, 61440)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
            ChanBody {
                rx,
                exact: Some(1 << 20),
            }
            .boxed()
        }
        p if p.starts_with("/norm/") => full(format!("norm body for {p}\n")),
        _ => {
            b = b.status(StatusCode::NOT_FOUND);
            full("unknown path\n")
        }
    };
    b.body(body).unwrap()
}

/// A loopback upstream on its own runtime thread.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    /// Plain HTTP on `127.0.0.1:port` (0 = any).
    pub fn http(port: u16) -> Upstream {
        Upstream::start(port, None)
    }

    /// HTTPS with a leaf from `ca`.
    pub fn https(ca: &TestCa) -> Upstream {
        Upstream::start(0, Some(ca.server_config()))
    }

    fn start(port: u16, tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        let seen = Arc::new(Seen::default());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let s = seen.clone();
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                loop {
                    let (tcp, _) = tokio::select! {
                        _ = &mut stop_rx => return,
                        r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                    };
                    s.conns.fetch_add(1, Ordering::SeqCst);
                    let s2 = s.clone();
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        let scheme = if tls.is_some() { "https" } else { "http" };
                        let svc = service_fn(move |req| {
                            let s3 = s2.clone();
                            async move { Ok::<_, Infallible>(route(s3, scheme, req).await) }
                        });
                        let builder = hyper::server::conn::http1::Builder::new();
                        match tls {
                            None => {
                                let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                            }
                            Some(cfg) => {
                                if let Ok(t) =
                                    tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await
                                {
                                    let _ = builder.serve_connection(TokioIo::new(t), svc).await;
                                }
                            }
                        }
                    });
                }
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        Upstream {
            addr,
            seen,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Counts every TCP connection made to it, answers none.
pub struct Canary {
    pub addr: SocketAddr,
    pub conns: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Canary {
    /// On `port` (0: any free one). A given port was just an upstream's:
    /// until another process's short-lived socket that took it as its
    /// ephemeral port lets go, the bind is tried again (for up to 10 s).
    pub fn start(port: u16) -> Canary {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let l = loop {
            match std::net::TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => break l,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Err(e) => panic!("the canary cannot listen on 127.0.0.1:{port}: {e}"),
            }
        };
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, s) = (conns.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok(_) => {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Canary {
            addr,
            conns,
            stop,
            thread: Some(thread),
        }
    }

    pub fn count(&self) -> u64 {
        // Let any in-flight connect land first.
        std::thread::sleep(Duration::from_millis(50));
        self.conns.load(Ordering::SeqCst)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A test CA for the upstream HTTPS server, and its PEM on disk.
pub struct TestCa {
    pub pem_path: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new(dir: &Path) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "upstream test CA");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).unwrap();
        let pem_path = dir.join("upstream-ca.pem");
        std::fs::write(&pem_path, cert.pem()).unwrap();
        TestCa {
            pem_path,
            issuer: rcgen::Issuer::new(p, key),
        }
    }

    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        p.use_authority_key_identifier_extension = true;
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        let der = rustls_pki_types::PrivateKeyDer::Pkcs8(
            rustls_pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()),
        );
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der)
        .unwrap();
        Arc::new(cfg)
    }
}

/// A store, a lock path and an event log under one temp dir.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub store: PathBuf,
    pub events: Arc<Mutex<Vec<Event>>>,
}

impl Harness {
    pub fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        Harness {
            dir,
            store,
            events: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.store.join("ca/ca.crt")
    }

    pub fn proxy(&self, mode: Mode, lock: &Path, upstream_ca: Option<&Path>) -> RunningProxy {
        self.proxy_with(mode, lock, upstream_ca, |_| {})
    }

    /// [`Harness::proxy`], with `tune` applied to the config last.
    pub fn proxy_with(
        &self,
        mode: Mode,
        lock: &Path,
        upstream_ca: Option<&Path>,
        tune: impl FnOnce(&mut ProxyConfig),
    ) -> RunningProxy {
        let store = castore::LocalStore::open(&self.store).unwrap();
        let mut cfg = ProxyConfig::new(mode, lock.to_path_buf(), store).unwrap();
        cfg.system_roots = false;
        cfg.upstream_ca_files = upstream_ca
            .map(|p| vec![p.to_path_buf()])
            .unwrap_or_default();
        let ev = self.events.clone();
        cfg.events = Some(Arc::new(move |e: &Event| {
            ev.lock().unwrap().push(e.clone());
        }));
        tune(&mut cfg);
        RunningProxy::start(
            cfg,
            fetch_proxy::Listen::Tcp("127.0.0.1:0".parse().unwrap()),
        )
        .unwrap()
    }

    pub fn refusals(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, Event::Refused { .. }))
            .cloned()
            .collect()
    }

    /// Bytes in the store's staging area (in-flight or leftover writes).
    pub fn staged_bytes(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let mut total = 0;
            for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                let m = match e.metadata() {
                    Ok(m) => m,
                    Err(_) => continue,
                };
                total += if m.is_dir() { walk(&e.path()) } else { m.len() };
            }
            total
        }
        walk(&self.store.join("tmp"))
    }

    pub fn blob_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let blobs = self.store.join("blobs");
        if let Ok(rd) = std::fs::read_dir(&blobs) {
            for shard in rd.flatten() {
                if let Ok(rd2) = std::fs::read_dir(shard.path()) {
                    out.extend(rd2.flatten().map(|e| e.path()));
                }
            }
        }
        out.sort();
        out
    }
}

// ---------------------------------------------------------------------------
// Clients

pub fn require(tool: &str, apt: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "`{tool}` is required by these tests: apt-get install -y {apt}"
    );
}

fn clean_env(c: &mut Command) {
    for v in [
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
    ] {
        c.env_remove(v);
    }
}

/// curl through the proxy; returns (status, body).
pub fn curl(proxy: SocketAddr, cacert: &Path, url: &str, extra: &[&str]) -> (u16, Vec<u8>) {
    require("curl", "curl");
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut c = Command::new("curl");
    clean_env(&mut c);
    c.args(["-sS", "--noproxy", "", "--proxy"])
        .arg(format!("http://{proxy}"))
        .arg("--cacert")
        .arg(cacert)
        .arg("-o")
        .arg(out.path())
        .args(["-w", "%{http_code}"])
        .args(extra)
        .arg(url);
    let o = c.output().unwrap();
    let code = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, std::fs::read(out.path()).unwrap_or_default())
}

const PY: &str = r#"
import sys, ssl, urllib.request, urllib.error
proxy, cafile, url, out = sys.argv[1:5]
headers = dict(h.split(": ", 1) for h in sys.argv[5:])
ctx = ssl.create_default_context(cafile=cafile)
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({"http": proxy, "https": proxy}),
    urllib.request.HTTPSHandler(context=ctx))
req = urllib.request.Request(url, headers=headers)
try:
    r = opener.open(req, timeout=60)
    code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
open(out, "wb").write(body)
print(code)
"#;

/// Python urllib through the proxy; returns (status, body).
pub fn python(proxy: SocketAddr, cacert: &Path, url: &str, headers: &[&str]) -> (u16, Vec<u8>) {
    require("python3", "python3");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fetch.py");
    std::fs::write(&script, PY).unwrap();
    let out = dir.path().join("out");
    let mut c = Command::new("python3");
    clean_env(&mut c);
    let o = c
        .arg(&script)
        .arg(format!("http://{proxy}"))
        .arg(cacert)
        .arg(url)
        .arg(&out)
        .args(headers)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let code = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, std::fs::read(&out).unwrap_or_default())
}

/// A parsed raw HTTP/1.x response.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub fn parse_raw(buf: &[u8], head_request: bool) -> Raw {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no header end");
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = buf[end + 4..].to_vec();
    let r = Raw {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(cl) = r
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        if !head_request {
            body.truncate(cl);
        }
    }
    Raw { body, ..r }
}

/// Send `request` verbatim to the proxy (it should ask `Connection: close`).
pub fn raw(proxy: SocketAddr, request: &str) -> Raw {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse_raw(&buf, request.starts_with("HEAD "))
}

/// `GET absolute-url` with `Connection: close` and extra header lines.
pub fn raw_get(proxy: SocketAddr, url: &str, extra: &str) -> Raw {
    let host = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    raw(
        proxy,
        &format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\r\n"),
    )
}

/// Read a child process's peak resident set (VmHWM) in KiB.
pub fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
