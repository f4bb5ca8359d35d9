//! The build pipeline: action → composed view → FUSE mount → sandbox →
//! read-set check → outputs → manifest → signed record.
//!
//! Every resource a build takes — the scratch directory, the mount, the
//! sandbox's processes — is owned by a guard on this stack frame, so any
//! error path (and a panic) releases it: a failed build leaves no mount,
//! process or temp dir behind.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Digest, Directory, Name, Node};
use castore_fuse::{MountOptions, ReadSet};
use ed25519_dalek::SigningKey;
use executor_core::record::{list_digest, RECORD_FORMAT};
use executor_core::{
    BuildOutcome, BuildRecord, BuildRequest, ExitStatus, NetworkMode, ResourceUse,
};
use executor_sandbox::{Outcome, Output, RealFs, RunOptions, Runtime, SandboxSpec, Stdin};

use crate::scratch::{DiskLimit, WorkArea};
use crate::{ingest, keys, manifest, sign, Error};

/// The primary FHS executor over a local store.
pub struct FhsExecutor {
    store: LocalStore,
    key: SigningKey,
    /// SIGTERM → SIGKILL grace at a timeout.
    pub grace: Duration,
    /// Set to stop a running build (SIGINT, a client that went away): it
    /// ends like a timeout and everything is cleaned up.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Keep the scratch directory of a failed build for debugging (its path
    /// is written to the log).
    pub keep_failed: bool,
}

/// The fixed environment every build starts from (the action's `env`
/// overrides or extends it).
const BASE_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
    ),
    ("HOME", "/build/home"),
    ("TMPDIR", "/tmp"),
    ("SOURCE_DATE_EPOCH", "0"),
    ("LANG", "C.UTF-8"),
    ("TZ", "UTC"),
    ("USER", "build"),
    ("out", "/build/out"),
];

/// What the view gets when no atom supplies these files (as Nix does).
const SYNTHETIC_ETC: &[(&str, &str)] = &[
    ("passwd", "root:x:0:0:root:/build:/noshell\nbuild:x:1000:100:build:/build/home:/noshell\nnobody:x:65534:65534:nobody:/nonexistent:/noshell\n"),
    ("group", "root:x:0:\nusers:x:100:\nnogroup:x:65534:\n"),
    ("hosts", "127.0.0.1 localhost\n::1 localhost\n"),
];

impl FhsExecutor {
    /// An executor over `store`, signing with the store's key (created on
    /// first use).
    pub fn open(store: LocalStore) -> Result<Self, Error> {
        let key = keys::load_or_generate(&keys::key_path(store.root()))?;
        Ok(FhsExecutor {
            store,
            key,
            grace: executor_sandbox::GRACE_PERIOD,
            cancel: None,
            keep_failed: false,
        })
    }

    pub fn store(&self) -> &LocalStore {
        &self.store
    }

    /// Sign the binding of a TLS certificate to this executor's key (see
    /// [`sign::tls_binding_message`]).
    pub fn sign_tls_binding(&self, cert_der: &[u8]) -> Vec<u8> {
        use ed25519_dalek::Signer;
        self.key
            .sign(&sign::tls_binding_message(cert_der))
            .to_bytes()
            .to_vec()
    }

    pub fn public_key(&self) -> String {
        keys::public_key_string(&self.key.verifying_key())
    }

    fn check_present(&self, what: &'static str, d: &Digest) -> Result<(), Error> {
        if self.store.has_directory(d)? {
            Ok(())
        } else {
            Err(Error::MissingInput { what, digest: *d })
        }
    }

    /// Compose closure then toolchain, plus synthetic `/etc` files no atom
    /// supplies.
    fn compose_view(&self, atoms: &[Digest]) -> Result<castore::Composition, Error> {
        let first = castore::compose(&self.store, atoms)?;
        let mut missing = Directory::new();
        for (name, content) in SYNTHETIC_ETC {
            let path = format!("etc/{name}");
            if castore::walk::lookup(&self.store, &first.root, &path).is_err() {
                let digest = self.store.put_blob(content.as_bytes())?;
                missing.insert(
                    Name::new(*name)?,
                    Node::File {
                        digest,
                        size: content.len() as u64,
                        executable: false,
                    },
                )?;
            }
        }
        if missing.is_empty() {
            return Ok(first);
        }
        let mut root = Directory::new();
        root.insert(
            Name::new("etc")?,
            Node::Directory {
                size: missing.size(),
                digest: self.store.put_directory(&missing)?,
            },
        )?;
        let synthetic = self.store.put_directory(&root)?;
        let mut all = atoms.to_vec();
        all.push(synthetic);
        Ok(castore::compose(&self.store, &all)?)
    }

