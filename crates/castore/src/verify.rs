//! Re-hashing what the store holds and reporting, by path, every object that
//! is corrupt or missing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::path::PathBuf;

use rayon::prelude::*;

use crate::store::{DirectoryStore, LocalStore, ObjectKind};
use crate::{Digest, Directory, Error, Node, Progress, Result};

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// `corrupt` (bytes don't match the name), `invalid` (a directory that
    /// does not decode) or `missing` (referenced but absent).
    pub kind: &'static str,
    pub object: Digest,
    /// Where in which tree it is used: `b3:<root>/path`.
    pub used_at: Vec<String>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    pub blobs_checked: u64,
    pub directories_checked: u64,
    pub bytes_checked: u64,
    pub problems: Vec<Problem>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

fn list(store: &LocalStore, kind: ObjectKind) -> Result<Vec<(Digest, PathBuf)>> {
    let base = store.root().join(kind.dir_name());
    let mut out = Vec::new();
    for shard in fs::read_dir(&base)
        .map_err(crate::error::io("read", &base))?
        .flatten()
    {
        for e in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
            let name = e.file_name();
            let digest = name
                .to_str()
                .and_then(|h| format!("b3:{h}").parse::<Digest>().ok());
            if let Some(d) = digest {
                out.push((d, e.path()));
            }
        }
    }
    Ok(out)
}

/// Every object kept by the store, for gc.
pub(crate) fn all_objects(store: &LocalStore, kind: ObjectKind) -> Result<Vec<(Digest, PathBuf)>> {
    list(store, kind)
}

/// Verify the whole store (`root = None`) or one tree.
pub fn verify(
    store: &LocalStore,
    root: Option<&Digest>,
    progress: &dyn Progress,
) -> Result<Report> {
    match root {
        None => verify_all(store, progress),
        Some(r) => verify_tree(store, r, progress),
    }
}

fn verify_all(store: &LocalStore, progress: &dyn Progress) -> Result<Report> {
    let blobs = list(store, ObjectKind::Blob)?;
    let dirs = list(store, ObjectKind::Directory)?;
    let mut report = Report::default();
    // Hash every blob on all cores.
    let bad_blobs: Vec<(Digest, u64, bool)> = blobs
        .par_iter()
        .map(|(d, p)| match LocalStore::hash_file(p) {
            Ok((actual, len)) => {
                progress.advance(1, len);
                (*d, len, actual != *d)
            }
            Err(_) => (*d, 0, true),
        })
        .collect();
    report.blobs_checked = bad_blobs.len() as u64;
    report.bytes_checked = bad_blobs.iter().map(|b| b.1).sum();
    let corrupt: HashSet<Digest> = bad_blobs.iter().filter(|b| b.2).map(|b| b.0).collect();
    // Decode every directory (which verifies its digest and validity).
    let mut decoded: HashMap<Digest, Directory> = HashMap::new();
    let mut bad_dirs: BTreeMap<Digest, &'static str> = BTreeMap::new();
    for (d, _) in &dirs {
        match store.get_directory(d) {
            Ok(dir) => {
                decoded.insert(*d, dir);
            }
            Err(Error::Corrupt { .. }) => {
                bad_dirs.insert(*d, "corrupt");
            }
            Err(_) => {
                bad_dirs.insert(*d, "invalid");
            }
        }
        progress.advance(1, 0);
    }
    report.directories_checked = dirs.len() as u64;
    // Name the paths: walk from every directory no other directory refers to.
    let mut referenced = HashSet::new();
    for dir in decoded.values() {
        for (_, n) in dir.entries() {
            if let Node::Directory { digest, .. } = n {
                referenced.insert(*digest);
            }
        }
    }
    let roots: BTreeSet<Digest> = decoded
        .keys()
        .chain(bad_dirs.keys())
        .filter(|d| !referenced.contains(*d))
        .copied()
        .collect();
    let mut problems: BTreeMap<(Digest, &'static str), Vec<String>> = BTreeMap::new();
    for d in &corrupt {
        problems.entry((*d, "corrupt")).or_default();
    }
    for (d, k) in &bad_dirs {
        problems.entry((*d, *k)).or_default();
    }
    let all_blobs: HashSet<Digest> = blobs.iter().map(|b| b.0).collect();
    let mut visited = HashSet::new();
    for r in &roots {
        let mut ctx = Walk {
            decoded: &decoded,
            bad_dirs: &bad_dirs,
            corrupt: &corrupt,
            present_blobs: &all_blobs,
            problems: &mut problems,
            visited: &mut visited,
        };
        ctx.walk(r);
    }
    report.problems = problems
        .into_iter()
        .map(|((object, kind), used_at)| Problem {
            kind,
            object,
            used_at,
        })
        .collect();
    Ok(report)
}

struct Walk<'a> {
    decoded: &'a HashMap<Digest, Directory>,
    bad_dirs: &'a BTreeMap<Digest, &'static str>,
    corrupt: &'a HashSet<Digest>,
    present_blobs: &'a HashSet<Digest>,
    problems: &'a mut BTreeMap<(Digest, &'static str), Vec<String>>,
    /// Directories already walked, from any root.
    visited: &'a mut HashSet<Digest>,
}

