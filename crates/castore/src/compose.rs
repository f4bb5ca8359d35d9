//! Composition: an ordered list of atom roots merged into one FHS tree.
//!
//! Identical entries merge, directories merge recursively, and any other
//! clash is an error naming the path and both atoms. The result remembers
//! who supplied what in a [`CompositionMap`], stored as a blob and indexed by
//! the composed root's digest, so a read of the composed tree can be charged
//! to its atom.
//!
//! The map is prefix-compressed: a subtree that only one atom supplies is one
//! entry, not one per file, so the map of a composition stays small even for
//! large atoms. [`CompositionMap::owners`] resolves a path by its longest
//! recorded prefix.

use std::collections::BTreeMap;
use std::fs;

use crate::error::io;
use crate::store::{BlobStore, DirectoryStore, LocalStore, Txn};
use crate::{Digest, Directory, Error, Name, Node, Result};

/// A stored composition: its root, its atoms in order, and its map blob.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Composition {
    pub root: Digest,
    pub atoms: Vec<Digest>,
    pub map: Digest,
}

/// Which atoms supplied each path of a composed tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompositionMap {
    /// Path (no leading slash; "" is the root) → indices into `atoms`.
    entries: BTreeMap<String, Vec<u32>>,
}

impl CompositionMap {
    /// The atoms (as indices) that supplied `path`: those recorded for its
    /// longest recorded prefix.
    pub fn owners(&self, path: &str) -> &[u32] {
        let mut p = path.trim_matches('/');
        loop {
            if let Some(o) = self.entries.get(p) {
                return o;
            }
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None if !p.is_empty() => p = "",
                None => return &[],
            }
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &[u32])> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// One line per entry: `i[,j…]<TAB>path`, path bytes `%`-escaped where
    /// they are `%`, control characters or not UTF-8.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = String::new();
        for (path, owners) in &self.entries {
            let o: Vec<String> = owners.iter().map(|i| i.to_string()).collect();
            out.push_str(&o.join(","));
            out.push('\t');
            out.push_str(path);
            out.push('\n');
        }
        out.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = || Error::InvalidDirectory("malformed composition map".into());
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let mut entries = BTreeMap::new();
        for line in text.lines() {
            let (o, path) = line.split_once('\t').ok_or_else(bad)?;
            let owners = o
                .split(',')
                .map(|i| i.parse::<u32>().map_err(|_| bad()))
                .collect::<Result<Vec<_>>>()?;
            entries.insert(path.to_owned(), owners);
        }
        Ok(CompositionMap { entries })
    }
}

