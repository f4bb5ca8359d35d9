//! Looking up paths inside a stored tree, and bounding its depth.

use std::collections::HashMap;

use crate::store::DirectoryStore;
use crate::{Digest, Directory, Error, Node, Result};

/// Refuse the stored tree `root` if directories nest in it more than
/// `limit` deep. Trees a remote client uploads are shaped by the client,
/// and a stored tree is a DAG: this walks each distinct directory once,
/// with its own stack, so neither a deep chain nor a wide DAG (k objects
/// naming 2^k paths) costs more than the objects themselves. What passes
/// can be walked by the store's recursive walkers (export, compose,
/// verify, diff) on any thread's stack.
pub fn check_depth(store: &dyn DirectoryStore, root: &Digest, limit: usize) -> Result<()> {
    check_depth_with([*root], limit, |d| {
        Ok(subdirectories(&store.get_directory(d)?))
    })
}

/// [`check_depth`] of each of `roots`, a directory's subdirectories
/// given by `children` (a tree not yet whole in one store: what a copy
/// received, over what the store has). Each distinct directory is asked
/// for once across all the roots.
pub fn check_depth_with(
    roots: impl IntoIterator<Item = Digest>,
    limit: usize,
    mut children: impl FnMut(&Digest) -> Result<Vec<Digest>>,
) -> Result<()> {
    // Each directory's height once known: how many levels of directories
    // nest below it. Exact (a directory is done only after all it names),
    // so it holds for every root.
    let mut height: HashMap<Digest, usize> = HashMap::new();
    for root in roots {
        let too_deep = || Error::TreeTooDeep { root, limit };
        // Directories to visit; with their subdirectories once those are
        // pushed, when they are on the current path.
        let mut stack: Vec<(Digest, Option<Vec<Digest>>)> = vec![(root, None)];
        let mut on_path = 0usize;
        while let Some((d, expanded)) = stack.pop() {
            if let Some(children) = expanded {
                on_path -= 1;
                let h = children
                    .iter()
                    .filter_map(|c| height.get(c).map(|h| h + 1))
                    .max()
                    .unwrap_or(0);
                if h > limit {
                    return Err(too_deep());
                }
                height.insert(d, h);
                continue;
            }
            if height.contains_key(&d) {
                continue;
            }
            let subdirs = children(&d)?;
            let todo: Vec<_> = subdirs
                .iter()
                .filter(|c| !height.contains_key(*c))
                .map(|c| (*c, None))
                .collect();
            stack.push((d, Some(subdirs)));
            on_path += 1;
            // A chain deeper than the limit is refused before it is walked out.
            if on_path > limit + 1 {
                return Err(too_deep());
            }
            stack.extend(todo);
        }
    }
    Ok(())
}

/// The digests of the directories `dir` names.
pub fn subdirectories(dir: &Directory) -> Vec<Digest> {
    dir.entries()
        .filter_map(|(_, n)| match n {
            Node::Directory { digest, .. } => Some(*digest),
            _ => None,
        })
        .collect()
}

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
        // A stored name may be one a build chose: shown escaped.
        walked.push_str(&crate::shown::escaped(comp));
        node = dir.get(comp).cloned().ok_or_else(|| Error::BadTreePath {
            path: walked.clone(),
            reason: "no such file or directory in the tree".into(),
        })?;
    }
    Ok(node)
}

/// Stored trees made object by object, for tests.
#[cfg(test)]
pub(crate) mod test_trees {
    use crate::store::{DirectoryStore, LocalStore};
    use crate::{Digest, Directory, Name, Node};

