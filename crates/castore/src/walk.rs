//! Looking up paths inside a stored tree.

use crate::store::DirectoryStore;
use crate::{Digest, Error, Node, Result};

/// The root node of a tree named by a directory digest.
pub fn root_node(store: &dyn DirectoryStore, root: &Digest) -> Result<Node> {
    let d = store.get_directory(root)?;
    Ok(Node::Directory {
        digest: *root,
        size: d.size(),
    })
}

/// Resolve `path` (slash-separated, relative to `root`; empty or `/` is the
/// root) to a node. Symlinks are not followed: castore never follows one.
pub fn lookup(store: &dyn DirectoryStore, root: &Digest, path: &str) -> Result<Node> {
    lookup_bytes(store, root, path.as_bytes())
}

/// Resolve a path given as raw name bytes (names may be any bytes but `/`
/// and NUL, so not every path is a `str`). Components `""` and `.` are
/// skipped. Symlinks are not followed.
pub fn lookup_bytes(store: &dyn DirectoryStore, root: &Digest, path: &[u8]) -> Result<Node> {
    let mut node = root_node(store, root)?;
    let mut walked = String::new();
    for comp in path
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
    {
        let Node::Directory { digest, .. } = &node else {
            return Err(Error::BadTreePath {
                path: walked,
                reason: format!("is {}, not a directory", node.kind()),
            });
        };
        let dir = store
            .get_directory(digest)
            .map_err(|e| e.at_path(&walked))?;
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(&String::from_utf8_lossy(comp));
        node = dir.get(comp).cloned().ok_or_else(|| Error::BadTreePath {
            path: walked.clone(),
            reason: "no such file or directory in the tree".into(),
        })?;
    }
    Ok(node)
}
