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
//! relative symlinks that climb out of their output (an output placed in
//! the root, `[outputs] at`, lives at its path: a link may climb as far as
//! `/`, `../usr/lib/os-release` from an output at `/etc`). An absolute symlink
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
//!
//! What a build leaves is an attacker's: its trees are walked by
//! [`castore::fs_tree`] (no recursion, two descriptors at any depth),
//! refused past [`castore::fs_tree::MAX_DEPTH`] and past `[limits] output`
//! (bytes, at their apparent size) and `output_entries`, and any name of
//! the build's is escaped before a message shows it.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fs;
use std::os::fd::BorrowedFd;
use std::path::Path;

use castore::fs_tree::{Step, TreePath};
use rustix::fs::{FileType, Stat};

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
    /// Each output's entry count (its root's `size`), as import found it:
    /// so that naming the outputs together decodes none of them again.
    pub sizes: BTreeMap<OutputName, u64>,
    /// Symlinks that were rewritten, one line each, for the log.
    pub notes: Vec<String>,
}

impl Ingested {
    /// A directory holding each output under its name: what the interface
    /// manifest is derived over.
    pub fn combined_tree(&self, store: &LocalStore) -> Result<Digest, Error> {
        let mut dir = Directory::new();
        for (name, digest) in &self.outputs {
            let size = match self.sizes.get(name) {
                Some(size) => *size,
                None => store.get_directory(digest)?.size(),
            };
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

/// What the outputs together may hold (`[limits] output` and
/// `output_entries`).
#[derive(Debug, Clone, Copy)]
pub struct OutputLimits {
    pub bytes: u64,
    pub entries: u64,
}

/// Check every output `scratch/NAME`, then import each. Nothing reaches
/// the store before all of them have been checked: an output refused (a
/// special file, an escaping link, too deep, past a limit) leaves nothing
/// of any output behind.
/// `places`: where each output placed in the root lives (`[outputs] at`).
pub fn ingest_outputs(
    store: &LocalStore,
    scratch: &Path,
    names: &[OutputName],
    places: &BTreeMap<OutputName, String>,
    limits: OutputLimits,
) -> Result<Ingested, Error> {
    let mut checker = Checker {
        scratch,
        outputs: names,
        output: None,
        placed: !places.is_empty(),
        above: 0,
        notes: Vec::new(),
        entries: 0,
        bytes: 0,
        limits,
    };
    for name in names {
        let host = scratch.join(name.as_str());
        let meta = match fs::symlink_metadata(&host) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad_output(name, not_made(name, names)))
            }
            Err(e) => return Err(Error::io("stat", &host, e)),
        };
        if !meta.is_dir() {
            return Err(bad_output(
                name,
                format!(
                    "is {}, not a directory: an output is an atom, a directory whose content composes at `/`",
                    kind_of(&meta.file_type())
                ),
            ));
        }
        // The output's own directory, like everything below it, is opened
        // up for reading (it is not a link: just seen).
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
        if mode & 0o500 != 0o500 {
            fs::set_permissions(
                &host,
                std::os::unix::fs::PermissionsExt::from_mode(mode | 0o500),
            )
            .map_err(|e| Error::io("chmod", &host, e))?;
        }
        checker.output = Some(name);
        checker.above = places
            .get(name)
            .map_or(0, |p| p.split('/').filter(|c| !c.is_empty()).count());
        castore::fs_tree::walk(&host, castore::fs_tree::MAX_DEPTH, &mut checker).map_err(
            |e| match e {
                Error::Store(castore::Error::TooDeep { prefix, limit, .. }) => Error::BadOutput {
                    path: format!("${name}/{prefix}"),
                    reason: format!("nests directories more than {limit} deep below the output, deeper than the store takes: make the tree shallower"),
                },
                e => e,
            },
        )?;
    }
    let mut ingested = Ingested {
        notes: checker.notes,
        ..Ingested::default()
    };
    for name in names {
        let host = scratch.join(name.as_str());
        let imported = castore::import::import_path(store, &host, &())?;
        ingested.outputs.insert(name.clone(), imported.root);
        ingested.sizes.insert(name.clone(), imported.size);
    }
    Ok(ingested)
}

