//! `fhsx build ACTION.toml`: build an action — after every action it names
//! by reference (`other.toml#out`), in dependency order, each taken from the
//! cache where it can be — and print the root's signed record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use std::path::PathBuf;

use clap::Args;
use executor_core::{
    Action, ActionGraph, BuildOutcome, BuildRecord, BuildRequest, CachePolicy, CheckReport,
    Executor, ExitClass, GraphNode,
};
use fhs_executor::pool::ScratchPool;
use fhs_executor::FhsExecutor;
use serde_json::json;

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

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
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["record", "keep_failed", "upstream_ca", "vary", "diffoscope"])]
    pub remote: Option<String>,
    /// Records signed by this key (`ed25519:<hex>`) are cache hits too, and
    /// with --remote only a worker whose key is listed is accepted. Repeatable.
    #[arg(long, value_name = "KEY")]
    pub trust: Vec<String>,
    /// With --remote: the worker's access token (the file given to `fhsx worker --token-file`).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<PathBuf>,
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
struct Built {
    outcome: BuildOutcome,
    remote: Option<serde_json::Value>,
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
    let mut exec = FhsExecutor::open(store)?;
    // SIGINT/SIGTERM stop the build gracefully (the sandbox is torn down,
    // the view unmounted, scratch removed) instead of killing fhsx mid-way.
    let cancel = Arc::new(AtomicBool::new(false));
    let signals = castore_fuse::TerminationSignals::block().context("blocking SIGINT/SIGTERM")?;
    let flag = cancel.clone();
    std::thread::spawn(move || {
        if signals.wait().is_ok() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    exec.cancel = Some(cancel);
    exec.keep_failed = a.keep_failed;
    exec.scratch_medium = a.scratch.into();
    exec.scratch_pool = (a.scratch_pool > 0).then(|| ScratchPool::new(a.scratch_pool));
    exec.zero_message_open = a.opens == OpensArg::Kernel;
    // The build's own output goes to stderr, so stdout stays the result.
    let mut sink = std::io::stderr();
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
    let built = graph.build_all(
        |p| import(&store, &hold, p),
        |node, action, is_root| {
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
                action,
            };
            let outcome = if req.vary.is_some() {
                fhs_executor::check::check_varied(&exec, &req, &mut sink)
            } else {
                exec.build(&req, &mut sink)
            }
            .with_context(|| building(node, is_root))?;
            dependency_ok(node, is_root, &outcome.record.record)?;
            Ok::<_, anyhow::Error>((
                outcome.record.record.outputs.clone(),
                Built {
                    outcome,
                    remote: None,
                },
            ))
        },
    );
    if let (Some(pool), Some(_)) = (&exec.scratch_pool, std::env::var_os("FHSX_TIMINGS")) {
        eprintln!(
            "fhsx: timings: {} of the graph's builds ran on a recycled scratch",
            pool.reused()
        );
    }
    // The pool and what it holds go now, before fhsx exits.
    drop(exec);
    built
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
        |p| import(&store, &hold, p),
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
                check: out.check,
            };
            Ok::<_, anyhow::Error>((
                outcome.record.record.outputs.clone(),
                Built {
                    outcome,
                    remote: Some(remote),
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
) -> anyhow::Result<Vec<castore::Digest>> {
    let atoms = if path.extension().is_some_and(|e| e == "toolchain") {
        toolchain_atoms(store, path)?
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

/// A toolchain file's atoms, each of which must be in the store.
fn toolchain_atoms(
    store: &castore::LocalStore,
    path: &std::path::Path,
) -> anyhow::Result<Vec<castore::Digest>> {
    let usage = |m: String| anyhow::Error::from(Classified(ExitClass::Usage, m));
    let t = debian::Toolchain::read(path).map_err(|e| usage(castore::Chain(&e).to_string()))?;
    for p in &t.packages {
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
    Err(Classified(
        ExitClass::BuildFailed,
        format!(
            "{} failed ({}), so what refers to it cannot be built; its log is blob {}",
            node.file.display(),
            how_it_failed(rec),
            rec.log_digest
        ),
    )
    .into())
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
        });
        if let Some(m) = v.as_object_mut() {
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
            if out.cached { " (cached)" } else { "" }
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
