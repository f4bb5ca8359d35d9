//! `fetch-proxy`: the build's only network path.
//!
//! Owns: the record/replay HTTP(S) proxy (hyper 1 on tokio; HTTP/1.1 to
//! clients, HTTP/2 inside CONNECT tunnels by ALPN), the lock file
//! (`fetch.lock`: [`lock`]), URL normalisation ([`url`]), and the per-store CA
//! that mints leaf certificates per SNI ([`ca`]). In record mode every
//! response body streams into the CAS and becomes a lock entry; in replay
//! mode only the lock is served, from the CAS, and everything else is refused
//! with `403` and a structured log line — no upstream socket is ever opened.
//!
//! Does not own: the store itself (`castore`), starting the proxy per build
//! and forwarding `127.0.0.1:3128` inside the sandbox to its UNIX socket
//! (`executor-sandbox` / `fhs-executor`), or the command line (`fhsx`).
//!
//! Entry points: [`ProxyConfig`] + [`RunningProxy::start`] (TCP or UNIX
//! listener, own runtime thread), [`client_env`] for the sandbox's
//! environment, [`Lock`] for `fhsx lock verify|diff`.
//!
//! Behaviour worth knowing (see also DESIGN.md, "The fetch proxy"):
//! - Record mode serves every response from the CAS after the blob is
//!   committed and the lock entry written, exactly as replay would serve it
//!   (Content-Length always, allow-listed headers only). The one difference:
//!   a `Location` holding secrets goes to the live client as the upstream
//!   sent it, and to the lock sanitised.
//! - Only `GET` (and `HEAD`, recorded as `GET`) is recorded; other methods
//!   are refused with 403 in both modes.
//! - An upstream `Content-Encoding: gzip`/`deflate` body is stored decoded
//!   (stable digest whatever the upstream's gzip settings), unless the
//!   resource is itself a gzip file (`.gz`/`.tgz` path or gzip content type),
//!   which is stored as sent. Any other encoding is stored as sent and its
//!   `content-encoding` kept in the entry.
//! - Upstream 5xx and connection failures are not recorded: the client gets
//!   `502` with `x-fhsx-error: 1`. Refusals are always `403` with
//!   `x-fhsx-refused: <reason>`.
//! - A key answered with a different status, body or `Location` aborts the
//!   recording (every later request is refused, [`RunningProxy::shutdown`]
//!   returns [`Error::NonDeterministic`]); a drifting ETag or Last-Modified
//!   with the same body keeps the recorded entry untouched.
//! - Recording is bounded: one body may store at most
//!   [`ProxyConfig::max_body_bytes`] (default 4 GiB, after decoding) and one
//!   recording (one proxy run) at most [`ProxyConfig::max_record_bytes`]
//!   (default 16 GiB) in all. A declared `Content-Length` past either is
//!   refused before a byte is stored; otherwise the count is kept as the
//!   body streams. Crossing a limit aborts the recording like
//!   non-determinism does — the request gets `403` with
//!   `x-fhsx-refused: limit`, every later request is refused, and
//!   [`RunningProxy::abort`] / [`RunningProxy::aborted`] name the limit —
//!   and `shutdown` returns [`Error::RecordLimit`]. Both aborts are
//!   [`Error::is_violation`]: the build failed a rule, the executor records
//!   it as such. The defaults are above the largest single downloads real
//!   builds make (toolchain and SDK archives of a few GB) while keeping one
//!   runaway or endless response from filling the disk.
//! - Nothing half-done is stored: a body streams into a store transaction
//!   whose staging is discarded unless the body ended whole (an explicit
//!   end from the upstream, and its `Content-Length` if it had one), fit
//!   the limits, and its lock entry was written (or matched the one there);
//!   only then is it committed. A cancelled or interrupted body — the
//!   upstream hung up, the client went away, the proxy was stopped at the
//!   build's timeout — never becomes a store object, and `shutdown`
//!   returns only once every unfinished body has been discarded.
//! - Every blob the proxy records or serves is added to temporary gc roots
//!   (the caller's [`ProxyConfig::temp_roots`], else the proxy's own) before
//!   it is committed or checked, so a concurrent `fhsx store gc` cannot
//!   delete it under the build.

pub mod ca;
pub mod lock;
mod proxy;
mod server;
pub mod url;

use std::path::{Path, PathBuf};

pub use ca::CertAuthority;
pub use lock::{Entry, Key, Lock, LockDiff, VerifyProblem};
pub use proxy::{
    Abort, Event, EventSink, Mode, ProxyConfig, RecordLimit, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
};
pub use server::{Listen, ListenAddr, RunningProxy, Stats, Summary};

/// Variables naming the CA bundle, one per client family (OpenSSL, curl,
/// Python requests, cargo, Node, git).
pub const CA_BUNDLE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

/// The environment a build inside the sandbox needs to use the proxy:
/// `http_proxy`/`https_proxy` in both cases pointing at `proxy_url` (inside
/// the sandbox, `http://127.0.0.1:3128`), every [`CA_BUNDLE_VARS`] entry
/// pointing at `ca_bundle` (a file holding only the proxy's CA, see
/// [`CertAuthority::cert_pem`]), and `no_proxy` empty so nothing bypasses it.
pub fn client_env(proxy_url: &str, ca_bundle: &str) -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> =
        ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"]
            .into_iter()
            .map(|k| (k, proxy_url.to_string()))
            .collect();
    v.push(("no_proxy", String::new()));
    v.push(("NO_PROXY", String::new()));
    v.extend(CA_BUNDLE_VARS.iter().map(|k| (*k, ca_bundle.to_string())));
    v
}

/// Everything the proxy library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid URL: {0}")]
    BadUrl(String),

    #[error("invalid lock file {}: {reason}", .path.display())]
    BadLock { path: PathBuf, reason: String },

    #[error("TLS setup failed: {0}")]
    Tls(String),

    #[error("cannot read upstream CA file {}: {reason}", .path.display())]
    UpstreamCa { path: PathBuf, reason: String },

    #[error(transparent)]
    Store(#[from] castore::Error),

    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot start the proxy runtime")]
    Runtime(#[source] std::io::Error),

    /// Recording stopped: the same request got a different answer.
    #[error("non-deterministic upstream: {0}; the recording was aborted (delete the entry from the lock to re-record it on purpose)")]
    NonDeterministic(String),

    /// Recording stopped: a body, or the recording, outgrew a limit.
    #[error("{message}; the recording was aborted")]
    RecordLimit {
        limit: RecordLimit,
        /// The limit's value in bytes.
        max: u64,
        message: String,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether this is an integrity failure (DESIGN.md's exit code 3) rather
    /// than a usage or environment error.
    pub fn is_integrity(&self) -> bool {
        matches!(self, Error::NonDeterministic(_))
            || matches!(self, Error::Store(e) if e.kind() == castore::ErrorKind::Integrity)
    }

    /// Whether the recording was aborted ([`Error::NonDeterministic`] or
    /// [`Error::RecordLimit`]): the build broke a rule and must be recorded
    /// as failed with this as its violation — not an infrastructure error.
    pub fn is_violation(&self) -> bool {
        matches!(self, Error::NonDeterministic(_) | Error::RecordLimit { .. })
    }
}
