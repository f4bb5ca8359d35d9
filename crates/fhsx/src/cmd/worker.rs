//! `fhsx worker --listen ADDR | --unix PATH`: serve builds over Cap'n Proto;
//! `fhsx worker --reapi URL --toolchain FILE…`: take leases from an REAPI
//! engine's Bots service instead.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ::worker::server::{Listen, WorkerConfig};
use anyhow::Context;
use clap::Args;

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// TCP address to listen on (loopback unless you say otherwise; port 0 picks one).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7070",
        conflicts_with = "unix"
    )]
    pub listen: SocketAddr,
    /// Listen on a UNIX socket instead.
    #[arg(long, value_name = "PATH")]
    pub unix: Option<PathBuf>,
    /// Builds run at once; more are queued (default: the number of cores).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// CPU tokens the builds share: each running build holds one, and a
    /// `make` without `-j` in any of them takes more as they are free (one
    /// GNU make jobserver for every sandbox). Fewer than --jobs makes
    /// builds wait for a token, with their inputs already fetched.
    /// Default: the larger of --jobs and the CPUs the worker may use.
    #[arg(long, value_name = "N")]
    pub tokens: Option<usize>,
    /// On SIGTERM, how long running builds may go on before they are cancelled ("90s", "5m").
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub shutdown_grace: String,
    /// How long an upload or download of a blob may go without a chunk moving before the worker ends it and gives its turn to the next ("60s").
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub stall_timeout: String,
    /// Hash every store file a build opens at its first open in that build.
    /// By default a file an earlier build of this worker hashed, and that
    /// is unchanged since (same inode, size, mtime and ctime), is trusted:
    /// a toolchain's compiler is then hashed once, not once per action.
    #[arg(long)]
    pub hash_every_build: bool,
    /// Keep up to N emptied scratch file systems mounted between builds
    /// (as root; default: as many as --jobs; 0: none), so a build skips
    /// its loop device and ext4 mount and their teardown. A scratch is
    /// parked only after a build that succeeded and once it is exactly as
    /// new (empty, its root reset, free blocks and inodes as fresh); else
    /// it is removed. The worker's parked scratches go when it ends.
    #[arg(long, value_name = "N")]
    pub scratch_pool: Option<usize>,
    /// What backs each build's scratch: `disk` or `memory` (see `fhsx build --scratch`).
    #[arg(long, value_name = "MEDIUM", value_enum, default_value_t = super::build::ScratchArg::Disk)]
    pub scratch: super::build::ScratchArg,
    /// How builds open the view's files: `daemon` (default: passthrough,
    /// the store's page cache shared by every build — a worker's actions
    /// are mostly one compile each) or `kernel` (see `fhsx build --opens`).
    #[arg(long, value_name = "WHO", value_enum, default_value_t = super::build::OpensArg::Daemon)]
    pub opens: super::build::OpensArg,
    /// Serve only clients presenting this access token (a file of at least
    /// 16 random bytes; clients pass the same file). Required to listen on
    /// anything but loopback or a UNIX socket.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Attach to this REAPI engine's Bots service (`grpc://HOST:PORT`)
    /// instead of listening: take leases and run each action through the
    /// same executor as `fhsx build`.
    #[arg(long, value_name = "URL", conflicts_with_all = ["unix", "token_file"])]
    pub reapi: Option<String>,
    /// The engine's CAS, when it is not served at --reapi's address.
    #[arg(long, value_name = "URL", requires = "reapi")]
    pub cas: Option<String>,
    /// The REAPI instance name.
    #[arg(long, value_name = "NAME", default_value = "", requires = "reapi")]
    pub instance: String,
    /// A toolchain this worker runs actions on (a file from `fhsx toolchain
    /// apt … -o FILE`; its atoms must be in the store). Actions select it
    /// with the platform property `fhsx-toolchain=ID` (`fhsx toolchain id
    /// FILE`). Repeatable. An action naming none runs with its input root
    /// as `/` (the input root holds its tools, as BuildStream's does).
    #[arg(long, value_name = "FILE", requires = "reapi")]
    pub toolchain: Vec<PathBuf>,
    /// The toolchain an action whose input root is its `/` sits over when
    /// it names none (the input root's entries take precedence); registered
    /// as a --toolchain is. Unset, such an action has its input root only.
    #[arg(long, value_name = "FILE", requires = "reapi")]
    pub input_root_over: Option<PathBuf>,
    /// Another property of this worker for the engine to match actions on
    /// (`KEY=VALUE`). Repeatable. The worker also advertises
    /// `OSFamily=linux` and the ISA it runs on (`ISA=x86-64`); a
    /// `--property` for either key replaces that default.
    #[arg(long, value_name = "KEY=VALUE", requires = "reapi")]
    pub property: Vec<String>,
    /// This worker's id at the engine (session N is ID-N); default: the host name.
    #[arg(long, value_name = "ID", requires = "reapi")]
    pub bot_id: Option<String>,
    /// The timeout of an action that sets none.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "1h",
        requires = "reapi"
    )]
    pub default_timeout: String,
    /// Actions asking for a longer timeout are refused.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "24h",
        requires = "reapi"
    )]
    pub max_timeout: String,
}

fn duration(flag: &str, s: &str) -> anyhow::Result<Duration> {
    executor_core::action::parse_duration(s)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Classified(
                executor_core::ExitClass::Usage,
                format!("{flag} {s:?}: use 90s, 5m or 1h"),
            )
            .into()
        })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "fhsx".into())
}

