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
    for r in &roots {
        let mut ctx = Walk {
            decoded: &decoded,
            bad_dirs: &bad_dirs,
            corrupt: &corrupt,
            present_blobs: &all_blobs,
            problems: &mut problems,
        };
        ctx.walk(r, &format!("{r}"));
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
}

impl Walk<'_> {
    fn walk(&mut self, d: &Digest, at: &str) {
        let Some(dir) = self.decoded.get(d) else {
            let kind = self.bad_dirs.get(d).copied().unwrap_or("missing");
            self.problems
                .entry((*d, kind))
                .or_default()
                .push(at.to_owned());
            return;
        };
        for (name, node) in dir.entries() {
            let p = format!("{at}/{name}");
            match node {
                Node::Directory { digest, .. } => self.walk(digest, &p),
                Node::File { digest, .. } => {
                    if self.corrupt.contains(digest) {
                        self.problems
                            .entry((*digest, "corrupt"))
                            .or_default()
                            .push(p);
                    } else if !self.present_blobs.contains(digest) {
                        self.problems
                            .entry((*digest, "missing"))
                            .or_default()
                            .push(p);
                    }
                }
                Node::Symlink { .. } => {}
            }
        }
    }
}

fn verify_tree(store: &LocalStore, root: &Digest, progress: &dyn Progress) -> Result<Report> {
    // Collect the tree's objects, then check blobs in parallel.
    let mut dirs = Vec::new();
    let mut files: BTreeMap<Digest, Vec<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut stack = vec![(*root, root.to_string())];
    let mut seen = HashSet::new();
    while let Some((d, at)) = stack.pop() {
        match store.get_directory(&d) {
            Ok(dir) => {
                if seen.insert(d) {
                    dirs.push(d);
                }
                for (name, node) in dir.entries() {
                    let p = format!("{at}/{name}");
                    match node {
                        Node::Directory { digest, .. } => stack.push((*digest, p)),
                        Node::File { digest, .. } => files.entry(*digest).or_default().push(p),
                        Node::Symlink { .. } => {}
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
                used_at: vec![at],
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
