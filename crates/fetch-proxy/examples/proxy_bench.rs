//! Replay throughput and latency of the fetch proxy vs a direct loopback
//! fetch, with curl as the client. Run through `bench/proxy_replay.sh`.
//!
//! Usage: proxy_bench [BIG_MIB] [SMALL_REQUESTS]
//!
//! 1. a static loopback server (hyper, 256 KiB reads) serves a BIG_MIB file
//!    and a 100-byte file;
//! 2. both are recorded through the proxy into a fresh store;
//! 3. replay: curl fetches the big file directly and through the proxy
//!    (best of 3 each), then SMALL_REQUESTS small fetches on one keep-alive
//!    connection, direct and through the proxy; medians of curl's per-
//!    transfer time_total are compared.

use std::convert::Infallible;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use fetch_proxy::{Listen, Mode, ProxyConfig, RunningProxy};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

type B = BoxBody<Bytes, std::io::Error>;

struct ChanBody {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
    len: u64,
}

impl Body for ChanBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

fn serve_file(path: PathBuf) -> B {
    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if len <= 64 * 1024 {
        return Full::new(Bytes::from(std::fs::read(&path).unwrap_or_default()))
            .map_err(|n| match n {})
            .boxed();
    }
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let Ok(mut f) = std::fs::File::open(&path) else {
            return;
        };
        loop {
            let mut buf = vec![0u8; 256 * 1024];
            match f.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    ChanBody { rx, len }.boxed()
}

fn start_static(root: PathBuf) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(l.local_addr().expect("addr")).expect("send");
            let root = Arc::new(root);
            loop {
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                let _ = s.set_nodelay(true);
                let root = root.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let p = root.join(req.uri().path().trim_start_matches('/'));
                        async move { Ok::<_, Infallible>(hyper::Response::new(serve_file(p))) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
    });
    rx.recv().expect("static server address")
}

fn curl_time(proxy: Option<std::net::SocketAddr>, urls: &[String]) -> Vec<f64> {
    let mut c = Command::new("curl");
    for v in [
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "no_proxy",
        "NO_PROXY",
    ] {
        c.env_remove(v);
    }
    c.args(["-sS", "--noproxy", ""]);
    if let Some(p) = proxy {
        c.arg("--proxy").arg(format!("http://{p}"));
    }
    for u in urls {
        c.args(["-o", "/dev/null", "-w", "%{http_code} %{time_total}\\n"])
            .arg(u);
    }
    let o = c.output().expect("run curl (apt-get install -y curl)");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let (code, t) = l.split_once(' ').expect("curl output");
            assert_eq!(code, "200", "curl got {code}");
            t.parse::<f64>().expect("time")
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn write_big(path: &Path, mib: u64) {
    let mut block = vec![0u8; 1 << 20];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    for i in 0..mib {
        block[0..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(&block).expect("write");
    }
    f.flush().expect("flush");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let small_n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let dir = tempfile::tempdir().expect("tempdir");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).expect("mkdir");
    write_big(&www.join("big"), mib);
    std::fs::write(www.join("small"), [b'x'; 100]).expect("small");
    let origin = start_static(www);
    let big = format!("http://{origin}/big");
    let small = format!("http://{origin}/small");

    let store_dir = dir.path().join("store");
    let lock = dir.path().join("fetch.lock");
    let open = |mode| {
        let store = castore::LocalStore::open(&store_dir).expect("store");
        let cfg = ProxyConfig::new(mode, lock.clone(), store).expect("config");
        RunningProxy::start(cfg, Listen::Tcp("127.0.0.1:0".parse().expect("addr"))).expect("proxy")
    };
    let t = Instant::now();
    let rec = open(Mode::Record);
    curl_time(rec.tcp_addr(), &[big.clone(), small.clone()]);
    rec.shutdown().expect("record");
    println!(
        "recorded {mib} MiB + 100 B in {:.2}s",
        t.elapsed().as_secs_f64()
    );

    let rep = open(Mode::Replay);
    let p = rep.tcp_addr();
    // Warm: page cache for the origin file and the blob, blob verification.
    curl_time(None, std::slice::from_ref(&big));
    let first = curl_time(p, std::slice::from_ref(&big))[0];
    let direct: Vec<f64> = (0..3)
        .flat_map(|_| curl_time(None, std::slice::from_ref(&big)))
        .collect();
    let proxied: Vec<f64> = (0..3)
        .flat_map(|_| curl_time(p, std::slice::from_ref(&big)))
        .collect();
    let best = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
    let bytes = (mib << 20) as f64;
    let (d, x) = (best(&direct), best(&proxied));
    println!(
        "big body {mib} MiB: direct {:.0} MiB/s, replay {:.0} MiB/s, ratio {:.2}x (first replay incl. blob verification {:.0} MiB/s)",
        bytes / d / 1048576.0,
        bytes / x / 1048576.0,
        d / x,
        bytes / first / 1048576.0
    );
    let urls: Vec<String> = (0..small_n).map(|_| small.clone()).collect();
    let sd = median(curl_time(None, &urls)[1..].to_vec());
    let sp = median(curl_time(p, &urls)[1..].to_vec());
    println!(
        "small body (100 B, {small_n} requests, keep-alive): direct median {:.3} ms, replay median {:.3} ms, overhead {:.3} ms",
        sd * 1000.0,
        sp * 1000.0,
        (sp - sd) * 1000.0
    );
    let s = rep.shutdown().expect("replay").stats;
    assert_eq!(s.upstream_connects, 0);
}
