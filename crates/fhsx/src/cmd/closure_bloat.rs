//! `fhsx closure-bloat RECORD|READSET`: the atoms (and their largest paths)
//! a view declared but a build never read. The argument is a BuildRecord's
//! digest, a read set's digest, or a read-set file. With a record,
//! `--prune` writes the action pruned to what the build read, and `--prove`
//! builds it and requires bit-identical outputs.

use std::path::Path;

use anyhow::Context;
use castore::Digest;
use castore_fuse::ReadSet;
use clap::Args;

use super::mount::fuse_error;
use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

#[derive(Args, Debug)]
pub struct ClosureBloatArgs {
    /// A BuildRecord digest, a read-set digest, or a read-set file (as `fhsx mount --read-set` writes).
    pub read_set: String,
    /// How many of each atom's largest unread paths to list.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Write the record's action pruned to its read set: `atoms` (the
    /// default) keeps only the atoms it touched, `paths` one synthetic atom
    /// of exactly what it read.
    #[arg(long, value_name = "HOW", num_args = 0..=1, default_missing_value = "atoms", value_parser = ["atoms", "paths"])]
    pub prune: Option<String>,
    /// With --prune: write the pruned action here (default: stdout).
    #[arg(long, short = 'o', value_name = "FILE", requires = "prune")]
    pub output: Option<std::path::PathBuf>,
    /// With --prune: build the pruned action and require bit-identical
    /// outputs (exit 4 and the differing paths if not).
    #[arg(long, requires = "prune")]
    pub prove: bool,
}

fn human(bytes: u64) -> String {
    let mut v = bytes as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if v < 1024.0 || unit == "GiB" {
            return if unit == "B" {
                format!("{bytes} B")
            } else {
                format!("{v:.1} {unit}")
            };
        }
        v /= 1024.0;
    }
    format!("{bytes} B")
}

pub fn run(g: &Globals, a: ClosureBloatArgs) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    if let Some(how) = &a.prune {
        return prune(g, &store, &a, how);
    }
    let rs = if let Ok(d) = a.read_set.parse::<Digest>() {
        // A record names its read set; anything else must be one.
        match fhs_executor::sign::load_record(&store, &d) {
            Ok(rec) => {
                ReadSet::load(&store, &rec.record.observed_read_set_digest).map_err(fuse_error)?
            }
            Err(_) => ReadSet::load(&store, &d).map_err(fuse_error)?,
        }
    } else {
        let p = Path::new(&a.read_set);
        let bytes =
            std::fs::read(p).with_context(|| format!("reading the read set {}", p.display()))?;
        ReadSet::decode(&bytes).map_err(fuse_error)?
    };
    let report = castore_fuse::closure_bloat(&store, &rs, a.top).map_err(fuse_error)?;
    if g.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let unused = report.unused_atoms().count();
    println!(
        "view {}: {} read-set entries, {} atoms, {} never read (they could go: `--prune`)",
        report.root,
        report.read_set_entries,
        report.atoms.len(),
        unused
    );
    let mut atoms: Vec<_> = report.atoms.iter().collect();
    // Most bytes never read first.
    atoms.sort_by(|x, y| {
        y.unread_bytes
            .cmp(&x.unread_bytes)
            .then(x.index.cmp(&y.index))
    });
    for u in atoms {
        let name = debian::atom_name(&store, &u.atom).unwrap_or_else(|| u.atom.to_string());
        println!(
            "{} {:<40} read {}/{} files, {}/{}; never read {}",
            if u.unused() { "could go" } else { "        " },
            name,
            u.read_files,
            u.declared_files,
            human(u.read_bytes),
            human(u.declared_bytes),
            human(u.unread_bytes)
        );
        for (p, s) in &u.largest_unread {
            println!("           unread {p} ({})", human(*s));
        }
    }
    Ok(0)
}

