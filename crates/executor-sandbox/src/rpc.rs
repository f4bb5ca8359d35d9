//! The supervisor RPC bridge: the one sanctioned channel between a contained
//! run and the program that started it.
//!
//! Wire format: each message is one frame, a big-endian `u32` length then
//! that many bytes of JSON ([`Request`] from the sandbox, [`Response`] back).
//! A frame longer than [`MAX_FRAME`] is answered with an error and the
//! connection closed; garbage is answered with an error and closed; a
//! truncated frame just closes the connection. Connections beyond the limit
//! are refused with an error frame, and so is every request past the run's
//! budget of frames and bytes ([`RpcLimits`]). Nothing a client sends can
//! take the server down.
//!
//! What a client sends is an attacker's: a log line's level comes from a
//! closed set and its message is escaped ([`castore::shown::escaped`]), so
//! it is one line that no terminal acts on, and it starts `[sandbox LEVEL]`,
//! never as fhsx's own lines do. It goes where the command's stderr goes —
//! for `fhsx build` the build's log, where it counts against `[limits]
//! log` like anything else the build prints.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use executor_core::SandboxError;
use serde::{Deserialize, Serialize};

use crate::sys::path_err;

/// The largest frame payload accepted: 1 MiB.
pub const MAX_FRAME: usize = 1 << 20;

/// What a sandboxed process may ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Liveness check.
    Ping,
    /// A log line for the run's log.
    Log { level: String, message: String },
    /// The run's state.
    Status,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Pong,
    Logged,
    Status { run_id: String, elapsed_ms: u64 },
    Error { message: String },
}

/// What the embedding program implements to answer requests.
pub trait RpcHandler: Send + Sync + 'static {
    fn handle(&self, request: Request) -> Response;
}

/// The levels a log line may have.
pub const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// A handler that answers ping and status and writes log lines where the
/// command's stderr goes (fhsx's own stderr if not told otherwise).
#[derive(Debug)]
pub struct BasicHandler {
    pub run_id: String,
    started: Instant,
    out: Option<std::sync::Mutex<std::fs::File>>,
}

impl BasicHandler {
    pub fn new(run_id: impl Into<String>) -> Self {
        BasicHandler {
            run_id: run_id.into(),
            started: Instant::now(),
            out: None,
        }
    }

    /// Log lines go to `out` (the run's output: its log, for a build).
    pub fn with_output(mut self, out: Option<std::fs::File>) -> Self {
        self.out = out.map(std::sync::Mutex::new);
        self
    }

    fn log(&self, level: &str, message: &str) -> Response {
        let Some(level) = LOG_LEVELS.iter().find(|l| **l == level) else {
            let shown: String = castore::shown::escaped(level.as_bytes())
                .chars()
                .take(64)
                .collect();
            return Response::Error {
                message: format!(
                    "unknown log level \"{shown}\": use one of {}",
                    LOG_LEVELS.join(", ")
                ),
            };
        };
        let line = format!(
            "[sandbox {level}] {}\n",
            castore::shown::escaped(message.as_bytes())
        );
        let written = match &self.out {
            Some(out) => out
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .write_all(line.as_bytes()),
            None => io::stderr().write_all(line.as_bytes()),
        };
        match written {
            Ok(()) => Response::Logged,
            Err(e) => Response::Error {
                message: format!("the run's log is closed: {e}"),
            },
        }
    }
}

impl RpcHandler for BasicHandler {
    fn handle(&self, request: Request) -> Response {
        match request {
            Request::Ping => Response::Pong,
            Request::Log { level, message } => self.log(&level, &message),
            Request::Status => Response::Status {
                run_id: self.run_id.clone(),
                elapsed_ms: self.started.elapsed().as_millis() as u64,
            },
        }
    }
}

/// Write one frame.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> Result<(), SandboxError> {
    if payload.len() > MAX_FRAME {
        return Err(SandboxError::FrameTooLarge {
            len: payload.len() as u64,
            max: MAX_FRAME as u64,
        });
    }
    let len = (payload.len() as u32).to_be_bytes();
    w.write_all(&len)
        .and_then(|_| w.write_all(payload))
        .and_then(|_| w.flush())
        .map_err(|e| SandboxError::Protocol(format!("writing a frame: {e}")))
}

