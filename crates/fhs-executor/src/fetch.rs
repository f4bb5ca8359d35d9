//! The network stage: the record/replay fetch proxy for one build, wired
//! into its sandbox.
//!
//! Replay serves the action's lock as it is. Record starts from an empty
//! lock in the build's working area — a re-recording, as `cargo update`
//! re-resolves rather than patches — and the new lock replaces the
//! action's only once the build has succeeded ([`Recording::commit`]), by
//! an atomic rename: a failed or interrupted recording leaves the old lock
//! exactly as it was.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use castore::store::LocalStore;
use castore::Digest;
use executor_sandbox::SandboxSpec;

use crate::Error;

/// Where the build reaches the proxy, and where it finds the proxy's CA.
const PROXY_PORT: u16 = executor_sandbox::DEFAULT_PROXY_PORT;
const PROXY_CA: &str = executor_sandbox::PROXY_CA_PATH;

/// What a build's network is to be.
pub struct Network<'a> {
    /// Record (afresh) rather than replay.
    pub record: bool,
    /// The action's lock.
    pub lock: &'a Path,
    /// Extra CAs trusted upstream while recording.
    pub upstream_ca: &'a [PathBuf],
    /// `[limits] fetch`.
    pub max_record_bytes: u64,
}

/// A running proxy for one build.
pub struct FetchSession {
    proxy: fetch_proxy::RunningProxy,
    /// The lock the proxy serves or writes.
    lock_path: PathBuf,
    /// In record mode: the action's lock, replaced on success.
    record_into: Option<PathBuf>,
    refusals: Arc<Mutex<Vec<String>>>,
}

/// What the proxy saw, once stopped.
pub struct FetchResult {
    pub refusals: Vec<String>,
    pub aborted: Option<String>,
    pub lock_digest: Digest,
    /// The lock's bytes (served, or recorded).
    pub lock_bytes: Vec<u8>,
    /// A finished recording, to commit if the build succeeds.
    pub recording: Option<Recording>,
}

/// A lock recorded in the working area, not yet the action's.
pub struct Recording {
    recorded: PathBuf,
    into: PathBuf,
}

impl Recording {
    /// Make the recorded lock the action's: written beside it, then renamed
    /// over it.
    pub fn commit(self) -> Result<PathBuf, Error> {
        let bytes = fs::read(&self.recorded).map_err(|e| Error::io("read", &self.recorded, e))?;
        let dir = self.into.parent().unwrap_or(Path::new("."));
        let tmp = tempfile::NamedTempFile::new_in(dir)
            .map_err(|e| Error::io("create a temporary lock in", dir, e))?;
        fs::write(tmp.path(), &bytes).map_err(|e| Error::io("write", tmp.path(), e))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| Error::io("sync", tmp.path(), e))?;
        tmp.persist(&self.into)
            .map_err(|e| Error::io("replace", &self.into, e.error))?;
        Ok(self.into)
    }
}

impl FetchSession {
    /// Start the proxy on a UNIX socket in `work` and wire it into `spec`:
    /// the supervisor forwards `127.0.0.1:3128` inside to it, and the build
    /// trusts only the proxy's CA. `lock` is the action's lock.
    pub fn start(
        store: &LocalStore,
        net: &Network<'_>,
        work: &Path,
        roots: &Arc<castore::TempRoots>,
        spec: &mut SandboxSpec,
    ) -> Result<FetchSession, Error> {
        let Network {
            record,
            lock,
            upstream_ca,
            max_record_bytes,
        } = *net;
        let (mode, lock_path, record_into) = if record {
            (
                fetch_proxy::Mode::Record,
                work.join("fetch.lock"),
                Some(lock.to_path_buf()),
            )
        } else {
            (fetch_proxy::Mode::Replay, lock.to_path_buf(), None)
        };
        let start_err = |e: fetch_proxy::Error| {
            Error::Other(format!("starting the fetch proxy: {}", castore::Chain(&e)))
        };
        let mut cfg = fetch_proxy::ProxyConfig::new(mode, lock_path.clone(), store.clone())
            .map_err(start_err)?;
        cfg.upstream_ca_files = upstream_ca.to_vec();
        // What it serves and records stays in the store while the build lives.
        cfg.temp_roots = Some(roots.clone());
        cfg.max_record_bytes = max_record_bytes;
        cfg.max_body_bytes = cfg.max_body_bytes.min(max_record_bytes);
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let sink = refusals.clone();
        cfg.events = Some(Arc::new(move |e: &fetch_proxy::Event| {
            if let fetch_proxy::Event::Refused { .. } = e {
                let line = serde_json::to_string(e).unwrap_or_default();
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        }));
        let ca = work.join("proxy-ca.pem");
        fs::write(&ca, cfg.ca.cert_pem()).map_err(|e| Error::io("write", &ca, e))?;
        // Public, and read by the build (a build user, as root) whatever
        // our umask.
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&ca, fs::Permissions::from_mode(0o644))
                .map_err(|e| Error::io("chmod", &ca, e))?;
        }
        let sock = work.join("proxy.sock");
        let proxy = fetch_proxy::RunningProxy::start(cfg, fetch_proxy::Listen::Unix(sock.clone()))
            .map_err(start_err)?;
        spec.proxy(&sock, PROXY_PORT)?;
        spec.ro_bind_file(&ca, Path::new(PROXY_CA))?;
        for (k, v) in fetch_proxy::client_env(&format!("http://127.0.0.1:{PROXY_PORT}"), PROXY_CA) {
            spec.set_env(k, v)?;
        }
        Ok(FetchSession {
            proxy,
            lock_path,
            record_into,
            refusals,
        })
    }

    /// Stop the proxy and say what it saw.
    pub fn finish(self) -> Result<FetchResult, Error> {
        // A limit is the action's `[limits] fetch`, whichever of the
        // proxy's two caps it was.
        let aborted = match self.proxy.abort() {
            Some(fetch_proxy::Abort::Limit { max, request, .. }) => Some(format!(
                "[limits] fetch: recording {request} went past {max} bytes, so the recording was stopped and nothing of it kept; raise [limits] fetch (bytes) if the download is legitimate"
            )),
            Some(other) => Some(other.to_string()),
            None => None,
        };
        let shut = self.proxy.shutdown();
        let aborted = match (shut, aborted) {
            (Ok(_), a) => a,
            (Err(e), a) if e.is_violation() || e.is_integrity() => {
                Some(a.unwrap_or_else(|| castore::Chain(&e).to_string()))
            }
            (Err(e), _) => {
                return Err(Error::Other(format!(
                    "stopping the fetch proxy: {}",
                    castore::Chain(&e)
                )))
            }
        };
        let bytes = fs::read(&self.lock_path).unwrap_or_default();
        let refusals =
            std::mem::take(&mut *self.refusals.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(FetchResult {
            refusals,
            aborted,
            lock_digest: Digest::of(&bytes),
            lock_bytes: bytes,
            recording: self.record_into.map(|into| Recording {
                recorded: self.lock_path,
                into,
            }),
        })
    }
}
