//! `fhsx lock verify FILE` (every entry's blob present and matching) and
//! `fhsx lock diff A B` (entries added, removed, changed).

use std::path::PathBuf;

use clap::Subcommand;
use executor_core::ExitClass;
use fetch_proxy::Lock;
use serde_json::json;

use super::proxy::proxy_error;
use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum LockCmd {
    /// Check that every entry's blob is in the store and matches its size, BLAKE3 and SHA-256.
    Verify { file: PathBuf },
    /// Show entries added, removed and changed from A to B.
    Diff { a: PathBuf, b: PathBuf },
}

pub fn run(g: &Globals, cmd: LockCmd) -> anyhow::Result<i32> {
    match cmd {
        LockCmd::Verify { file } => {
            let lock = Lock::load(&file).map_err(proxy_error)?;
            let store = open_store(g)?;
            let problems = lock.verify(&store);
            if g.json {
                let ps: Vec<_> = problems
                    .iter()
                    .map(|p| json!({"entry": p.key.to_string(), "problem": p.problem}))
                    .collect();
                println!("{}", json!({"entries": lock.len(), "problems": ps}));
            } else {
                for p in &problems {
                    println!("BAD {p}");
                }
                if problems.is_empty() {
                    println!("ok: {} entries verified", lock.len());
                }
            }
            if problems.is_empty() {
                Ok(0)
            } else {
                Err(anyhow::Error::new(Classified(
                    ExitClass::Integrity,
                    format!(
                        "{} of {} lock entries failed verification; re-record them or import their blobs",
                        problems.len(),
                        lock.len()
                    ),
                )))
            }
        }
        LockCmd::Diff { a, b } => {
            let la = Lock::load(&a).map_err(proxy_error)?;
            let lb = Lock::load(&b).map_err(proxy_error)?;
            let d = la.diff(&lb);
            if g.json {
                let e = |x: &fetch_proxy::Entry| json!({"method": x.method, "url": x.url, "status": x.status, "size": x.size, "blake3": x.blake3});
                println!(
                    "{}",
                    json!({
                        "added": d.added.iter().map(e).collect::<Vec<_>>(),
                        "removed": d.removed.iter().map(e).collect::<Vec<_>>(),
                        "changed": d.changed.iter().map(|(k, f)| json!({"entry": k.to_string(), "fields": f})).collect::<Vec<_>>(),
                    })
                );
            } else if d.is_empty() {
                println!("no differences");
            } else {
                print!("{d}");
            }
            Ok(0)
        }
    }
}
