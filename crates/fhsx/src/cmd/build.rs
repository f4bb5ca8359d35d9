//! `fhsx build ACTION.toml`: build an action — after every action it names
//! by reference (`other.toml#out`), in dependency order, each taken from the
//! cache where it can be — and print the root's signed record.

use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use castore::store::ObjectKind;
use clap::Args;
use executor_core::schedule::{self, End, Step};
use executor_core::{
    Action, ActionGraph, BuildOutcome, BuildRecord, BuildRequest, CachePolicy, CheckReport,
    Executor, ExitClass, GraphNode,
};
use fhs_executor::history::{Entry, History};
use fhs_executor::jobserver::TokenPool;
use fhs_executor::pool::ScratchPool;
use fhs_executor::FhsExecutor;
use serde_json::json;

use super::cache::CacheArgs;
use super::store::open_store;
use super::Globals;
use crate::exit::Classified;
use crate::watch::{GraphWatch, Shown};

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The action file.
    pub action: PathBuf,
    /// Run in record mode, the one impure mode: fetch upstream through the
    /// proxy and rewrite the action's lock (a `replay` action is recorded
    /// afresh, like `cargo update`; a `record` action needs this to run).
    #[arg(long)]
    pub record: bool,
    /// Run even if the cache holds a record of this action.
    #[arg(long)]
    pub rebuild: bool,
    /// Rebuild an action that has a cached record and compare the outputs
    /// bit for bit (exit 4 and the differing paths if they differ).
    #[arg(long, conflicts_with_all = ["rebuild", "record"])]
    pub check: bool,
    /// With --check: vary what fhsx pins in the rebuild — `all` (the
    /// default), or some of readdir, readdir-reverse, env, user, hostname,
    /// umask, cpus, aslr, mtime — and, on a difference, find which
    /// variation causes it.
    #[arg(long, value_name = "LIST", num_args = 0..=1, default_missing_value = "all", requires = "check")]
    pub vary: Option<String>,
    /// With --vary: the readdir shuffle's seed (default: a fresh one; the
    /// check record names it, so a run can be replayed).
    #[arg(long, value_name = "N", requires = "vary")]
    pub seed: Option<u64>,
    /// With --check: run diffoscope on differing outputs and keep its
    /// report (a blob the check record names).
    #[arg(long, requires = "check")]
    pub diffoscope: bool,
    /// Keep a failed build's scratch directory (its path is printed) for debugging.
    #[arg(long)]
    pub keep_failed: bool,
    /// What backs the scratch (as root): `disk`, an ext4 image of
    /// `[limits] disk` bytes; or `memory`, a tmpfs of at most `[limits]
    /// disk` and `[limits] memory` bytes whose content counts against the
    /// memory limit — a few ms faster per build, for small actions.
    #[arg(long, value_name = "MEDIUM", value_enum, default_value_t = ScratchArg::Disk)]
    pub scratch: ScratchArg,
    /// Keep up to N emptied disk scratch file systems (as root) for the
    /// next actions of this graph, so an action skips its loop device and
    /// ext4 mount and their teardown. A scratch is kept only once it is
    /// exactly as new (empty, its root reset, free blocks and inodes as
    /// fresh), and every one is taken down before fhsx exits. 0: none.
    #[arg(long, value_name = "N", env = "FHSX_SCRATCH_POOL", default_value_t = DEFAULT_SCRATCH_POOL)]
    pub scratch_pool: usize,
    /// How the sandbox opens the view's files: `kernel`, without a message
    /// to the view's daemon (for builds that open the same files thousands
    /// of times, like `make -j` of a package); `daemon`, each open a
    /// message that hands the kernel the store file (for a small action
    /// that reads a large compiler once).
    #[arg(long, value_name = "WHO", value_enum, default_value_t = OpensArg::Kernel)]
    pub opens: OpensArg,
    /// Trust this CA (PEM) for upstream TLS while recording, besides the host's. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Vec<PathBuf>,
    /// Run on the worker at ADDR (`HOST:PORT` or `unix:PATH`, see `fhsx worker`):
    /// upload what it lacks, stream the log, download the record and output.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["record", "keep_failed", "upstream_ca", "vary", "diffoscope", "cache"])]
    pub remote: Option<String>,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Records signed by this key (`ed25519:<hex>`) are cache hits too, and
    /// with --remote only a worker whose key is listed is accepted. Repeatable.
    #[arg(long, value_name = "KEY")]
    pub trust: Vec<String>,
    /// With --remote: the worker's access token (the file given to `fhsx worker --token-file`).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<PathBuf>,
    /// Run up to N ready actions at once, and share N CPU tokens among
    /// them as one GNU make jobserver (each running action holds one; a
    /// `make` without `-j` in any of them takes more as they are free).
    /// Default: the CPUs fhsx may use.
    #[arg(short = 'j', long, value_name = "N", conflicts_with = "remote")]
    pub jobs: Option<usize>,
    /// Go on past a failure: build every action whose inputs can be made,
    /// then name each failure, its log and what it left unbuilt (exit 1).
    /// Without it nothing new starts after a failure, and the actions
    /// already running finish.
    #[arg(short = 'k', long, conflicts_with = "remote")]
    pub keep_going: bool,
    /// Write one JSON object per line for each event of the graph (an
    /// action queued, started, finished, cached, failed, left unbuilt) to
    /// FILE, `-` for stdout.
    #[arg(long, value_name = "FILE", conflicts_with = "remote")]
    pub events: Option<PathBuf>,
    /// Write a Chrome trace of the graph to FILE (open it in Perfetto): a
    /// track per slot, and a counter of the CPU tokens in use.
    #[arg(long, value_name = "FILE", conflicts_with = "remote")]
    pub trace: Option<PathBuf>,
}

