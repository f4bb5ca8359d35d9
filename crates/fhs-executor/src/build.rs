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
//!
//! What overlaps on threads, and how each overlap is joined:
//! - **compose**: both the composition and the synthetic layer are pure
//!   functions of what is stored, so both are remembered in `ROOT/memo/`; a
//!   memo's reader checks that the root, map and composition record it
//!   names are present and still this composition's
//!   (`compose::a_remembered_composition_is_the_recorded_one`).
//! - **prepare**: the scratch itself — mounted, `/build/home` made, the
//!   source exported, all handed to the build's user — is made on a thread
//!   (`WorkArea::create`) while the run stage mounts the view and composes
//!   the sandbox, and waited for (`WorkArea::ready`) just before the sandbox
//!   starts; its error is the build's there, and a build ending earlier
//!   still joins it before unmounting or removing anything.
//! - **run**: the view is mounted and warmed on a scoped thread while this
//!   one composes the sandbox and the runner makes the run's own (cgroups,
//!   argv and seccomp memfds, the RPC socket); bwrap starts once the view's
//!   root is listed (`Runtime::run_when`); the read set is taken once the
//!   connection has ended. A failed mount abandons the run before anything
//!   starts; a run failing before it asks for the view leaves the unmount to
//!   the scope's join. The superblock is released on a thread while the
//!   build goes on (`MountGuard::finish_deferred`, `background.rs`).
//! - **ingest**: the scratch is emptied and parked or removed on a thread
//!   while the record is made (not for a recording, whose new lock lives in
//!   the working area until committed).
//!
//! Background threads are joined before `build` returns: nothing of a build
//! outlives it. A tree a remote client uploaded is checked for depth before
//! a build uses it ([`InputDepths`]: `castore::walk::check_depth` walks
//! each distinct directory once, with its own stack, so a deep chain or a
//! DAG of 2^k paths costs its objects; each tree that passed is
//! remembered).
//!
//! A refused output still leaves a signed record, with `failure` saying
//! why, so `--json` prints a result and `--keep-failed` keeps the scratch.
//! A recording's new lock replaces the action's by an atomic rename.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::TempRoots;
use castore::{Composition, Digest};
use castore_fuse::{CompactOutcome, MountOptions};
use ed25519_dalek::SigningKey;
use executor_core::record::{list_digest, RECORD_FORMAT};
use executor_core::{
    Action, BuildOutcome, BuildRecord, BuildRequest, CachePolicy, ExitStatus, NetworkMode,
    ResourceUse,
};
use executor_sandbox::{
    Outcome, Output, RealFs, RunOptions, RunReport, Runtime, SandboxSpec, Stdin,
};

use crate::background::Background;
use crate::cache::{ActionCache, Found};
use crate::fetch::{FetchResult, FetchSession, Network};
use crate::ingest::Ingested;
use crate::log::BuildLog;
use crate::remote::{Key, Records, Remote, RemoteCache};
use crate::scratch::{DiskLimit, ScratchMedium, WorkArea};
use crate::world::World;
use crate::{ahead, check, ingest, keys, manifest, sign, view, Error};

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
    /// Store files already hashed and found right, shared by this
    /// executor's builds (default: the process's table; a fresh table per
    /// build hashes every blob at its first open in each build).
    pub verified: Arc<castore_fuse::VerifiedBlobs>,
    /// Where emptied scratch file systems wait for the next build (a
    /// worker's); `None`: each build mounts its own and unmounts it.
    pub scratch_pool: Option<Arc<crate::pool::ScratchPool>>,
    /// Check every input tree's depth before a build uses it, remembering
    /// the ones that passed: a worker's, whose inputs a remote client
    /// uploaded, shaped as it liked (see [`InputDepths`]). `None`: inputs
    /// were made on this host, by import or ingest, which bound it there.
    pub input_depths: Option<Arc<InputDepths>>,
    /// What backs each build's scratch (default: disk). In memory, the
    /// scratch holds at most `[limits] disk` and `[limits] memory` bytes,
    /// and what it holds counts against the memory limit.
    pub scratch_medium: ScratchMedium,
    /// Open the view's files without a message to its daemon (the
    /// kernel's `no_open`, see `castore_fuse::MountOptions`): faster for a
    /// build that opens the same headers and tools thousands of times
    /// (default, as in `fhsx build`); off, each open hands the kernel the
    /// store file (passthrough), whose page cache every build shares —
    /// faster for many small actions that each read a large compiler once
    /// (`fhsx worker`'s default).
    pub zero_message_open: bool,
    /// The process's CPU budget ([`crate::jobserver`]): each build waits
    /// for a token before its scratch is made, holds it until its sandbox
    /// is gone, and its build gets a jobserver on the same pool. `None`:
    /// builds start at once and get no jobserver.
    pub jobserver: Option<Arc<crate::jobserver::TokenPool>>,
    /// A remote cache ([`crate::remote`]): consulted after the local one,
    /// asked for inputs the store lacks, and, with `push`, sent what this
    /// executor builds. `None`: the local store is all there is.
    pub remote: Option<Remote>,
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
    /// Everything but the closure and toolchain (the validated cache's key).
    command_digest: Digest,
    /// What the build sees beyond its inputs: pinned, or varied for a
    /// `--check --vary`.
    world: World,
    /// What was varied (for the record), empty when nothing was.
    variations: std::collections::BTreeMap<String, String>,
}