    /// A directory holding `child` under each of `names`, and the blob
    /// `file` (1 byte, whether stored or not) as `f` if given.
    pub(crate) fn holding(
        s: &LocalStore,
        child: Option<Digest>,
        names: &[&str],
        file: Option<Digest>,
    ) -> Digest {
        let mut d = Directory::new();
        if let Some(c) = child {
            let size = s.get_directory(&c).unwrap().size();
            for n in names {
                d.insert(
                    Name::new(n.as_bytes()).unwrap(),
                    Node::Directory { digest: c, size },
                )
                .unwrap();
            }
        }
        if let Some(f) = file {
            d.insert(
                Name::new(b"f").unwrap(),
                Node::File {
                    digest: f,
                    size: 1,
                    executable: false,
                },
            )
            .unwrap();
        }
        s.put_directory(&d).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;
    use test_trees::holding;

    #[test]
    fn a_chain_past_the_limit_is_refused_and_one_at_it_taken() {
        let t = tempfile::tempdir().unwrap();
        let s = LocalStore::open(t.path()).unwrap();
        let mut top = holding(&s, None, &[], None);
        for _ in 0..100 {
            top = holding(&s, Some(top), &["d"], None);
        }
        check_depth(&s, &top, 100).unwrap();
        let err = check_depth(&s, &top, 99).unwrap_err().to_string();
        assert!(err.contains("more than 99 deep"), "{err}");
        // Far past the limit, refused without walking it out.
        for _ in 0..2_000 {
            top = holding(&s, Some(top), &["d"], None);
        }
        assert!(check_depth(&s, &top, 1024).is_err());
    }

    /// A directory given by the closure over a chain in the store counts
    /// the chain's height; each directory is asked for once across roots.
    #[test]
    fn depth_with_counts_what_lies_below_in_the_store_once() {
        let t = tempfile::tempdir().unwrap();
        let s = LocalStore::open(t.path()).unwrap();
        let mut top = holding(&s, None, &[], None);
        for _ in 0..10 {
            top = holding(&s, Some(top), &["d"], None);
        }
        // Two directories not in the store, each naming the chain's top.
        let (a, b) = (Digest::of(b"received a"), Digest::of(b"received b"));
        let mut asked: HashMap<Digest, usize> = HashMap::new();
        let mut children = |d: &Digest| {
            *asked.entry(*d).or_default() += 1;
            if *d == a || *d == b {
                Ok(vec![top])
            } else {
                Ok(subdirectories(&s.get_directory(d)?))
            }
        };
        check_depth_with([a, b], 11, &mut children).unwrap();
        assert!(asked.values().all(|n| *n == 1), "{asked:?}");
        assert_eq!(asked.len(), 13);
        let err = check_depth_with([top, b], 10, |d: &Digest| {
            if *d == b {
                Ok(vec![top])
            } else {
                Ok(subdirectories(&s.get_directory(d)?))
            }
        })
        .unwrap_err();
        assert!(
            matches!(err, Error::TreeTooDeep { root, .. } if root == b),
            "{err}"
        );
    }

    /// A stored name a build chose (an escape sequence) reaches no message
    /// raw: not a lookup's path, not an I/O error's.
    #[test]
    fn names_in_errors_are_escaped() {
        let t = tempfile::tempdir().unwrap();
        let s = LocalStore::open(t.path()).unwrap();
        let leaf = holding(&s, None, &[], Some(Digest::of(b"x")));
        let top = holding(&s, Some(leaf), &["\x1b]52;c;x\x07"], None);
        let err = lookup(&s, &top, "\x1b]52;c;x\x07/f/deeper")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\\x1b]52;c;x\\x07/f") && !err.contains('\x1b'),
            "{err}"
        );
        let io = crate::error::io("open", "/out/\x1b[2J")(std::io::Error::other("gone"));
        let shown = io.to_string();
        assert!(
            shown.contains("\\x1b[2J") && !shown.contains('\x1b'),
            "{shown}"
        );
    }

    /// Sixty levels of two names each for the same child: 2^60 paths, 61
    /// objects, each visited once.
    #[test]
    fn a_wide_dag_costs_its_objects_not_its_paths() {
        let t = tempfile::tempdir().unwrap();
        let s = LocalStore::open(t.path()).unwrap();
        let mut top = holding(&s, None, &[], None);
        for _ in 0..60 {
            top = holding(&s, Some(top), &["a", "b"], None);
        }
        check_depth(&s, &top, 60).unwrap();
        assert!(check_depth(&s, &top, 59).is_err());
    }
}