/// Escape a name for a map path: `%`, control bytes and invalid UTF-8 as `%XX`.
pub fn escape_name(name: &[u8]) -> String {
    let mut out = String::new();
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '%' || c.is_control() {
                let mut b = [0u8; 4];
                for byte in c.encode_utf8(&mut b).bytes() {
                    out.push_str(&format!("%{byte:02X}"));
                }
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn join(prefix: &str, name: &Name) -> String {
    let n = escape_name(name.as_bytes());
    if prefix.is_empty() {
        n
    } else {
        format!("{prefix}/{n}")
    }
}

/// Compose `atoms` (directory digests, in order) into one tree, store it and
/// its map, and return the composition.
pub fn compose(store: &LocalStore, atoms: &[Digest]) -> Result<Composition> {
    let key = atoms_key(atoms);
    if let Some(c) = remembered(store, &key, atoms) {
        return Ok(c);
    }
    let mut roots = Vec::with_capacity(atoms.len());
    for (i, a) in atoms.iter().enumerate() {
        roots.push((i as u32, store.get_directory(a)?));
    }
    let txn = store.txn()?;
    let mut map = CompositionMap::default();
    let dir = merge(store, &txn, atoms, roots, "", &mut map)?;
    let root = txn.put_directory(&dir)?;
    let map_blob = txn.put_blob(&map.encode())?;
    let c = Composition {
        root,
        atoms: atoms.to_vec(),
        map: map_blob,
    };
    let rec = serde_json::to_vec_pretty(&c).map_err(|e| Error::InvalidDirectory(e.to_string()))?;
    let dest = composition_path(store, &root);
    // The same composition again (every rebuild of an action) changes
    // nothing: leave the record alone so the commit has nothing to flush.
    if fs::read(&dest).ok().as_deref() != Some(rec.as_slice()) {
        txn.put_record(&dest, &rec)?;
    }
    txn.commit()?;
    // Merging is a pure function of the atoms (see `store::memo`).
    let _ = store.remember(MEMO, &key, &rec);
    Ok(c)
}

/// Each tree of `lowers` without what the tree `upper` holds: where both
/// have a directory, its entries are shadowed in turn; any other entry of
/// `upper` removes the lower tree's of that name (and all below it).
/// Composed together, `upper` and the results never clash, and every path
/// resolves as in `upper` over `lowers` — how a client's input root sits
/// over a toolchain's atoms and takes precedence. Only directories both
/// have are read and rewritten; the rest is shared by digest, and a lower
/// tree that `upper` does not touch comes back as it is.
///
/// Recursive, over the directories the trees share only: as deep as the
/// shallower, and the lower trees are a toolchain its operator made.
pub fn shadowed(store: &LocalStore, lowers: &[Digest], upper: &Digest) -> Result<Vec<Digest>> {
    // A pure function of the trees (see `store::memo`), remembered for the
    // whole list: a worker asks it again for every action on the same
    // input root, one recall rather than one per atom.
    let mut trees = vec![*upper];
    trees.extend_from_slice(lowers);
    let key = atoms_key(&trees);
    let recalled = store.recall(SHADOWED, &key).and_then(|b| {
        let text = String::from_utf8(b).ok()?;
        let ds: Vec<Digest> = text
            .lines()
            .map(|l| l.parse().ok())
            .collect::<Option<_>>()?;
        let whole =
            ds.len() == lowers.len() && ds.iter().all(|d| store.has_directory(d).unwrap_or(false));
        whole.then_some(ds)
    });
    if let Some(ds) = recalled {
        return Ok(ds);
    }
    let txn = store.txn()?;
    let mut out = Vec::with_capacity(lowers.len());
    for lower in lowers {
        out.push(shadow(store, &txn, lower, upper)?.0);
    }
    txn.commit()?;
    let answer: Vec<String> = out.iter().map(Digest::to_string).collect();
    let _ = store.remember(SHADOWED, &key, answer.join("\n").as_bytes());
    Ok(out)
}

/// The memos of [`shadowed`].
const SHADOWED: &str = "shadowed";

/// [`shadowed`] of one directory: its digest and size.
fn shadow(
    store: &LocalStore,
    txn: &Txn<'_>,
    lower: &Digest,
    upper: &Digest,
) -> Result<(Digest, u64)> {
    let low = store.get_directory(lower)?;
    let up = store.get_directory(upper)?;
    let mut out = Directory::new();
    let mut changed = false;
    for (name, node) in low.entries() {
        let kept = match (node, up.get(name.as_bytes())) {
            (_, None) => Some(node.clone()),
            (Node::Directory { digest, .. }, Some(Node::Directory { digest: u, .. })) => {
                let (d, size) = shadow(store, txn, digest, u)?;
                changed |= d != *digest;
                Some(Node::Directory { digest: d, size })
            }
            (_, Some(_)) => None,
        };
        match kept {
            Some(n) => out.insert(name.clone(), n)?,
            None => changed = true,
        }
    }
    if !changed {
        return Ok((*lower, low.size()));
    }
    let size = out.size();
    Ok((txn.put_directory(&out)?, size))
}

/// The memos of compositions (see `store::memo`).
const MEMO: &str = "composition";

/// The memo key of `atoms`, in this order.
fn atoms_key(atoms: &[Digest]) -> Digest {
    let mut key = Vec::with_capacity(atoms.len() * 32);
    for a in atoms {
        key.extend_from_slice(a.as_bytes());
    }
    Digest::of(&key)
}

/// The composition remembered for `key`, if it is of `atoms` and the store
/// still holds its tree's root, its map and its record.
/// The record indexed by the root must be this very composition's: the
/// same root composed from the atoms in another order since has another
/// map, and the last composition's record is the one kept.
fn remembered(store: &LocalStore, key: &Digest, atoms: &[Digest]) -> Option<Composition> {
    let memo = store.recall(MEMO, key)?;
    let c: Composition = serde_json::from_slice(&memo).ok()?;
    let whole = c.atoms == atoms
        && store.has_directory(&c.root).ok()?
        && store.has_blob(&c.map).ok()?
        && fs::read(composition_path(store, &c.root)).ok()? == memo;
    whole.then_some(c)
}

pub(crate) fn composition_path(store: &LocalStore, root: &Digest) -> std::path::PathBuf {
    store.root().join("compositions").join(root.hex())
}

/// The compositions recorded for `root` (none if `root` was never composed).
pub fn load_composition(
    store: &LocalStore,
    root: &Digest,
) -> Result<Option<(Composition, CompositionMap)>> {
    let p = composition_path(store, root);
    let bytes = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read", &p)(e)),
    };
    let c: Composition = serde_json::from_slice(&bytes)
        .map_err(|e| Error::InvalidDirectory(format!("composition record {}: {e}", p.display())))?;
    let mut r = store.open_blob(&c.map)?;
    let mut buf = Vec::new();
    std::io::Read::read_to_end(&mut r, &mut buf).map_err(io("read", &p))?;
    let map = CompositionMap::decode(&buf)?;
    Ok(Some((c, map)))
}

fn merge(
    store: &LocalStore,
    txn: &Txn<'_>,
    atoms: &[Digest],
    dirs: Vec<(u32, Directory)>,
    path: &str,
    map: &mut CompositionMap,
) -> Result<Directory> {
    map.entries
        .insert(path.to_owned(), dirs.iter().map(|(i, _)| *i).collect());
    let mut by_name: BTreeMap<&Name, Vec<(u32, &Node)>> = BTreeMap::new();
    for (i, d) in &dirs {
        for (name, node) in d.entries() {
            by_name.entry(name).or_default().push((*i, node));
        }
    }
    let mut out = Directory::new();
    for (name, nodes) in by_name {
        let p = join(path, name);
        let (first_atom, first) = nodes[0];
        if nodes.len() == 1 {
            map.entries.insert(p, vec![first_atom]);
            out.insert(name.clone(), first.clone())?;
            continue;
        }
        let all_dirs = nodes
            .iter()
            .all(|(_, n)| matches!(n, Node::Directory { .. }));
        if all_dirs {
            let mut sub = Vec::with_capacity(nodes.len());
            for (i, n) in &nodes {
                if let Some(d) = n.digest() {
                    sub.push((*i, store.get_directory(d).map_err(|e| e.at_path(&p))?));
                }
            }
            let merged = merge(store, txn, atoms, sub, &p, map)?;
            out.insert(
                name.clone(),
                Node::Directory {
                    size: merged.size(),
                    digest: txn.put_directory(&merged)?,
                },
            )?;
            continue;
        }
        if let Some((second_atom, second)) = nodes.iter().find(|(_, n)| *n != first) {
            return Err(Error::ComposeClash(Box::new(crate::error::Clash {
                path: p,
                first: atoms[first_atom as usize],
                first_kind: first.describe(),
                second: atoms[*second_atom as usize],
                second_kind: second.describe(),
            })));
        }
        map.entries
            .insert(p, nodes.iter().map(|(i, _)| *i).collect());
        out.insert(name.clone(), first.clone())?;
    }
    Ok(out)
}
