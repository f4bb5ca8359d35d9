//! Closure bloat acted on: an action pruned to what its build read.
//!
//! From a record, its stored action (kept under the action digest) and its
//! read set, [`prune`] writes the same action — command, env, source,
//! outputs, limits, network — with a smaller root:
//!
//! - [`PruneMode::Atoms`]: `closure` and `toolchain` keep only the atoms
//!   the read set touched. An atom is touched if it supplied a file or
//!   symlink the build observed, or a directory only it supplies. A
//!   directory several atoms supply says nothing about any one of them, so
//!   if none of its suppliers is kept otherwise the first one is, lest the
//!   directory vanish. Absences need nothing: removing atoms cannot make an
//!   absent path present.
//! - [`PruneMode::Paths`]: one synthetic atom holding exactly the observed
//!   files, symlinks and directories, plus the entries of every listed
//!   directory (so listings are unchanged), and nothing else.
//!
//! Either way the pruned view answers every observation of the read set as
//! the original did, so a hermetic build gives bit-identical outputs in it:
//! `--prove` rebuilds and checks that. A difference means the build saw
//! something the read set did not record — a containment bug to
//! investigate (docs/DESIGN.md).
//!
//! A pruned build that fails is as much a finding as one whose outputs
//! differ. A replay action's lock is written beside the pruned action. The
//! closure-bloat report lists, per atom, files and bytes read, sorted by
//! bytes never read.

use std::collections::{BTreeMap, BTreeSet};

use castore::compose::load_composition;
use castore::store::{DirectoryStore, LocalStore};
use castore::{Digest, Directory, Name, Node};
use castore_fuse::{Access, EntryKind, ReadSet};
use executor_core::{Action, NetworkMode};

use crate::{sign, Error};

/// How far to prune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneMode {
    Atoms,
    Paths,
}

/// A pruned action.
#[derive(Debug, Clone)]
pub struct Pruned {
    pub action: Action,
    /// The record it was pruned from.
    pub from: Digest,
    /// Atoms in the original closure and toolchain, and in the pruned ones.
    pub atoms_before: usize,
    pub atoms_after: usize,
    /// The fetch lock's bytes, for an action with network.
    pub lock: Option<Vec<u8>>,
}

/// The action a record was built from (stored under the action digest).
pub fn recorded_action(
    store: &LocalStore,
    record: &executor_core::BuildRecord,
) -> Result<Action, Error> {
    stored_action(store, record).map(|(action, _)| action)
}

/// The command digest a build indexed `record` under: its stored action's,
/// with the lock that action replays — the digest stored with it, which is
/// the one the build resolved (`build.rs`, `resolve`), and which the
/// action digest covers.
pub fn recorded_command(
    store: &LocalStore,
    record: &executor_core::BuildRecord,
) -> Result<Digest, Error> {
    let (action, lock) = stored_action(store, record)?;
    let lock = lock.filter(|_| action.network.mode == NetworkMode::Replay);
    Ok(action.command_digest(lock.as_ref()))
}

/// The stored action and the lock digest stored in it (read once).
fn stored_action(
    store: &LocalStore,
    record: &executor_core::BuildRecord,
) -> Result<(Action, Option<Digest>), Error> {
    let bytes = store.read_blob(&record.action_digest).map_err(|e| {
        Error::Usage(format!(
            "the record's action {} is not in the store ({}); only records of this fhsx keep their action",
            record.action_digest,
            castore::Chain(&e)
        ))
    })?;
    let mut v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::BadRecord(format!("the stored action is not JSON: {e}")))?;
    let lock = match v
        .get_mut("network")
        .and_then(|n| n.as_object_mut())
        .and_then(|net| net.remove("lock_digest"))
    {
        None => None,
        Some(d) => Some(d.as_str().and_then(|s| s.parse().ok()).ok_or_else(|| {
            Error::BadRecord("the stored action's network.lock_digest is not a digest".into())
        })?),
    };
    let action = serde_json::from_value(v)
        .map_err(|e| Error::BadRecord(format!("the stored action does not parse: {e}")))?;
    Ok((action, lock))
}