/// Why output `name` is missing: an action that names no output has
/// `out` all the same, which it may not know.
fn not_made(name: &OutputName, names: &[OutputName]) -> String {
    let declared = if names.len() == 1 && name.as_str() == "out" {
        "is the action's output (`out` is every action's only output unless [outputs] names says otherwise)"
    } else {
        "is declared in [outputs] names"
    };
    format!(
        "{declared} but the build did not create it (fhsx does not: `mkdir -p ${name}` or `make install DESTDIR=${name}`)"
    )
}

fn bad_output(name: &OutputName, reason: String) -> Error {
    Error::BadOutput {
        path: format!("${name} ({})", name.build_path()),
        reason,
    }
}

/// The checking walk over every output: kinds, links and totals; it also
/// makes whatever the build left unreadable readable to ingest (`u+rx` on
/// a directory, `u+r` on a file, nothing else, no symlink followed). Root
/// could read them anyway, but an unprivileged caller, who owns what its
/// build made, could not; castore keeps no mode bit but the exec bit,
/// which this never changes.
struct Checker<'a> {
    /// Where the outputs are, `scratch/NAME` each.
    scratch: &'a Path,
    outputs: &'a [OutputName],
    /// The output being walked.
    output: Option<&'a OutputName>,
    /// The outputs are placed in the root: there is no `/build` in the
    /// sandbox, so a link to it is nothing of the build's scratch nor of
    /// an output (the view's own `/build`, if any), and kept as it is.
    placed: bool,
    /// How many directories lie above its root: its place's depth, for an
    /// output placed in the root; 0 for one that composes at `/`.
    above: usize,
    /// The links into an output rewritten, one line each, for the log.
    notes: Vec<String>,
    entries: u64,
    bytes: u64,
    limits: OutputLimits,
}

impl castore::fs_tree::Visitor for Checker<'_> {
    type Dir = ();
    type Error = Error;

    fn enter(&mut self, _: &TreePath<'_>, _: BorrowedFd<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn entry(
        &mut self,
        (): &mut (),
        at: &TreePath<'_>,
        parent: BorrowedFd<'_>,
        name: &CStr,
        stat: &Stat,
    ) -> Result<Step, Error> {
        let output = self.output.map(|o| o.as_str()).unwrap_or("out");
        let rel = format!("${output}/{}", at.display());
        let bad = |reason: &str| Error::BadOutput {
            path: rel.clone(),
            reason: reason.to_owned(),
        };
        self.entries += 1;
        if self.entries > self.limits.entries {
            return Err(bad(&format!(
                "is past the outputs' limit of {} entries ([limits] output_entries): fewer files, or raise the limit",
                self.limits.entries
            )));
        }
        let ft = FileType::from_raw_mode(stat.st_mode);
        match ft {
            FileType::Directory => {
                castore::fs_tree::open_up(parent, name, stat, 0o500)?;
                Ok(Step::Enter)
            }
            FileType::RegularFile => {
                // The apparent size: a sparse file is stored as it reads.
                self.bytes = self.bytes.saturating_add(stat.st_size as u64);
                if self.bytes > self.limits.bytes {
                    return Err(bad(&format!(
                        "takes the outputs past their limit of {} bytes ([limits] output, else disk; a sparse file counts at its apparent size): write less, or raise the limit",
                        self.limits.bytes
                    )));
                }
                castore::fs_tree::open_up(parent, name, stat, 0o400)?;
                Ok(Step::Skip)
            }
            FileType::Symlink => {
                let t = rustix::fs::readlinkat(parent, name, Vec::new())
                    .map_err(|e| Error::io("readlink", Path::new(&rel), e.into()))?;
                let t = String::from_utf8_lossy(t.as_bytes());
                if let Some(fhs) = self.check_link(at, &t, &bad)? {
                    self.rewrite(parent, name, &fhs, &rel)?;
                    let dangles = if self.holds(&fhs) {
                        ""
                    } else {
                        "; warning: no output holds it, so the link dangles unless another atom composed with it does"
                    };
                    self.notes.push(format!(
                        "fhsx: output {output}: symlink {} → {} points into an output; rewritten to {}, where it will be once composed{dangles}",
                        at.display(),
                        castore::fs_tree::escaped(t.as_bytes()),
                        castore::fs_tree::escaped(fhs.as_bytes()),
                    ));
                }
                Ok(Step::Skip)
            }
            FileType::Socket => Err(bad(
                "is a socket; outputs hold only files, directories and symlinks",
            )),
            FileType::Fifo => Err(bad(
                "is a FIFO; outputs hold only files, directories and symlinks",
            )),
            _ => Err(bad(
                "is a device node; outputs hold only files, directories and symlinks",
            )),
        }
    }

    fn leave(
        &mut self,
        (): (),
        _: &TreePath<'_>,
        _: Option<(&mut (), BorrowedFd<'_>)>,
    ) -> Result<(), Error> {
        Ok(())
    }
}

