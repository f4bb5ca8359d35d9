//! `fhsx worker --listen ADDR | --unix PATH`: serve builds over Cap'n Proto.

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
    /// On SIGTERM, how long running builds may go on before they are cancelled ("90s", "5m").
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub shutdown_grace: String,
    /// Serve only clients presenting this access token (a file of at least
    /// 16 random bytes; clients pass the same file). Required to listen on
    /// anything but loopback or a UNIX socket.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
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
    let listen = match a.unix {
        Some(p) => Listen::Unix(p),
        None => Listen::Tcp(a.listen),
    };
    let token = a
        .token_file
        .as_deref()
        .map(::worker::read_token_file)
        .transpose()
        .map_err(|e| Classified(e.exit_class(), e.to_string()))?;
    let json = g.json;
    let config = WorkerConfig {
        store,
        jobs,
        shutdown_grace: grace,
        token,
    };
    ::worker::server::serve(config, listen, |addr| {
        if json {
            println!("{}", serde_json::json!({"listening": addr, "jobs": jobs}));
        } else {
            println!("fhsx worker: listening on {addr} ({jobs} jobs)");
        }
        let _ = std::io::stdout().flush();
    })
    .map_err(|e| Classified(e.exit_class(), e.to_string()))?;
    Ok(0)
}