/// Prune the action of record `from` to its read set.
pub fn prune(store: &LocalStore, from: &Digest, mode: PruneMode) -> Result<Pruned, Error> {
    let rec = sign::load_record(store, from)?.record;
    if !rec.succeeded() {
        return Err(Error::Usage(format!(
            "record {from} is of a failed build: only a successful build's read set says what it needs"
        )));
    }
    let mut action = recorded_action(store, &rec)?;
    let rs = ReadSet::load(store, &rec.observed_read_set_digest).map_err(|e| {
        Error::Other(format!(
            "reading the read set of {from}: {}",
            castore::Chain(&e)
        ))
    })?;
    let before = action.inputs.closure.len() + action.inputs.toolchain.len();
    match mode {
        PruneMode::Atoms => {
            let used = used_atoms(store, &rec.view_digest, &rs)?;
            action.inputs.closure.retain(|a| used.contains(a));
            action.inputs.toolchain.retain(|a| used.contains(a));
        }
        PruneMode::Paths => {
            let atom = paths_atom(store, &rs)?;
            action.inputs.closure = vec![atom];
            action.inputs.toolchain.clear();
        }
    }
    if action.inputs.closure.is_empty() && action.inputs.toolchain.is_empty() {
        return Err(Error::Usage(format!(
            "the build of {from} read nothing of its closure: a pruned action would have an empty root"
        )));
    }
    let lock = match rec.fetch_lock_digest {
        // A stored action names no lock file, only its digest: its mode
        // says whether it replays one.
        Some(d) if action.network.mode == NetworkMode::Replay => Some(store.read_blob(&d)?),
        _ => None,
    };
    Ok(Pruned {
        atoms_after: action.inputs.closure.len() + action.inputs.toolchain.len(),
        action,
        from: *from,
        atoms_before: before,
        lock,
    })
}

/// The atoms of `view`'s composition the read set touched (see the module
/// doc for the rule).
fn used_atoms(store: &LocalStore, view: &Digest, rs: &ReadSet) -> Result<BTreeSet<Digest>, Error> {
    let (comp, map) = load_composition(store, view)?.ok_or_else(|| {
        Error::Other(format!(
            "view {view} has no composition record: it cannot be charged to atoms"
        ))
    })?;
    let mut used: BTreeSet<u32> = BTreeSet::new();
    let mut shared_dirs: Vec<Vec<u32>> = Vec::new();
    for e in &rs.entries {
        let owners = map.owners(e.map_path());
        match e.kind {
            EntryKind::Absent => {}
            EntryKind::Dir if owners.len() > 1 => shared_dirs.push(owners.to_vec()),
            _ => used.extend(owners),
        }
    }
    for owners in shared_dirs {
        if !owners.iter().any(|o| used.contains(o)) {
            used.insert(owners[0]);
        }
    }
    Ok(used
        .into_iter()
        .filter_map(|i| comp.atoms.get(i as usize).copied())
        .collect())
}

/// A tree of exactly what the read set observed, taken from the view it
/// was observed in.
fn paths_atom(store: &LocalStore, rs: &ReadSet) -> Result<Digest, Error> {
    #[derive(Default)]
    struct Tree {
        node: Option<Node>,
        children: BTreeMap<Vec<u8>, Tree>,
    }
    fn at<'t>(t: &'t mut Tree, path: &[u8]) -> &'t mut Tree {
        let mut cur = t;
        for c in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
            cur = cur.children.entry(c.to_vec()).or_default();
        }
        cur
    }
    fn put(store: &LocalStore, t: Tree) -> Result<Node, Error> {
        if let Some(n) = t.node {
            if !matches!(n, Node::Directory { .. }) {
                return Ok(n);
            }
        }
        let mut d = Directory::new();
        for (name, child) in t.children {
            d.insert(Name::new(name)?, put(store, child)?)?;
        }
        Ok(Node::Directory {
            size: d.size(),
            digest: store.put_directory(&d)?,
        })
    }
    let mut root = Tree::default();
    for e in &rs.entries {
        if e.kind == EntryKind::Absent {
            continue;
        }
        let path = e.raw_path();
        let node = castore::walk::lookup_bytes(store, &rs.root, &path)?;
        if let (Node::Directory { digest, .. }, Access::Read) = (&node, e.access) {
            // Listed: every entry, so the listing is the same; a
            // subdirectory comes as a directory, its content only as
            // observed.
            let dir = store.get_directory(digest)?;
            let here = at(&mut root, &path);
            for (name, child) in dir.entries() {
                let slot = here.children.entry(name.as_bytes().to_vec()).or_default();
                if !matches!(child, Node::Directory { .. }) {
                    slot.node = Some(child.clone());
                }
            }
        }
        if !matches!(node, Node::Directory { .. }) {
            at(&mut root, &path).node = Some(node);
        }
    }
    match put(store, root)? {
        Node::Directory { digest, .. } => Ok(digest),
        _ => Err(Error::Other(
            "the read set's root is not a directory".into(),
        )),
    }
}