impl BuildArgs {
    /// The cache policy for one action of the graph: the flags apply to
    /// the action named on the command line; what it refers to is built
    /// or taken from the cache.
    fn policy(&self, is_root: bool) -> CachePolicy {
        match (is_root, self.check, self.rebuild) {
            (true, true, _) => CachePolicy::Check,
            (true, false, true) => CachePolicy::Rebuild,
            _ => CachePolicy::Use,
        }
    }
}

/// Disk scratch file systems kept for the next actions of one graph
/// build (the pool goes with the process).
const DEFAULT_SCRATCH_POOL: usize = 2;

/// `--scratch`'s values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScratchArg {
    Disk,
    Memory,
}

impl From<ScratchArg> for fhs_executor::ScratchMedium {
    fn from(a: ScratchArg) -> Self {
        match a {
            ScratchArg::Disk => fhs_executor::ScratchMedium::Disk,
            ScratchArg::Memory => fhs_executor::ScratchMedium::Memory,
        }
    }
}

/// `--opens`' values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpensArg {
    Kernel,
    Daemon,
}

/// A built action: the outcome, plus what the remote path adds.
pub(crate) struct Built {
    pub(crate) outcome: BuildOutcome,
    pub(crate) remote: Option<serde_json::Value>,
    /// Its log, a file of the store a person can open.
    pub(crate) log_path: PathBuf,
}

/// `--jobs`' default: the CPUs this process may run on (its affinity and
/// its cgroup's quota, as `nproc` counts them).
fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The outputs of the action in `file`, built (with what it refers to) or
/// taken from the cache, as a plain `fhsx build` would.
pub fn outputs_of(
    g: &Globals,
    file: &std::path::Path,
) -> anyhow::Result<std::collections::BTreeMap<executor_core::OutputName, castore::Digest>> {
    let a = BuildArgs {
        action: file.to_path_buf(),
        record: false,
        rebuild: false,
        check: false,
        vary: None,
        seed: None,
        diffoscope: false,
        keep_failed: false,
        scratch: ScratchArg::Disk,
        scratch_pool: DEFAULT_SCRATCH_POOL,
        opens: OpensArg::Kernel,
        upstream_ca: Vec::new(),
        remote: None,
        trust: Vec::new(),
        token_file: None,
        jobs: None,
        keep_going: false,
        events: None,
        trace: None,
        cache: CacheArgs::default(),
    };
    let graph = ActionGraph::load(file)?;
    let built = build_local(g, &a, &graph)?;
    let rec = &built.outcome.record.record;
    if !rec.succeeded() {
        return Err(Classified(
            ExitClass::BuildFailed,
            format!(
                "{} failed; its log is blob {}",
                file.display(),
                rec.log_digest
            ),
        )
        .into());
    }
    Ok(rec.outputs.clone())
}

