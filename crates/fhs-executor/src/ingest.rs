//! Ingesting a build's declared outputs into the store, each as an atom.
//!
//! An output `NAME` is the directory `/build/NAME`; its atom's root is that
//! directory's content, so what the build wrote at `$out/usr/bin/hello`
//! composes at `/usr/bin/hello` wherever the atom is used.
//!
//! Outputs are normalised by construction — castore keeps no mtimes, owners
//! or mode bits beyond the executable bit, so setuid/setgid bits and
//! ownership are dropped — and checked for what must not leave a build:
//! sockets, devices and FIFOs, symlinks into the scratch directory, and
//! relative symlinks that climb out of their output. An absolute symlink
//! into a declared output (`/build/out/usr/bin/bzgrep`, as `make install
//! PREFIX=$out/usr` makes them) has an obvious meaning once outputs compose
//! at FHS paths: it is rewritten to where its target will be
//! (`/usr/bin/bzgrep`), and the log says so.
//!
//! Ingest runs on the host after every process of the build is gone, so
//! nothing can change the scratch between the checks and the import. It
//! trusts nothing of the scratch's ownership or modes: as root the files
//! are the build user's, and whatever modes the build left (a file or a
//! directory of mode 000) are opened up for reading first ([`open_up`]),
//! without following a symlink.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use castore::store::{DirectoryStore, LocalStore};
use castore::{Digest, Directory, Name, Node};
use executor_core::OutputName;

use crate::Error;

/// The scratch directory as the build sees it.
pub const SCRATCH: &str = "/build";

/// The declared outputs, stored.
#[derive(Debug, Clone, Default)]
pub struct Ingested {
    pub outputs: BTreeMap<OutputName, Digest>,
    /// Symlinks that were rewritten, one line each, for the log.
    pub notes: Vec<String>,
}

impl Ingested {
    /// A directory holding each output under its name: what the interface
    /// manifest is derived over.
    pub fn combined_tree(&self, store: &LocalStore) -> Result<Digest, Error> {
        let mut dir = Directory::new();
        for (name, digest) in &self.outputs {
            let size = store.get_directory(digest)?.size();
            dir.insert(
                Name::new(name.as_str())?,
                Node::Directory {
                    digest: *digest,
                    size,
                },
            )?;
        }
        Ok(store.put_directory(&dir)?)
    }
}

/// Check and import each output `scratch/NAME`.
pub fn ingest_outputs(
    store: &LocalStore,
    scratch: &Path,
    names: &[OutputName],
) -> Result<Ingested, Error> {
    let mut ingested = Ingested::default();
    for name in names {
        let host = scratch.join(name.as_str());
        let bad = |reason: String| Error::BadOutput {
            path: format!("${name} ({})", name.build_path()),
            reason,
        };
        let meta = match fs::symlink_metadata(&host) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(
                    "is declared in [outputs] names but the build did not create it (fhsx does not: `mkdir -p $NAME` or `make install DESTDIR=$NAME`)".into(),
                ))
            }
            Err(e) => return Err(Error::io("stat", &host, e)),
        };
        if !meta.is_dir() {
            return Err(bad(format!(
                "is {}, not a directory: an output is an atom, a directory whose content composes at `/`",
                kind_of(&meta.file_type())
            )));
        }
        open_up(&host)?;
        let mut rewrites = Vec::new();
        check_tree(&host, name.as_str(), 0, names, &mut rewrites)?;
        for (link, target, rewritten) in rewrites {
            fs::remove_file(&link).map_err(|e| Error::io("remove", &link, e))?;
            std::os::unix::fs::symlink(&rewritten, &link)
                .map_err(|e| Error::io("create symlink", &link, e))?;
            let rel = link.strip_prefix(scratch).unwrap_or(&link);
            ingested.notes.push(format!(
                "fhsx: output {}: symlink {} → {target} points into an output; rewritten to {rewritten}, where it will be once composed",
                name,
                rel.display()
            ));
        }
        let imported = castore::import::import_path(store, &host, &())?;
        ingested.outputs.insert(name.clone(), imported.root);
    }
    Ok(ingested)
}

