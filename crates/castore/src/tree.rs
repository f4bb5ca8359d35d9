//! An in-memory tree assembled from entries named by path — an archive's,
//! or a synthetic layer's (the alternatives links, a pruned read set) — and
//! its conversion into stored Directory objects.
//!
//! Entries come by path, in any order, possibly twice, possibly through
//! symlinks. The builder accepts only what describes one unambiguous tree:
//! no `..`, no absolute paths, nothing written through a symlink or a file,
//! no name used twice (a directory repeated is harmless and merges).

use std::collections::BTreeMap;

use crate::store::Txn;
use crate::{Digest, Directory, Name, Node, Result, SymlinkTarget};

enum Pending {
    Dir(BTreeMap<Name, Pending>),
    Leaf(Node),
}

#[derive(Default)]
pub struct TreeBuilder {
    root: BTreeMap<Name, Pending>,
    /// Every regular file by its path, for resolving hard links.
    files: BTreeMap<Vec<Name>, Node>,
}

/// Split an archive path into validated components. Leading `./` and empty
/// components (`a//b`, a trailing `/`) are dropped; `..`, a leading `/`,
/// invalid names and more than [`crate::fs_tree::MAX_DEPTH`] components
/// are errors (so the builder's own recursion is bounded too).
pub fn components(raw: &[u8]) -> std::result::Result<Vec<Name>, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".into());
    }
    if raw.starts_with(b"/") {
        return Err(format!("absolute path {:?}", String::from_utf8_lossy(raw)));
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => continue,
            b".." => {
                return Err(format!(
                    "path {:?} contains `..`",
                    String::from_utf8_lossy(raw)
                ))
            }
            c => out.push(Name::new(c).map_err(|e| e.to_string())?),
        }
        if out.len() > crate::fs_tree::MAX_DEPTH {
            return Err(format!(
                "path {:?}… nests more than {} deep; the store takes trees at most {} deep",
                crate::shown::escaped(&raw[..raw.len().min(200)]),
                crate::fs_tree::MAX_DEPTH,
                crate::fs_tree::MAX_DEPTH
            ));
        }
    }
    Ok(out)
}

fn show(path: &[Name]) -> String {
    path.iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join("/")
}

impl TreeBuilder {
    /// The directory that will hold `path`'s last component, created as
    /// needed. Errors if a prefix is a file or symlink.
    fn parent_of(
        &mut self,
        path: &[Name],
    ) -> std::result::Result<&mut BTreeMap<Name, Pending>, String> {
        let mut cur = &mut self.root;
        for (i, c) in path[..path.len().saturating_sub(1)].iter().enumerate() {
            let e = cur
                .entry(c.clone())
                .or_insert_with(|| Pending::Dir(BTreeMap::new()));
            cur = match e {
                Pending::Dir(m) => m,
                Pending::Leaf(Node::Symlink { .. }) => {
                    return Err(format!(
                        "{} is written through the symlink {}",
                        show(path),
                        show(&path[..=i])
                    ))
                }
                Pending::Leaf(_) => {
                    return Err(format!(
                        "{} is below {}, which is a file",
                        show(path),
                        show(&path[..=i])
                    ))
                }
            };
        }
        Ok(cur)
    }

    pub fn add_dir(&mut self, path: &[Name]) -> std::result::Result<(), String> {
        let Some(last) = path.last() else {
            return Ok(()); // the root itself
        };
        let parent = self.parent_of(path)?;
        match parent.get(last) {
            None => {
                parent.insert(last.clone(), Pending::Dir(BTreeMap::new()));
                Ok(())
            }
            Some(Pending::Dir(_)) => Ok(()),
            Some(Pending::Leaf(_)) => Err(format!("duplicate entry {}", show(path))),
        }
    }

    pub fn add_leaf(&mut self, path: &[Name], node: Node) -> std::result::Result<(), String> {
        let Some(last) = path.last() else {
            return Err("an entry other than a directory at the archive root".into());
        };
        let parent = self.parent_of(path)?;
        if parent.contains_key(last) {
            return Err(format!("duplicate entry {}", show(path)));
        }
        parent.insert(last.clone(), Pending::Leaf(node.clone()));
        if matches!(node, Node::File { .. }) {
            self.files.insert(path.to_vec(), node);
        }
        Ok(())
    }

    /// A hard link: allowed only to a regular file seen earlier in the same
    /// archive; the link becomes a second file node with the same content.
    pub fn add_hardlink(
        &mut self,
        path: &[Name],
        target: &[Name],
    ) -> std::result::Result<(), String> {
        let node = self.files.get(target).cloned().ok_or_else(|| {
            format!(
                "hard link {} points to {}, which is not a regular file earlier in the archive",
                show(path),
                show(target)
            )
        })?;
        self.add_leaf(path, node)
    }

    pub fn add_symlink(&mut self, path: &[Name], target: &[u8]) -> std::result::Result<(), String> {
        let target = SymlinkTarget::new(target).map_err(|e| format!("{}: {e}", show(path)))?;
        self.add_leaf(path, Node::Symlink { target })
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.root.is_empty()
    }

    /// Store every directory, children first, and return the root's digest and size.
    pub fn finish(self, txn: &Txn<'_>) -> Result<(Digest, u64)> {
        let dir = store_dir(txn, self.root)?;
        let size = dir.size();
        Ok((txn.put_directory(&dir)?, size))
    }
}

fn store_dir(txn: &Txn<'_>, entries: BTreeMap<Name, Pending>) -> Result<Directory> {
    let mut dir = Directory::new();
    for (name, p) in entries {
        let node = match p {
            Pending::Leaf(n) => n,
            Pending::Dir(children) => {
                let d = store_dir(txn, children)?;
                Node::Directory {
                    size: d.size(),
                    digest: txn.put_directory(&d)?,
                }
            }
        };
        dir.insert(name, node)?;
    }
    Ok(dir)
}