pub fn run(g: &Globals, a: BuildArgs) -> anyhow::Result<i32> {
    let graph = ActionGraph::load(&a.action)?;
    let built = match &a.remote {
        Some(addr) => build_remote(g, &a, &graph, addr)?,
        None => build_local(g, &a, &graph)?,
    };
    report(g, &built)
}

fn build_local(g: &Globals, a: &BuildArgs, graph: &ActionGraph) -> anyhow::Result<Built> {
    let store = open_store(g)?;
    let jobs = a.jobs.unwrap_or_else(default_jobs);
    if jobs == 0 {
        return Err(Classified(ExitClass::Usage, "--jobs 0: give at least 1".into()).into());
    }
    let mut exec = FhsExecutor::open(store)?;
    // SIGINT/SIGTERM stop the build gracefully (every sandbox torn down,
    // every view unmounted, every scratch removed) instead of killing fhsx
    // mid-way; nothing new starts.
    let cancel = Arc::new(AtomicBool::new(false));
    let signals = castore_fuse::TerminationSignals::block().context("blocking SIGINT/SIGTERM")?;
    let flag = cancel.clone();
    std::thread::spawn(move || {
        if signals.wait().is_ok() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    let pool = TokenPool::new(jobs)?;
    exec.cancel = Some(cancel.clone());
    exec.keep_failed = a.keep_failed;
    exec.scratch_medium = a.scratch.into();
    exec.scratch_pool = (a.scratch_pool > 0).then(|| ScratchPool::new(a.scratch_pool));
    exec.zero_message_open = a.opens == OpensArg::Kernel;
    exec.jobserver = Some(pool.clone());
    exec.remote = a.cache.open(exec.store())?;
    // With a remote cache, an input named by digest need not be here: a
    // hit needs none, and a build that must run fetches what it lacks.
    let inputs_here = exec.remote.is_none();
    let store = exec.store().clone();
    let vary = match &a.vary {
        Some(list) => Some(
            executor_core::vary::Variations::parse(list, a.seed.unwrap_or_else(fresh_seed))
                .map_err(|m| Classified(ExitClass::Usage, m))?,
        ),
        None => None,
    };
    // What the graph imports and builds stays in the store until it is done.
    let hold = Arc::new(store.temp_roots(&[])?);
    let history = History::open(&store);
    let keys: Vec<castore::Digest> = (graph.nodes().iter())
        .map(|n| History::key(n.canonical().as_os_str().as_bytes()))
        .collect();
    let (expected, known) = expected_ms(graph, &history, &keys);
    let priority = schedule::priorities(graph, &expected);
    let n = graph.nodes().len();
    let terminal = std::io::stderr().is_terminal();
    let shown = Shown {
        live: n > 1 && terminal,
        lines: n > 1,
        events: a.events.as_deref().map(open_events).transpose()?,
        trace: a.trace.is_some(),
    };
    let watch = GraphWatch::new(
        graph,
        expected,
        known,
        priority.clone(),
        jobs,
        a.keep_going,
        Some(pool.clone()),
        shown,
    );
    // Logs of actions that may run side by side, or under the live view,
    // are shown a line at a time, each named; one action's goes as it is.
    let named_logs = n > 1 && (jobs > 1 || terminal);
    let options = schedule::Options {
        jobs,
        keep_going: a.keep_going,
        cancel: Some(cancel.clone()),
    };
    // With a remote cache, what each action resolved to and made: an
    // action that must run and cannot fetch a dependency's output from the
    // cache rebuilds that dependency here (`rewind`).
    let made: std::sync::Mutex<Vec<Option<Made>>> = std::sync::Mutex::new(vec![None; n]);
    let build_one = |i: usize, node: &GraphNode, action: Action, _slot: usize| {
        let is_root = i + 1 == n;
        let resolved = exec.remote.is_some().then(|| action.clone());
        let req = BuildRequest {
            hold: Some(hold.clone()),
            pruned_from: None,
            vary: if is_root { vary.clone() } else { None },
            diffoscope: is_root && a.diffoscope,
            lock_path: node.action.lock_path(&node.file),
            record: is_root && a.record,
            upstream_ca: a.upstream_ca.clone(),
            cache: a.policy(is_root),
            trust: a.trust.clone(),
            failed_outputs: false,
            split_streams: false,
            priority: priority[i].remaining_ms,
            action,
        };
        let mut sink = ActionLog::new(named_logs.then_some(i), &watch);
        let mut outcome = if req.vary.is_some() {
            fhs_executor::check::check_varied(&exec, &req, &mut sink)
        } else {
            exec.build(&req, &mut sink)
        };
        if let Err(fhs_executor::Error::MissingInput { digest, .. }) = &outcome {
            if exec.remote.is_some() && rewind(&exec, graph, &made, i, digest, &req, &mut sink)? {
                outcome = exec.build(&req, &mut sink);
            }
        }
        let outcome = outcome.with_context(|| building(node, is_root))?;
        drop(sink);
        let rec = &outcome.record.record;
        if let (Some(action), Ok(mut m)) = (resolved, made.lock()) {
            m[i] = Some(Made {
                action,
                outputs: rec.outputs.clone(),
            });
        }
        if !outcome.cached && rec.reused.is_none() && rec.succeeded() {
            // A hint for the next schedule: losing it costs a guess.
            let entry = Entry {
                file: node.file_digest,
                wall_ms: rec.resources.wall_ms,
            };
            let _ = history.put(&keys[i], &entry);
        }
        let log_path = store.object_path(ObjectKind::Blob, &rec.log_digest);
        Ok::<_, anyhow::Error>(Step {
            outputs: rec.succeeded().then(|| rec.outputs.clone()),
            value: Built {
                outcome,
                remote: None,
                log_path,
            },
        })
    };
    let ticking = watch_ticks(n > 1 && terminal, a.trace.is_some());
    let done = AtomicBool::new(false);
    let ends = std::thread::scope(|scope| {
        if let Some(every) = ticking {
            let (watch, done) = (&watch, &done);
            scope.spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    watch.tick();
                    std::thread::sleep(every);
                }
            });
        }
        let ends = schedule::run_graph(
            graph,
            &priority,
            &options,
            &watch,
            |p| import(&store, &hold, p, inputs_here),
            build_one,
        );
        done.store(true, Ordering::SeqCst);
        ends
    });
    watch.tick();
    watch.finish(a.trace.as_deref())?;
    if let (Some(pool), Some(_)) = (&exec.scratch_pool, std::env::var_os("FHSX_TIMINGS")) {
        eprintln!(
            "fhsx: timings: {} of the graph's builds ran on a recycled scratch",
            pool.reused()
        );
    }
    // The pool and what it holds go now, before fhsx exits.
    drop(exec);
    root_of(graph, ends, cancel.load(Ordering::SeqCst))
}

