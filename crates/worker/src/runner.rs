//! The job runner both front doors share: at most `jobs` builds at once
//! (the rest queue for a slot), one token pool every build's sandbox sees
//! as its make jobserver (so `jobs` builds together run as many jobs as
//! the pool has tokens, not each as many as the machine has CPUs), a
//! cancel flag per build, the call into [`FhsExecutor`] with its action
//! cache and limits, and a shutdown that lets running builds finish up to
//! a deadline before cancelling them.
//!
//! A build holds its slot until its sandbox is torn down, so the number of
//! live builds never exceeds `jobs`, cancelled ones included. Builds run on
//! blocking threads; the runner itself is `Send + Sync` and may be driven
//! from any task.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use castore::store::LocalStore;
use castore::Digest;
use executor_core::{
    Action, BuildRequest, CachePolicy, CheckReport, Executor as _, ExitClass, NetworkMode,
    SignedRecord,
};
use fhs_executor::FhsExecutor;
use tokio::sync::{mpsc, Semaphore};

/// One build to run: a resolved action, its fetch lock (replay), and
/// whether the action cache may answer it.
#[derive(Debug, Clone)]
pub struct Job {
    pub action: Action,
    pub lock: Vec<u8>,
    pub cache: CachePolicy,
    /// Whether the record may answer later builds (REAPI's `do_not_cache`
    /// says no: it is signed and kept, then taken out of the cache index).
    pub cacheable: bool,
    /// Keep what a failed command left ([`BuildRequest::failed_outputs`]).
    pub failed_outputs: bool,
    /// Keep stdout and stderr apart ([`BuildRequest::split_streams`]).
    pub split_streams: bool,
}

/// How a job ended.
#[derive(Debug)]
pub enum JobResult {
    Done {
        digest: Digest,
        record: Box<SignedRecord>,
        /// The stored record's bytes.
        bytes: Vec<u8>,
        cached: bool,
        check: Option<CheckReport>,
    },
    Failed {
        class: ExitClass,
        message: String,
    },
}

/// The runner is shutting down: the job was not started.
#[derive(Debug, Clone, Copy)]
pub struct Closed;

/// Counters the Cap'n Proto `stats` call reports.
#[derive(Default)]
pub struct RunnerStats {
    pub builds_started: AtomicU64,
    pub queued: AtomicU32,
    pub max_running: AtomicU32,
}

/// How a worker's builds run, beyond what each action says.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuildOptions {
    /// Hash every store file at its first open in each build (default: a
    /// file an earlier build hashed, unchanged since, is trusted).
    pub hash_every_build: bool,
    /// Keep up to this many emptied scratch file systems mounted for the
    /// next builds (0: none; see `fhs_executor::pool`).
    pub scratch_pool: usize,
    /// What backs each build's scratch (see `fhs_executor::ScratchMedium`).
    pub scratch: fhs_executor::ScratchMedium,
    /// Open the view's files without a message to its daemon (see
    /// `FhsExecutor::zero_message_open`; a worker's default is off).
    pub zero_message_open: bool,
    /// CPU tokens every build shares (`fhs_executor::jobserver`); 0: the
    /// larger of `jobs` and the CPUs this process may use, so every job
    /// can run and their makes share the rest.
    pub tokens: usize,
}

pub struct Runner {
    store: LocalStore,
    jobs: usize,
    builds: BuildOptions,
    /// Emptied scratch file systems kept for the next builds, if asked for.
    scratch_pool: Option<Arc<fhs_executor::pool::ScratchPool>>,
    /// The CPU budget every build shares as its jobserver.
    tokens: Arc<fhs_executor::jobserver::TokenPool>,
    /// Input trees (uploaded by clients) found shallow enough to build on.
    input_depths: Arc<fhs_executor::build::InputDepths>,
    slots: Arc<Semaphore>,
    /// Cancel flags of builds whose sandbox is live (removed by the build
    /// thread itself once everything is torn down).
    running: Arc<Mutex<HashMap<u64, Arc<AtomicBool>>>>,
    next: AtomicU64,
    pub stats: RunnerStats,
}