fn run_reapi(
    g: &Globals,
    a: WorkerArgs,
    store: castore::LocalStore,
    jobs: usize,
    grace: Duration,
    engine: String,
) -> anyhow::Result<i32> {
    use castore::store::DirectoryStore;
    let usage = |m: String| Classified(executor_core::ExitClass::Usage, m);
    let builds = build_options(&a, jobs);
    let mut toolchains = std::collections::BTreeMap::new();
    let mut named = Vec::new();
    let mut input_root_over = None;
    let over = a.input_root_over.iter().map(|f| (f, true));
    for (f, over) in a.toolchain.iter().map(|f| (f, false)).chain(over) {
        let t = debian::Toolchain::read(f).map_err(|e| usage(castore::Chain(&e).to_string()))?;
        let atoms = t.atoms();
        for d in &atoms {
            if !store.has_directory(d)? {
                return Err(usage(format!(
                    "toolchain {}: atom {d} is not in this worker's store: run `fhsx toolchain apt` here (it imports the packages) or import them",
                    f.display()
                ))
                .into());
            }
        }
        let id = super::toolchain::toolchain_id(&atoms);
        if over {
            input_root_over = Some(id);
        }
        if toolchains.insert(id, atoms).is_none() {
            named.push((f.display().to_string(), id));
        }
    }
    let mut extra = Vec::new();
    for p in &a.property {
        match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => extra.push((k.to_owned(), v.to_owned())),
            _ => return Err(usage(format!("--property {p:?}: write KEY=VALUE")).into()),
        }
    }
    let properties =
        ::worker::reapi::platform::advertised(&toolchains, &extra, std::env::consts::ARCH);
    let policy = ::worker::reapi::mapping::Policy {
        default_timeout: duration("--default-timeout", &a.default_timeout)?,
        max_timeout: duration("--max-timeout", &a.max_timeout)?,
        toolchains,
        input_root_over,
        limits: executor_core::action::Limits::default(),
    };
    let config = ::worker::reapi::BotConfig {
        store,
        engine,
        cas: a.cas,
        instance: a.instance,
        jobs,
        bot_id: a.bot_id.unwrap_or_else(host_name),
        properties: properties.clone(),
        policy,
        shutdown_grace: grace,
        builds,
    };
    let json = g.json;
    ::worker::reapi::run(config, |url| {
        // What the engine matches actions on: an action asking for a key or
        // value missing here is never handed to this worker.
        for (k, v) in &properties {
            eprintln!("fhsx: worker: property {k}={v}");
        }
        if json {
            let t: Vec<_> = named
                .iter()
                .map(|(f, id)| serde_json::json!({"file": f, "property": format!("fhsx-toolchain={id}")}))
                .collect();
            println!("{}", serde_json::json!({"engine": url, "jobs": jobs, "toolchains": t}));
        } else {
            println!("fhsx worker: attached to {url} ({jobs} jobs)");
            for (f, id) in &named {
                println!("fhsx worker: toolchain {f}: fhsx-toolchain={id}");
            }
        }
        let _ = std::io::stdout().flush();
    })
    .map_err(|e| Classified(e.exit_class(), castore::Chain(&e).to_string()))?;
    Ok(0)
}

fn build_options(a: &WorkerArgs, jobs: usize) -> ::worker::runner::BuildOptions {
    ::worker::runner::BuildOptions {
        hash_every_build: a.hash_every_build,
        scratch_pool: a.scratch_pool.unwrap_or(jobs),
        scratch: a.scratch.into(),
        zero_message_open: a.opens == super::build::OpensArg::Kernel,
        tokens: a.tokens.unwrap_or(0),
    }
}

pub fn run(g: &Globals, a: WorkerArgs) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if jobs == 0 {
        anyhow::bail!(Classified(
            executor_core::ExitClass::Usage,
            "--jobs must be at least 1".into()
        ));
    }
    let grace: Duration = executor_core::action::parse_duration(&a.shutdown_grace)
        .with_context(|| format!("--shutdown-grace {:?}: use 90s, 5m or 1h", a.shutdown_grace))?;
    if let Some(engine) = a.reapi.clone() {
        return run_reapi(g, a, store, jobs, grace, engine);
    }
    let builds = build_options(&a, jobs);
    let listen = match a.unix {
        Some(p) => Listen::Unix(p),
        None => Listen::Tcp(a.listen),
    };
    let token = a
        .token_file
        .as_deref()
        .map(::worker::read_token_file)
        .transpose()
        .map_err(|e| Classified(e.exit_class(), castore::Chain(&e).to_string()))?;
    let stall_timeout: Duration = executor_core::action::parse_duration(&a.stall_timeout)
        .with_context(|| format!("--stall-timeout {:?}: use 30s, 5m or 1h", a.stall_timeout))?;
    if stall_timeout.is_zero() {
        return Err(Classified(
            executor_core::ExitClass::Usage,
            "--stall-timeout 0 would end every transfer before its first chunk: give it a duration such as 30s or 5m".into(),
        )
        .into());
    }
    let json = g.json;
    let config = WorkerConfig {
        store,
        jobs,
        shutdown_grace: grace,
        token,
        builds,
        stall_timeout,
    };
    ::worker::server::serve(config, listen, |addr| {
        if json {
            println!("{}", serde_json::json!({"listening": addr, "jobs": jobs}));
        } else {
            println!("fhsx worker: listening on {addr} ({jobs} jobs)");
        }
        let _ = std::io::stdout().flush();
    })
    .map_err(|e| Classified(e.exit_class(), castore::Chain(&e).to_string()))?;
    Ok(0)
}