/// `--prune`: write the pruned action; with `--prove`, build it and
/// compare its outputs with the record's.
fn prune(
    g: &Globals,
    store: &castore::LocalStore,
    a: &ClosureBloatArgs,
    how: &str,
) -> anyhow::Result<i32> {
    use executor_core::{BuildRequest, CachePolicy, Executor, ExitClass};
    let from: Digest = a.read_set.parse().map_err(|_| {
        Classified(
            ExitClass::Usage,
            format!("--prune needs a record's digest, not {:?}", a.read_set),
        )
    })?;
    let mode = if how == "paths" {
        fhs_executor::prune::PruneMode::Paths
    } else {
        fhs_executor::prune::PruneMode::Atoms
    };
    let mut pruned = fhs_executor::prune::prune(store, &from, mode)?;
    let lock_path = match (&pruned.lock, &a.output) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(Classified(
                ExitClass::Usage,
                "the action has network: give --output FILE, so its fetch lock can be written beside it".into(),
            )
            .into())
        }
        (Some(bytes), Some(out)) => {
            let lock = out.with_extension("lock");
            std::fs::write(&lock, bytes).with_context(|| format!("writing {}", lock.display()))?;
            pruned.action.network.lock = lock.file_name().map(std::path::PathBuf::from);
            Some(lock)
        }
    };
    let text = format!(
        "# Pruned by `fhsx closure-bloat --prune={how}` from record {from}:\n# {} of {} atoms kept.\n{}",
        pruned.atoms_after,
        pruned.atoms_before,
        pruned.action.to_toml()
    );
    match &a.output {
        Some(out) => {
            std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?
        }
        None if !a.prove => print!("{text}"),
        None => {}
    }
    eprintln!(
        "fhsx: pruned {from}: {} of {} atoms kept",
        pruned.atoms_after, pruned.atoms_before
    );
    if !a.prove {
        return Ok(0);
    }
    let mut exec = fhs_executor::FhsExecutor::open(store.clone())?;
    // The proof runs as `fhsx build` runs the build it proves: with the
    // jobserver (`MAKEFLAGS`, its FIFO and descriptors), one token a CPU.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    exec.jobserver = Some(fhs_executor::jobserver::TokenPool::new(cpus)?);
    let mut req = BuildRequest::new(pruned.action.clone(), lock_path);
    req.cache = CachePolicy::Rebuild;
    req.pruned_from = Some(from);
    let out = exec.build(&req, &mut std::io::stderr())?;
    if !out.record.record.succeeded() {
        return Err(Classified(
            ExitClass::CheckMismatch,
            format!(
                "the pruned action failed ({}): the build needed something its read set does not name — a finding to investigate; its log is blob {}",
                super::build::how_it_failed(&out.record.record),
                out.record.record.log_digest
            ),
        )
        .into());
    }
    let original = fhs_executor::cache::Found {
        digest: from,
        record: fhs_executor::sign::load_record(store, &from)?,
    };
    let report = fhs_executor::check::compare(store, &original, &out.record.record.outputs)?;
    if g.json {
        println!(
            "{}",
            serde_json::json!({"record": out.record_digest, "pruned_from": from, "atoms_before": pruned.atoms_before, "atoms_after": pruned.atoms_after, "check": report})
        );
    } else {
        println!("record  {} (pruned from {from})", out.record_digest);
    }
    if report.differences.is_empty() {
        eprintln!("fhsx: proved: the pruned action's outputs are bit-identical to {from}'s");
        Ok(0)
    } else {
        for d in &report.differences {
            eprintln!("fhsx: differs: ${}/{}", d.output, d.difference.path);
        }
        Err(Classified(
            ExitClass::CheckMismatch,
            format!(
                "the pruned action's outputs differ from {from}'s in {} path(s): the build read something its read set does not show — investigate (docs/DESIGN.md, closure bloat)",
                report.differences.len()
            ),
        )
        .into())
    }
}
