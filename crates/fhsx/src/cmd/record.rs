//! `fhsx record show|verify RECORD`.

use castore::Digest;
use clap::Subcommand;
use fhs_executor::{keys, sign};

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;
use executor_core::ExitClass;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum RecordCmd {
    /// Print a BuildRecord.
    Show { record: Digest },
    /// Check a record's signature and that every digest it names is present and intact.
    Verify {
        record: Digest,
        /// Accept only these signers (`ed25519:<hex>`, as `fhsx key show` prints). Repeatable.
        #[arg(long)]
        trust: Vec<String>,
    },
}

pub fn run(g: &Globals, cmd: RecordCmd) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    match cmd {
        RecordCmd::Show { record } => {
            let r = match sign::load_any(&store, &record)? {
                sign::StoredRecord::Current(r) => *r,
                sign::StoredRecord::Older {
                    format,
                    record: raw,
                    public_key,
                    signature,
                } => {
                    let v = serde_json::json!({"record": raw, "public_key": public_key, "signature": signature});
                    if !g.json {
                        println!("(a format-{format} record, shown as stored; `fhsx record verify` checks it)");
                    }
                    println!("{}", serde_json::to_string_pretty(&v)?);
                    return Ok(0);
                }
            };
            if g.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                let rec = &r.record;
                println!("record      {record}");
                println!("signed by   {}", r.public_key);
                println!("action      {}", rec.action_digest);
                println!("view        {}", rec.view_digest);
                println!("exit        {}", rec.exit);
                if let Some(f) = &rec.failure {
                    println!("failure     {f}");
                }
                if rec.outputs.is_empty() {
                    println!("output      (none)");
                }
                for (name, d) in &rec.outputs {
                    println!("output      {name} {d}");
                }
                if let Some(d) = rec.interface_manifest_digest {
                    println!("manifest    {d}");
                }
                println!(
                    "read set    {} ({} entries)",
                    rec.observed_read_set_digest, rec.read_set_size
                );
                if let Some(d) = rec.fetch_lock_digest {
                    println!("fetch lock  {d}");
                }
                if let Some(d) = rec.check_of {
                    println!("check of    {d}");
                }
                if let Some(d) = rec.reused {
                    println!(
                        "reused      {d} (nothing ran: that record's read set holds in this view)"
                    );
                }
                if let Some(d) = rec.pruned_from {
                    println!("pruned from {d}");
                }
                if !rec.read_set_complete {
                    println!("read set    INCOMPLETE ([limits] reads was hit)");
                }
                println!("log         {}", rec.log_digest);
                if let Some(d) = rec.stderr_digest {
                    println!("stderr      {d} (the log is stdout alone)");
                }
                println!(
                    "resources   {} ms wall, {} ms user, {} ms sys",
                    rec.resources.wall_ms, rec.resources.user_ms, rec.resources.system_ms
                );
                println!("executor    {}", rec.executor);
            }
            Ok(0)
        }
        RecordCmd::Verify { record, trust } => {
            let r = sign::load_any(&store, &record)?;
            let trust = trust
                .iter()
                .map(|t| keys::parse_public_key(t))
                .collect::<Result<Vec<_>, _>>()?;
            let v = sign::verify_any(&store, &r, &trust, sign::Depth::Rehash)?;
            if let sign::StoredRecord::Older { format, .. } = &r {
                if !g.json {
                    println!("note: a format-{format} record: checked as such (its signature and the digests it names); it is never a cache hit — rebuild the action for a current record");
                }
            }
            if g.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for p in &v.problems {
                    println!("problem: {p}");
                }
                if !v.trusted {
                    println!("problem: signer {} is not in the --trust list", v.signer);
                }
            }
            if v.ok() {
                if !g.json {
                    println!("ok: {record} signed by {}", v.signer);
                }
                Ok(0)
            } else {
                Err(Classified(
                    ExitClass::Integrity,
                    format!("record {record} failed verification"),
                )
                .into())
            }
        }
    }
}
