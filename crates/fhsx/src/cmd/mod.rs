//! Subcommands, one module each. `dispatch` returns the process exit code.

pub(crate) mod build;
mod cache;
mod closure_bloat;
mod compose;
mod doctor;
mod key;
mod lock;
mod materialize;
mod mount;
mod proxy;
mod record;
mod run;
mod store;
mod toolchain;
mod worker;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "fhsx",
    version,
    about = "A hermetic FHS build sandbox over a content-addressed store"
)]
pub struct Cli {
    /// The store directory (default: $FHSX_STORE, else $XDG_DATA_HOME/fhsx, else ~/.local/share/fhsx).
    #[arg(long, global = true, env = "FHSX_STORE")]
    pub store: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Each subcommand's arguments are built only when it is the one run
/// (`defer`, here and on every nested subcommand enum): building them all
/// took 0.25 ms of every `fhsx` start, 0.15 ms now — `fhsx run` spends
/// about 3.5 ms more than a bare bwrap in all.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum Command {
    /// Put trees into the store, look at them, check them, take them out.
    #[command(subcommand)]
    Store(store::StoreCmd),
    /// Merge ordered atoms into one FHS tree.
    Compose(compose::ComposeArgs),
    /// Run one build action hermetically; print its signed record.
    Build(build::BuildArgs),
    /// The executor's signing key.
    #[command(subcommand)]
    Key(key::KeyCmd),
    /// Inspect and check signed BuildRecords.
    #[command(subcommand)]
    Record(record::RecordCmd),
    /// Run a command contained: host toolchain read-only, workspace writable, no network.
    Run(run::RunArgs),
    /// Serve a view read-only (Observe tier) until SIGINT/SIGTERM; write its read set.
    Mount(mount::MountArgs),
    /// Atoms (and their largest paths) a read set never touched: declared − read.
    ClosureBloat(closure_bloat::ClosureBloatArgs),
    /// Run the record/replay fetch proxy until SIGINT/SIGTERM.
    Proxy(proxy::ProxyArgs),
    /// Check a fetch lock against the store, or compare two.
    #[command(subcommand)]
    Lock(lock::LockCmd),
    /// Serve builds to remote clients over Cap'n Proto (`fhsx build --remote`).
    Worker(worker::WorkerArgs),
    /// Make toolchain files: Debian packages pinned as atoms.
    #[command(subcommand)]
    Toolchain(toolchain::ToolchainCmd),
    /// Realise a view outside the store: Fast tier (read-only link farm) or Export (tarball, OCI layout).
    Materialize(materialize::MaterializeArgs),
    /// Try each mechanism fhsx relies on and say which guarantees hold here, with the fix for each that does not.
    Doctor(doctor::DoctorArgs),
}

impl Command {
    /// Whether this command opens no socket: no worker or client, no
    /// fetch proxy or download, no sandbox with its RPC bridge, no FUSE
    /// session. Only these may die of SIGPIPE (see `main`).
    pub fn holds_no_socket(&self) -> bool {
        match self {
            Command::Store(_)
            | Command::Compose(_)
            | Command::Key(_)
            | Command::Record(_)
            | Command::ClosureBloat(_)
            | Command::Lock(_)
            | Command::Materialize(_) => true,
            Command::Build(_)
            | Command::Run(_)
            | Command::Mount(_)
            | Command::Proxy(_)
            | Command::Worker(_)
            | Command::Toolchain(_)
            | Command::Doctor(_) => false,
        }
    }

    /// Whether this command moves objects over the wire in a stream of
    /// batches: the worker, and a build sent to one.
    pub fn streams_objects(&self) -> bool {
        match self {
            Command::Worker(_) => true,
            Command::Build(a) => a.remote.is_some(),
            _ => false,
        }
    }
}

/// Global options every subcommand sees.
pub struct Globals {
    pub store: Option<PathBuf>,
    pub json: bool,
}

pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let g = Globals {
        store: cli.store,
        json: cli.json,
    };
    match cli.command {
        Command::Store(c) => store::run(&g, c),
        Command::Compose(a) => compose::run(&g, a),
        Command::Build(a) => build::run(&g, a),
        Command::Key(c) => key::run(&g, c),
        Command::Record(c) => record::run(&g, c),
        Command::Run(a) => run::run(&g, a),
        Command::Mount(a) => mount::run(&g, a),
        Command::ClosureBloat(a) => closure_bloat::run(&g, a),
        Command::Proxy(a) => proxy::run(&g, a),
        Command::Lock(c) => lock::run(&g, c),
        Command::Worker(a) => worker::run(&g, a),
        Command::Materialize(a) => materialize::run(&g, a),
        Command::Doctor(a) => doctor::run(&g, a),
        Command::Toolchain(c) => toolchain::run(&g, c),
    }
}