/// An action of the graph as it was resolved, and what it made.
#[derive(Clone)]
struct Made {
    action: Action,
    outputs: std::collections::BTreeMap<executor_core::OutputName, castore::Digest>,
}

/// Action rewinding (Bazel's word): the action `i` must run, and its
/// input `missing` — a dependency's output, held by the remote cache — did
/// not come (the cache lost it, or refused it as not the record's). Build
/// that dependency here, and say whether `i` may try again: only if the
/// rebuild made what its cached record named, else `i` would be resolved
/// against outputs that no longer exist.
fn rewind(
    exec: &FhsExecutor,
    graph: &ActionGraph,
    made: &std::sync::Mutex<Vec<Option<Made>>>,
    i: usize,
    missing: &castore::Digest,
    req: &BuildRequest,
    sink: &mut ActionLog<'_>,
) -> anyhow::Result<bool> {
    let found = {
        let m = made
            .lock()
            .map_err(|_| anyhow::anyhow!("a build thread panicked"))?;
        graph.dependencies(i).iter().find_map(|&j| {
            let d = m[j].as_ref()?;
            d.outputs
                .values()
                .any(|o| o == missing)
                .then(|| (j, d.clone()))
        })
    };
    let Some((j, dep)) = found else {
        return Ok(false);
    };
    let node = &graph.nodes()[j];
    let _ = writeln!(
        sink,
        "fhsx: {} made {missing}, which the remote cache did not give: building {} here",
        node.file.display(),
        node.file.display()
    );
    let again = BuildRequest {
        action: dep.action.clone(),
        lock_path: node.action.lock_path(&node.file),
        cache: CachePolicy::Rebuild,
        vary: None,
        diffoscope: false,
        record: false,
        ..req.clone()
    };
    let rebuilt = exec
        .build(&again, sink)
        .with_context(|| building(node, false))?;
    if rebuilt.record.record.outputs != dep.outputs {
        return Err(Classified(
            ExitClass::BuildFailed,
            format!(
                "{} was built here because the remote cache could not give its output, and it made other outputs than its cached record names (it does not reproduce): run the build again, and `fhsx build --check {}` to see how it differs",
                node.file.display(),
                node.file.display()
            ),
        )
        .into());
    }
    Ok(true)
}