impl Checker<'_> {
    /// Refuse a link into the scratch or out of its output; for one into
    /// an output, where it must point once composed.
    fn check_link(
        &self,
        at: &TreePath<'_>,
        t: &str,
        bad: &dyn Fn(&str) -> Error,
    ) -> Result<Option<String>, Error> {
        let into_scratch = t == SCRATCH || t.starts_with(&format!("{SCRATCH}/"));
        if self.placed && into_scratch {
            return Ok(None);
        }
        if let Some(fhs) = into_output(t, self.outputs) {
            return Ok(Some(fhs));
        } else if into_scratch {
            return Err(bad(&format!(
                "is a symlink into the scratch directory ({}), which will not exist at runtime",
                castore::fs_tree::escaped(t.as_bytes())
            )));
        } else if !t.starts_with('/') {
            // The link's directory is its depth less one below the
            // output's root (level 0), itself `above` below `/`; each `..`
            // climbs one more.
            let mut level = at.depth() as i64 - 1 + self.above as i64;
            for c in t.split('/') {
                match c {
                    ".." => level -= 1,
                    "" | "." => {}
                    _ => level += 1,
                }
                if level < 0 {
                    return Err(bad(&format!(
                        "is a symlink ({}) that leaves the output",
                        castore::fs_tree::escaped(t.as_bytes())
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Whether some output holds `fhs` (`/usr/bin/x`: `scratch/NAME/usr/bin/x`
    /// for an output NAME) as a link's target will find it once composed.
    /// No link of the build's is followed: a path through one, or one that
    /// cannot be looked at, is taken to be there (the warning is for links
    /// that surely dangle).
    fn holds(&self, fhs: &str) -> bool {
        self.outputs.iter().any(|o| {
            let mut at = self.scratch.join(o.as_str());
            for c in fhs.split('/').filter(|c| !c.is_empty() && *c != ".") {
                match fs::symlink_metadata(&at) {
                    Ok(m) if m.is_dir() => {}
                    Ok(m) => return m.file_type().is_symlink(),
                    Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
                }
                if c == ".." {
                    return true;
                }
                at.push(c);
            }
            fs::symlink_metadata(&at)
                .map_or_else(|e| e.kind() != std::io::ErrorKind::NotFound, |_| true)
        })
    }

    /// Make the link `name` in `parent` point at `target` instead.
    fn rewrite(
        &self,
        parent: BorrowedFd<'_>,
        name: &CStr,
        target: &str,
        rel: &str,
    ) -> Result<(), Error> {
        let shown = Path::new(rel);
        rustix::fs::unlinkat(parent, name, rustix::fs::AtFlags::empty())
            .map_err(|e| Error::io("remove", shown, e.into()))?;
        rustix::fs::symlinkat(target, parent, name)
            .map_err(|e| Error::io("create symlink", shown, e.into()))
    }
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