impl Plan<'_> {
    fn recording(&self) -> bool {
        self.action.network.mode == NetworkMode::Record
    }

    /// Every input: closure, toolchain, source.
    fn inputs(&self) -> Vec<Digest> {
        self.action.inputs.iter().map(|(_, d)| *d).collect()
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
    mounted: CompactOutcome,
    fetch: Option<FetchResult>,
    /// The view's superblock, freed meanwhile.
    teardown: Background,
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
            verified: castore_fuse::VerifiedBlobs::process(),
            scratch_pool: None,
            input_depths: None,
            scratch_medium: ScratchMedium::Disk,
            zero_message_open: true,
            jobserver: None,
            remote: None,
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
        live: &mut (dyn Write + Send),
    ) -> Result<BuildOutcome, Error> {
        let started = Instant::now();
        let mut clock = Stages::new(started);
        let plan = self.resolve(req)?;
        let cache = self.cache(&req.trust)?.with_remote(self.remote_cache());
        let against = match self.consult_cache(&plan, &cache, live)? {
            Consulted::Hit(outcome) => return Ok(*outcome),
            Consulted::Run { against } => against,
        };
        clock.mark("resolve+cache");
        // Everything the build reads or makes is a temporary gc root from
        // here until its record is stored (and the caller holds it).
        let roots = Arc::new(self.store.temp_roots(&plan.inputs())?);
        self.check_inputs(&plan, live)?;
        let mount_points: Vec<&str> = plan
            .action
            .outputs
            .at
            .values()
            .map(|p| p.as_str())
            .collect();
        let view = roots.rooted(
            || view::compose(&self.store, &plan.atoms(), &plan.world, &mount_points),
            |v| vec![v.root],
        )?;
        clock.mark("compose");
        if let Some(hit) = self.consult_validated(&plan, &cache, &view, &roots, started, live)? {
            return Ok(hit);
        }
        clock.mark("validate");
        let mut log = match req.split_streams {
            true => BuildLog::split(&self.store, plan.action.limits.log)?,
            false => BuildLog::new(&self.store, plan.action.limits.log)?,
        };
        // A CPU token first: from here on the build uses the machine.
        let waiting = Instant::now();
        let mut lease = match &self.jobserver {
            Some(pool) => Some(pool.acquire(req.priority, self.cancel.as_deref())?),
            None => None,
        };
        let waited = waiting.elapsed();
        clock.mark("token");
        let mut work = self.prepare(&plan)?;
        if let Some(lease) = lease.as_mut() {
            work.open_jobserver(lease)?;
        }
        clock.mark("prepare");
        let ran = self.run(&plan, &view, &mut work, &roots, &mut log, live)?;
        // Every token the build's jobs took comes back with the sandbox gone.
        drop(lease);
        clock.mark("run");
        let violations = violations(&ran, &mut log, live);
        if let Some(f) = &ran.fetch {
            // The lock the record names, kept with it.
            roots.rooted(|| self.store.put_blob(&f.lock_bytes), |d| vec![*d])?;
        }
        self.prove(&view, &ran)?;
        clock.mark("prove");
        let exit = exit_status(&ran.report, &log);
        let mut failure = limit_failure(&plan, &ran, &log);
        let contained = failure.is_none() && violations.is_empty();
        let ran_to_end = matches!(
            exit,
            ExitStatus::Exited { .. } | ExitStatus::Signaled { .. }
        );
        let ingested = if contained && exit.success() {
            self.ingest(&plan, &work, &roots, &mut failure)?
        } else if contained && ran_to_end && req.failed_outputs {
            // What the failed command left, for its client to read: an
            // output refused here is left out, not a second failure.
            self.ingest(&plan, &work, &roots, &mut None)?
        } else {
            Ingested::default()
        };
        clock.mark("ingest");
        for line in ingested.notes.iter().chain(&failure) {
            log.note(line, live);
        }
        // The scratch is done with: emptied and parked (or removed) while
        // the record is made — unless a recording's new lock still lives
        // in the working area, to be committed once the record is signed.
        let succeeded = exit.success()
            && violations.is_empty()
            && failure.is_none()
            && ran.mounted.read_set_overflow.is_none();
        let recording = ran.fetch.as_ref().is_some_and(|f| f.recording.is_some());
        let (mut work, mut released) = (Some(work), None);
        if !recording {
            released = work
                .take()
                .and_then(|w| self.finish_work(w, succeeded, live));
        }
        // A check is compared before it is signed: the comparison (and
        // diffoscope's report) belongs to its record.
        let mut check = match &against {
            Some(a) => Some(check::compare(&self.store, a, &ingested.outputs)?),
            None => None,
        };
        if let Some(c) = check.as_mut() {
            c.variations = plan.variations.clone();
            if req.diffoscope && !c.differences.is_empty() {
                c.diffoscope = check::diffoscope(&self.store, &roots, c, &ingested.outputs, live)?;
            }
        }
        let (log_digest, stderr_digest) = log.finish(&roots)?;
        let record = BuildRecord {
            format: RECORD_FORMAT,
            action_digest: plan.action_digest,
            closure_digest: list_digest(&plan.action.inputs.closure),
            toolchain_digest: list_digest(&plan.action.inputs.toolchain),
            view_digest: view.root,
            fetch_lock_digest: (ran.fetch.as_ref().map(|f| f.lock_digest)).or(plan.lock_digest),
            interface_manifest_digest: self.manifest(&ingested, &roots)?,
            outputs: ingested.outputs,
            observed_read_set_digest: ran.mounted.read_set_digest,
            read_set_size: ran.mounted.read_set.len(),
            read_set_complete: ran.mounted.read_set_overflow.is_none(),
            log_digest,
            stderr_digest,
            exit,
            violations: violations.clone(),
            failure,
            check_of: against.as_ref().map(|f| f.digest),
            reused: None,
            pruned_from: req.pruned_from,
            variations: plan.variations.clone(),
            diffoscope: check.as_ref().and_then(|c| c.diffoscope),
            resources: ResourceUse {
                // Its own time, not the wait for a token (the scheduler
                // reads it as this action's expected duration).
                wall_ms: started.elapsed().saturating_sub(waited).as_millis() as u64,
                ..ResourceUse::default()
            },
            executor: self.executor_name(),
        };
        let (record_digest, signed) = self.sign(&plan, &cache, &roots, record)?;
        self.push(&plan, &record_digest, &signed.record, live);
        clock.mark("sign");
        if let Some(hold) = &req.hold {
            hold.add(&roots.digests())?;
        }
        // The recorded lock lives in the working area until it is committed.
        let committed = match ran.fetch.and_then(|f| f.recording) {
            Some(recording) if signed.record.succeeded() => Some(recording.commit()),
            _ => None,
        };
        if let Some(work) = work {
            released = self.finish_work(work, signed.record.succeeded(), live);
        }
        drop((released, ran.teardown));
        clock.mark("cleanup");
        clock.report(live);
        if !violations.is_empty() {
            return Err(Error::Containment(format!(
                "{}; the record {record_digest} says so",
                violations.join("; ")
            )));
        }
        if let Some(lock) = committed.transpose()? {
            let _ = writeln!(live, "fhsx: recorded the fetch lock {}", lock.display());
        }
        Ok(BuildOutcome {
            record_digest,
            record: signed,
            cached: false,
            remote: None,
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
        let command_digest = action.command_digest(lock_digest.as_ref());
        let vary = match (&req.vary, req.cache) {
            (Some(v), CachePolicy::Check) => Some(v),
            (Some(_), _) => {
                return Err(Error::Usage(
                    "--vary varies a --check rebuild: give --check too".into(),
                ))
            }
            (None, _) => None,
        };
        Ok(Plan {
            req,
            action,
            lock_digest,
            action_digest,
            command_digest,
            world: vary.map(World::varied).unwrap_or_default(),
            variations: vary
                .map(|v| v.describe(crate::world::varied_cpus()))
                .unwrap_or_default(),
        })
    }

    /// Stage 3a, inputs: every input is in the store (a cache hit needs
    /// none of them); what is not is fetched from the remote cache, if it
    /// holds it.
    fn check_inputs(&self, plan: &Plan<'_>, live: &mut (dyn Write + Send)) -> Result<(), Error> {
        let mut absent = Vec::new();
        for (list, d) in plan.action.inputs.iter() {
            if !self.store.has_directory(d)? {
                absent.push((list, *d));
            }
        }
        if let (Some(remote), false) = (self.remote_cache(), absent.is_empty()) {
            let wanted: Vec<Digest> = absent.iter().map(|(_, d)| *d).collect();
            if let Err(e) = remote.fetch_trees(&wanted) {
                let _ = writeln!(
                    live,
                    "fhsx: warning: the remote cache {}: {} input(s) this build needs could not be fetched: {e}",
                    remote.name(),
                    wanted.len()
                );
            }
        }
        for (list, d) in absent {
            if !self.store.has_directory(&d)? {
                return Err(Error::MissingInput {
                    what: list.name(),
                    digest: d,
                });
            }
        }
        if let Some(depths) = &self.input_depths {
            for (_, d) in plan.action.inputs.iter() {
                depths.check(&self.store, d)?;
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
                let (hit, remote) = match cache.lookup(&plan.action_digest)?.hit {
                    Some(hit) => (hit, None),
                    None => match self.remote_hit(plan, cache, log)? {
                        Some(hit) => hit,
                        None => return Ok(Consulted::Run { against: None }),
                    },
                };
                if let Some(hold) = &plan.req.hold {
                    let mut keep: Vec<Digest> =
                        hit.record.record.outputs.values().copied().collect();
                    keep.push(hit.digest);
                    hold.add(&keep)?;
                }
                let from = match &remote {
                    Some(name) => format!(" from the remote cache {name}"),
                    None => String::new(),
                };
                // Built here before, and the remote not seen holding its
                // outputs: it may lack the result yet.
                let held = |o: &Digest| cache.remote().is_some_and(|r| r.holds(o));
                if remote.is_none() && !hit.record.record.outputs.values().all(held) {
                    self.push(plan, &hit.digest, &hit.record.record, log);
                }
                let _ = writeln!(
                    log,
                    "fhsx: cached: action {} → record {}{from}; nothing ran (--rebuild runs it)",
                    plan.action_digest, hit.digest
                );
                Ok(Consulted::Hit(Box::new(BuildOutcome {
                    record_digest: hit.digest,
                    record: hit.record,
                    cached: true,
                    remote,
                    check: None,
                })))
            }
            CachePolicy::Check => {
                let found = cache.lookup(&plan.action_digest)?;
                let failed = found.rejected.iter().find_map(|(d, why)| {
                    let failure = why.strip_prefix(crate::cache::FAILED_BUILD)?;
                    let failure = failure.strip_prefix('(')?.strip_suffix(')')?;
                    Some(format!(
                        "--check: action {} was built here and failed ({failure}; record {d}, which `fhsx record show` prints), so there are no outputs to compare a rebuild with: fix the build and run `fhsx build` until it succeeds, then --check it",
                        plan.action_digest
                    ))
                });
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
                    None => Err(Error::Usage(match (failed, found.rejected.first()) {
                        (Some(m), _) => m,
                        (None, Some((d, why))) => format!(
                            "--check: no record of action {} can be checked against: record {d} is not usable because {why}; build it first (`fhsx build` without --check)",
                            plan.action_digest
                        ),
                        (None, None) => format!(
                            "--check: action {} was never built here, so there is nothing to compare with; build it first (`fhsx build` without --check)",
                            plan.action_digest
                        ),
                    })),
                }
            }
        }
    }

    /// Stage 4, prepare: the working area and the view's mount point; the
    /// scratch (size-capped where the host allows, holding the source tree)
    /// is made on a thread of its own while the run stage mounts the view,
    /// and is ready before the sandbox starts.
    fn prepare(&self, plan: &Plan<'_>) -> Result<WorkArea, Error> {
        let limits = &plan.action.limits;
        let fill = self.scratch_fill(plan)?;
        // A memory scratch is never pooled: its mount costs microseconds.
        let work = match (self.scratch_medium, &self.scratch_pool) {
            (ScratchMedium::Memory, _) => {
                WorkArea::create(limits.disk.min(limits.memory), ScratchMedium::Memory, fill)?
            }
            (ScratchMedium::Disk, Some(pool)) => WorkArea::create_pooled(limits.disk, pool, fill)?,
            (ScratchMedium::Disk, None) => {
                WorkArea::create(limits.disk, ScratchMedium::Disk, fill)?
            }
        };
        // A recycled area keeps its (empty) mount point.
        let view = work.path().join(crate::scratch::VIEW);
        match fs::create_dir(&view) {
            Err(e) if !(e.kind() == std::io::ErrorKind::AlreadyExists && view.is_dir()) => {
                return Err(Error::io("create", &view, e))
            }
            _ => {}
        }
        Ok(work)
    }

    /// What the scratch holds before the build starts: `/build/home`, the
    /// home the world names, and the source tree, exported; or, for
    /// outputs placed in the root, one directory per output holding what
    /// the closure has at its place, exported writable.
    fn scratch_fill(&self, plan: &Plan<'_>) -> Result<crate::scratch::Fill, Error> {
        let store = self.store.clone();
        let outputs = &plan.action.outputs;
        if outputs.placed() {
            // A place starts as the closure's (the action's own tree; an
            // REAPI action's input root), not the toolchain's or the
            // synthetic layer's: the output is that tree after the build.
            let closure = &plan.action.inputs.closure;
            let seed = match closure.as_slice() {
                [] => None,
                [one] => Some(*one),
                many => Some(castore::compose(&self.store, many)?.root),
            };
            let mut placed = Vec::new();
            for (name, path) in &outputs.at {
                let held = match seed.map(|root| castore::walk::lookup(&self.store, &root, path)) {
                    Some(Ok(castore::Node::Directory { digest, size })) if size > 0 => Some(digest),
                    Some(Err(castore::Error::BadTreePath { .. })) | Some(Ok(_)) | None => None,
                    Some(Err(e)) => return Err(e.into()),
                };
                placed.push((name.as_str().to_owned(), held));
            }
            return Ok(Box::new(move |scratch: &Path| {
                for (name, held) in placed {
                    let dir = scratch.join(name);
                    fs::create_dir(&dir).map_err(|e| Error::io("create", &dir, e))?;
                    if let Some(tree) = held {
                        castore::export::export(&store, &tree, &dir, &())?;
                    }
                }
                Ok(())
            }));
        }
        let home = PathBuf::from(plan.world.home.trim_start_matches("/build/"));
        let source = plan
            .action
            .inputs
            .source
            .map(|src| (src, outputs.source_dir().to_owned()));
        Ok(Box::new(move |scratch: &Path| {
            for d in [scratch.join("home"), scratch.join(&home)] {
                fs::create_dir_all(&d).map_err(|e| Error::io("create", &d, e))?;
            }
            if let Some((src, dir)) = source {
                castore::export::export(&store, &src, &scratch.join(dir), &())?;
            }
            Ok(())
        }))
    }

    /// Stage 5, run: mount the view (on a thread of its own, while the
    /// sandbox is composed), run the command in the sandbox with its
    /// output streamed into the log and to the live sink, stop the proxy,
    /// unmount.
    fn run(
        &self,
        plan: &Plan<'_>,
        view: &Composition,
        work: &mut WorkArea,
        roots: &Arc<TempRoots>,
        log: &mut BuildLog,
        live: &mut (dyn Write + Send),
    ) -> Result<Ran, Error> {
        let action = &plan.action;
        let mnt = work.path().join(crate::scratch::VIEW);
        castore_fuse::preflight().map_err(|e| Error::Other(castore::Chain(&e).to_string()))?;
        std::thread::scope(|scope| {
            let viewing = scope.spawn(|| self.mount_view(plan, view, &mnt));
            let runtime = Runtime::new()?;
            let (spec, proxy) = self.compose_sandbox(plan, view, work, &runtime, &mnt, roots)?;
            // The scratch, mounted and filled meanwhile on a thread of its own.
            work.ready()?;
            if let DiskLimit::NotEnforced(why) = &work.disk {
                log.note(
                    &format!("fhsx: [limits] disk is not enforced here: {why}"),
                    live,
                );
            }
            let command: Vec<OsString> = action.run.command.iter().map(OsString::from).collect();
            // stdout and stderr share one pipe, streamed into the log; kept
            // apart, stderr has one of its own.
            let pipe = || {
                std::io::pipe().map_err(|e| Error::io("create the log pipe for", work.scratch(), e))
            };
            let (mut reader, writer) = pipe()?;
            let mut stderr = if log.is_split() { Some(pipe()?) } else { None };
            let output = match stderr.as_mut().map(|(_, w)| w.try_clone()) {
                None => Output::Fd(writer.into()),
                Some(w) => Output::Split(
                    writer.into(),
                    w.map_err(|e| Error::io("duplicate the log pipe for", work.scratch(), e))?
                        .into(),
                ),
            };
            // Only the sandbox holds the write ends: the reads end with it.
            let mut err_reader = stderr.map(|(r, _)| r);
            let stop = Arc::new(AtomicBool::new(false));
            let opts = RunOptions {
                timeout: Some(action.run.timeout),
                grace: self.grace,
                stdin: Stdin::Null,
                output,
                cancel: self.cancel.clone(),
                stop: Some(stop.clone()),
                ..RunOptions::default()
            };
            // bwrap starts once the view is mounted and its root listed
            // (the sandbox's set-up must find every root entry known).
            let (mut guard, mut unready) = (None, None);
            let ready = || {
                let listed = viewing
                    .join()
                    .unwrap_or_else(|_| Err(Error::Other("mounting the view panicked".into())))
                    .and_then(|mut g| {
                        g.root_listed().map_err(|e| {
                            Error::Other(format!("listing the view's root: {}", castore::Chain(&e)))
                        })?;
                        Ok(g)
                    });
                match listed {
                    Ok(g) => guard = Some(g),
                    Err(e) => unready = Some(e),
                }
                guard.is_some()
            };
            let report = std::thread::scope(|tees| {
                let tee = tees.spawn(|| match err_reader.as_mut() {
                    Some(err) => log.tee_split(&mut reader, err, live, &stop),
                    None => log.tee(&mut reader, live, &stop),
                });
                let host = executor_sandbox::current_host_env();
                let ran = runtime.run_when(&spec, &host, &command, opts, ready);
                let _ = tee.join();
                ran
            });
            if let Some(e) = unready {
                return Err(e);
            }
            let Some(guard) = guard else {
                return Err(report.err().map_or_else(
                    || Error::Other("the sandbox ran without its view".into()),
                    Error::from,
                ));
            };
            // Unmount before anything else can fail: the read set is wanted
            // either way. The superblock (its inodes and page cache) is freed
            // on a thread while the build goes on.
            let (mounted, teardown) = guard.finish_deferred(&self.store, roots).map_err(|e| {
                Error::Other(format!("unmounting the view: {}", castore::Chain(&e)))
            })?;
            let teardown = Background::start("fhsx-unmount", move || drop(teardown));
            let fetch = proxy.map(|p| p.finish()).transpose()?;
            let report = report?;
            if let Some(user) = work.build_user() {
                user.run_ended(report.sandbox_emptied);
            }
            Ok(Ran {
                report,
                mounted,
                fetch,
                teardown,
            })
        })
    }

    /// The view mounted at `mnt` and warmed: the root's listing and the
    /// command's first opens (see `ahead.rs`).
    fn mount_view(
        &self,
        plan: &Plan<'_>,
        view: &Composition,
        mnt: &Path,
    ) -> Result<castore_fuse::MountGuard, Error> {
        let action = &plan.action;
        let options = MountOptions {
            max_read_set_entries: action.limits.reads,
            readdir_order: plan.world.readdir,
            mtime_secs: plan.world.mtime_secs,
            verified: self.verified.clone(),
            zero_message_open: self.zero_message_open,
            ..MountOptions::default()
        };
        let mut guard = castore_fuse::mount(&self.store, &view.root, mnt, &options)
            .map_err(|e| Error::Other(format!("mounting the view: {}", castore::Chain(&e))))?;
        let (store, root, cmd, path) = (
            self.store.clone(),
            view.root,
            action.run.command.first().cloned().unwrap_or_default(),
            sandbox_path(plan),
        );
        guard
            .warm(move || ahead::first_opens(&store, &root, &cmd, &path))
            .map_err(|e| {
                Error::Other(format!("listing the view's root: {}", castore::Chain(&e)))
            })?;
        Ok(guard)
    }

    /// The sandbox over the view at `mnt` and the scratch: its layout, the
    /// build user, the environment, the limits, and the fetch proxy if the
    /// action has network.
    fn compose_sandbox(
        &self,
        plan: &Plan<'_>,
        view: &Composition,
        work: &WorkArea,
        runtime: &Runtime,
        mnt: &Path,
        roots: &Arc<TempRoots>,
    ) -> Result<(SandboxSpec, Option<FetchSession>), Error> {
        let action = &plan.action;
        // The root's entries from the store, not through the mount: this
        // process serves the view and must never wait on it itself.
        let entries = root_entries(&self.store, &view.root)?;
        let mut spec = SandboxSpec::view_of(
            mnt,
            entries,
            work.scratch(),
            runtime.paths().clone(),
            Arc::new(RealFs),
        )?;
        if let Some(user) = work.build_user() {
            spec.build_user(user);
        }
        if let Some(js) = work.jobserver() {
            spec.jobserver(&js.spares, &js.returns)?;
        }
        let outputs = &action.outputs;
        if outputs.placed() {
            let places = outputs
                .at
                .iter()
                .map(|(name, inside)| (work.scratch().join(name.as_str()), PathBuf::from(inside)));
            spec.place_scratch(places.collect())?;
        }
        for (k, v) in BASE_ENV {
            spec.set_env(k, *v)?;
        }
        for (k, v) in &plan.world.env {
            spec.set_env(k, v)?;
        }
        if outputs.placed() {
            // No /build/home without /build: the private /tmp is writable.
            spec.set_env("HOME", "/tmp")?;
        }
        spec.persona(&plan.world.persona)?;
        for name in &outputs.names {
            spec.set_env(name.as_str(), outputs.path_of(name))?;
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
                &Network {
                    record: mode == NetworkMode::Record,
                    lock,
                    upstream_ca: &plan.req.upstream_ca,
                    max_record_bytes: action.limits.fetch,
                },
                work.path(),
                roots,
                &mut spec,
            )?),
        };
        Ok((spec, proxy))
    }

    /// Stage 6, prove: every byte served was the store's, and every read
    /// lies inside the declared view.
    fn prove(&self, view: &Composition, ran: &Ran) -> Result<(), Error> {
        if let Some(first) = ran.mounted.integrity_failures.first() {
            return Err(Error::Containment(format!(
                "the view refused corrupt store content: {first}"
            )));
        }
        ran.mounted
            .read_set
            .check_within(&self.store, &view.root)
            .map_err(|e| {
                Error::Containment(format!(
                    "the read set does not prove reads ⊆ declared: {}",
                    castore::Chain(&e)
                ))
            })
    }

    /// Stage 7, ingest: each declared output as an atom. A refused output
    /// is the build's failure (`failure`), not an error: the record still
    /// says what happened.
    fn ingest(
        &self,
        plan: &Plan<'_>,
        work: &WorkArea,
        roots: &TempRoots,
        failure: &mut Option<String>,
    ) -> Result<Ingested, Error> {
        let names = &plan.action.outputs.names;
        let ingested = roots.rooted(
            || {
                let limits = &plan.action.limits;
                let limits = ingest::OutputLimits {
                    bytes: limits.output_bytes(),
                    entries: limits.output_entries(),
                };
                let places = &plan.action.outputs.at;
                ingest::ingest_outputs(&self.store, work.scratch(), names, places, limits)
            },
            |i| i.outputs.values().copied().collect(),
        );
        match ingested {
            Ok(i) => Ok(i),
            Err(Error::BadOutput { path, reason }) => {
                *failure = Some(format!("fhsx: output {path} {reason}"));
                Ok(Ingested::default())
            }
            Err(e) => Err(e),
        }
    }

    /// The interface manifest over every output, if there are any.
    fn manifest(&self, ingested: &Ingested, roots: &TempRoots) -> Result<Option<Digest>, Error> {
        if ingested.outputs.is_empty() {
            return Ok(None);
        }
        let m = roots.rooted(
            || {
                let tree = ingested.combined_tree(&self.store)?;
                manifest::derive_and_store(&self.store, &tree)
            },
            |m| vec![*m],
        )?;
        Ok(Some(m))
    }

    /// Stage 8, sign: sign and store the record (and the action it names,
    /// under its digest), and index it.
    fn sign(
        &self,
        plan: &Plan<'_>,
        cache: &ActionCache<'_>,
        roots: &TempRoots,
        record: BuildRecord,
    ) -> Result<(Digest, executor_core::SignedRecord), Error> {
        let signed = sign::sign(record, &self.key);
        let digest = roots.rooted(
            || {
                self.store
                    .put_blob(&plan.action.canonical(plan.lock_digest.as_ref()))?;
                sign::store_record(&self.store, &signed)
            },
            |d| vec![*d, plan.action_digest],
        )?;
        let r = &signed.record;
        cache.insert(&r.action_digest, &digest)?;
        if r.succeeded() && r.check_of.is_none() && r.reused.is_none() {
            cache.insert_command(&plan.command_digest, &digest)?;
        }
        Ok((digest, signed))
    }

    fn remote_cache(&self) -> Option<&dyn RemoteCache> {
        self.remote.as_ref().map(|r| &*r.cache)
    }

    /// Stage 2b, the remote cache: a record it holds for this action that
    /// answers here as a local one would (trusted signer, this action, a
    /// success); its outputs stay remote until something needs them. The
    /// record is indexed here, so the next lookup is local.
    fn remote_hit(
        &self,
        plan: &Plan<'_>,
        cache: &ActionCache<'_>,
        log: &mut (dyn Write + Send),
    ) -> Result<Option<(Found, Option<String>)>, Error> {
        let Some(remote) = self.remote_cache() else {
            return Ok(None);
        };
        let found = self.remote_records(remote, Key::Action(plan.action_digest), log);
        let found = cache.answer(&plan.action_digest, found.records);
        for (record, why) in &found.rejected {
            let _ = writeln!(
                log,
                "fhsx: warning: the remote cache {} holds record {record} for this action, refused: {why}; building locally",
                remote.name()
            );
        }
        let Some(hit) = found.hit else {
            return Ok(None);
        };
        cache.insert(&plan.action_digest, &hit.digest)?;
        Ok(Some((hit, Some(remote.name().to_owned()))))
    }

    /// The records `remote` holds under `key`; none, with a warning, when
    /// it cannot say.
    fn remote_records(
        &self,
        remote: &dyn RemoteCache,
        key: Key,
        log: &mut (dyn Write + Send),
    ) -> Records {
        match remote.records(key) {
            Ok(records) => records,
            Err(e) => {
                let _ = writeln!(
                    log,
                    "fhsx: warning: the remote cache {}: {e}; building locally",
                    remote.name()
                );
                Records::default()
            }
        }
    }

    /// Send a successful build's record and what it names to the remote
    /// cache, if this executor pushes. A push that fails is reported; the
    /// build stands.
    fn push(
        &self,
        plan: &Plan<'_>,
        record_digest: &Digest,
        record: &BuildRecord,
        log: &mut (dyn Write + Send),
    ) {
        let Some(remote) = self.remote.as_ref().filter(|r| r.push) else {
            return;
        };
        if !record.succeeded() || record.check_of.is_some() || plan.recording() {
            return;
        }
        // A record whose outputs are only held remotely is there already.
        if !(record.outputs.values()).all(|o| self.store.has_directory(o).unwrap_or(false)) {
            return;
        }
        let command = record.reused.is_none().then_some(&plan.command_digest);
        match remote.cache.push(record_digest, command) {
            Ok(sent) => {
                let _ = writeln!(
                    log,
                    "fhsx: pushed record {record_digest} to the remote cache {} ({} objects, {} bytes sent)",
                    remote.cache.name(),
                    sent.objects,
                    sent.bytes
                );
            }
            Err(e) => {
                let _ = writeln!(
                    log,
                    "fhsx: warning: pushing record {record_digest} to the remote cache {} failed: {e}; the build stands",
                    remote.cache.name()
                );
            }
        }
    }

    fn executor_name(&self) -> String {
        format!("fhsx {} {}", env!("CARGO_PKG_VERSION"), self.public_key())
    }

    /// Stage 3b, the validated cache: an earlier record of the same command
    /// whose read set holds in this view answers the build (see
    /// [`crate::validate`]); a new record is signed for this action naming
    /// the one reused.
    fn consult_validated(
        &self,
        plan: &Plan<'_>,
        cache: &ActionCache<'_>,
        view: &Composition,
        roots: &TempRoots,
        started: Instant,
        live: &mut (dyn Write + Send),
    ) -> Result<Option<BuildOutcome>, Error> {
        if plan.req.cache != CachePolicy::Use || plan.recording() {
            return Ok(None);
        }
        let mut rejected = Vec::new();
        let mut remote = None;
        let mut found = cache.validated(&plan.command_digest, &view.root, &mut rejected)?;
        if found.is_none() {
            if let Some(r) = self.remote_cache() {
                let got = self.remote_records(r, Key::Command(plan.command_digest), live);
                found =
                    cache.validated_among(got.records, &got.listed, &view.root, &mut rejected)?;
                remote = found.as_ref().map(|_| r.name().to_owned());
            }
        }
        let Some(hit) = found else {
            for (record, why) in rejected.iter().take(3) {
                let _ = writeln!(
                    live,
                    "fhsx: record {record} of the same command does not answer: {why}"
                );
            }
            return Ok(None);
        };
        let old = &hit.record.record;
        roots.add(&old.outputs.values().copied().collect::<Vec<_>>())?;
        let record = BuildRecord {
            format: RECORD_FORMAT,
            action_digest: plan.action_digest,
            closure_digest: list_digest(&plan.action.inputs.closure),
            toolchain_digest: list_digest(&plan.action.inputs.toolchain),
            view_digest: view.root,
            fetch_lock_digest: old.fetch_lock_digest,
            interface_manifest_digest: old.interface_manifest_digest,
            outputs: old.outputs.clone(),
            observed_read_set_digest: old.observed_read_set_digest,
            read_set_size: old.read_set_size,
            read_set_complete: true,
            log_digest: old.log_digest,
            stderr_digest: old.stderr_digest,
            exit: old.exit.clone(),
            violations: Vec::new(),
            failure: None,
            check_of: None,
            reused: Some(hit.digest),
            pruned_from: None,
            variations: Default::default(),
            diffoscope: None,
            resources: ResourceUse {
                wall_ms: started.elapsed().as_millis() as u64,
                ..ResourceUse::default()
            },
            executor: self.executor_name(),
        };
        let (record_digest, signed) = self.sign(plan, cache, roots, record)?;
        self.push(plan, &record_digest, &signed.record, live);
        if let Some(hold) = &plan.req.hold {
            hold.add(&roots.digests())?;
        }
        let from = match &remote {
            Some(name) => format!(" (from the remote cache {name})"),
            None => String::new(),
        };
        let _ = writeln!(
            live,
            "fhsx: cached: action {} → record {record_digest}, reusing record {}{from} of the same command, whose read set holds in this view; nothing ran (--rebuild runs it)",
            plan.action_digest, hit.digest
        );
        Ok(Some(BuildOutcome {
            record_digest,
            record: signed,
            cached: true,
            remote,
            check: None,
        }))
    }

    /// Release the working area after a build that succeeded (back to its
    /// pool, if it has one and it can be made as new) or remove it after
    /// one that failed, both on a thread of their own; or keep a failed
    /// build's for `--keep-failed`.
    fn finish_work(
        &self,
        work: WorkArea,
        succeeded: bool,
        log: &mut (dyn Write + Send),
    ) -> Option<Background> {
        if succeeded {
            return Some(Background::start("fhsx-scratch", move || work.release()));
        }
        if !self.keep_failed {
            return Some(Background::start("fhsx-scratch", move || drop(work)));
        }
        let own_fs = matches!(work.disk, DiskLimit::Enforced(_));
        let owner = work.build_user().map(|u| u.uid());
        let kept = work.keep();
        let _ = writeln!(
            log,
            "fhsx: kept the failed build's scratch at {}/build",
            kept.display()
        );
        if let Some(uid) = owner {
            let _ = writeln!(log, "fhsx: its files are build user {uid}'s (uid and gid)");
        }
        if own_fs {
            let _ = writeln!(
                log,
                "fhsx: it is its own size-capped file system: `umount {}/build` when done",
                kept.display()
            );
        }
        None
    }
}