/// How often the live view is redrawn and the token counter sampled, if
/// either is wanted.
fn watch_ticks(live: bool, trace: bool) -> Option<Duration> {
    match (live, trace) {
        (true, _) => Some(Duration::from_millis(100)),
        (false, true) => Some(Duration::from_millis(50)),
        (false, false) => None,
    }
}

/// What a cache hit costs, as an expected time: next to nothing.
const HIT_MS: u64 = 1;

/// Each action's expected milliseconds, and whether any was known. An
/// action that will likely run — never timed, its file changed since its
/// last run, or something it depends on will likely run — is expected to
/// take its last run's time (never timed: the mean of those timed, or 1 s
/// where none is); one the cache will likely answer, next to nothing. So
/// after an edit, the chain that must rebuild starts first.
fn expected_ms(
    graph: &ActionGraph,
    history: &History,
    keys: &[castore::Digest],
) -> (Vec<u64>, bool) {
    if keys.len() < 2 {
        // One action: no order to choose.
        return (vec![HIT_MS; keys.len()], false);
    }
    let last: Vec<Option<Entry>> = keys.iter().map(|k| history.get(k)).collect();
    let (sum, count) = last.iter().flatten().fold((0u64, 0u64), |(s, c), e| {
        (s.saturating_add(e.wall_ms), c + 1)
    });
    let guess = sum.checked_div(count).unwrap_or(1000);
    let mut runs = vec![false; keys.len()];
    let mut out = Vec::with_capacity(keys.len());
    // Dependencies come first: each one's verdict is known when asked.
    for (i, node) in graph.nodes().iter().enumerate() {
        runs[i] = last[i].is_none_or(|e| e.file != node.file_digest)
            || graph.dependencies(i).iter().any(|&d| runs[d]);
        out.push(match (runs[i], last[i]) {
            (false, _) => HIT_MS,
            (true, Some(e)) => e.wall_ms,
            (true, None) => guess,
        });
    }
    (out, count > 0)
}

/// `--events FILE`: the file, or stdout for `-`.
fn open_events(path: &Path) -> anyhow::Result<Box<dyn Write + Send>> {
    if path == Path::new("-") {
        return Ok(Box::new(std::io::stdout()));
    }
    let f = std::fs::File::create(path).map_err(|e| {
        Classified(
            ExitClass::Usage,
            format!("--events {}: {e}", path.display()),
        )
    })?;
    Ok(Box::new(std::io::LineWriter::new(f)))
}

