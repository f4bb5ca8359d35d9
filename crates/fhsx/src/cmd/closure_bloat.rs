//! `fhsx closure-bloat RECORD|READSET`: the atoms (and their largest paths)
//! a view declared but a build never read. The argument is a BuildRecord's
//! digest, a read set's digest, or a read-set file.

use std::path::Path;

use anyhow::Context;
use castore::Digest;
use castore_fuse::ReadSet;
use clap::Args;

use super::mount::fuse_error;
use super::store::open_store;
use super::Globals;

#[derive(Args, Debug)]
pub struct ClosureBloatArgs {
    /// A BuildRecord digest, a read-set digest, or a read-set file (as `fhsx mount --read-set` writes).
    pub read_set: String,
    /// How many of each atom's largest unread paths to list.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
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
        "view {}: {} read-set entries, {} atoms, {} never read",
        report.root,
        report.read_set_entries,
        report.atoms.len(),
        unused
    );
    let mut atoms: Vec<_> = report.atoms.iter().collect();
    // Never-read atoms first, then by unread bytes.
    atoms.sort_by(|x, y| {
        y.unused()
            .cmp(&x.unused())
            .then(y.unread_bytes.cmp(&x.unread_bytes))
    });
    for u in atoms {
        println!(
            "{}atom {} {}: declared {} files ({}), read {} ({}), unread {} ({})",
            if u.unused() { "NEVER READ " } else { "" },
            u.index,
            u.atom,
            u.declared_files,
            human(u.declared_bytes),
            u.read_files,
            human(u.read_bytes),
            u.unread_files,
            human(u.unread_bytes)
        );
        for (p, s) in &u.largest_unread {
            println!("    unread {p} ({})", human(*s));
        }
    }
    Ok(0)
}
