//! The build pipeline, as stages that read top to bottom:
//!
//! ```text
//! resolve → cache → compose → prepare → run (mount, sandbox, unmount)
//!         → prove → ingest → sign → (check)
//! ```
//!
//! Each stage is one function that owns what it creates. Every resource a
//! build takes — the working area, the mount, the sandbox's processes, the
//! proxy — is held by a guard on this stack, so any error path (and a
//! panic) releases it: a failed build leaves no mount, process or temp dir
//! behind. The cache stage answers a build without running it; `--check`
//! runs it anyway and compares ([`crate::check`]).

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Composition, Digest};
use castore_fuse::{MountOptions, MountOutcome};
use ed25519_dalek::SigningKey;
use executor_core::record::{list_digest, RECORD_FORMAT};
use executor_core::{
    Action, BuildOutcome, BuildRecord, BuildRequest, CachePolicy, ExitStatus, NetworkMode,
    ResourceUse,
};
use executor_sandbox::{
    Outcome, Output, RealFs, RunOptions, RunReport, Runtime, SandboxSpec, Stdin,
};

use crate::cache::{ActionCache, Found};
use crate::fetch::{FetchResult, FetchSession};
use crate::ingest::Ingested;
use crate::scratch::{DiskLimit, WorkArea};
use crate::{check, ingest, keys, manifest, sign, view, Error};

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
/// overrides or extends it; each output adds `$NAME=/build/NAME`).
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
];

/// Stage 1's result: exactly what will be built.
struct Plan<'r> {
    req: &'r BuildRequest,
    /// The action as it runs: its network mode is the effective one.
    action: Action,
    /// The replay lock's digest (record mode starts from none).
    lock_digest: Option<Digest>,
    action_digest: Digest,
}

impl Plan<'_> {
    fn recording(&self) -> bool {
        self.action.network.mode == NetworkMode::Record
    }

    /// Closure, then toolchain: the composition order.
    fn atoms(&self) -> Vec<Digest> {
        let i = &self.action.inputs;
        i.closure.iter().chain(&i.toolchain).copied().collect()
    }
}