/// Let ingest read every file and directory below `root`, whatever mode
/// the build left them in (000, say): a directory gets `u+rx`, a file
/// `u+r`, nothing else, and no symlink is followed. Root could read them
/// anyway (as long as it has CAP_DAC_OVERRIDE), but an unprivileged caller,
/// who owns what its build made, could not. castore keeps no mode bit but
/// the exec bit, which this never changes.
fn open_up(root: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p).map_err(|e| Error::io("stat", &p, e))?;
        let need = if meta.is_dir() {
            0o500
        } else if meta.is_file() {
            0o400
        } else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if mode & need != need {
            fs::set_permissions(&p, fs::Permissions::from_mode(mode | need))
                .map_err(|e| Error::io("chmod", &p, e))?;
        }
        if meta.is_dir() {
            for e in fs::read_dir(&p).map_err(|e| Error::io("read directory", &p, e))? {
                stack.push(e.map_err(|e| Error::io("read directory", &p, e))?.path());
            }
        }
    }
    Ok(())
}

fn kind_of(ft: &fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "a symlink"
    } else if ft.is_file() {
        "a file"
    } else {
        "a special file"
    }
}

/// Refuse special files and escaping symlinks anywhere below `p`, and
/// collect `(link, old target, new target)` for absolute links into an
/// output. `level` is how deep `p` is below its output's root.
fn check_tree(
    p: &Path,
    rel: &str,
    level: usize,
    outputs: &[OutputName],
    rewrites: &mut Vec<(std::path::PathBuf, String, String)>,
) -> Result<(), Error> {
    let meta = fs::symlink_metadata(p).map_err(|e| Error::io("stat", p, e))?;
    let ft = meta.file_type();
    let bad = |reason: &str| Error::BadOutput {
        path: rel.to_owned(),
        reason: reason.to_owned(),
    };
    if ft.is_socket() {
        return Err(bad(
            "is a socket; outputs hold only files, directories and symlinks",
        ));
    }
    if ft.is_fifo() {
        return Err(bad(
            "is a FIFO; outputs hold only files, directories and symlinks",
        ));
    }
    if ft.is_block_device() || ft.is_char_device() {
        return Err(bad(
            "is a device node; outputs hold only files, directories and symlinks",
        ));
    }
    if ft.is_symlink() {
        let t = fs::read_link(p).map_err(|e| Error::io("readlink", p, e))?;
        let t = t.to_string_lossy().into_owned();
        if let Some(fhs) = into_output(&t, outputs) {
            rewrites.push((p.to_path_buf(), t, fhs));
        } else if t == SCRATCH || t.starts_with(&format!("{SCRATCH}/")) {
            return Err(bad(&format!(
                "is a symlink into the scratch directory ({t}), which will not exist at runtime"
            )));
        } else if !t.starts_with('/') {
            // The link's directory is one level above the link; each `..`
            // climbs one more, and the output's root is level 0.
            let mut at = level as i64 - 1;
            for c in t.split('/') {
                match c {
                    ".." => at -= 1,
                    "" | "." => {}
                    _ => at += 1,
                }
                if at < 0 {
                    return Err(bad(&format!("is a symlink ({t}) that leaves the output")));
                }
            }
        }
    }
    if ft.is_dir() {
        for e in fs::read_dir(p).map_err(|e| Error::io("read directory", p, e))? {
            let e = e.map_err(|e| Error::io("read directory", p, e))?;
            let child_rel = format!("{rel}/{}", e.file_name().to_string_lossy());
            check_tree(&e.path(), &child_rel, level + 1, outputs, rewrites)?;
        }
    }
    Ok(())
}

/// Where an absolute symlink target inside a declared output will be once
/// that output is composed: `/build/out/usr/bin/x` → `/usr/bin/x`.
fn into_output(target: &str, outputs: &[OutputName]) -> Option<String> {
    let rest = target.strip_prefix(SCRATCH)?.strip_prefix('/')?;
    let (first, below) = rest.split_once('/').unwrap_or((rest, ""));
    outputs.iter().any(|o| o.as_str() == first).then(|| {
        let below = below.trim_start_matches('/');
        format!("/{below}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_into_an_output_point_where_it_will_be() {
        let outs: Vec<OutputName> = vec!["out".parse().unwrap(), "dev".parse().unwrap()];
        assert_eq!(
            into_output("/build/out/usr/bin/bzgrep", &outs).as_deref(),
            Some("/usr/bin/bzgrep")
        );
        assert_eq!(into_output("/build/dev", &outs).as_deref(), Some("/"));
        assert_eq!(into_output("/build/dev/", &outs).as_deref(), Some("/"));
        assert_eq!(into_output("/build/src/x", &outs), None);
        assert_eq!(into_output("/build/outx/y", &outs), None);
        assert_eq!(into_output("/usr/lib/x", &outs), None);
    }
}