/// The `PATH` the build's command is looked up on: the action's, else the
/// world's, else the base environment's.
fn sandbox_path(plan: &Plan<'_>) -> String {
    let world = plan.world.env.iter().rev().find(|(k, _)| *k == "PATH");
    let base = BASE_ENV.iter().find(|(k, _)| *k == "PATH");
    (plan.action.run.env.get("PATH").cloned())
        .or_else(|| world.map(|(_, v)| v.clone()))
        .or_else(|| base.map(|(_, v)| (*v).to_owned()))
        .unwrap_or_default()
}

/// The names and kinds of the entries of the stored directory `root`.
fn root_entries(
    store: &LocalStore,
    root: &Digest,
) -> Result<Vec<(OsString, executor_sandbox::FileKind)>, Error> {
    use castore::store::DirectoryStore;
    use executor_sandbox::FileKind;
    use std::os::unix::ffi::OsStrExt;
    let dir = store.get_directory(root)?;
    Ok(dir
        .entries()
        .map(|(name, node)| {
            let kind = match node {
                castore::Node::Directory { .. } => FileKind::Dir,
                castore::Node::File { .. } => FileKind::File,
                castore::Node::Symlink { target } => FileKind::Symlink(std::path::PathBuf::from(
                    std::ffi::OsStr::from_bytes(target.as_bytes()),
                )),
            };
            (
                OsString::from(std::ffi::OsStr::from_bytes(name.as_bytes())),
                kind,
            )
        })
        .collect())
}