    fn build_inner(
        &self,
        req: &BuildRequest,
        log: &mut (dyn Write + Send),
    ) -> Result<BuildOutcome, Error> {
        let action = &req.action;
        let started = Instant::now();
        let (lock_digest, lock_bytes) = match action.network.mode {
            NetworkMode::None => (None, None),
            NetworkMode::Record if !req.allow_record => {
                return Err(Error::Usage(
                    "the action asks for network mode \"record\", the one impure mode: pass --record to allow it".into(),
                ))
            }
            NetworkMode::Replay | NetworkMode::Record => {
                let p = req.lock_path.as_ref().ok_or_else(|| {
                    Error::Other("network mode needs a lock file; none was given".into())
                })?;
                let bytes = match fs::read(p) {
                    Ok(b) => b,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && action.network.mode == NetworkMode::Record => Vec::new(),
                    Err(e) => return Err(Error::io("read fetch lock", p, e)),
                };
                (Some(Digest::of(&bytes)), Some(bytes))
            }
        };
        let _ = lock_bytes;
        for d in &action.inputs.closure {
            self.check_present("closure", d)?;
        }
        for d in &action.inputs.toolchain {
            self.check_present("toolchain", d)?;
        }
        if let Some(s) = &action.inputs.source {
            self.check_present("source", s)?;
        }
        let action_digest = action.digest(lock_digest.as_ref());

        let mut atoms = action.inputs.closure.clone();
        atoms.extend_from_slice(&action.inputs.toolchain);
        let view = self.compose_view(&atoms)?;

        // Private working area: scratch (→ /build, size-capped where the
        // host allows) and the mount point.
        let work = WorkArea::create(action.limits.disk)?;
        // fhsx's own lines, ahead of the build's in the stored log.
        let mut notes = Vec::new();
        if let DiskLimit::NotEnforced(why) = &work.disk {
            let _ = writeln!(notes, "fhsx: [limits] disk is not enforced here: {why}");
            let _ = log.write_all(&notes);
        }
        let scratch = work.scratch().to_path_buf();
        let mnt = work.path().join("view");
        for d in [&scratch, &mnt, &scratch.join("home"), &scratch.join("out")] {
            fs::create_dir_all(d).map_err(|e| Error::io("create", d, e))?;
        }
        if let Some(src) = &action.inputs.source {
            castore::export::export(&self.store, src, &scratch.join("src"), &())?;
        }
        make_world_writable(&scratch)?;

        castore_fuse::preflight().map_err(|e| Error::Other(e.to_string()))?;
        let guard = castore_fuse::mount(&self.store, &view.root, &mnt, &MountOptions::default())
            .map_err(|e| Error::Other(format!("mounting the view: {e}")))?;

        let runtime = Runtime::new()?;
        let mut spec =
            SandboxSpec::view(&mnt, &scratch, runtime.paths().clone(), Arc::new(RealFs))?;
        for (k, v) in BASE_ENV {
            spec.set_env(k, *v)?;
        }
        for (k, v) in &action.run.env {
            spec.set_env(k, v)?;
        }
        spec.chdir(&action.run.workdir);
        spec.nproc(Some(action.limits.pids));
        spec.limits(executor_sandbox::Limits {
            memory: Some(action.limits.memory),
            file_size: Some(action.limits.file_size),
            open_files: Some(action.limits.open_files),
        });
        let proxy = match action.network.mode {
            NetworkMode::None => None,
            mode => Some(self.start_proxy(req, mode, work.path(), &mut spec)?),
        };
        let command: Vec<OsString> = action.run.command.iter().map(OsString::from).collect();
        // stdout and stderr share one pipe, teed live to `log` and kept whole.
        let (mut reader, writer) =
            std::io::pipe().map_err(|e| Error::io("create the log pipe for", &scratch, e))?;
        let opts = RunOptions {
            timeout: Some(action.run.timeout),
            grace: self.grace,
            stdin: Stdin::Null,
            output: Output::Fd(writer.into()),
            cancel: self.cancel.clone(),
            ..RunOptions::default()
        };
        let (ran, mut log_bytes) = std::thread::scope(|scope| {
            let log = &mut *log;
            let tee = scope.spawn(move || {
                let mut all = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match reader.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let _ = log.write_all(&buf[..n]);
                            all.extend_from_slice(&buf[..n]);
                        }
                    }
                }
                all
            });
            let ran = runtime.run(&spec, &executor_sandbox::current_host_env(), &command, opts);
            (ran, tee.join().unwrap_or_default())
        });
        // Unmount before anything else can fail: the read set is wanted either way.
        let mounted = guard
            .finish(&self.store)
            .map_err(|e| Error::Other(format!("unmounting the view: {e}")))?;
        let fetch = proxy.map(|p| p.finish()).transpose()?;
        let report = ran?;
        log_bytes.splice(0..0, notes);
        let mut violations = Vec::new();
        let mut fetch_lock_digest = lock_digest;
        if let Some(f) = &fetch {
            for line in &f.refusals {
                log_bytes.extend_from_slice(format!("fhsx: fetch refused: {line}\n").as_bytes());
                violations.push(format!("fetch refused: {line}"));
            }
            if let Some(why) = &f.aborted {
                log_bytes.extend_from_slice(format!("fhsx: recording aborted: {why}\n").as_bytes());
                violations.push(format!("recording aborted: {why}"));
            }
            fetch_lock_digest = Some(f.lock_digest);
        }
        let log_digest = self.store.put_blob(&log_bytes)?;
        mounted.check().map_err(|e| {
            Error::Containment(format!("the view refused corrupt store content: {e}"))
        })?;
        check_read_set(&self.store, &view.root, &mounted.read_set)?;

        let exit = match report.outcome {
            Outcome::Exited(c) => ExitStatus::Exited { code: c },
            Outcome::Signaled(s) => ExitStatus::Signaled { signal: s },
            Outcome::TimedOut { .. } => ExitStatus::TimedOut,
        };
        let (output_digest, manifest_digest) = if exit.success() && violations.is_empty() {
            let out = ingest::ingest_outputs(&self.store, &scratch, &action.outputs.paths)?;
            let (_, m) = manifest::derive_and_store(&self.store, &out)?;
            (Some(out), Some(m))
        } else {
            (None, None)
        };
        let record = BuildRecord {
            format: RECORD_FORMAT,
            action_digest,
            closure_digest: list_digest(&action.inputs.closure),
            toolchain_digest: list_digest(&action.inputs.toolchain),
            view_digest: view.root,
            fetch_lock_digest,
            output_digest,
            interface_manifest_digest: manifest_digest,
            observed_read_set_digest: mounted.read_set_digest,
            read_set_size: mounted.read_set.entries.len() as u64,
            log_digest,
            exit,
            violations: violations.clone(),
            resources: ResourceUse {
                wall_ms: started.elapsed().as_millis() as u64,
                ..ResourceUse::default()
            },
            executor: format!("fhsx {} {}", env!("CARGO_PKG_VERSION"), self.public_key()),
        };
        let signed = sign::sign(record, &self.key);
        let record_digest = sign::store_record(&self.store, &signed)?;
        let failed = !signed.record.exit.success() || !violations.is_empty();
        if failed && self.keep_failed {
            let own_fs = matches!(work.disk, DiskLimit::Enforced(_));
            let kept = work.keep();
            let _ = writeln!(
                log,
                "fhsx: kept the failed build's scratch at {}/build",
                kept.display()
            );
            if own_fs {
                let _ = writeln!(
                    log,
                    "fhsx: it is its own size-capped file system: `umount {}/build` when done",
                    kept.display()
                );
            }
        } else {
            drop(work);
        }
        if !violations.is_empty() {
            return Err(Error::Containment(format!(
                "{}; the record {record_digest} says so",
                violations.join("; ")
            )));
        }
        Ok(BuildOutcome {
            record_digest,
            record: signed,
        })
    }

    /// Start the fetch proxy on a UNIX socket in `work` and wire it into the
    /// sandbox: the supervisor forwards `127.0.0.1:3128` inside to it, and
    /// the build trusts only the proxy's CA.
    fn start_proxy(
        &self,
        req: &BuildRequest,
        mode: NetworkMode,
        work: &Path,
        spec: &mut SandboxSpec,
    ) -> Result<FetchSession, Error> {
        let lock_path = req
            .lock_path
            .clone()
            .ok_or_else(|| Error::Usage("network mode needs a lock file; none was given".into()))?;
        let mode = match mode {
            NetworkMode::Record => fetch_proxy::Mode::Record,
            _ => fetch_proxy::Mode::Replay,
        };
        let mut cfg = fetch_proxy::ProxyConfig::new(mode, lock_path.clone(), self.store.clone())
            .map_err(|e| Error::Other(format!("starting the fetch proxy: {e}")))?;
        cfg.upstream_ca_files = req.upstream_ca.clone();
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
        let sock = work.join("proxy.sock");
        let proxy = fetch_proxy::RunningProxy::start(cfg, fetch_proxy::Listen::Unix(sock.clone()))
            .map_err(|e| Error::Other(format!("starting the fetch proxy: {e}")))?;
        spec.proxy(&sock, PROXY_PORT)?;
        spec.ro_bind_file(&ca, Path::new(PROXY_CA))?;
        for (k, v) in fetch_proxy::client_env(&format!("http://127.0.0.1:{PROXY_PORT}"), PROXY_CA) {
            spec.set_env(k, v)?;
        }
        Ok(FetchSession {
            proxy,
            lock_path,
            refusals,
        })
    }
}

