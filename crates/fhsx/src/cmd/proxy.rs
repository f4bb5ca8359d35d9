//! `fhsx proxy --lock FILE --mode record|replay [--listen ADDR | --unix PATH]
//! [--upstream-ca FILE]`: run the fetch proxy standalone until SIGINT or
//! SIGTERM. Events (refusals, recordings) go to stderr as JSON lines.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use castore_fuse::TerminationSignals;
use clap::{Args, ValueEnum};
use executor_core::ExitClass;
use fetch_proxy::{Listen, Mode, ProxyConfig, RunningProxy};
use serde_json::json;

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// Fetch upstream, store every body in the CAS, write the lock.
    Record,
    /// Serve only what the lock holds; refuse everything else.
    Replay,
}

#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// The lock file (`fetch.lock`): read in both modes, written in record mode.
    #[arg(long, value_name = "FILE")]
    pub lock: PathBuf,
    #[arg(long, value_enum)]
    pub mode: ModeArg,
    /// TCP address to listen on.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:3128",
        conflicts_with = "unix"
    )]
    pub listen: SocketAddr,
    /// Listen on a UNIX socket instead (it must not exist yet).
    #[arg(long, value_name = "PATH")]
    pub unix: Option<PathBuf>,
    /// Extra CA certificates (PEM) trusted for upstream TLS when recording.
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Vec<PathBuf>,
    /// Do not trust the host's CA certificates upstream (only --upstream-ca).
    #[arg(long)]
    pub no_system_roots: bool,
}

/// A fetch-proxy error with the exit class DESIGN.md gives it.
pub(super) fn proxy_error(e: fetch_proxy::Error) -> anyhow::Error {
    match e {
        fetch_proxy::Error::Store(inner) => anyhow::Error::from(inner),
        other => {
            let class = if other.is_integrity() {
                ExitClass::Integrity
            } else {
                match other {
                    fetch_proxy::Error::Io { .. }
                    | fetch_proxy::Error::Runtime(_)
                    | fetch_proxy::Error::Tls(_) => ExitClass::BuildFailed,
                    _ => ExitClass::Usage,
                }
            };
            anyhow::Error::new(Classified(class, other.to_string()))
        }
    }
}

pub fn run(g: &Globals, a: ProxyArgs) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    let mode = match a.mode {
        ModeArg::Record => Mode::Record,
        ModeArg::Replay => Mode::Replay,
    };
    // Blocked before any proxy thread exists, so only `wait` sees them.
    let signals = TerminationSignals::block().context("blocking SIGINT/SIGTERM")?;
    let mut cfg = ProxyConfig::new(mode, a.lock.clone(), store).map_err(proxy_error)?;
    cfg.system_roots = !a.no_system_roots;
    cfg.upstream_ca_files = a.upstream_ca.clone();
    let ca = cfg.ca.cert_path();
    let listen = match &a.unix {
        Some(p) => Listen::Unix(p.clone()),
        None => Listen::Tcp(a.listen),
    };
    let proxy = RunningProxy::start(cfg, listen).map_err(proxy_error)?;
    if g.json {
        println!(
            "{}",
            json!({"listen": proxy.addr().to_string(), "mode": mode.as_str(), "lock": a.lock, "ca": ca})
        );
    } else {
        println!("listening on {}", proxy.addr());
        println!(
            "mode {} lock {} ca {}",
            mode.as_str(),
            a.lock.display(),
            ca.display()
        );
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let sig = signals.wait().context("waiting for SIGINT/SIGTERM")?;
    eprintln!("fhsx: signal {sig}: stopping the proxy");
    let summary = proxy.shutdown().map_err(proxy_error)?;
    let s = summary.stats;
    if g.json {
        println!(
            "{}",
            json!({"served": s.served, "refused": s.refused, "recorded": s.recorded, "upstream_connects": s.upstream_connects})
        );
    } else {
        println!(
            "served {} refused {} recorded {} upstream connections {}",
            s.served, s.refused, s.recorded, s.upstream_connects
        );
    }
    Ok(0)
}
