//! `fhsx mount VIEW MOUNTPOINT [--read-set FILE]`: serve a view read-only
//! through the Observe tier until SIGINT/SIGTERM, then unmount and write
//! the read set. For debugging and inspection; builds mount their own.

use std::path::PathBuf;

use anyhow::Context;
use castore::Digest;
use castore_fuse::{MountOptions, TerminationSignals};
use clap::Args;
use executor_core::ExitClass;
use serde_json::json;

use super::store::open_store;
use super::Globals;
use crate::exit::Classified;

#[derive(Args, Debug)]
pub struct MountArgs {
    /// The view: a tree's root digest (usually what `fhsx compose` printed).
    pub view: Digest,
    /// An existing directory to mount it on.
    pub mountpoint: PathBuf,
    /// At unmount, also write the read set (canonical JSON) to this file.
    #[arg(long, value_name = "FILE")]
    pub read_set: Option<PathBuf>,
    /// Serve every read through the daemon instead of FUSE passthrough.
    #[arg(long)]
    pub no_passthrough: bool,
}

/// A castore-fuse error as the CLI reports it: store errors keep castore's
/// classification, the rest get theirs (integrity → exit 3).
pub(super) fn fuse_error(e: castore_fuse::Error) -> anyhow::Error {
    match e {
        castore_fuse::Error::Store(inner) => anyhow::Error::from(*inner),
        other => {
            let class = match other.kind() {
                castore::ErrorKind::Integrity => ExitClass::Integrity,
                castore::ErrorKind::Input => ExitClass::Usage,
                castore::ErrorKind::Io => ExitClass::BuildFailed,
            };
            anyhow::Error::new(Classified(class, other.to_string()))
        }
    }
}

pub fn run(g: &Globals, a: MountArgs) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    // Blocked before any serving thread exists, so only `wait` sees them.
    let signals = TerminationSignals::block().context("blocking SIGINT/SIGTERM")?;
    let opts = MountOptions {
        passthrough: !a.no_passthrough,
        ..MountOptions::default()
    };
    let guard = castore_fuse::mount(&store, &a.view, &a.mountpoint, &opts).map_err(fuse_error)?;
    eprintln!(
        "fhsx: serving {} read-only at {}; stop with Ctrl-C or SIGTERM",
        a.view,
        guard.mountpoint().display()
    );
    loop {
        if let Some(sig) = signals
            .wait_timeout(std::time::Duration::from_millis(500))
            .context("waiting for SIGINT/SIGTERM")?
        {
            eprintln!("fhsx: signal {sig}: unmounting");
            break;
        }
        if !guard.is_serving() {
            eprintln!("fhsx: the view was unmounted from outside");
            break;
        }
    }
    let out = guard.finish(&store).map_err(fuse_error)?;
    if let Some(p) = &a.read_set {
        std::fs::write(p, out.read_set.encode())
            .with_context(|| format!("writing the read set to {}", p.display()))?;
    }
    if g.json {
        println!(
            "{}",
            json!({
                "view": a.view,
                "read_set": out.read_set_digest,
                "entries": out.read_set.entries.len(),
                "integrity_failures": out.integrity_failures,
            })
        );
    } else {
        println!("{}", out.read_set_digest);
        eprintln!(
            "fhsx: read set {} ({} entries) stored",
            out.read_set_digest,
            out.read_set.entries.len()
        );
    }
    out.check().map_err(fuse_error)?;
    Ok(0)
}