impl Walk<'_> {
    /// Walk the tree `root`, each distinct directory once (see [`Named`]),
    /// noting where each bad object is used.
    fn walk(&mut self, root: &Digest) {
        let mut named = Named::new(root);
        let mut stack = vec![(*root, 0)];
        while let Some((d, at)) = stack.pop() {
            if !self.visited.insert(d) {
                continue;
            }
            let Some(dir) = self.decoded.get(&d) else {
                let kind = self.bad_dirs.get(&d).copied().unwrap_or("missing");
                self.problems
                    .entry((d, kind))
                    .or_default()
                    .push(named.path(at, None));
                continue;
            };
            for (name, node) in dir.entries() {
                match node {
                    Node::Directory { digest, .. } if !self.visited.contains(digest) => {
                        stack.push((*digest, named.child(at, name)));
                    }
                    Node::File { digest, .. } => {
                        let kind = if self.corrupt.contains(digest) {
                            "corrupt"
                        } else if !self.present_blobs.contains(digest) {
                            "missing"
                        } else {
                            continue;
                        };
                        self.problems
                            .entry((*digest, kind))
                            .or_default()
                            .push(named.path(at, Some(name)));
                    }
                    _ => {}
                }
            }
        }
    }
}

/// How each directory of a walk was first reached: its parent's place and
/// its name, so a path is spelled only for what is reported. A tree's
/// depth costs a name per directory, not a path per directory; and a
/// directory reached by many paths (a stored tree is a DAG: k objects can
/// spell 2^k paths) is walked, and named, once.
struct Named {
    /// `(parent, name)`; the root's entry holds its digest as its name.
    reached: Vec<(usize, String)>,
}

impl Named {
    /// The most of a path a report spells out.
    const SHOWN: usize = 400;

    fn new(root: &Digest) -> Named {
        Named {
            reached: vec![(usize::MAX, root.to_string())],
        }
    }

    /// The place of `name` below the directory at `parent`.
    fn child(&mut self, parent: usize, name: &crate::Name) -> usize {
        self.reached.push((parent, name.to_string()));
        self.reached.len() - 1
    }

    /// The path of the directory at `at` (and of `leaf` in it), from its
    /// root, cut after [`Named::SHOWN`] bytes.
    fn path(&self, at: usize, leaf: Option<&crate::Name>) -> String {
        let mut names = Vec::new();
        let mut i = at;
        while let Some((parent, name)) = self.reached.get(i) {
            names.push(name.as_str());
            i = *parent;
        }
        let leaf = leaf.map(|l| l.to_string());
        let mut path = String::new();
        for n in names.into_iter().rev().chain(leaf.as_deref()) {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(n);
            if path.len() > Self::SHOWN {
                let mut cut = Self::SHOWN;
                while !path.is_char_boundary(cut) {
                    cut -= 1;
                }
                path.truncate(cut);
                path.push('…');
                break;
            }
        }
        path
    }
}