/// Input trees known to nest no deeper than the store takes
/// ([`castore::fs_tree::MAX_DEPTH`]), so that the walks a build makes of
/// them (compose, export, the view) stay within their stacks. Each tree is
/// walked once ([`castore::walk::check_depth`]: every distinct directory
/// once) and then remembered, up to [`InputDepths::REMEMBERED`] trees.
#[derive(Debug, Default)]
pub struct InputDepths {
    passed: std::sync::Mutex<std::collections::HashSet<Digest>>,
}

impl InputDepths {
    /// Trees remembered at most; past it the memory starts again.
    pub const REMEMBERED: usize = 1 << 16;

    fn check(&self, store: &LocalStore, root: &Digest) -> Result<(), Error> {
        let known = |p: &std::sync::Mutex<std::collections::HashSet<Digest>>| {
            p.lock().unwrap_or_else(|e| e.into_inner()).contains(root)
        };
        if known(&self.passed) {
            return Ok(());
        }
        castore::walk::check_depth(store, root, castore::fs_tree::MAX_DEPTH)?;
        let mut passed = self.passed.lock().unwrap_or_else(|e| e.into_inner());
        if passed.len() >= Self::REMEMBERED {
            passed.clear();
        }
        passed.insert(*root);
        Ok(())
    }
}

