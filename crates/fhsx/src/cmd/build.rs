//! `fhsx build ACTION.toml`: run one action hermetically and print its
//! signed record.

use std::io::IsTerminal;
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
}

pub fn run(g: &Globals, a: BuildArgs) -> anyhow::Result<i32> {
    let action = Action::load(&a.action)?;
    let lock_path = action.lock_path(&a.action);
    let store = open_store(g)?;
    let exec = FhsExecutor::open(store)?;
    let req = BuildRequest {
        action,
        lock_path,
        allow_record: a.record,
    };
    // The build's own output goes to stderr, so stdout stays the result.
    let mut sink: Box<dyn std::io::Write> = if g.json && !std::io::stderr().is_terminal() {
        Box::new(std::io::sink())
    } else {
        Box::new(std::io::stderr())
    };
    let out = exec.build(&req, &mut sink)?;
    let rec = &out.record.record;
    if g.json {
        println!(
            "{}",
            json!({
                "record": out.record_digest,
                "output": rec.output_digest,
                "read_set": rec.observed_read_set_digest,
                "log": rec.log_digest,
                "exit": rec.exit,
                "action": rec.action_digest,
            })
        );
    } else {
        println!("record  {}", out.record_digest);
        match rec.output_digest {
            Some(d) => println!("output  {d}"),
            None => println!("output  (none: the build failed)"),
        }
        println!("reads   {} ({} entries)", rec.observed_read_set_digest, rec.read_set_size);
        println!("log     {} (`fhsx store blob` prints it)", rec.log_digest);
    }
    if rec.exit.success() {
        Ok(0)
    } else {
        Err(Classified(
            ExitClass::BuildFailed,
            format!("the build failed ({:?}); its log is blob {}", rec.exit, rec.log_digest),
        )
        .into())
    }
}