/// The root's result: its own outcome where it ran, else the failure that
/// kept it from running (a dependency's error as it was, or its failed
/// build named with its log).
fn root_of(
    graph: &ActionGraph,
    mut ends: Vec<End<Built, anyhow::Error>>,
    cancelled: bool,
) -> anyhow::Result<Built> {
    // A bug of fhsx, not of the build.
    let panicked = |node: &GraphNode, message: &str| -> anyhow::Error {
        Classified(
            ExitClass::BuildFailed,
            format!(
                "fhsx panicked building {} (a bug in fhsx; please report it): {message}",
                node.file.display()
            ),
        )
        .into()
    };
    let because = match ends.pop() {
        Some(End::Made(b)) | Some(End::Failed(b)) => return Ok(b),
        Some(End::Error(e)) => return Err(e),
        Some(End::Panicked(m)) => return Err(panicked(graph.root(), &m)),
        Some(End::Unbuilt { because }) => because,
        Some(End::NotStarted) | None => {
            return Err(Classified(
                ExitClass::BuildFailed,
                if cancelled {
                    "interrupted (SIGINT or SIGTERM): the running actions were stopped and nothing more started".into()
                } else {
                    "the graph stopped before its root could start".into()
                },
            )
            .into())
        }
    };
    match std::mem::replace(&mut ends[because], End::NotStarted) {
        End::Error(e) => Err(e),
        End::Panicked(m) => Err(panicked(&graph.nodes()[because], &m)),
        End::Failed(b) => Err(failed_dependency(
            &graph.nodes()[because],
            &b.outcome.record.record,
        )),
        _ => Err(Classified(
            ExitClass::BuildFailed,
            "an action the root refers to was not built".into(),
        )
        .into()),
    }
}

/// An action's live log: straight to stderr, or, where several actions'
/// logs meet, a line at a time, each line named `ACTION> ` (as `nix
/// build -L` does) and printed above the live view. The executor has
/// already escaped what the build wrote; a line longer than
/// [`ActionLog::MAX_LINE`] is shown in pieces.
struct ActionLog<'w> {
    named: Option<(String, &'w GraphWatch)>,
    line: Vec<u8>,
}

impl<'w> ActionLog<'w> {
    const MAX_LINE: usize = 4096;

    fn new(node: Option<usize>, watch: &'w GraphWatch) -> ActionLog<'w> {
        ActionLog {
            named: node.map(|i| (format!("{}> ", watch.name(i)), watch)),
            line: Vec::new(),
        }
    }

    fn emit(&mut self) {
        if let Some((prefix, watch)) = &self.named {
            let text = String::from_utf8_lossy(&self.line);
            watch.say(&format!("{prefix}{}", text.trim_end_matches('\n')));
        }
        self.line.clear();
    }
}

impl Write for ActionLog<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.named.is_none() {
            return std::io::stderr().write(buf);
        }
        for &b in buf {
            self.line.push(b);
            if b == b'\n' || self.line.len() >= Self::MAX_LINE {
                self.emit();
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ActionLog<'_> {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.emit();
        }
    }
}

/// `fhsx build --remote ADDR`: the same graph, each action built by a
/// worker (or taken from the local cache).
fn build_remote(
    g: &Globals,
    a: &BuildArgs,
    graph: &ActionGraph,
    addr: &str,
) -> anyhow::Result<Built> {
    let endpoint = ::worker::Endpoint::parse(addr);
    if let ::worker::Endpoint::Tcp(a) = &endpoint {
        if a.rsplit_once(':').is_none_or(|(host, port)| {
            host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0)
        }) {
            return Err(Classified(
                ExitClass::Usage,
                format!("--remote {a}: write the worker's address as HOST:PORT or unix:PATH"),
            )
            .into());
        }
    }
    let store = open_store(g)?;
    let classify = |e: ::worker::Error| Classified(e.exit_class(), castore::Chain(&e).to_string());
    let token = match &a.token_file {
        Some(p) => ::worker::read_token_file(p).map_err(classify)?,
        None => Vec::new(),
    };
    let client =
        ::worker::client::Client::connect(&endpoint, &token, &a.trust).map_err(classify)?;
    let hold = store.temp_roots(&[])?;
    graph.build_all(
        |p| import(&store, &hold, p, true),
        |node, action: Action, is_root| {
            let lock = node.action.lock_path(&node.file);
            let out = client
                .build(
                    &store,
                    &action,
                    lock.as_deref(),
                    Box::new(std::io::stderr()),
                    &a.trust,
                    a.policy(is_root),
                )
                .map_err(classify)
                .with_context(|| building(node, is_root))?;
            dependency_ok(node, is_root, &out.record.record)?;
            hold.add(
                &out.record
                    .record
                    .outputs
                    .values()
                    .copied()
                    .collect::<Vec<_>>(),
            )?;
            let remote = json!({
                "worker": client.endpoint(),
                "worker_key": out.worker_key,
                "uploaded": out.uploaded,
                "upload_seconds": out.upload_time.as_secs_f64(),
                "downloaded": out.downloaded,
            });
            let outcome = BuildOutcome {
                record_digest: out.record_digest,
                record: out.record,
                cached: out.cached,
                remote: None,
                check: out.check,
            };
            let log_path = store.object_path(ObjectKind::Blob, &outcome.record.record.log_digest);
            Ok::<_, anyhow::Error>((
                outcome.record.record.outputs.clone(),
                Built {
                    outcome,
                    remote: Some(remote),
                    log_path,
                },
            ))
        },
    )
}

