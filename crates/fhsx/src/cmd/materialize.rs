//! `fhsx materialize`: realise a view outside the store at the Fast tier (a
//! read-only hard-link farm, for running) or the Export tier (a tarball or
//! an OCI image layout, for shipping); `--check DEST` re-verifies a Fast
//! tree. The work is castore's (`castore::tier`); this is only the CLI.

use std::path::PathBuf;

use castore::tier::{self, export, fast};
use castore::Digest;
use clap::{Args, ValueEnum};
use executor_core::ExitClass;

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;
use crate::progress::Bar;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Tier {
    /// A read-only tree of hard links (reflinks, copies) to the store's blobs.
    Fast,
    /// A deterministic tarball, or with --format oci an OCI image layout.
    Export,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// DEST.tar or DEST.tar.zst.
    Tar,
    /// An OCI image layout directory (one layer).
    Oci,
}

#[derive(Args, Debug)]
pub struct MaterializeArgs {
    /// Which tier to realise.
    #[arg(long, value_enum, default_value = "fast")]
    pub tier: Tier,
    /// Export format (export tier only).
    #[arg(long, value_enum, default_value = "tar")]
    pub format: Format,
    /// The tag index.json gives the image (--format oci).
    #[arg(long, default_value = export::DEFAULT_TAG)]
    pub tag: String,
    /// Hash every blob before linking it (fast tier; copies are always verified).
    #[arg(long)]
    pub verify: bool,
    /// Instead of materializing, re-hash the Fast-tier tree at DEST against
    /// the view its marker names; exit 3 on any difference.
    #[arg(long, value_name = "DEST", conflicts_with_all = ["view", "dest"])]
    pub check: Option<PathBuf>,
    /// The view: a tree's root digest (usually what `fhsx compose` printed).
    #[arg(required_unless_present = "check")]
    pub view: Option<Digest>,
    /// Where: a directory (fast, oci) or a *.tar / *.tar.zst file.
    #[arg(required_unless_present = "check")]
    pub dest: Option<PathBuf>,
    /// With --cache, a view the store lacks (an output a remote cache
    /// holds) is fetched first.
    #[command(flatten)]
    pub cache: super::cache::CacheArgs,
}

/// A tier error as the CLI reports it: store errors keep castore's class.
fn tier_error(e: tier::Error) -> anyhow::Error {
    match e {
        tier::Error::Store(inner) => anyhow::Error::from(inner),
        other => {
            let class = if other.is_input() {
                ExitClass::Usage
            } else {
                ExitClass::BuildFailed
            };
            anyhow::Error::new(Classified(class, other.to_string()))
        }
    }
}

pub fn run(g: &Globals, a: MaterializeArgs) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    if let Some(dest) = &a.check {
        let bar = Bar::new("checking");
        let r = fast::check(&store, dest);
        bar.finish();
        let r = r.map_err(tier_error)?;
        if g.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            for p in &r.problems {
                let at = if p.path.is_empty() { "." } else { &p.path };
                println!("{at}: {}", p.problem);
            }
            eprintln!(
                "fhsx: {} ({}): {} files, {} bytes hashed: {}",
                dest.display(),
                r.root,
                r.files_hashed,
                r.bytes_hashed,
                if r.is_clean() {
                    "intact".to_owned()
                } else {
                    format!("{} problems (tampered or damaged)", r.problems.len())
                }
            );
        }
        return Ok(if r.is_clean() {
            0
        } else {
            ExitClass::Integrity.code()
        });
    }
    let (Some(view), Some(dest)) = (a.view, a.dest) else {
        return Err(Classified(
            ExitClass::Usage,
            "give VIEW and DEST (or --check DEST)".into(),
        )
        .into());
    };
    super::cache::fetch_if_absent(&a.cache, &store, &view)?;
    match (a.tier, a.format) {
        (Tier::Fast, Format::Oci) => {
            return Err(
                Classified(ExitClass::Usage, "--format oci needs --tier export".into()).into(),
            )
        }
        (Tier::Fast, Format::Tar) => {
            let bar = Bar::new("materializing");
            let r = fast::materialize(
                &store,
                &view,
                &dest,
                &fast::FastOptions { verify: a.verify },
                &bar,
            );
            bar.finish();
            let r = r.map_err(tier_error)?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else if r.unchanged {
                eprintln!(
                    "fhsx: {} already holds {view}: nothing to do",
                    dest.display()
                );
            } else {
                eprintln!(
                    "fhsx: {} files ({} bytes) at {}: {} hard-linked, {} reflinked, {} copied{}",
                    r.files,
                    r.bytes,
                    dest.display(),
                    r.linked,
                    r.reflinked,
                    r.copied,
                    if r.replaced {
                        "; replaced the previous tree"
                    } else {
                        ""
                    }
                );
            }
        }
        (Tier::Export, Format::Tar) => {
            let mtime = export::source_date_epoch().map_err(tier_error)?;
            let bar = Bar::new("exporting");
            let r = export::export_tarball(&store, &view, &dest, mtime, &bar);
            bar.finish();
            let r = r.map_err(tier_error)?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("sha256:{}\t{}", r.sha256, dest.display());
            }
        }
        (Tier::Export, Format::Oci) => {
            let mtime = export::source_date_epoch().map_err(tier_error)?;
            let bar = Bar::new("exporting");
            let r = export::export_oci(&store, &view, &dest, &a.tag, mtime, &bar);
            bar.finish();
            let r = r.map_err(tier_error)?;
            if g.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("{}\t{}:{}", r.manifest, dest.display(), r.tag);
            }
        }
    }
    Ok(0)
}