/// Where the build reaches the proxy, and where it finds the proxy's CA.
const PROXY_PORT: u16 = executor_sandbox::DEFAULT_PROXY_PORT;
const PROXY_CA: &str = executor_sandbox::PROXY_CA_PATH;

/// A running proxy for one build.
struct FetchSession {
    proxy: fetch_proxy::RunningProxy,
    lock_path: PathBuf,
    refusals: Arc<Mutex<Vec<String>>>,
}

/// What the proxy saw, once stopped.
struct FetchResult {
    refusals: Vec<String>,
    aborted: Option<String>,
    lock_digest: Digest,
}

impl FetchSession {
    fn finish(self) -> Result<FetchResult, Error> {
        let aborted = self.proxy.aborted();
        let shut = self.proxy.shutdown();
        let aborted = match (shut, aborted) {
            (Ok(_), a) => a,
            (Err(e), a) if e.is_integrity() => Some(a.unwrap_or_else(|| e.to_string())),
            (Err(e), _) => return Err(Error::Other(format!("stopping the fetch proxy: {e}"))),
        };
        let bytes = fs::read(&self.lock_path).unwrap_or_default();
        let refusals =
            std::mem::take(&mut *self.refusals.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(FetchResult {
            refusals,
            aborted,
            lock_digest: Digest::of(&bytes),
        })
    }
}

impl executor_core::Executor for FhsExecutor {
    type Error = Error;

