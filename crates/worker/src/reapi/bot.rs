//! The bot: `--jobs` sessions with the engine's `Bots` service, each
//! holding at most one lease, all running their builds through one
//! [`Runner`].
//!
//! A session's loop: `CreateBotSession`, then `UpdateBotSession` forever —
//! long-polled while idle (the engine answers when it has a lease or the
//! poll times out), a heartbeat before the session's `expire_time` while a
//! build runs, and at once when it ends, with the lease `COMPLETED` and
//! its `ActionResult`. A lease the engine drops from the session (the
//! client cancelled, or the engine gave it to another bot) is cancelled
//! here: the build stops and its result is never reported. A session the
//! engine forgot (it expired) is created anew.
//!
//! Sessions are named `ID-0…ID-(N-1)` after `--bot-id`; a heartbeat goes at
//! a third of the time left to `expire_time`. A forgotten session's lease
//! is cancelled (the engine requeues it). At start-up the worker removes
//! what a killed predecessor left mounted and asks `GetCapabilities`: a
//! wire other than SHA-256 refuses the start, saying what the engine
//! speaks. `FHSX_TIMINGS` prints each build's stage timings by lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use castore::store::LocalStore;
use castore::{Digest, Node};
use executor_core::{CachePolicy, SignedRecord};
use prost::Message;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::Channel;

use super::cas::{self, Cas, CasError, Upload};
use super::mapping::{self, Found, Plan, Policy, Refusal, Root};
use super::proto::{
    self, pack, re, Any, BotSession, BotStatus, BotsClient, Code, CreateBotSessionRequest, Device,
    KeyValue, Lease, LeaseState, Status, Timestamp, UpdateBotSessionRequest, Worker,
};
use crate::runner::{Job, JobResult, Runner};
use crate::Error;

/// How the bot is run.
#[derive(Debug, Clone)]
pub struct BotConfig {
    pub store: LocalStore,
    /// The engine's gRPC endpoint (`grpc://HOST:PORT`, `http://…`).
    pub engine: String,
    /// Its CAS, when it is served elsewhere.
    pub cas: Option<String>,
    /// The REAPI instance name.
    pub instance: String,
    /// Sessions, each holding one lease at a time.
    pub jobs: usize,
    /// This worker's id; session `i` is `ID-i`.
    pub bot_id: String,
    /// Every property of the primary device, as the engine registers them
    /// ([`super::platform::advertised`]).
    pub properties: Vec<(String, String)>,
    pub policy: Policy,
    /// On SIGTERM/SIGINT, how long running builds may go on before they are
    /// cancelled.
    pub shutdown_grace: Duration,
    pub builds: crate::runner::BuildOptions,
}

fn grpc_url(u: &str) -> String {
    match u.strip_prefix("grpc://") {
        Some(rest) => format!("http://{rest}"),
        None => u.to_owned(),
    }
}

async fn connect(url: &str) -> Result<Channel, Error> {
    let ep = tonic::transport::Endpoint::from_shared(grpc_url(url))
        .map_err(|e| {
            Error::Usage(format!(
                "{url} is not an engine URL (grpc://HOST:PORT): {e}"
            ))
        })?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    ep.connect()
        .await
        .map_err(|e| Error::Usage(format!("cannot reach the engine at {url}: {e}")))
}