impl Runner {
    pub fn new(
        store: LocalStore,
        jobs: usize,
        builds: BuildOptions,
    ) -> Result<Arc<Runner>, fhs_executor::Error> {
        let jobs = jobs.max(1);
        let tokens = match builds.tokens {
            0 => jobs.max(std::thread::available_parallelism().map_or(1, |n| n.get())),
            n => n,
        };
        Ok(Arc::new(Runner {
            store,
            jobs,
            builds,
            scratch_pool: (builds.scratch_pool > 0)
                .then(|| fhs_executor::pool::ScratchPool::new(builds.scratch_pool)),
            tokens: fhs_executor::jobserver::TokenPool::new(tokens)?,
            input_depths: Arc::default(),
            slots: Arc::new(Semaphore::new(jobs)),
            running: Arc::new(Mutex::new(HashMap::new())),
            next: AtomicU64::new(0),
            stats: RunnerStats::default(),
        }))
    }

    /// The token pool the builds share.
    pub fn tokens(&self) -> &fhs_executor::jobserver::TokenPool {
        &self.tokens
    }

    pub fn jobs(&self) -> usize {
        self.jobs
    }

    pub fn store(&self) -> &LocalStore {
        &self.store
    }

    pub fn running_count(&self) -> usize {
        self.running.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Wait for a slot, run the job on a blocking thread with its log sent
    /// to `log`, and return how it ended. Setting `cancel` stops the build
    /// (it ends as a timeout would, everything cleaned up).
    pub async fn run(
        &self,
        job: Job,
        cancel: Arc<AtomicBool>,
        log: mpsc::Sender<Vec<u8>>,
    ) -> Result<JobResult, Closed> {
        if job.action.network.mode == NetworkMode::Record {
            return Ok(JobResult::Failed {
                class: ExitClass::Usage,
                message: "network mode \"record\" is refused on a worker: it is the one impure mode (it fetches upstream and writes the lock). Record locally with `fhsx build --record`, then build the replay remotely".into(),
            });
        }
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        let permit = self.slots.clone().acquire_owned().await;
        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
        let permit = permit.map_err(|_| Closed)?;
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        {
            let mut m = self.running.lock().map_err(|_| Closed)?;
            m.insert(id, cancel.clone());
            self.stats
                .max_running
                .fetch_max(m.len() as u32, Ordering::SeqCst);
        }
        self.stats.builds_started.fetch_add(1, Ordering::SeqCst);
        let store = self.store.clone();
        let running = self.running.clone();
        let jobs = self.jobs;
        let builds = self.builds;
        let pool = self.scratch_pool.clone();
        let depths = self.input_depths.clone();
        let tokens = self.tokens.clone();
        let handle = tokio::task::spawn_blocking(move || {
            let now = running.lock().map(|m| m.len()).unwrap_or(0);
            eprintln!("fhsx worker: build {id} started ({now}/{jobs} slots busy)");
            let shared = Shared {
                scratch_pool: pool.clone(),
                input_depths: depths,
                tokens,
            };
            let r = run_build(store, job, cancel, log, builds, shared);
            // Totals, not this build's share: with several slots a counter
            // read around one build also counts its neighbours'.
            if let Some(p) = &pool {
                eprintln!(
                    "fhsx worker: scratch pool: {} builds on a recycled scratch so far, {} parked",
                    p.reused(),
                    p.parked()
                );
            }
            // The slot and the registry entry go only once the sandbox is down.
            if let Ok(mut m) = running.lock() {
                m.remove(&id);
            }
            drop(permit);
            match &r {
                JobResult::Done { digest, cached, .. } => eprintln!(
                    "fhsx worker: build {id} done: record {digest}{}",
                    if *cached {
                        " (cached: nothing ran)"
                    } else {
                        ""
                    }
                ),
                JobResult::Failed { message, .. } => {
                    eprintln!("fhsx worker: build {id} failed: {message}")
                }
            }
            r
        });
        Ok(handle.await.unwrap_or_else(|e| JobResult::Failed {
            class: ExitClass::BuildFailed,
            message: format!("worker task failed: {e}"),
        }))
    }

    /// Refuse queued and new jobs; let the running ones finish up to
    /// `grace`, then cancel them and wait until they are torn down.
    pub async fn shut_down(&self, grace: Duration) {
        self.slots.close();
        let n = self.running_count();
        if n > 0 {
            eprintln!(
                "fhsx worker: shutting down; waiting up to {grace:?} for {n} running build(s)"
            );
        }
        let deadline = tokio::time::Instant::now() + grace;
        while self.running_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.running_count() > 0 {
            eprintln!("fhsx worker: deadline reached; cancelling the running builds");
            if let Ok(m) = self.running.lock() {
                for c in m.values() {
                    c.store(true, Ordering::SeqCst);
                }
            }
            while self.running_count() > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The build's log as a `Write`, feeding an async consumer.
struct ChannelWriter(mpsc::Sender<Vec<u8>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A gone consumer is not the build's error: it is cancelled separately.
        let _ = self.0.blocking_send(buf.to_vec());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What every build of the runner shares.
struct Shared {
    scratch_pool: Option<Arc<fhs_executor::pool::ScratchPool>>,
    input_depths: Arc<fhs_executor::build::InputDepths>,
    tokens: Arc<fhs_executor::jobserver::TokenPool>,
}

fn run_build(
    store: LocalStore,
    job: Job,
    cancel: Arc<AtomicBool>,
    log: mpsc::Sender<Vec<u8>>,
    builds: BuildOptions,
    shared: Shared,
) -> JobResult {
    let failed = |class, message: String| JobResult::Failed { class, message };
    let dir = match tempfile::Builder::new().prefix("fhsx-remote-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            return failed(
                ExitClass::BuildFailed,
                format!("creating the build's lock directory: {e}"),
            )
        }
    };
    let lock_path = if job.action.network.mode == NetworkMode::None {
        None
    } else {
        let p = dir.path().join("fetch.lock");
        if let Err(e) = std::fs::write(&p, &job.lock) {
            return failed(
                ExitClass::BuildFailed,
                format!("writing the fetch lock: {e}"),
            );
        }
        Some(p)
    };
    let mut exec = match FhsExecutor::open(store.clone()) {
        Ok(e) => e,
        Err(e) => return failed(e.exit_class(), castore::Chain(&e).to_string()),
    };
    exec.cancel = Some(cancel);
    if builds.hash_every_build {
        exec.verified = Arc::default();
    }
    exec.scratch_pool = shared.scratch_pool;
    exec.input_depths = Some(shared.input_depths);
    exec.jobserver = Some(shared.tokens);
    exec.scratch_medium = builds.scratch;
    exec.zero_message_open = builds.zero_message_open;
    let mut req = BuildRequest::new(job.action, lock_path);
    req.cache = job.cache;
    req.failed_outputs = job.failed_outputs;
    req.split_streams = job.split_streams;
    let mut w = ChannelWriter(log);
    match exec.build(&req, &mut w) {
        Ok(out) if !job.cacheable && !out.cached => {
            if let Err(e) = fhs_executor::cache::unindex(
                &store,
                &out.record.record.action_digest,
                &out.record_digest,
            ) {
                return failed(e.exit_class(), castore::Chain(&e).to_string());
            }
            match store.read_blob(&out.record_digest) {
                Ok(bytes) => JobResult::Done {
                    digest: out.record_digest,
                    record: Box::new(out.record),
                    bytes,
                    cached: false,
                    check: out.check,
                },
                Err(e) => failed(ExitClass::BuildFailed, castore::Chain(&e).to_string()),
            }
        }
        Ok(out) => match store.read_blob(&out.record_digest) {
            Ok(bytes) => JobResult::Done {
                digest: out.record_digest,
                record: Box::new(out.record),
                bytes,
                cached: out.cached,
                check: out.check,
            },
            Err(e) => failed(ExitClass::BuildFailed, castore::Chain(&e).to_string()),
        },
        Err(e) => failed(e.exit_class(), castore::Chain(&e).to_string()),
    }
}