/// A seed for a shuffle nobody asked to replay.
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

/// A path input: a toolchain file's atoms, or a directory or archive
/// imported (an unchanged archive is not read again).
fn import(
    store: &castore::LocalStore,
    hold: &castore::TempRoots,
    path: &std::path::Path,
    present: bool,
) -> anyhow::Result<Vec<castore::Digest>> {
    let atoms = if path.extension().is_some_and(|e| e == "toolchain") {
        toolchain_atoms(store, path, present)?
    } else {
        let imported = hold
            .rooted(
                || castore::import::import_path_cached(store, path),
                |i| vec![i.root],
            )
            .with_context(|| format!("importing the input {}", path.display()))?;
        vec![imported.root]
    };
    hold.add(&atoms)?;
    Ok(atoms)
}

/// A toolchain file's atoms, each of which must be in the store if
/// `present`.
fn toolchain_atoms(
    store: &castore::LocalStore,
    path: &std::path::Path,
    present: bool,
) -> anyhow::Result<Vec<castore::Digest>> {
    let usage = |m: String| anyhow::Error::from(Classified(ExitClass::Usage, m));
    let t = debian::Toolchain::read(path).map_err(|e| usage(castore::Chain(&e).to_string()))?;
    for p in t.packages.iter().filter(|_| present) {
        if !castore::DirectoryStore::has_directory(store, &p.atom)? {
            return Err(usage(format!(
                "{}: package {} {} (atom {}) is not in this store: make the toolchain here with `fhsx toolchain apt {} -o {}`",
                path.display(),
                p.name,
                p.version,
                p.atom,
                t.requested.join(" "),
                path.display()
            )));
        }
    }
    Ok(t.atoms())
}

fn building(node: &GraphNode, is_root: bool) -> String {
    if is_root {
        format!("building {}", node.file.display())
    } else {
        format!(
            "building {}, which the action refers to",
            node.file.display()
        )
    }
}

/// Why a build that ran failed, for a message after its live log: its
/// exit status, or, where fhsx stopped it or refused what it made, that
/// the log's last line (already shown) says why.
pub(crate) fn how_it_failed(rec: &BuildRecord) -> String {
    if rec.failure.is_some() {
        "fhsx's last line in its log, above, says why".into()
    } else if !rec.exit.success() {
        rec.exit.to_string()
    } else if let Some(v) = rec.violations.first() {
        format!("a containment violation: {v}")
    } else {
        "its read set is incomplete".into()
    }
}

/// A dependency that failed stops the graph: what refers to it cannot run.
fn dependency_ok(node: &GraphNode, is_root: bool, rec: &BuildRecord) -> anyhow::Result<()> {
    if is_root || rec.succeeded() {
        return Ok(());
    }
    Err(failed_dependency(node, rec))
}

/// Why what refers to `node`, whose build ran and failed, cannot be built.
fn failed_dependency(node: &GraphNode, rec: &BuildRecord) -> anyhow::Error {
    Classified(
        ExitClass::BuildFailed,
        format!(
            "{} failed ({}), so what refers to it cannot be built; its log is blob {}",
            node.file.display(),
            how_it_failed(rec),
            rec.log_digest
        ),
    )
    .into()
}

