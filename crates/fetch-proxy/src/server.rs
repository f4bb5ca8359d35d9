//! Running the proxy: a listener (TCP or UNIX socket) on its own tokio
//! runtime thread, so synchronous callers (the executor, the CLI, tests) can
//! start and stop it like any other resource.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::oneshot;

use crate::proxy::{serve_client, Shared};
use crate::{Abort, Error, ProxyConfig};

/// Where to listen.
#[derive(Clone, Debug)]
pub enum Listen {
    Tcp(SocketAddr),
    /// A UNIX socket path; it must not exist yet.
    Unix(PathBuf),
}

/// Where the proxy actually listens (a TCP port 0 resolved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Responses served from the CAS (both modes).
    pub served: u64,
    /// Requests refused with `403`.
    pub refused: u64,
    /// Responses recorded (record mode).
    pub recorded: u64,
    /// Upstream TCP connections opened. Always 0 in replay.
    pub upstream_connects: u64,
}

/// What a finished proxy reports.
#[derive(Clone, Debug)]
pub struct Summary {
    pub stats: Stats,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// A proxy running on its own runtime thread. Dropping it stops it.
pub struct RunningProxy {
    shared: Arc<Shared>,
    addr: ListenAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningProxy {
    /// Load the lock, bind, and start serving.
    pub fn start(cfg: ProxyConfig, listen: Listen) -> Result<Self, Error> {
        let shared = Arc::new(Shared::new(cfg)?);
        // Everything async happens on the proxy's own thread, so `start`
        // works from plain threads and from inside another tokio runtime.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<ListenAddr, Error>>();
        let (stop_tx, stop_rx) = oneshot::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fetch-proxy-main".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("fetch-proxy")
                    .enable_io()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Runtime(e)));
                        return;
                    }
                };
                let bound = rt.block_on(bind(&listen));
                let listener = match bound {
                    Ok((l, addr)) => {
                        let _ = ready_tx.send(Ok(addr));
                        l
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(accept_loop(s, listener, stop_rx));
                rt.shutdown_timeout(Duration::from_millis(200));
            })
            .map_err(Error::Runtime)?;
        let addr = match ready_rx.recv() {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::Runtime(std::io::Error::other(
                    "the proxy thread died while starting",
                )));
            }
        };
        Ok(RunningProxy {
            shared,
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// The TCP address, if listening on TCP.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self.addr {
            ListenAddr::Tcp(a) => Some(a),
            ListenAddr::Unix(_) => None,
        }
    }

    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        Stats {
            served: c.served.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            recorded: c.recorded.load(Ordering::Relaxed),
            upstream_connects: c.upstream_connects.load(Ordering::Relaxed),
        }
    }

    /// Why recording was aborted, if it was: the message (naming the limit,
    /// for a limit).
    pub fn aborted(&self) -> Option<String> {
        self.abort().map(|a| a.to_string())
    }

    /// Why recording was aborted, if it was.
    pub fn abort(&self) -> Option<Abort> {
        self.shared
            .aborted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn stop_thread(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Bodies still streaming when the runtime stopped fail (their
        // sender is gone) and drop their transactions: wait for that, so
        // nothing half-stored outlives the proxy.
        self.shared.writers.wait_idle(Duration::from_secs(60));
        if let ListenAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Stop serving. Fails if the recording was aborted — as
    /// non-deterministic ([`Error::NonDeterministic`]) or past a limit
    /// ([`Error::RecordLimit`]); both are [`Error::is_violation`]. The lock
    /// then holds only what was recorded before the abort.
    pub fn shutdown(mut self) -> Result<Summary, Error> {
        self.stop_thread();
        let stats = self.stats();
        match self.abort() {
            Some(Abort::NonDeterministic(why)) => Err(Error::NonDeterministic(why)),
            Some(a @ Abort::Limit { limit, max, .. }) => Err(Error::RecordLimit {
                limit,
                max,
                message: a.to_string(),
            }),
            None => Ok(Summary { stats }),
        }
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

async fn bind(listen: &Listen) -> Result<(Listener, ListenAddr), Error> {
    match listen {
        Listen::Tcp(a) => {
            let err = |source| Error::Listen {
                addr: a.to_string(),
                source,
            };
            let l = TcpListener::bind(a).await.map_err(err)?;
            let local = l.local_addr().map_err(err)?;
            Ok((Listener::Tcp(l), ListenAddr::Tcp(local)))
        }
        Listen::Unix(p) => {
            let l = UnixListener::bind(p).map_err(|source| Error::Listen {
                addr: p.display().to_string(),
                source,
            })?;
            Ok((Listener::Unix(l), ListenAddr::Unix(p.clone())))
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: Listener, mut stop: oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            _ = &mut stop => return,
            r = accept(&listener) => {
                if let Some(fut) = r {
                    let s = shared.clone();
                    match fut {
                        Conn::Tcp(t) => { let _ = t.set_nodelay(true); tokio::spawn(serve_client(s, t)); }
                        Conn::Unix(u) => { tokio::spawn(serve_client(s, u)); }
                    }
                } else {
                    // Transient accept failure (e.g. EMFILE): back off briefly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(l: &Listener) -> Option<Conn> {
    match l {
        Listener::Tcp(l) => l.accept().await.ok().map(|(s, _)| Conn::Tcp(s)),
        Listener::Unix(l) => l.accept().await.ok().map(|(s, _)| Conn::Unix(s)),
    }
}