/// Where a build's time goes, stage by stage: said on the live log when
/// `FHSX_TIMINGS` is set (for profiling; never in the stored log).
struct Stages {
    last: Instant,
    marks: Vec<(&'static str, Duration)>,
    on: bool,
}

impl Stages {
    fn new(started: Instant) -> Stages {
        Stages {
            last: started,
            marks: Vec::new(),
            on: std::env::var_os("FHSX_TIMINGS").is_some(),
        }
    }

    fn mark(&mut self, stage: &'static str) {
        if self.on {
            let now = Instant::now();
            self.marks.push((stage, now - self.last));
            self.last = now;
        }
    }

    fn report(&self, live: &mut dyn Write) {
        if self.on {
            let parts: Vec<String> = (self.marks.iter())
                .map(|(s, d)| format!("{s} {:.2} ms", d.as_secs_f64() * 1000.0))
                .collect();
            let _ = writeln!(live, "fhsx: timings: {}", parts.join(", "));
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
fn violations(ran: &Ran, log: &mut BuildLog, live: &mut dyn Write) -> Vec<String> {
    let mut violations = Vec::new();
    if let Some(f) = &ran.fetch {
        for line in &f.refusals {
            log.note(&format!("fhsx: fetch refused: {line}"), live);
            violations.push(format!("fetch refused: {line}"));
        }
        if let Some(why) = &f.aborted {
            log.note(&format!("fhsx: recording aborted: {why}"), live);
            violations.push(format!("recording aborted: {why}"));
        }
    }
    violations
}

/// A limit fhsx enforces itself that the build went past, said as its
/// failure: the log's size, the read set's.
fn limit_failure(plan: &Plan<'_>, ran: &Ran, log: &BuildLog) -> Option<String> {
    if log.exceeded() {
        return Some(format!(
            "fhsx: [limits] log: the build wrote more than {} bytes of output, so fhsx stopped it; raise [limits] log (bytes) if that much output is legitimate",
            log.cap()
        ));
    }
    ran.mounted.read_set_overflow.as_ref().map(|o| {
        format!(
            "fhsx: [limits] reads: the build observed more than {} distinct paths ({o}); its read set is incomplete, so the build is not trusted. Raise [limits] reads (currently {}) if that many are legitimate",
            plan.action.limits.reads, plan.action.limits.reads
        )
    })
}

fn exit_status(report: &RunReport, log: &BuildLog) -> ExitStatus {
    match report.outcome {
        Outcome::Exited(c) => ExitStatus::Exited { code: c },
        Outcome::Signaled(s) => ExitStatus::Signaled { signal: s },
        Outcome::TimedOut { .. } => ExitStatus::TimedOut,
        Outcome::Stopped { .. } => ExitStatus::LimitExceeded {
            limit: if log.exceeded() {
                "[limits] log"
            } else {
                "a limit of fhsx's"
            }
            .into(),
        },
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