fn verify_tree(store: &LocalStore, root: &Digest, progress: &dyn Progress) -> Result<Report> {
    // Collect the tree's objects, then check blobs in parallel.
    let mut dirs = Vec::new();
    let mut files: BTreeMap<Digest, Vec<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut named = Named::new(root);
    let mut stack = vec![(*root, 0)];
    let mut seen = HashSet::new();
    while let Some((d, at)) = stack.pop() {
        if !seen.insert(d) {
            continue;
        }
        match store.get_directory(&d) {
            Ok(dir) => {
                dirs.push(d);
                for (name, node) in dir.entries() {
                    match node {
                        Node::Directory { digest, .. } if !seen.contains(digest) => {
                            stack.push((*digest, named.child(at, name)));
                        }
                        Node::File { digest, .. } => {
                            files
                                .entry(*digest)
                                .or_default()
                                .push(named.path(at, Some(name)));
                        }
                        _ => {}
                    }
                }
            }
            Err(e) => problems.push(Problem {
                kind: match e {
                    Error::Missing { .. } => "missing",
                    Error::Corrupt { .. } => "corrupt",
                    _ => "invalid",
                },
                object: d,
                used_at: vec![named.path(at, None)],
            }),
        }
        progress.advance(1, 0);
    }
    let checked: Vec<(Digest, u64, Option<&'static str>)> = files
        .keys()
        .collect::<Vec<_>>()
        .par_iter()
        .map(|d| {
            let p = store.object_path(ObjectKind::Blob, d);
            match LocalStore::hash_file(&p) {
                Ok((actual, len)) => {
                    progress.advance(1, len);
                    (**d, len, (actual != **d).then_some("corrupt"))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (**d, 0, Some("missing")),
                Err(_) => (**d, 0, Some("corrupt")),
            }
        })
        .collect();
    let mut report = Report {
        blobs_checked: checked.len() as u64,
        directories_checked: dirs.len() as u64,
        bytes_checked: checked.iter().map(|c| c.1).sum(),
        problems,
    };
    for (d, _, bad) in checked {
        if let Some(kind) = bad {
            let mut used_at = files.remove(&d).unwrap_or_default();
            used_at.sort();
            report.problems.push(Problem {
                kind,
                object: d,
                used_at,
            });
        }
    }
    report.problems.sort_by(|a, b| a.used_at.cmp(&b.used_at));
    Ok(report)
}

#[cfg(test)]
mod bounded {
    use super::*;
    use crate::walk::test_trees::holding;

    /// A chain 3,000 deep and a DAG of 2^60 paths, each with a missing
    /// blob at the bottom: verified with the store's own stack, each
    /// directory once, the blob reported at one shortened path.
    #[test]
    fn deep_chains_and_wide_dags_are_verified_by_their_objects() {
        let t = tempfile::tempdir().unwrap();
        let s = LocalStore::open(t.path()).unwrap();
        let absent = Digest::of(b"never stored");
        let mut chain = holding(&s, None, &[], Some(absent));
        for _ in 0..3_000 {
            chain = holding(&s, Some(chain), &["d"], None);
        }
        let r = verify(&s, Some(&chain), &()).unwrap();
        assert_eq!(r.directories_checked, 3_001);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(r.problems[0].used_at[0].len() < 500);
        let mut dag = holding(&s, None, &[], Some(absent));
        for _ in 0..60 {
            dag = holding(&s, Some(dag), &["a", "b"], None);
        }
        let r = verify(&s, Some(&dag), &()).unwrap();
        assert_eq!(r.directories_checked, 61);
        let all = verify(&s, None, &()).unwrap();
        assert_eq!(all.problems.len(), 1, "{:?}", all.problems);
    }
}
