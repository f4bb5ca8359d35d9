//! The compose stage: the declared atoms merged into the build's FHS view,
//! and the proof that what the build read of it lies inside it.

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Digest, Directory, Name, Node};
use castore_fuse::ReadSet;

use crate::Error;

/// What the view gets when no atom supplies these files (as Nix does).
const SYNTHETIC_ETC: &[(&str, &str)] = &[
    ("passwd", "root:x:0:0:root:/build:/noshell\nbuild:x:1000:100:build:/build/home:/noshell\nnobody:x:65534:65534:nobody:/nonexistent:/noshell\n"),
    ("group", "root:x:0:\nusers:x:100:\nnogroup:x:65534:\n"),
    ("hosts", "127.0.0.1 localhost\n::1 localhost\n"),
];

/// Compose `atoms` in order, plus synthetic `/etc` files no atom supplies.
pub fn compose(store: &LocalStore, atoms: &[Digest]) -> Result<castore::Composition, Error> {
    let first = castore::compose(store, atoms)?;
    let mut missing = Directory::new();
    for (name, content) in SYNTHETIC_ETC {
        let path = format!("etc/{name}");
        if castore::walk::lookup(store, &first.root, &path).is_err() {
            let digest = store.put_blob(content.as_bytes())?;
            missing.insert(
                Name::new(*name)?,
                Node::File {
                    digest,
                    size: content.len() as u64,
                    executable: false,
                },
            )?;
        }
    }
    if missing.is_empty() {
        return Ok(first);
    }
    let mut root = Directory::new();
    root.insert(
        Name::new("etc")?,
        Node::Directory {
            size: missing.size(),
            digest: store.put_directory(&missing)?,
        },
    )?;
    let synthetic = store.put_directory(&root)?;
    let mut all = atoms.to_vec();
    all.push(synthetic);
    Ok(castore::compose(store, &all)?)
}

/// The proof of `reads ⊆ declared`: every observed path resolves in the
/// declared view to exactly the node that was served, and every observed
/// absence is absent from it.
pub fn check_read_set(store: &LocalStore, view: &Digest, rs: &ReadSet) -> Result<(), Error> {
    if rs.root != *view {
        return Err(Error::Containment(format!(
            "the read set is of view {}, not the declared view {view}",
            rs.root
        )));
    }
    for e in &rs.entries {
        // Read-set paths escape odd bytes as the compose map does; resolve the real ones.
        let found = castore::walk::lookup_bytes(store, view, &e.raw_path()).ok();
        let consistent = match (&found, e.digest) {
            (None, None) => true,
            (Some(n), Some(d)) => match n {
                Node::Symlink { target } => Digest::of(target.as_bytes()) == d,
                other => other.digest() == Some(&d),
            },
            _ => false,
        };
        if !consistent {
            return Err(Error::Containment(format!(
                "the build observed {} as {:?}, which the declared closure does not hold",
                e.path, e.digest
            )));
        }
    }
    Ok(())
}