/// Read one frame; `Ok(None)` on a clean end of stream before a frame.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Vec<u8>>, SandboxError> {
    let mut hdr = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut hdr[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(SandboxError::Protocol("truncated frame header".into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SandboxError::Protocol(format!("reading a frame: {e}"))),
        }
    }
    let len = u32::from_be_bytes(hdr) as usize;
    if len > MAX_FRAME {
        return Err(SandboxError::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME as u64,
        });
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)
        .map_err(|e| SandboxError::Protocol(format!("truncated frame body: {e}")))?;
    Ok(Some(buf))
}

/// Send a request and read its response (a client, for tests and tools).
pub fn call(stream: &mut UnixStream, request: &Request) -> Result<Response, SandboxError> {
    let body = serde_json::to_vec(request)
        .map_err(|e| SandboxError::Protocol(format!("encoding a request: {e}")))?;
    write_frame(stream, &body)?;
    let frame = read_frame(stream)?
        .ok_or_else(|| SandboxError::Protocol("the server closed the connection".into()))?;
    serde_json::from_slice(&frame)
        .map_err(|e| SandboxError::Protocol(format!("malformed response: {e}")))
}

/// Server limits.
#[derive(Debug, Clone, Copy)]
pub struct RpcLimits {
    /// Connections served at once; more are refused.
    pub max_connections: usize,
    /// A connection idle this long is closed.
    pub idle_timeout: Duration,
    /// Requests the server answers over its life, all connections
    /// together; past it each is refused and its connection closed.
    pub max_frames: u64,
    /// Request bytes the server reads over its life, likewise.
    pub max_bytes: u64,
}

impl Default for RpcLimits {
    fn default() -> Self {
        RpcLimits {
            max_connections: 16,
            idle_timeout: Duration::from_secs(60),
            // Room for a chatty build's log lines and pings (a million
            // requests, 256 MiB), not for a flood that keeps fhsx busy.
            max_frames: 1 << 20,
            max_bytes: 256 << 20,
        }
    }
}

/// What the clients of one server have sent so far.
#[derive(Debug, Default)]
struct Budget {
    frames: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
}

impl Budget {
    /// Count a frame of `len` bytes; an error message once past `limits`.
    fn spend(&self, len: usize, limits: &RpcLimits) -> Result<(), String> {
        let frames = self.frames.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = self.bytes.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        if frames > limits.max_frames || bytes > limits.max_bytes {
            return Err(format!(
                "the bridge's budget for this run ({} requests, {} bytes) is spent; send fewer messages",
                limits.max_frames, limits.max_bytes
            ));
        }
        Ok(())
    }
}

/// The host side of the bridge: a listening UNIX socket and its threads.
pub struct RpcServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    listener: Arc<UnixListener>,
    thread: Option<JoinHandle<()>>,
    active: Arc<AtomicUsize>,
    handler: Arc<dyn RpcHandler>,
    limits: RpcLimits,
    budget: Arc<Budget>,
}

impl std::fmt::Debug for RpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer")
            .field("path", &self.path)
            .finish()
    }
}

impl RpcServer {
    /// Listen at `path` and serve `handler` on a background thread.
    pub fn bind(
        path: &Path,
        handler: Arc<dyn RpcHandler>,
        limits: RpcLimits,
    ) -> Result<RpcServer, SandboxError> {
        let mut server = Self::bind_polled(path, handler, limits)?;
        set_nonblocking(&server.listener, false, path)?;
        let (l2, s2) = (server.listener.clone(), server.stop.clone());
        let conns = server.connections();
        let thread = std::thread::Builder::new()
            .name("fhsx-rpc".into())
            .spawn(move || accept_loop(&l2, &s2, &conns))
            .map_err(|e| path_err("starting the RPC thread for", path, e))?;
        server.thread = Some(thread);
        Ok(server)
    }