    fn build(
        &self,
        request: &BuildRequest,
        log: &mut (dyn Write + Send),
    ) -> Result<BuildOutcome, Error> {
        self.build_inner(request, log)
    }
}

/// The sandbox user is not the host user: let it write its scratch.
fn make_world_writable(dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let meta = fs::symlink_metadata(&d).map_err(|e| Error::io("stat", &d, e))?;
        if meta.is_dir() {
            fs::set_permissions(&d, fs::Permissions::from_mode(0o777))
                .map_err(|e| Error::io("chmod", &d, e))?;
            for e in fs::read_dir(&d).map_err(|e| Error::io("read", &d, e))? {
                stack.push(e.map_err(|e| Error::io("read", &d, e))?.path());
            }
        } else if meta.is_file() {
            let mode = meta.permissions().mode() | 0o666;
            fs::set_permissions(&d, fs::Permissions::from_mode(mode))
                .map_err(|e| Error::io("chmod", &d, e))?;
        }
    }
    Ok(())
}

/// The proof of `reads ⊆ declared`: every observed path resolves in the
/// declared view to exactly the node that was served, and every observed
/// absence is absent from it.
pub fn check_read_set(store: &LocalStore, view: &Digest, rs: &ReadSet) -> Result<(), Error> {
    if rs.root != *view {
        return Err(Error::Containment(format!(
            "the read set is of view {}, not the declared view {view}",
            rs.root
        )));
    }
    for e in &rs.entries {
        // Read-set paths escape odd bytes as the compose map does; resolve the real ones.
        let found = castore::walk::lookup_bytes(store, view, &e.raw_path()).ok();
        let consistent = match (&found, e.digest) {
            (None, None) => true,
            (Some(n), Some(d)) => match n {
                Node::Symlink { target } => Digest::of(target.as_bytes()) == d,
                other => other.digest() == Some(&d),
            },
            _ => false,
        };
        if !consistent {
            return Err(Error::Containment(format!(
                "the build observed {} as {:?}, which the declared closure does not hold",
                e.path, e.digest
            )));
        }
    }
    Ok(())
}
