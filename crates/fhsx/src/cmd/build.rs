//! `fhsx build ACTION.toml`: run one action hermetically and print its
//! signed record.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use std::path::PathBuf;

use clap::Args;
use executor_core::{Action, BuildRequest, Executor, ExitClass};
use fhs_executor::FhsExecutor;
use serde_json::json;

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The action file.
    pub action: PathBuf,
    /// Allow `network.mode = "record"` (the one impure mode: fetches upstream and writes the lock).
    #[arg(long)]
    pub record: bool,
    /// Keep a failed build's scratch directory (its path is printed) for debugging.
    #[arg(long)]
    pub keep_failed: bool,
    /// Trust this CA (PEM) for upstream TLS while recording, besides the host's. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Vec<PathBuf>,
    /// Run on the worker at ADDR (`HOST:PORT` or `unix:PATH`, see `fhsx worker`):
    /// upload what it lacks, stream the log, download the record and output.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["record", "keep_failed", "upstream_ca"])]
    pub remote: Option<String>,
    /// With --remote: accept only a worker whose key (`ed25519:<hex>`) is listed. Repeatable.
    #[arg(long, value_name = "KEY", requires = "remote")]
    pub trust: Vec<String>,
    /// With --remote: the worker's access token (the file given to `fhsx worker --token-file`).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<PathBuf>,
}

pub fn run(g: &Globals, a: BuildArgs) -> anyhow::Result<i32> {
    if let Some(addr) = &a.remote {
        return run_remote(g, &a, addr);
    }
    let action = Action::load(&a.action)?;
    let lock_path = action.lock_path(&a.action);
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
    let req = BuildRequest {
        action,
        lock_path,
        allow_record: a.record,
        upstream_ca: a.upstream_ca,
    };
    // The build's own output goes to stderr, so stdout stays the result.
    let mut sink: Box<dyn std::io::Write + Send> = if g.json && !std::io::stderr().is_terminal() {
        Box::new(std::io::sink())
    } else {
        Box::new(std::io::stderr())
    };
    let out = exec.build(&req, &mut sink)?;
    report(g, &out.record_digest, &out.record.record, None)
}

/// `fhsx build --remote ADDR`: the same result, built by a worker.
fn run_remote(g: &Globals, a: &BuildArgs, addr: &str) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    let classify = |e: ::worker::Error| Classified(e.exit_class(), e.to_string());
    let token = match &a.token_file {
        Some(p) => ::worker::read_token_file(p).map_err(classify)?,
        None => Vec::new(),
    };
    let client =
        ::worker::client::Client::connect(&::worker::Endpoint::parse(addr), &token, &a.trust)
            .map_err(classify)?;
    let sink: Box<dyn std::io::Write> = if g.json && !std::io::stderr().is_terminal() {
        Box::new(std::io::sink())
    } else {
        Box::new(std::io::stderr())
    };
    let out = client
        .build(&store, &a.action, sink, &a.trust)
        .map_err(classify)?;
    let transfer = json!({
        "worker": client.endpoint(),
        "worker_key": out.worker_key,
        "uploaded": out.uploaded,
        "downloaded": out.downloaded,
    });
    report(g, &out.record_digest, &out.record.record, Some(transfer))
}

/// Print a finished build's result; the exit code follows its status.
fn report(
    g: &Globals,
    record_digest: &castore::Digest,
    rec: &executor_core::BuildRecord,
    remote: Option<serde_json::Value>,
) -> anyhow::Result<i32> {
    if g.json {
        let mut v = json!({
            "record": record_digest,
            "output": rec.output_digest,
            "read_set": rec.observed_read_set_digest,
            "log": rec.log_digest,
            "exit": rec.exit,
            "action": rec.action_digest,
        });
        if let (Some(r), Some(m)) = (remote, v.as_object_mut()) {
            m.insert("remote".into(), r);
        }
        println!("{v}");
    } else {
        println!("record  {record_digest}");
        match rec.output_digest {
            Some(d) => println!("output  {d}"),
            None => println!("output  (none: the build failed)"),
        }
        println!(
            "reads   {} ({} entries)",
            rec.observed_read_set_digest, rec.read_set_size
        );
        println!("log     {} (`fhsx store blob` prints it)", rec.log_digest);
        if let Some(r) = remote {
            println!(
                "remote  {} signed by {}; uploaded {} blobs ({} bytes), {} directories",
                r["worker"].as_str().unwrap_or_default(),
                r["worker_key"].as_str().unwrap_or_default(),
                r["uploaded"]["blobs"],
                r["uploaded"]["bytes"],
                r["uploaded"]["directories"]
            );
        }
    }
    if rec.exit.success() {
        Ok(0)
    } else {
        Err(Classified(
            ExitClass::BuildFailed,
            format!(
                "the build failed ({:?}); its log is blob {}",
                rec.exit, rec.log_digest
            ),
        )
        .into())
    }
}
