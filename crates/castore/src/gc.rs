//! Garbage collection: keep what the roots reach, delete the rest.
//!
//! The roots are the store's persistent roots (`ROOT/roots/`), every live
//! process's temporary roots (`ROOT/temproots/`, see [`crate::roots`]) and
//! whatever the caller adds. A root digest keeps the blob, the directory
//! tree, or the composed view (atoms, map and merged tree) it names.
//!
//! gc holds the store lock exclusively from the first read of a root to the
//! last deletion: no writer is mid-transaction and no root is being added
//! while it runs, which is what makes temporary roots race-free.

use std::collections::HashSet;
use std::fs;

use crate::compose::load_composition;
use crate::store::{DirectoryStore, LocalStore, ObjectKind};
use crate::{Digest, Node, Result};

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GcReport {
    pub kept_objects: u64,
    pub deleted_blobs: u64,
    pub deleted_directories: u64,
    pub freed_bytes: u64,
    /// Digests named by persistent roots.
    pub persistent_roots: u64,
    /// Digests named by live processes' temporary roots.
    pub temp_roots: u64,
    /// Temp-roots files of dead processes removed.
    pub reclaimed_temp_root_files: u64,
}

/// Delete every object not reachable from the persistent roots, the live
/// temporary roots, or `keep`. Takes the store lock exclusively, so no
/// import is in flight while it sweeps.
pub fn gc(store: &LocalStore, keep: &[Digest]) -> Result<GcReport> {
    gc_with(store, keep, &|_| Vec::new())
}

/// What gc found reachable so far.
pub struct Live {
    dirs: HashSet<Digest>,
    blobs: HashSet<Digest>,
}

impl Live {
    /// Whether the tree `d` is kept.
    pub fn has_directory(&self, d: &Digest) -> bool {
        self.dirs.contains(d)
    }

    /// Whether the blob `d` is kept.
    pub fn has_blob(&self, d: &Digest) -> bool {
        self.blobs.contains(d)
    }
}

/// [`gc`], where what the roots reach may keep more: once the roots are
/// marked, `also` sees what is live and names further roots (a layer above
/// the store keeping the records of kept outputs, say), which are marked
/// before anything is deleted.
pub fn gc_with(
    store: &LocalStore,
    keep: &[Digest],
    also: &dyn Fn(&Live) -> Vec<Digest>,
) -> Result<GcReport> {
    let lock = crate::store::lock_exclusive(store)?;
    let persistent = crate::roots::persistent_digests(store)?;
    let temp = crate::roots::scan_temp_roots(store, &lock)?;
    let mut roots: Vec<Digest> = keep.to_vec();
    roots.extend_from_slice(&persistent);
    roots.extend_from_slice(&temp.digests);
    roots.sort();
    roots.dedup();
    let mut live = Live {
        dirs: HashSet::new(),
        blobs: HashSet::new(),
    };
    mark(store, &roots, &mut live)?;
    let more = also(&live);
    mark(store, &more, &mut live)?;
    let Live {
        dirs: live_dirs,
        blobs: live_blobs,
    } = live;
    let mut r = GcReport {
        kept_objects: (live_dirs.len() + live_blobs.len()) as u64,
        persistent_roots: persistent.len() as u64,
        temp_roots: temp.digests.len() as u64,
        reclaimed_temp_root_files: temp.reclaimed_files,
        ..Default::default()
    };
    for (kind, live) in [
        (ObjectKind::Blob, &live_blobs),
        (ObjectKind::Directory, &live_dirs),
    ] {
        for (d, p) in crate::verify::all_objects(store, kind)? {
            if live.contains(&d) {
                continue;
            }
            let len = fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            if fs::remove_file(&p).is_ok() {
                r.freed_bytes += len;
                match kind {
                    ObjectKind::Blob => r.deleted_blobs += 1,
                    ObjectKind::Directory => r.deleted_directories += 1,
                }
            }
        }
    }
    // The Fast tier's caches: executable twins of dead blobs (and temp files
    // a killed run left), and cached roots of dead views.
    let twins = store.root().join(crate::tier::fast::EXEC_BLOBS);
    for shard in fs::read_dir(&twins).into_iter().flatten().flatten() {
        for e in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
            let name = e.file_name();
            let live = name
                .to_str()
                .and_then(|h| format!("b3:{h}").parse::<Digest>().ok())
                .is_some_and(|d| live_blobs.contains(&d));
            if !live && fs::remove_file(e.path()).is_ok() {
                r.deleted_blobs += 1;
            }
        }
    }
    let fast = store.root().join("fast");
    for e in fs::read_dir(&fast).into_iter().flatten().flatten() {
        let name = e.file_name();
        let hex = name.to_string_lossy();
        let hex = hex.trim_end_matches(".fhsx-view");
        let live = format!("b3:{hex}")
            .parse::<Digest>()
            .is_ok_and(|d| live_dirs.contains(&d));
        if !live {
            remove_read_only_tree(&e.path());
        }
    }
    // Memos: shortcuts only, and none may outlive what it names.
    store.forget_memos();
    // Composition records whose root is gone.
    let comps = store.root().join("compositions");
    for e in fs::read_dir(&comps).into_iter().flatten().flatten() {
        let name = e.file_name();
        let root = name
            .to_str()
            .and_then(|h| format!("b3:{h}").parse::<Digest>().ok());
        if root.is_none_or(|r| !live_dirs.contains(&r)) {
            let _ = fs::remove_file(e.path());
        }
    }
    Ok(r)
}

/// Add what `roots` reach to `live`.
fn mark(store: &LocalStore, roots: &[Digest], live: &mut Live) -> Result<()> {
    let mut stack: Vec<Digest> = roots.to_vec();
    for k in roots {
        // A kept root that is a blob (a read set, a log) stays too.
        if store.has(ObjectKind::Blob, k) {
            live.blobs.insert(*k);
        }
        if let Some((c, _)) = load_composition(store, k)? {
            live.blobs.insert(c.map);
            stack.extend(c.atoms);
        }
    }
    while let Some(d) = stack.pop() {
        if !store.has(ObjectKind::Directory, &d) || !live.dirs.insert(d) {
            continue;
        }
        let dir = store
            .get_directory(&d)
            .map_err(|e| e.at_path(&d.to_string()))?;
        for (_, n) in dir.entries() {
            match n {
                Node::Directory { digest, .. } => stack.push(*digest),
                Node::File { digest, .. } => {
                    live.blobs.insert(*digest);
                }
                Node::Symlink { .. } => {}
            }
        }
    }
    Ok(())
}

/// Remove a tree whose directories are read-only (a Fast-tier root):
/// make each directory writable first, then delete.
fn remove_read_only_tree(p: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = fs::symlink_metadata(p) {
        if m.is_dir() {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o755));
            for e in fs::read_dir(p).into_iter().flatten().flatten() {
                remove_read_only_tree(&e.path());
            }
            let _ = fs::remove_dir(p);
        } else {
            let _ = fs::remove_file(p);
        }
    }
}