/// Check the engine's capabilities: SHA-256 is the one digest function
/// this worker speaks. `Err` says what the engine offers instead.
pub fn check_capabilities(c: &re::ServerCapabilities) -> Result<i64, String> {
    let sha = re::digest_function::Value::Sha256 as i32;
    let name = |v: &i32| {
        re::digest_function::Value::try_from(*v)
            .map(|f| f.as_str_name().to_owned())
            .unwrap_or_else(|_| format!("#{v}"))
    };
    let cache = c.cache_capabilities.clone().unwrap_or_default();
    if !cache.digest_functions.contains(&sha) {
        return Err(format!(
            "its CAS speaks {} and this worker speaks SHA256 only (its local store stays BLAKE3; the wire must be SHA-256): use an engine or instance configured for SHA-256",
            if cache.digest_functions.is_empty() {
                "no digest function".to_owned()
            } else {
                cache.digest_functions.iter().map(name).collect::<Vec<_>>().join(", ")
            }
        ));
    }
    if let Some(x) = &c.execution_capabilities {
        let fns: Vec<i32> = if x.digest_functions.is_empty() {
            vec![x.digest_function]
        } else {
            x.digest_functions.clone()
        };
        if !fns.contains(&sha) {
            return Err(format!(
                "it executes with {} and this worker speaks SHA256 only",
                fns.iter().map(name).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    Ok(cache.max_batch_total_size_bytes)
}

/// Attach to the engine and serve leases until SIGTERM or SIGINT. `ready`
/// is called once the engine's capabilities were checked, before the
/// first session is created.
pub fn run(config: BotConfig, ready: impl FnOnce(&str)) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|source| Error::Io {
            what: "start the bot runtime for",
            endpoint: config.engine.clone(),
            source,
        })?;
    rt.block_on(run_async(config, ready))
}

struct Ctx {
    runner: Arc<Runner>,
    cas: Cas,
    policy: Policy,
    public_key: String,
}

async fn run_async(config: BotConfig, ready: impl FnOnce(&str)) -> Result<(), Error> {
    // A killed predecessor may have left views and scratch file systems
    // mounted, and working areas behind: detach and remove them first.
    let _ = castore_fuse::cleanup_stale_mounts(&castore_fuse::default_registry());
    fhs_executor::scratch::sweep_abandoned(&std::env::temp_dir());
    let exec = fhs_executor::FhsExecutor::open(config.store.clone())?;
    let public_key = exec.public_key();
    drop(exec);

    let channel = connect(&config.engine).await?;
    let cas_channel = match &config.cas {
        Some(u) => connect(u).await?,
        None => channel.clone(),
    };
    // An engine that is still starting may accept the connection before
    // it answers: ask again for a while.
    let mut caps_client = bazel_remote_apis::build::bazel::remote::execution::v2::capabilities_client::CapabilitiesClient::new(cas_channel.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let caps = loop {
        let mut req = tonic::Request::new(re::GetCapabilitiesRequest {
            instance_name: config.instance.clone(),
        });
        req.set_timeout(Duration::from_secs(5));
        match caps_client.get_capabilities(req).await {
            Ok(r) => break r.into_inner(),
            Err(e)
                if matches!(
                    e.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                ) && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                return Err(Error::Usage(format!(
                    "asking the engine at {} for its capabilities (instance {:?}): {e}",
                    config.engine, config.instance
                )))
            }
        }
    };
    let max_batch = check_capabilities(&caps).map_err(|why| {
        Error::Usage(format!(
            "refusing to attach to the engine at {}: {why}",
            config.engine
        ))
    })?;
    let cas = Cas::new(
        cas_channel,
        config.instance.clone(),
        config.store.clone(),
        max_batch,
    );
    let runner = Runner::new(config.store.clone(), config.jobs, config.builds)?;
    let ctx = Arc::new(Ctx {
        runner: runner.clone(),
        cas,
        policy: config.policy.clone(),
        public_key,
    });
    ready(&config.engine);

    let properties: Vec<KeyValue> = config
        .properties
        .iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: v.clone(),
        })
        .collect();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut sessions = Vec::new();
    for i in 0..config.jobs.max(1) {
        let s = Session {
            ctx: ctx.clone(),
            bots: BotsClient::new(channel.clone()),
            instance: config.instance.clone(),
            bot_id: format!("{}-{i}", config.bot_id),
            properties: properties.clone(),
            stop: stop_rx.clone(),
        };
        sessions.push(tokio::spawn(s.serve()));
    }

    let io = |what: &'static str| {
        let ep = config.engine.clone();
        move |source| Error::Io {
            what,
            endpoint: ep,
            source,
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(io("install a SIGTERM handler for"))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(io("install a SIGINT handler for"))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("fhsx worker: stopping: no new leases");
    let _ = stop_tx.send(true);
    runner.shut_down(config.shutdown_grace).await;
    for s in sessions {
        let _ = tokio::time::timeout(Duration::from_secs(10), s).await;
    }
    Ok(())
}

/// A running lease.
struct Current {
    lease: Lease,
    cancel: Arc<AtomicBool>,
    done: oneshot::Receiver<(Status, Option<re::ActionResult>)>,
}

struct Session {
    ctx: Arc<Ctx>,
    bots: BotsClient,
    instance: String,
    bot_id: String,
    properties: Vec<KeyValue>,
    stop: watch::Receiver<bool>,
}

/// How long an idle poll may wait for a lease.
const POLL: Duration = Duration::from_secs(30);

impl Session {
    fn fresh(&self, status: BotStatus) -> BotSession {
        BotSession {
            bot_id: self.bot_id.clone(),
            status: status as i32,
            worker: Some(Worker {
                devices: vec![Device {
                    handle: self.bot_id.clone(),
                    properties: self.properties.clone(),
                }],
                properties: Vec::new(),
                configs: Vec::new(),
            }),
            ..Default::default()
        }
    }

    async fn serve(mut self) {
        let mut backoff = Duration::from_millis(200);
        let mut current: Option<Current> = None;
        'session: loop {
            if *self.stop.borrow() && current.is_none() {
                return;
            }
            let mut req = tonic::Request::new(CreateBotSessionRequest {
                parent: self.instance.clone(),
                bot_session: Some(self.fresh(BotStatus::Ok)),
            });
            req.set_timeout(POLL);
            let mut session = match self.bots.create_bot_session(req).await {
                Ok(r) => r.into_inner(),
                Err(e) => {
                    eprintln!(
                        "fhsx worker: {}: CreateBotSession: {e}; retrying",
                        self.bot_id
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            backoff = Duration::from_millis(200);
            if let Some(c) = current.take() {
                // The engine requeued what the old session held.
                c.cancel.store(true, Ordering::SeqCst);
            }
            eprintln!("fhsx worker: {}: session {}", self.bot_id, session.name);
            loop {
                self.take_leases(&mut session, &mut current);
                let stopping = *self.stop.borrow();
                // Wait for the build to end or the next heartbeat.
                let mut finished = None;
                if let Some(c) = current.as_mut() {
                    let beat = heartbeat(&session);
                    tokio::select! {
                        r = &mut c.done => finished = Some(r.unwrap_or_else(|_| (status(Code::Internal, "the build task vanished"), None))),
                        _ = tokio::time::sleep(beat) => {}
                    }
                } else if stopping {
                    return;
                }
                let mut reported = None;
                session.leases.clear();
                if let Some((st, result)) = finished {
                    if let Some(c) = current.take() {
                        let mut l = c.lease;
                        l.state = LeaseState::Completed as i32;
                        l.status = Some(st);
                        l.result = result.map(|r| pack(proto::TYPE_ACTION_RESULT, &r));
                        l.payload = None;
                        reported = Some(l.id.clone());
                        session.leases.push(l);
                    }
                } else if let Some(c) = &current {
                    let mut l = c.lease.clone();
                    l.payload = None;
                    session.leases.push(l);
                }
                if stopping && current.is_none() {
                    session.status = BotStatus::BotTerminating as i32;
                }
                let mut req = tonic::Request::new(UpdateBotSessionRequest {
                    name: session.name.clone(),
                    bot_session: Some(session.clone()),
                });
                // Idle: a long poll. Busy or reporting: a quick exchange.
                req.set_timeout(if current.is_none() && reported.is_none() {
                    POLL
                } else {
                    Duration::from_secs(20)
                });
                match self.bots.update_bot_session(req).await {
                    Ok(r) => {
                        session = r.into_inner();
                        if let Some(c) = &current {
                            if !session.leases.iter().any(|l| l.id == c.lease.id) {
                                eprintln!(
                                    "fhsx worker: {}: lease {} was cancelled by the engine; stopping its build",
                                    self.bot_id, c.lease.id
                                );
                                c.cancel.store(true, Ordering::SeqCst);
                                current = None;
                            }
                        }
                        if let Some(c) = current.as_mut() {
                            if let Some(l) = session.leases.iter().find(|l| l.id == c.lease.id) {
                                c.lease.state = l.state;
                            }
                        }
                        if stopping && current.is_none() {
                            return;
                        }
                    }
                    Err(e) if e.code() == tonic::Code::DeadlineExceeded => {
                        // An idle poll that outlived its deadline: poll again.
                        if reported.is_some() {
                            eprintln!(
                                "fhsx worker: {}: reporting a lease timed out: {e}; starting a new session",
                                self.bot_id
                            );
                            continue 'session;
                        }
                    }
                    Err(e) => {
                        eprintln!(
                            "fhsx worker: {}: UpdateBotSession: {e}; starting a new session",
                            self.bot_id
                        );
                        tokio::time::sleep(backoff).await;
                        continue 'session;
                    }
                }
            }
        }
    }

    /// Start the first new lease of `session` (one per session).
    fn take_leases(&self, session: &mut BotSession, current: &mut Option<Current>) {
        for l in &session.leases {
            if current.as_ref().is_some_and(|c| c.lease.id == l.id) {
                continue;
            }
            let state = LeaseState::try_from(l.state).unwrap_or(LeaseState::Unspecified);
            if !matches!(state, LeaseState::Pending | LeaseState::Active) {
                continue;
            }
            if current.is_some() || *self.stop.borrow() {
                continue;
            }
            let cancel = Arc::new(AtomicBool::new(false));
            let (tx, rx) = oneshot::channel();
            let ctx = self.ctx.clone();
            let lease = l.clone();
            let flag = cancel.clone();
            let bot = self.bot_id.clone();
            eprintln!("fhsx worker: {bot}: took lease {}", lease.id);
            tokio::spawn(async move {
                let r = execute(&ctx, &bot, &lease, flag).await;
                let _ = tx.send(r);
            });
            *current = Some(Current {
                lease: Lease {
                    payload: None,
                    ..l.clone()
                },
                cancel,
                done: rx,
            });
        }
    }
}

/// Before the session expires: a third of the time left, within 1–20 s.
fn heartbeat(s: &BotSession) -> Duration {
    let left = s
        .expire_time
        .as_ref()
        .and_then(|t| {
            let at = SystemTime::UNIX_EPOCH
                + Duration::new(t.seconds.max(0) as u64, t.nanos.max(0) as u32);
            at.duration_since(SystemTime::now()).ok()
        })
        .unwrap_or(Duration::from_secs(10));
    (left / 3).clamp(Duration::from_secs(1), Duration::from_secs(20))
}

fn status(code: Code, message: impl Into<String>) -> Status {
    Status {
        code: code as i32,
        message: message.into(),
        details: Vec::new(),
    }
}

fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// Run one lease: its status and, when the action ran, its result.
async fn execute(
    ctx: &Ctx,
    bot: &str,
    lease: &Lease,
    cancel: Arc<AtomicBool>,
) -> (Status, Option<re::ActionResult>) {
    // `queued_timestamp` is the engine's to set: a lease does not say when
    // its action was queued. (BuildGrid sets it, and its own worker start
    // and completion times over these.)
    let mut meta = re::ExecutedActionMetadata {
        worker: bot.to_owned(),
        worker_start_timestamp: Some(now()),
        ..Default::default()
    };
    match execute_inner(ctx, bot, lease, cancel, &mut meta).await {
        Ok((st, mut result)) => {
            if st.code != Code::Ok as i32 {
                eprintln!("fhsx worker: {bot}: lease {}: {}", lease.id, st.message);
            }
            meta.worker_completed_timestamp = Some(now());
            result.execution_metadata = Some(meta);
            (st, Some(result))
        }
        Err(e) => {
            eprintln!("fhsx worker: {bot}: lease {}: {}", lease.id, e.message);
            (status(e.code, e.message), None)
        }
    }
}

fn refusal(e: CasError) -> Refusal {
    Refusal::new(e.code(), castore::Chain(&e).to_string())
}

async fn execute_inner(
    ctx: &Ctx,
    bot: &str,
    lease: &Lease,
    cancel: Arc<AtomicBool>,
    meta: &mut re::ExecutedActionMetadata,
) -> Result<(Status, re::ActionResult), Refusal> {
    let payload = lease
        .payload
        .as_ref()
        .ok_or_else(|| Refusal::new(Code::InvalidArgument, "the lease carries no payload"))?;
    let action: re::Action = match payload.type_url.as_str() {
        proto::TYPE_ACTION => re::Action::decode(&payload.value[..]).map_err(|e| {
            Refusal::new(
                Code::InvalidArgument,
                format!("the lease's Action does not decode: {e}"),
            )
        })?,
        proto::TYPE_DIGEST => {
            let d = re::Digest::decode(&payload.value[..]).map_err(|e| {
                Refusal::new(
                    Code::InvalidArgument,
                    format!("the lease's Digest does not decode: {e}"),
                )
            })?;
            ctx.cas.message(&d).await.map_err(refusal)?
        }
        other => {
            return Err(Refusal::new(
                Code::InvalidArgument,
                format!("the lease carries a {other}, not an REAPI Action"),
            ))
        }
    };
    let cd = action
        .command_digest
        .clone()
        .ok_or_else(|| Refusal::new(Code::InvalidArgument, "the Action names no Command"))?;
    let command: re::Command = ctx.cas.message(&cd).await.map_err(refusal)?;
    let mut plan = mapping::plan(&action, &command, &ctx.policy)?;
    let root = action
        .input_root_digest
        .clone()
        .ok_or_else(|| Refusal::new(Code::InvalidArgument, "the Action names no input root"))?;

    meta.input_fetch_start_timestamp = Some(now());
    // gc is held off from the first object fetched until the input tree and
    // the source made from it are rooted for this job (a gc in between
    // would take blobs whose directories are not written yet); the roots
    // are held until the job ends, the build roots its own from its start.
    let store = ctx.cas.store().clone();
    let (hold, inputs) = tokio::task::spawn_blocking(move || {
        Ok::<_, castore::Error>((store.hold_gc()?, store.temp_roots(&[])?))
    })
    .await
    .map_err(|e| Refusal::new(Code::Internal, e.to_string()))?
    .map_err(|e| Refusal::new(Code::Internal, format!("holding off gc: {e}")))?;
    let (tree, xfer) = ctx.cas.fetch_tree(&root).await.map_err(refusal)?;
    eprintln!(
        "fhsx worker: {bot}: lease {}: input root {}/{}: fetched {} objects, {} bytes",
        lease.id, root.hash, root.size_bytes, xfer.blobs, xfer.bytes
    );
    let store = ctx.cas.store().clone();
    let dirs = plan.dirs.clone();
    let atoms: Vec<Digest> = plan.toolchain.iter().flat_map(|(_, a)| a.clone()).collect();
    let slash = matches!(plan.root, Root::Slash { .. });
    let whole_root = plan.whole_root();
    let (source, toolchain, top) = tokio::task::spawn_blocking(move || {
        let source = cas::with_dirs(&store, &tree, &dirs)?;
        let toolchain = if slash {
            castore::compose::shadowed(&store, &atoms, &source)?
        } else {
            atoms
        };
        let top = match whole_root {
            true => top_level_dirs(&store, &source)?,
            false => Vec::new(),
        };
        Ok::<_, CasError>((source, toolchain, top))
    })
    .await
    .map_err(|e| Refusal::new(Code::Internal, e.to_string()))?
    .map_err(refusal)?;
    plan.widen(top);
    let mut rooted = vec![tree, source];
    rooted.extend(&toolchain);
    inputs
        .add(&rooted)
        .map_err(|e| Refusal::new(Code::Internal, format!("rooting the inputs: {e}")))?;
    drop(hold);
    meta.input_fetch_completed_timestamp = Some(now());

    let fa = mapping::fhsx_action(&plan, source, toolchain, &ctx.policy.limits)?;
    let job = Job {
        action: fa,
        lock: Vec::new(),
        cache: if plan.do_not_cache {
            CachePolicy::Rebuild
        } else {
            CachePolicy::Use
        },
        cacheable: !plan.do_not_cache,
        // REAPI returns a failed command's outputs (a failed test's logs).
        failed_outputs: true,
        // Its two fields, read apart.
        split_streams: true,
    };
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    // The live log is not streamed to the engine: the record's log blob,
    // the same for a run and a cache hit, is the action's stdout. Under
    // FHSX_TIMINGS (profiling) the build's stage timings, said on the live
    // log only, go to the worker's stderr, named by lease.
    let timings = std::env::var_os("FHSX_TIMINGS").is_some();
    let drain = async move {
        let mut line = Vec::new();
        while let Some(chunk) = rx.recv().await {
            if !timings {
                continue;
            }
            for b in chunk {
                if b != b'\n' {
                    if line.len() < 4096 {
                        line.push(b);
                    }
                    continue;
                }
                if line.starts_with(b"fhsx: timings: ") {
                    eprintln!(
                        "fhsx worker: {bot}: lease {}: {}",
                        lease.id,
                        String::from_utf8_lossy(&line[6..]).escape_debug()
                    );
                }
                line.clear();
            }
        }
    };
    meta.execution_start_timestamp = Some(now());
    let (r, ()) = futures::future::join(ctx.runner.run(job, cancel, tx), drain).await;
    meta.execution_completed_timestamp = Some(now());
    let r = r.map_err(|_| Refusal::new(Code::Unavailable, "the worker is shutting down"))?;
    let (record_digest, record) = match r {
        JobResult::Done { digest, record, .. } => (digest, *record),
        JobResult::Failed { class, message } => {
            return Err(Refusal::new(mapping::error_code(class), message))
        }
    };
    meta.output_upload_start_timestamp = Some(now());
    let out = result(ctx, bot, &lease.id, &plan, &source, &record_digest, &record).await;
    meta.output_upload_completed_timestamp = Some(now());
    // Held until the upload is done: a whole-root output shares the input
    // root's unchanged directories.
    drop(inputs);
    let (st, mut res) = out?;
    res.execution_metadata = None;
    meta.auxiliary_metadata = proof_any(ctx, &record_digest, &record).await?;
    Ok((st, res))
}

/// The names of the top-level directories of the tree `root`.
fn top_level_dirs(store: &castore::LocalStore, root: &Digest) -> Result<Vec<String>, CasError> {
    use castore::store::DirectoryStore;
    Ok(store
        .get_directory(root)?
        .entries()
        .filter(|(_, n)| matches!(n, Node::Directory { .. }))
        .map(|(name, _)| String::from_utf8_lossy(name.as_bytes()).into_owned())
        .collect())
}

/// The input root `source` with each top-level directory in `replaced` as
/// the output it became: the whole root after the build.
fn whole_root_after(
    store: &castore::LocalStore,
    source: &Digest,
    replaced: &[(String, Digest)],
) -> Result<Digest, CasError> {
    use castore::store::DirectoryStore;
    let before = store.get_directory(source)?;
    let mut after = castore::Directory::new();
    for (name, node) in before.entries() {
        let node = match replaced
            .iter()
            .find(|(n, _)| n.as_bytes() == name.as_bytes())
        {
            Some((_, out)) => Node::Directory {
                digest: *out,
                size: store.get_directory(out)?.size(),
            },
            None => node.clone(),
        };
        after.insert(name.clone(), node)?;
    }
    Ok(store.put_directory(&after)?)
}

/// The record and its read set in the engine's CAS, named in
/// `auxiliary_metadata` (uploaded with the outputs).
async fn proof_any(
    ctx: &Ctx,
    record_digest: &Digest,
    record: &SignedRecord,
) -> Result<Vec<Any>, Refusal> {
    let rs = record.record.observed_read_set_digest;
    let shas = ctx
        .cas
        .sha_of_blobs(vec![*record_digest, rs])
        .await
        .map_err(refusal)?;
    let p = mapping::proof(
        &shas[record_digest],
        record_digest,
        &shas[&rs],
        &rs,
        &ctx.public_key,
    );
    Ok(p.iter().map(|f| pack(proto::TYPE_OUTPUT_FILE, f)).collect())
}

/// Upload the outputs, the log, the record and its read set; the result.
async fn result(
    ctx: &Ctx,
    bot: &str,
    lease: &str,
    plan: &Plan,
    source: &Digest,
    record_digest: &Digest,
    record: &SignedRecord,
) -> Result<(Status, re::ActionResult), Refusal> {
    let rec = &record.record;
    let (exit_code, _) = mapping::exit(&rec.exit);
    let mut uploads = vec![
        Upload::Stored(rec.log_digest),
        Upload::Stored(*record_digest),
        Upload::Stored(rec.observed_read_set_digest),
    ];
    uploads.extend(rec.stderr_digest.map(Upload::Stored));
    let mut res = re::ActionResult {
        exit_code,
        ..Default::default()
    };
    // Each requested path in the output holding it after the build (none
    // when the build failed or its outputs were refused).
    let located: Vec<Option<(Digest, String)>> = plan
        .outputs
        .iter()
        .map(|o| {
            let (name, rel) = plan.locate(&o.in_root)?;
            Some((*rec.outputs.get(&name)?, rel.to_owned()))
        })
        .collect();
    // The whole input root (asked for when the command may write all of
    // it): itself, with each top-level place as it was left.
    let replaced: Option<Vec<(String, Digest)>> = plan
        .top_level_places()
        .into_iter()
        .map(|(name, out)| Some((name, *rec.outputs.get(&out)?)))
        .collect();
    let whole = (plan.whole_root() && !rec.outputs.is_empty())
        .then_some(replaced)
        .flatten()
        .map(|r| (*source, r));
    if !rec.outputs.is_empty() {
        let store = ctx.cas.store().clone();
        let outputs = plan.outputs.clone();
        // Look every output up; load the directories below each.
        type Looked = Vec<(
            Option<Node>,
            Option<(
                std::collections::HashMap<Digest, castore::Directory>,
                Vec<Digest>,
            )>,
        )>;
        let looked: Looked = tokio::task::spawn_blocking(move || -> Result<Looked, CasError> {
            let whole = match whole {
                Some((source, replaced)) => Some(whole_root_after(&store, &source, &replaced)?),
                None => None,
            };
            let mut v = Vec::new();
            for (at, o) in located.iter().zip(&outputs) {
                let n = match (at, whole) {
                    (Some((tree, rel)), _) => cas::find(&store, tree, rel)?,
                    (None, Some(root)) if o.in_root.is_empty() => cas::find(&store, &root, "")?,
                    (None, _) => None,
                };
                let sub = match &n {
                    Some(Node::Directory { digest, .. }) => Some(cas::subtree(&store, digest)?),
                    _ => None,
                };
                v.push((n, sub));
            }
            Ok(v)
        })
        .await
        .map_err(|e| Refusal::new(Code::Internal, e.to_string()))?
        .map_err(refusal)?;
        let mut blobs: Vec<Digest> = Vec::new();
        for (n, sub) in &looked {
            if let Some(Node::File { digest, .. }) = n {
                blobs.push(*digest);
            }
            if let Some((_, b)) = sub {
                blobs.extend(b);
            }
        }
        let shas = ctx.cas.sha_of_blobs(blobs.clone()).await.map_err(refusal)?;
        let mut found = Vec::new();
        for (n, sub) in looked {
            found.push(match (n, sub) {
                (None, _) => Found::Missing,
                (
                    Some(Node::File {
                        digest, executable, ..
                    }),
                    _,
                ) => Found::File {
                    digest: shas[&digest].clone(),
                    executable,
                },
                (Some(Node::Symlink { target }), _) => Found::Symlink {
                    target: String::from_utf8_lossy(target.as_bytes()).into_owned(),
                },
                (Some(Node::Directory { digest, .. }), Some((dirs, _))) => {
                    let t = mapping::tree(&digest, &dirs, &shas)?;
                    let f = Found::Directory {
                        tree: t.digest.clone(),
                        root: t.root_directory.clone(),
                    };
                    uploads.push(Upload::Bytes(t.digest, t.bytes));
                    uploads.extend(t.directories.into_iter().map(|(d, b)| Upload::Bytes(d, b)));
                    f
                }
                (Some(Node::Directory { .. }), None) => Found::Missing,
            });
        }
        uploads.extend(blobs.into_iter().map(Upload::Stored));
        mapping::outputs(plan, &found, &mut res)?;
    }
    let up = ctx.cas.upload(uploads).await.map_err(refusal)?;
    eprintln!(
        "fhsx worker: {bot}: lease {lease}: uploaded {} objects, {} bytes",
        up.blobs, up.bytes
    );
    // The executor keeps the command's stdout and stderr apart for a
    // worker: the record's log is stdout, `stderr_digest` stderr (with
    // fhsx's own lines). A record made by `fhsx build` (one log, both
    // streams in order) answers with that log as stdout.
    let logs: Vec<Digest> = [Some(rec.log_digest), rec.stderr_digest]
        .into_iter()
        .flatten()
        .collect();
    let log = ctx.cas.sha_of_blobs(logs).await.map_err(refusal)?;
    res.stdout_digest = log.get(&rec.log_digest).cloned();
    res.stderr_digest = rec.stderr_digest.and_then(|d| log.get(&d).cloned());
    // A run fhsx refused (outputs, containment) still returns its result:
    // the exit code, the log and the proof are what tell the client why.
    let (code, message) = mapping::verdict(
        &rec.exit,
        rec.failure.as_deref(),
        &rec.violations,
        record_digest,
        plan.timeout,
    );
    Ok((status(code, message), res))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(cache: Vec<i32>, exec: Vec<i32>) -> re::ServerCapabilities {
        re::ServerCapabilities {
            cache_capabilities: Some(re::CacheCapabilities {
                digest_functions: cache,
                max_batch_total_size_bytes: 4 << 20,
                ..Default::default()
            }),
            execution_capabilities: Some(re::ExecutionCapabilities {
                digest_functions: exec,
                exec_enabled: true,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_blake3_only_engine_is_refused_with_what_it_offers() {
        let sha = re::digest_function::Value::Sha256 as i32;
        let b3 = re::digest_function::Value::Blake3 as i32;
        assert_eq!(
            check_capabilities(&caps(vec![sha, b3], vec![sha])),
            Ok(4 << 20)
        );
        let e = check_capabilities(&caps(vec![b3], vec![b3])).unwrap_err();
        assert!(e.contains("BLAKE3") && e.contains("SHA256 only"), "{e}");
        let e = check_capabilities(&caps(vec![sha], vec![b3])).unwrap_err();
        assert!(e.contains("executes with BLAKE3"), "{e}");
    }

    #[test]
    fn heartbeats_come_before_the_session_expires() {
        let mut s = BotSession::default();
        let t = now();
        s.expire_time = Some(Timestamp {
            seconds: t.seconds + 9,
            nanos: t.nanos,
        });
        let b = heartbeat(&s);
        assert!(
            b <= Duration::from_secs(3) && b >= Duration::from_secs(2),
            "{b:?}"
        );
        assert_eq!(
            heartbeat(&BotSession::default()),
            Duration::from_secs(10) / 3
        );
    }

    #[test]
    fn engine_urls() {
        assert_eq!(grpc_url("grpc://127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(grpc_url("http://h:1"), "http://h:1");
    }
}
