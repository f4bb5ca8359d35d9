//! `fhsx toolchain apt PKG…`: a toolchain file from Debian packages.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use executor_core::ExitClass;
use serde_json::json;

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ToolchainCmd {
    /// Resolve PKG… and their dependencies with the host's apt, import each
    /// `.deb` as an atom (once), and write a toolchain file actions can name
    /// (`toolchain = ["FILE"]`).
    Apt(AptArgs),
    /// Print the toolchain's id: the value of the `fhsx-toolchain` platform
    /// property that selects it on an REAPI worker (`fhsx worker --reapi
    /// … --toolchain FILE`), and the `toolchain_digest` its records carry.
    Id {
        /// A toolchain file (`fhsx toolchain apt … -o FILE`).
        file: PathBuf,
    },
}

/// The `fhsx-toolchain` value of a toolchain file: the digest of its atom
/// list, as a record's `toolchain_digest` names it.
pub fn toolchain_id(atoms: &[castore::Digest]) -> castore::Digest {
    executor_core::record::list_digest(atoms)
}

#[derive(Args, Debug)]
pub struct AptArgs {
    /// Debian package names.
    #[arg(required = true)]
    pub packages: Vec<String>,
    /// Add Debian's Essential and `required` packages (what every Debian
    /// system has: /bin/sh, coreutils, awk, sed, grep, locale, …).
    #[arg(long)]
    pub essential: bool,
    /// Write the toolchain file here (atomically) instead of to stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Keep the downloaded .debs in DIR (apt's file names) and reuse them:
    /// one download for many stores.
    #[arg(long, value_name = "DIR", env = "FHSX_DEB_CACHE")]
    pub deb_cache: Option<PathBuf>,
}

pub fn run(g: &Globals, cmd: ToolchainCmd) -> anyhow::Result<i32> {
    let classify = |e: debian::Error| {
        let class = if e.is_usage() {
            ExitClass::Usage
        } else {
            ExitClass::BuildFailed
        };
        Classified(class, castore::Chain(&e).to_string())
    };
    let a = match cmd {
        ToolchainCmd::Apt(a) => a,
        ToolchainCmd::Id { file } => {
            let t = debian::Toolchain::read(&file).map_err(classify)?;
            let id = toolchain_id(&t.atoms());
            if g.json {
                println!(
                    "{}",
                    json!({"file": file, "id": id, "property": format!("fhsx-toolchain={id}")})
                );
            } else {
                println!("{id}");
            }
            return Ok(0);
        }
    };
    let store = open_store(g)?;
    let req = debian::Request {
        packages: a.packages.clone(),
        essential: a.essential,
    };
    let packages = debian::resolve(&req).map_err(classify)?;
    let entries = debian::import_packages(&store, &packages, a.deb_cache.as_deref(), &mut |line| {
        eprintln!("fhsx: {line}")
    })
    .map_err(classify)?;
    let toolchain = debian::Toolchain::new(a.packages, a.essential, entries);
    match &a.output {
        Some(file) => {
            toolchain.write(file).map_err(classify)?;
            if g.json {
                println!(
                    "{}",
                    json!({"file": file, "packages": toolchain.packages.len(), "atoms": toolchain.atoms()})
                );
            } else {
                eprintln!(
                    "fhsx: wrote {} ({} packages)",
                    file.display(),
                    toolchain.packages.len()
                );
            }
        }
        None => print!("{}", toolchain.encode()),
    }
    Ok(0)
}
