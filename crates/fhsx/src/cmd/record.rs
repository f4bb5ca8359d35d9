//! `fhsx record show|verify RECORD`.

use castore::Digest;
use clap::Subcommand;
use fhs_executor::{keys, sign};

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;
use executor_core::ExitClass;

#[derive(Subcommand, Debug)]
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
            let r = sign::load_record(&store, &record)?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                let rec = &r.record;
                println!("record      {record}");
                println!("signed by   {}", r.public_key);
                println!("action      {}", rec.action_digest);
                println!("view        {}", rec.view_digest);
                println!("exit        {:?}", rec.exit);
                match rec.output_digest {
                    Some(d) => println!("output      {d}"),
                    None => println!("output      (none)"),
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
                println!("log         {}", rec.log_digest);
                println!(
                    "resources   {} ms wall, {} ms user, {} ms sys",
                    rec.resources.wall_ms, rec.resources.user_ms, rec.resources.system_ms
                );
                println!("executor    {}", rec.executor);
            }
            Ok(0)
        }
        RecordCmd::Verify { record, trust } => {
            let r = sign::load_record(&store, &record)?;
            let trust = trust
                .iter()
                .map(|t| keys::parse_public_key(t))
                .collect::<Result<Vec<_>, _>>()?;
            let v = sign::verify(&store, &r, &trust)?;
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
