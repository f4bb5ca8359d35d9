//! Ingesting a build's declared outputs into the store.
//!
//! Outputs are normalised by construction — castore keeps no mtimes, owners
//! or mode bits beyond the executable bit, so setuid/setgid bits and
//! ownership are dropped — and checked for what must not leave a build:
//! sockets, devices and FIFOs, and symlinks that point back into the
//! scratch directory or climb out of the output.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use castore::store::{BlobStore, LocalStore};
use castore::{Digest, Directory, DirectoryStore, Name, Node, SymlinkTarget};

use crate::Error;

/// The scratch directory as the build sees it.
pub const SCRATCH: &str = "/build";

/// Ingest each path in `outputs` (relative to `scratch`) and return the
/// digest of a directory holding them at those relative paths.
pub fn ingest_outputs(
    store: &LocalStore,
    scratch: &Path,
    outputs: &[String],
) -> Result<Digest, Error> {
    let mut tree = Tree::default();
    for rel in outputs {
        let host = scratch.join(rel);
        // Ingest runs on the host: a parent the build replaced with a
        // symlink would lead it out of the scratch (to `/etc`, say).
        let comps: Vec<&str> = rel.split('/').collect();
        for i in 1..comps.len() {
            let parent = comps[..i].join("/");
            let is_dir = fs::symlink_metadata(scratch.join(&parent))
                .map(|m| m.is_dir())
                .unwrap_or(false);
            if !is_dir {
                return Err(Error::BadOutput {
                    path: rel.clone(),
                    reason: format!(
                        "lies under {parent}, which is not a directory (a symlink is not followed)"
                    ),
                });
            }
        }
        let meta = fs::symlink_metadata(&host).map_err(|_| Error::BadOutput {
            path: rel.clone(),
            reason: "declared in [outputs] but the build did not create it".into(),
        })?;
        check_tree(&host, rel, 0, rel.matches('/').count() + 1)?;
        let node = if meta.is_dir() {
            let imported = castore::import::import_path(store, &host, &())?;
            Node::Directory {
                digest: imported.root,
                size: imported.size,
            }
        } else if meta.is_file() {
            let bytes = fs::read(&host).map_err(|e| Error::io("read", &host, e))?;
            Node::File {
                digest: store.put_blob(&bytes)?,
                size: bytes.len() as u64,
                executable: meta.mode() & 0o100 != 0,
            }
        } else {
            let t = fs::read_link(&host).map_err(|e| Error::io("readlink", &host, e))?;
            Node::Symlink {
                target: SymlinkTarget::new(t.as_os_str().as_encoded_bytes())?,
            }
        };
        tree.insert(rel, node)?;
    }
    tree.store(store)
}

/// Refuse special files and escaping symlinks anywhere below `p`.
/// `depth` is how deep `p` is below the output root's parent; `root_depth`
/// is the depth of the output root itself.
fn check_tree(p: &Path, rel: &str, depth: usize, root_depth: usize) -> Result<(), Error> {
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
        let t = t.to_string_lossy();
        if t == SCRATCH || t.starts_with(&format!("{SCRATCH}/")) {
            return Err(bad(&format!(
                "is a symlink into the scratch directory ({t}), which will not exist at runtime"
            )));
        }
        if !t.starts_with('/') {
            // Climb: each `..` goes up one level from the link's directory.
            let mut level = (depth + root_depth - 1) as i64;
            for c in t.split('/') {
                match c {
                    ".." => level -= 1,
                    "" | "." => {}
                    _ => level += 1,
                }
                if level < root_depth as i64 - 1 {
                    return Err(bad(&format!("is a symlink ({t}) that leaves the output")));
                }
            }
        }
    }
    if ft.is_dir() {
        for e in fs::read_dir(p).map_err(|e| Error::io("read directory", p, e))? {
            let e = e.map_err(|e| Error::io("read directory", p, e))?;
            let child_rel = format!("{rel}/{}", e.file_name().to_string_lossy());
            check_tree(&e.path(), &child_rel, depth + 1, root_depth)?;
        }
    }
    Ok(())
}

#[derive(Default)]
struct Tree {
    entries: BTreeMap<String, Entry>,
}

enum Entry {
    Leaf(Node),
    Sub(Tree),
}

impl Tree {
    fn insert(&mut self, rel: &str, node: Node) -> Result<(), Error> {
        let mut cur = self;
        let comps: Vec<&str> = rel.split('/').collect();
        for c in &comps[..comps.len() - 1] {
            let e = cur
                .entries
                .entry((*c).to_owned())
                .or_insert_with(|| Entry::Sub(Tree::default()));
            cur = match e {
                Entry::Sub(t) => t,
                Entry::Leaf(_) => {
                    return Err(Error::BadOutput {
                        path: rel.to_owned(),
                        reason: "is declared inside another declared output".into(),
                    })
                }
            };
        }
        let last = comps[comps.len() - 1].to_owned();
        if cur.entries.insert(last, Entry::Leaf(node)).is_some() {
            return Err(Error::BadOutput {
                path: rel.to_owned(),
                reason: "is declared twice or contains another declared output".into(),
            });
        }
        Ok(())
    }

    fn store(self, store: &LocalStore) -> Result<Digest, Error> {
        let dir = self.build(store)?;
        Ok(store.put_directory(&dir)?)
    }

    fn build(self, store: &LocalStore) -> Result<Directory, Error> {
        let mut dir = Directory::new();
        for (name, e) in self.entries {
            let node = match e {
                Entry::Leaf(n) => n,
                Entry::Sub(t) => {
                    let d = t.build(store)?;
                    Node::Directory {
                        size: d.size(),
                        digest: store.put_directory(&d)?,
                    }
                }
            };
            dir.insert(Name::new(name)?, node)?;
        }
        Ok(dir)
    }
}