/// What the run stage hands on.
struct Ran {
    report: RunReport,
    log: Vec<u8>,
    mounted: MountOutcome,
    fetch: Option<FetchResult>,
}

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

    /// The action cache as this executor consults it for `trust`.
    pub fn cache(&self, trust: &[String]) -> Result<ActionCache<'_>, Error> {
        ActionCache::new(&self.store, self.key.verifying_key(), trust)
    }

    fn build_inner(
        &self,
        req: &BuildRequest,
        log: &mut (dyn Write + Send),
    ) -> Result<BuildOutcome, Error> {
        let started = Instant::now();
        let plan = self.resolve(req)?;
        let cache = self.cache(&req.trust)?;
        let against = match self.consult_cache(&plan, &cache, log)? {
            Consulted::Hit(outcome) => return Ok(*outcome),
            Consulted::Run { against } => against,
        };
        self.check_inputs(&plan)?;
        let view = view::compose(&self.store, &plan.atoms())?;
        let mut notes = Vec::new();
        let work = self.prepare(&plan, &mut notes, log)?;
        let mut ran = self.run(&plan, &view, &work, log)?;
        ran.log.splice(0..0, notes);
        let violations = violations(&mut ran);
        self.prove(&view, &ran)?;
        let exit = exit_status(&ran.report);
        let ingested = if exit.success() && violations.is_empty() {
            match ingest::ingest_outputs(&self.store, work.scratch(), &plan.action.outputs.names) {
                Ok(i) => Ok(i),
                Err(Error::BadOutput { path, reason }) => Err(format!("output {path} {reason}")),
                Err(e) => return Err(e),
            }
        } else {
            Ok(Ingested::default())
        };
        let (ingested, failure) = match ingested {
            Ok(i) => (i, None),
            Err(why) => (Ingested::default(), Some(why)),
        };
        for line in ingested.notes.iter().chain(&failure) {
            let line = if line.starts_with("fhsx:") {
                line.clone()
            } else {
                format!("fhsx: {line}")
            };
            let _ = writeln!(log, "{line}");
            ran.log.extend_from_slice(format!("{line}\n").as_bytes());
        }
        let record = BuildRecord {
            format: RECORD_FORMAT,
            action_digest: plan.action_digest,
            closure_digest: list_digest(&plan.action.inputs.closure),
            toolchain_digest: list_digest(&plan.action.inputs.toolchain),
            view_digest: view.root,
            fetch_lock_digest: ran
                .fetch
                .as_ref()
                .map(|f| f.lock_digest)
                .or(plan.lock_digest),
            interface_manifest_digest: self.manifest(&ingested)?,
            outputs: ingested.outputs,
            observed_read_set_digest: ran.mounted.read_set_digest,
            read_set_size: ran.mounted.read_set.entries.len() as u64,
            log_digest: self.store.put_blob(&ran.log)?,
            exit,
            violations: violations.clone(),
            failure,
            check_of: against.as_ref().map(|f| f.digest),
            resources: ResourceUse {
                wall_ms: started.elapsed().as_millis() as u64,
                ..ResourceUse::default()
            },
            executor: format!("fhsx {} {}", env!("CARGO_PKG_VERSION"), self.public_key()),
        };
        let (record_digest, signed) = self.sign(&cache, record)?;
        // The recorded lock lives in the working area until it is committed.
        let committed = match ran.fetch.and_then(|f| f.recording) {
            Some(recording) if signed.record.succeeded() => Some(recording.commit()),
            _ => None,
        };
        self.finish_work(work, &signed, log);
        if !violations.is_empty() {
            return Err(Error::Containment(format!(
                "{}; the record {record_digest} says so",
                violations.join("; ")
            )));
        }
        if let Some(lock) = committed.transpose()? {
            let _ = writeln!(log, "fhsx: recorded the fetch lock {}", lock.display());
        }
        let check = match against {
            Some(a) => Some(check::compare(&self.store, &a, &signed)?),
            None => None,
        };
        Ok(BuildOutcome {
            record_digest,
            record: signed,
            cached: false,
            check,
        })
    }

    /// Stage 1, resolve: the effective network mode, the lock, the action
    /// digest.
    fn resolve<'r>(&self, req: &'r BuildRequest) -> Result<Plan<'r>, Error> {
        let mut action = req.action.clone();
        action.network.mode = match (action.network.mode, req.record) {
            (NetworkMode::None, true) => {
                return Err(Error::Usage(
                    "--record: the action has no network to record ([network] mode = \"none\"); give it `mode = \"replay\"` and a lock".into(),
                ))
            }
            (NetworkMode::Record, false) => {
                return Err(Error::Usage(
                    "the action asks for network mode \"record\", the one impure mode: pass --record to allow it".into(),
                ))
            }
            (_, true) => NetworkMode::Record,
            (mode, false) => mode,
        };
        let lock_digest = match action.network.mode {
            NetworkMode::None | NetworkMode::Record => None,
            NetworkMode::Replay => {
                let p = req.lock_path.as_ref().ok_or_else(|| {
                    Error::Usage("network mode \"replay\" needs a lock file; none was given".into())
                })?;
                match fs::read(p) {
                    Ok(bytes) => Some(Digest::of(&bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(Error::Usage(format!(
                            "the fetch lock {} does not exist: record it first with `fhsx build --record`",
                            p.display()
                        )))
                    }
                    Err(e) => return Err(Error::io("read fetch lock", p, e)),
                }
            }
        };
        let action_digest = action.digest(lock_digest.as_ref());
        Ok(Plan {
            req,
            action,
            lock_digest,
            action_digest,
        })
    }

    /// Stage 3a, inputs: every input is in the store (a cache hit needs
    /// none of them).
    fn check_inputs(&self, plan: &Plan<'_>) -> Result<(), Error> {
        for (list, d) in plan.action.inputs.iter() {
            if !self.store.has_directory(d)? {
                return Err(Error::MissingInput {
                    what: list.name(),
                    digest: *d,
                });
            }
        }
        Ok(())
    }

    /// Stage 2, cache: answer the build from a record if the policy allows;
    /// for `--check`, find the record to compare with.
    fn consult_cache(
        &self,
        plan: &Plan<'_>,
        cache: &ActionCache<'_>,
        log: &mut (dyn Write + Send),
    ) -> Result<Consulted, Error> {
        if plan.recording() {
            if plan.req.cache == CachePolicy::Check {
                return Err(Error::Usage(
                    "--check with --record: a recording is impure and cannot be checked; check the replay action instead".into(),
                ));
            }
            return Ok(Consulted::Run { against: None });
        }
        match plan.req.cache {
            CachePolicy::Rebuild => Ok(Consulted::Run { against: None }),
            CachePolicy::Use => {
                let Some(hit) = cache.lookup(&plan.action_digest)?.hit else {
                    return Ok(Consulted::Run { against: None });
                };
                let _ = writeln!(
                    log,
                    "fhsx: cached: action {} → record {}; nothing ran (--rebuild runs it)",
                    plan.action_digest, hit.digest
                );
                Ok(Consulted::Hit(Box::new(BuildOutcome {
                    record_digest: hit.digest,
                    record: hit.record,
                    cached: true,
                    check: None,
                })))
            }
            CachePolicy::Check => {
                let found = cache.lookup(&plan.action_digest)?;
                match found.hit {
                    Some(hit) => {
                        let _ = writeln!(
                            log,
                            "fhsx: check: rebuilding action {} to compare with record {}",
                            plan.action_digest, hit.digest
                        );
                        Ok(Consulted::Run {
                            against: Some(Box::new(hit)),
                        })
                    }
                    None => Err(Error::Usage(match found.rejected.first() {
                        Some((d, why)) => format!(
                            "--check: no record of action {} can be checked against: record {d} is not usable because {why}; build it first (`fhsx build` without --check)",
                            plan.action_digest
                        ),
                        None => format!(
                            "--check: action {} was never built here, so there is nothing to compare with; build it first (`fhsx build` without --check)",
                            plan.action_digest
                        ),
                    })),
                }
            }
        }
    }

    /// Stage 4, prepare: the working area (size-capped scratch where the
    /// host allows), the source tree, the mount point.
    fn prepare(
        &self,
        plan: &Plan<'_>,
        notes: &mut Vec<u8>,
        log: &mut (dyn Write + Send),
    ) -> Result<WorkArea, Error> {
        let work = WorkArea::create(plan.action.limits.disk)?;
        if let DiskLimit::NotEnforced(why) = &work.disk {
            let _ = writeln!(notes, "fhsx: [limits] disk is not enforced here: {why}");
            let _ = log.write_all(notes);
        }
        let scratch = work.scratch().to_path_buf();
        for d in [&work.path().join("view"), &scratch.join("home")] {
            fs::create_dir_all(d).map_err(|e| Error::io("create", d, e))?;
        }
        if let Some(src) = &plan.action.inputs.source {
            let dest = scratch.join(plan.action.outputs.source_dir());
            castore::export::export(&self.store, src, &dest, &())?;
        }
        make_world_writable(&scratch)?;
        Ok(work)
    }

    /// Stage 5, run: mount the view, run the command in the sandbox with
    /// its output teed live to `log` and kept, stop the proxy, unmount.
    fn run(
        &self,
        plan: &Plan<'_>,
        view: &Composition,
        work: &WorkArea,
        log: &mut (dyn Write + Send),
    ) -> Result<Ran, Error> {
        let action = &plan.action;
        let mnt = work.path().join("view");
        let scratch = work.scratch();
        castore_fuse::preflight().map_err(|e| Error::Other(e.to_string()))?;
        let guard = castore_fuse::mount(&self.store, &view.root, &mnt, &MountOptions::default())
            .map_err(|e| Error::Other(format!("mounting the view: {e}")))?;

        let runtime = Runtime::new()?;
        let mut spec = SandboxSpec::view(&mnt, scratch, runtime.paths().clone(), Arc::new(RealFs))?;
        for (k, v) in BASE_ENV {
            spec.set_env(k, *v)?;
        }
        for name in &action.outputs.names {
            spec.set_env(name.as_str(), name.build_path())?;
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
        let proxy = match (action.network.mode, &plan.req.lock_path) {
            (NetworkMode::None, _) => None,
            (_, None) => {
                return Err(Error::Usage(
                    "network mode needs a lock file; none was given".into(),
                ))
            }
            (mode, Some(lock)) => Some(FetchSession::start(
                &self.store,
                mode == NetworkMode::Record,
                lock,
                &plan.req.upstream_ca,
                work.path(),
                &mut spec,
            )?),
        };
        let command: Vec<OsString> = action.run.command.iter().map(OsString::from).collect();
        // stdout and stderr share one pipe, teed live to `log` and kept whole.
        let (mut reader, writer) =
            std::io::pipe().map_err(|e| Error::io("create the log pipe for", scratch, e))?;
        let opts = RunOptions {
            timeout: Some(action.run.timeout),
            grace: self.grace,
            stdin: Stdin::Null,
            output: Output::Fd(writer.into()),
            cancel: self.cancel.clone(),
            ..RunOptions::default()
        };
        let (report, log_bytes) = std::thread::scope(|scope| {
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
        Ok(Ran {
            report: report?,
            log: log_bytes,
            mounted,
            fetch,
        })
    }

    /// Stage 6, prove: every byte served was the store's, and every read
    /// lies inside the declared view.
    fn prove(&self, view: &Composition, ran: &Ran) -> Result<(), Error> {
        ran.mounted.check().map_err(|e| {
            Error::Containment(format!("the view refused corrupt store content: {e}"))
        })?;
        view::check_read_set(&self.store, &view.root, &ran.mounted.read_set)
    }

    /// The interface manifest over every output, if there are any.
    fn manifest(&self, ingested: &Ingested) -> Result<Option<Digest>, Error> {
        if ingested.outputs.is_empty() {
            return Ok(None);
        }
        let tree = ingested.combined_tree(&self.store)?;
        Ok(Some(manifest::derive_and_store(&self.store, &tree)?.1))
    }

    /// Stage 8, sign: sign and store the record, and index it.
    fn sign(
        &self,
        cache: &ActionCache<'_>,
        record: BuildRecord,
    ) -> Result<(Digest, executor_core::SignedRecord), Error> {
        let signed = sign::sign(record, &self.key);
        let digest = sign::store_record(&self.store, &signed)?;
        cache.insert(&signed.record.action_digest, &digest)?;
        Ok((digest, signed))
    }

    /// Remove the working area, or keep a failed build's for `--keep-failed`.
    fn finish_work(
        &self,
        work: WorkArea,
        signed: &executor_core::SignedRecord,
        log: &mut (dyn Write + Send),
    ) {
        if signed.record.succeeded() || !self.keep_failed {
            return drop(work);
        }
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
    }
}

/// What the cache stage decided.
enum Consulted {
    Hit(Box<BuildOutcome>),
    /// Run the build; with `--check`, compare with this record.
    Run {
        against: Option<Box<Found>>,
    },
}

/// The fetch proxy's refusals and aborts, as violations, also in the log.
fn violations(ran: &mut Ran) -> Vec<String> {
    let mut violations = Vec::new();
    if let Some(f) = &ran.fetch {
        for line in &f.refusals {
            ran.log
                .extend_from_slice(format!("fhsx: fetch refused: {line}\n").as_bytes());
            violations.push(format!("fetch refused: {line}"));
        }
        if let Some(why) = &f.aborted {
            ran.log
                .extend_from_slice(format!("fhsx: recording aborted: {why}\n").as_bytes());
            violations.push(format!("recording aborted: {why}"));
        }
    }
    violations
}

fn exit_status(report: &RunReport) -> ExitStatus {
    match report.outcome {
        Outcome::Exited(c) => ExitStatus::Exited { code: c },
        Outcome::Signaled(s) => ExitStatus::Signaled { signal: s },
        Outcome::TimedOut { .. } => ExitStatus::TimedOut,
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
fn make_world_writable(dir: &std::path::Path) -> Result<(), Error> {
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