    /// Listen at `path` without a thread of its own: the caller polls
    /// [`listener_fd`](Self::listener_fd) and calls
    /// [`accept_ready`](Self::accept_ready) when it is readable (each
    /// connection still gets its own thread). Saves a thread per run when
    /// most runs never connect. The socket is made mode 0600: only its
    /// owner may connect until it is handed on.
    pub fn bind_polled(
        path: &Path,
        handler: Arc<dyn RpcHandler>,
        limits: RpcLimits,
    ) -> Result<RpcServer, SandboxError> {
        let listener = Arc::new(
            crate::sys::listen_unix_owner_only(path)
                .map_err(|e| path_err("binding the RPC socket", path, e))?,
        );
        set_nonblocking(&listener, true, path)?;
        Ok(RpcServer {
            path: path.to_path_buf(),
            stop: Arc::new(AtomicBool::new(false)),
            listener,
            thread: None,
            active: Arc::new(AtomicUsize::new(0)),
            handler,
            limits,
            budget: Arc::new(Budget::default()),
        })
    }

    /// What serving a connection needs, to hand to a thread.
    fn connections(&self) -> Connections {
        Connections {
            active: self.active.clone(),
            handler: self.handler.clone(),
            limits: self.limits,
            budget: self.budget.clone(),
        }
    }

    /// The listening socket, for `poll`.
    pub fn listener_fd(&self) -> std::os::fd::RawFd {
        self.listener.as_raw_fd()
    }

    /// Admit every pending connection (polled mode).
    pub fn accept_ready(&self) {
        let conns = self.connections();
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => admit(stream, &conns),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // EMFILE and friends: back off rather than spin the poller.
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    /// The socket's host path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            // Wake accept(): shut the listener down and, in case that does
            // not interrupt it, connect once.
            // SAFETY: shutting down our own listening socket.
            unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
            let _ = UnixStream::connect(&self.path);
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn set_nonblocking(l: &UnixListener, on: bool, path: &Path) -> Result<(), SandboxError> {
    l.set_nonblocking(on)
        .map_err(|e| path_err("configuring the RPC socket", path, e))
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn error_frame(stream: &mut UnixStream, message: String) {
    if let Ok(body) = serde_json::to_vec(&Response::Error { message }) {
        let _ = write_frame(stream, &body);
    }
}

/// A server's connections: how many are served, by what, within what.
#[derive(Clone)]
struct Connections {
    active: Arc<AtomicUsize>,
    handler: Arc<dyn RpcHandler>,
    limits: RpcLimits,
    budget: Arc<Budget>,
}

fn accept_loop(listener: &UnixListener, stop: &AtomicBool, conns: &Connections) {
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok((s, _)) => admit(s, conns),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // EMFILE and friends: back off rather than spin.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Serve one accepted connection on its own thread, or refuse it with an
/// error frame when the limit is reached.
fn admit(mut stream: UnixStream, conns: &Connections) {
    let (active, limits) = (&conns.active, conns.limits);
    // An accepted socket does not inherit O_NONBLOCK on Linux, but be sure.
    let _ = stream.set_nonblocking(false);
    if active.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
        active.fetch_sub(1, Ordering::SeqCst);
        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
        error_frame(
            &mut stream,
            format!(
                "too many connections (limit {}); reuse one connection",
                limits.max_connections
            ),
        );
        return;
    }
    let slot = Slot(active.clone());
    let (h, budget) = (conns.handler.clone(), conns.budget.clone());
    // If the thread cannot start, the closure (and its slot) is dropped.
    let _ = std::thread::Builder::new()
        .name("fhsx-rpc-conn".into())
        .spawn(move || {
            let _slot = slot;
            serve(stream, &*h, limits, &budget);
        });
}

fn serve(mut stream: UnixStream, handler: &dyn RpcHandler, limits: RpcLimits, budget: &Budget) {
    let _ = stream.set_read_timeout(Some(limits.idle_timeout));
    let _ = stream.set_write_timeout(Some(limits.idle_timeout));
    loop {
        let frame = match read_frame(&mut stream) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e @ SandboxError::FrameTooLarge { .. }) => {
                error_frame(&mut stream, e.to_string());
                return;
            }
            Err(_) => return,
        };
        if let Err(message) = budget.spend(frame.len() + 4, &limits) {
            error_frame(&mut stream, message);
            return;
        }
        let response = match serde_json::from_slice::<Request>(&frame) {
            Ok(req) => handler.handle(req),
            Err(e) => {
                error_frame(&mut stream, format!("malformed request: {e}"));
                return;
            }
        };
        let Ok(body) = serde_json::to_vec(&response) else {
            return;
        };
        if write_frame(&mut stream, &body).is_err() {
            return;
        }
    }
}