/// Print a finished build's result; the exit code follows its status.
fn report(g: &Globals, built: &Built) -> anyhow::Result<i32> {
    let out = &built.outcome;
    let rec = &out.record.record;
    if g.json {
        let mut v = json!({
            "record": out.record_digest,
            "outputs": rec.outputs,
            "read_set": rec.observed_read_set_digest,
            "log": rec.log_digest,
            "exit": rec.exit,
            "action": rec.action_digest,
            "cached": out.cached,
            "source": source(out),
        });
        if let Some(m) = v.as_object_mut() {
            if let Some(cache) = &out.remote {
                m.insert("remote_cache".into(), json!(cache));
            }
            if let Some(r) = &built.remote {
                m.insert("remote".into(), r.clone());
            }
            if let Some(c) = &out.check {
                m.insert("check".into(), json!(c));
            }
            if let Some(f) = &rec.failure {
                m.insert("error".into(), json!(f));
            }
        }
        println!("{v}");
    } else {
        println!(
            "record  {}{}",
            out.record_digest,
            match (&out.remote, out.cached) {
                (Some(cache), _) => format!(" (cached, from the remote cache {cache})"),
                (None, true) => " (cached)".into(),
                (None, false) => String::new(),
            }
        );
        if rec.outputs.is_empty() {
            println!("output  (none: the build failed)");
        }
        for (name, d) in &rec.outputs {
            println!("output  {name} {d}");
        }
        println!(
            "reads   {} ({} entries)",
            rec.observed_read_set_digest, rec.read_set_size
        );
        println!("log     {} (`fhsx store blob` prints it)", rec.log_digest);
        if let Some(r) = &built.remote {
            println!(
                "remote  {} signed by {}; uploaded {} blobs ({} bytes), {} directories",
                r["worker"].as_str().unwrap_or_default(),
                r["worker_key"].as_str().unwrap_or_default(),
                r["uploaded"]["blobs"],
                r["uploaded"]["bytes"],
                r["uploaded"]["directories"]
            );
        }
        if let Some(c) = &out.check {
            print_check(c);
        }
    }
    if !rec.succeeded() {
        return Err(Classified(
            ExitClass::BuildFailed,
            format!(
                "the build failed ({}); its log is blob {}",
                how_it_failed(rec),
                rec.log_digest
            ),
        )
        .into());
    }
    match &out.check {
        Some(c) if !c.differences.is_empty() => Err(Classified(
            ExitClass::CheckMismatch,
            format!(
                "check: the rebuild differs from record {} in {} path(s); its record {} is kept, marked as a check",
                c.against,
                c.differences.len(),
                out.record_digest
            ),
        )
        .into()),
        _ => Ok(0),
    }
}

/// Where a result came from, for `--json`: `built` (it ran), `local`
/// (this store's cache), `remote` (the remote cache's record).
pub(crate) fn source(out: &BuildOutcome) -> &'static str {
    match (out.cached, &out.remote) {
        (_, Some(_)) => "remote",
        (true, None) => "local",
        (false, None) => "built",
    }
}

fn print_check(c: &CheckReport) {
    if c.differences.is_empty() {
        println!(
            "check   reproduced: every output is bit-identical to record {}",
            c.against
        );
        return;
    }
    println!("check   DIFFERS from record {}:", c.against);
    let side = |s: &Option<castore::diff::NodeSummary>| match s {
        Some(s) => format!(
            "{} {} ({} {})",
            s.kind.as_str(),
            s.digest,
            s.size,
            if s.kind == castore::diff::NodeKind::Dir {
                "entries"
            } else {
                "bytes"
            }
        ),
        None => "absent".to_owned(),
    };
    for (name, value) in &c.variations {
        println!("  varied {name}: {value}");
    }
    if let Some(culprits) = &c.culprits {
        println!("  caused by: {}", culprits.join(", "));
    }
    if let Some(d) = &c.diffoscope {
        println!("  diffoscope's report: blob {d}");
    }
    for d in &c.differences {
        let path = &d.difference.path;
        let shown = if path.is_empty() {
            format!("${}", d.output)
        } else {
            format!("${}/{path}", d.output)
        };
        println!(
            "  {shown}\n    before {}\n    after  {}",
            side(&d.difference.before),
            side(&d.difference.after)
        );
        if let Some(f) = &d.file {
            println!(
                "    {} file, first difference at byte {}",
                f.kind, f.first_difference
            );
        }
    }
}
