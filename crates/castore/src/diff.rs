//! Comparing two stored trees: the paths whose content differs.
//!
//! Trees are content-addressed, so equal subtrees are skipped by digest
//! without being read: comparing two large, nearly equal outputs costs the
//! directories on the paths to the differences, not the whole trees.

use crate::compose::escape_name;
use crate::store::DirectoryStore;
use crate::{Digest, Node, Result};

/// The kind of a node, as a comparison names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    File,
    Exe,
    Dir,
    Symlink,
}

impl NodeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::File => "file",
            NodeKind::Exe => "exe",
            NodeKind::Dir => "dir",
            NodeKind::Symlink => "symlink",
        }
    }
}

/// What a path held on one side of a comparison.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeSummary {
    pub kind: NodeKind,
    /// The blob's or directory's digest; for a symlink, the BLAKE3 of its
    /// target.
    pub digest: Digest,
    /// Bytes of a file, entries below a directory, bytes of a symlink's
    /// target.
    pub size: u64,
}

impl NodeSummary {
    pub fn of(node: &Node) -> Self {
        match node {
            Node::Directory { digest, size } => NodeSummary {
                kind: NodeKind::Dir,
                digest: *digest,
                size: *size,
            },
            Node::File {
                digest,
                size,
                executable,
            } => NodeSummary {
                kind: if *executable {
                    NodeKind::Exe
                } else {
                    NodeKind::File
                },
                digest: *digest,
                size: *size,
            },
            Node::Symlink { target } => NodeSummary {
                kind: NodeKind::Symlink,
                digest: Digest::of(target.as_bytes()),
                size: target.as_bytes().len() as u64,
            },
        }
    }
}

/// One path whose content differs; a side is `None` where the path is
/// absent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Difference {
    /// Relative to the trees' roots, names escaped as in composition maps.
    pub path: String,
    pub before: Option<NodeSummary>,
    pub after: Option<NodeSummary>,
}

/// Every path where the trees rooted at directories `before` and `after`
/// differ, sorted by path. A directory present on one side only is one
/// difference (not one per file below it); a path that is a directory on
/// both sides is descended into.
pub fn diff(
    store: &dyn DirectoryStore,
    before: &Digest,
    after: &Digest,
) -> Result<Vec<Difference>> {
    // The walk below recurses: only over depths it can take.
    for root in [before, after] {
        crate::walk::check_depth(store, root, crate::fs_tree::MAX_DEPTH)?;
    }
    let mut out = Vec::new();
    diff_dirs(store, "", before, after, &mut out)?;
    Ok(out)
}

fn diff_dirs(
    store: &dyn DirectoryStore,
    prefix: &str,
    before: &Digest,
    after: &Digest,
    out: &mut Vec<Difference>,
) -> Result<()> {
    if before == after {
        return Ok(());
    }
    let a = store.get_directory(before)?;
    let b = store.get_directory(after)?;
    let mut names: Vec<&[u8]> = a
        .entries()
        .chain(b.entries())
        .map(|(n, _)| n.as_bytes())
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let path = if prefix.is_empty() {
            escape_name(name)
        } else {
            format!("{prefix}/{}", escape_name(name))
        };
        match (a.get(name), b.get(name)) {
            (Some(x), Some(y)) if x == y => {}
            (Some(Node::Directory { digest: x, .. }), Some(Node::Directory { digest: y, .. })) => {
                diff_dirs(store, &path, x, y, out)?
            }
            (x, y) => out.push(Difference {
                path,
                before: x.map(NodeSummary::of),
                after: y.map(NodeSummary::of),
            }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BlobStore, LocalStore};
    use crate::{Directory, Name, SymlinkTarget};

    fn file(store: &LocalStore, bytes: &[u8]) -> Node {
        Node::File {
            digest: store.put_blob(bytes).unwrap(),
            size: bytes.len() as u64,
            executable: false,
        }
    }

    fn dir(store: &LocalStore, entries: Vec<(&str, Node)>) -> Node {
        let mut d = Directory::new();
        for (n, node) in entries {
            d.insert(Name::new(n).unwrap(), node).unwrap();
        }
        Node::Directory {
            size: d.size(),
            digest: store.put_directory(&d).unwrap(),
        }
    }

    #[test]
    fn lists_only_the_paths_that_differ() {
        let t = tempfile::tempdir().unwrap();
        let s = LocalStore::open(t.path()).unwrap();
        let same = dir(&s, vec![("x", file(&s, b"same"))]);
        let link = Node::Symlink {
            target: SymlinkTarget::new("a").unwrap(),
        };
        let a = dir(
            &s,
            vec![
                ("same", same.clone()),
                ("f", file(&s, b"one")),
                ("gone", file(&s, b"g")),
                ("sub", dir(&s, vec![("l", link), ("k", file(&s, b"k"))])),
            ],
        );
        let b = dir(
            &s,
            vec![
                ("same", same),
                ("f", file(&s, b"two!")),
                ("new", dir(&s, vec![])),
                (
                    "sub",
                    dir(
                        &s,
                        vec![
                            (
                                "l",
                                Node::Symlink {
                                    target: SymlinkTarget::new("b").unwrap(),
                                },
                            ),
                            ("k", file(&s, b"k")),
                        ],
                    ),
                ),
            ],
        );
        let (Some(a), Some(b)) = (a.digest(), b.digest()) else {
            unreachable!()
        };
        let d = diff(&s, a, b).unwrap();
        let paths: Vec<_> = d.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, ["f", "gone", "new", "sub/l"]);
        assert_eq!(d[0].before.as_ref().unwrap().size, 3);
        assert_eq!(d[0].after.as_ref().unwrap().size, 4);
        assert!(d[1].after.is_none() && d[2].before.is_none());
        assert_eq!(d[2].after.as_ref().unwrap().kind, NodeKind::Dir);
        assert!(diff(&s, a, a).unwrap().is_empty());
    }
}
