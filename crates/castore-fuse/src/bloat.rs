//! Closure bloat: which declared atoms (and which of their largest paths) a
//! build never touched, from its read set and the view's composition map.

use std::collections::{HashMap, HashSet};

use castore::compose::{escape_name, load_composition};
use castore::store::{DirectoryStore, LocalStore};
use castore::{Digest, Node};
use serde::Serialize;

use crate::readset::{EntryKind, ReadSet};
use crate::{Error, Result};

/// One atom's share of a view: what it declared and what of it was used.
#[derive(Debug, Clone, Serialize)]
pub struct AtomUsage {
    /// Position in the composition (0 is the first atom given to compose).
    pub index: u32,
    pub atom: Digest,
    /// Files and symlinks the atom supplies, and their bytes.
    pub declared_files: u64,
    pub declared_bytes: u64,
    /// Read-set entries charged to this atom (any access, directories it
    /// alone supplies included).
    pub observed_entries: u64,
    pub read_files: u64,
    pub read_bytes: u64,
    pub unread_files: u64,
    pub unread_bytes: u64,
    /// The largest never-observed files, largest first: `(path, bytes)`.
    pub largest_unread: Vec<(String, u64)>,
}

impl AtomUsage {
    /// Declared but never read: nothing it supplied was observed.
    pub fn unused(&self) -> bool {
        self.observed_entries == 0
    }
}

/// `declared − read`, per atom.
#[derive(Debug, Clone, Serialize)]
pub struct BloatReport {
    pub root: Digest,
    pub read_set_entries: u64,
    /// In composition order.
    pub atoms: Vec<AtomUsage>,
}

impl BloatReport {
    /// The atoms nothing was read from.
    pub fn unused_atoms(&self) -> impl Iterator<Item = &AtomUsage> {
        self.atoms.iter().filter(|a| a.unused())
    }
}

/// Charge every entry of `rs` to the atoms that supplied it and report, per
/// atom, what was declared but never read. `top` bounds `largest_unread`.
pub fn closure_bloat(store: &LocalStore, rs: &ReadSet, top: usize) -> Result<BloatReport> {
    let (comp, map) = load_composition(store, &rs.root)?.ok_or(Error::NotComposed(rs.root))?;
    let mut charged: HashMap<u32, (u64, HashSet<&str>)> = HashMap::new();
    for e in &rs.entries {
        let p = e.map_path();
        let owners = map.owners(p);
        match e.kind {
            EntryKind::Absent => {}
            // A directory shared by several atoms says nothing about any one
            // of them; one that a single atom supplies is that atom's.
            EntryKind::Dir if owners.len() != 1 => {}
            EntryKind::Dir => charged.entry(owners[0]).or_default().0 += 1,
            EntryKind::File | EntryKind::Exe | EntryKind::Symlink => {
                for o in owners {
                    let c = charged.entry(*o).or_default();
                    c.0 += 1;
                    c.1.insert(p);
                }
            }
        }
    }
    let mut atoms = Vec::with_capacity(comp.atoms.len());
    for (i, atom) in comp.atoms.iter().enumerate() {
        let i = i as u32;
        let mut files = Vec::new();
        walk(store, atom, String::new(), &mut files)?;
        let empty = (0, HashSet::new());
        let (observed, read) = charged.get(&i).unwrap_or(&empty);
        let mut u = AtomUsage {
            index: i,
            atom: *atom,
            declared_files: files.len() as u64,
            declared_bytes: files.iter().map(|(_, s)| s).sum(),
            observed_entries: *observed,
            read_files: 0,
            read_bytes: 0,
            unread_files: 0,
            unread_bytes: 0,
            largest_unread: Vec::new(),
        };
        let mut unread = Vec::new();
        for (p, size) in files {
            if read.contains(p.as_str()) {
                u.read_files += 1;
                u.read_bytes += size;
            } else {
                u.unread_files += 1;
                u.unread_bytes += size;
                unread.push((p, size));
            }
        }
        unread.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        unread.truncate(top);
        u.largest_unread = unread
            .into_iter()
            .map(|(p, s)| (format!("/{p}"), s))
            .collect();
        atoms.push(u);
    }
    Ok(BloatReport {
        root: rs.root,
        read_set_entries: rs.entries.len() as u64,
        atoms,
    })
}

/// Every file and symlink below `dir`, as map paths with byte sizes.
fn walk(
    store: &LocalStore,
    dir: &Digest,
    prefix: String,
    out: &mut Vec<(String, u64)>,
) -> Result<()> {
    let d = store.get_directory(dir).map_err(|e| e.at_path(&prefix))?;
    for (name, node) in d.entries() {
        let esc = escape_name(name.as_bytes());
        let p = if prefix.is_empty() {
            esc
        } else {
            format!("{prefix}/{esc}")
        };
        match node {
            Node::Directory { digest, .. } => walk(store, digest, p, out)?,
            Node::File { size, .. } => out.push((p, *size)),
            Node::Symlink { target } => out.push((p, target.as_bytes().len() as u64)),
        }
    }
    Ok(())
}
