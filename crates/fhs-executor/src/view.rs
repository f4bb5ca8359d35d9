//! The compose stage: the declared atoms merged into the build's FHS view —
//! with a synthetic layer for what an installed Debian system has that no
//! package file holds (fallback `/etc` files, the alternatives' links) —
//! and the proof that what the build read of it lies inside it.

use std::collections::BTreeMap;

use castore::alternatives::Alternative;
use castore::store::DirectoryStore;
use castore::store::{BlobStore, LocalStore};
use castore::tree::{components, TreeBuilder};
use castore::{Digest, Node};

use crate::world::World;
use castore_fuse::ReadSet;

use crate::Error;

/// What the view gets when no atom supplies these files (as Nix does):
/// `passwd` and `group` naming the build's user (see [`World`]), `hosts`.
fn synthetic_etc(world: &World) -> [(&'static str, String); 3] {
    [
        ("passwd", world.passwd()),
        ("group", world.group()),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n".into()),
    ]
}

/// Compose `atoms` in order, then one synthetic layer: `/etc` files no
/// atom supplies, the links of the alternatives the atoms' packages
/// register, as dpkg would set them, and the directories no atom has at
/// `mount_points` (where outputs placed in the root are mounted: a mount
/// needs a directory to cover, and the view is read-only). The layer is
/// an atom of its own, so the composition map charges those paths to it
/// and read sets and closure-bloat reports stay exact.
pub fn compose(
    store: &LocalStore,
    atoms: &[Digest],
    world: &World,
    mount_points: &[&str],
) -> Result<castore::Composition, Error> {
    let first = castore::compose(store, atoms)?;
    let Some(layer) = remembered_layer(store, &first, world, mount_points)? else {
        return Ok(first);
    };
    let mut all = atoms.to_vec();
    all.push(layer);
    Ok(castore::compose(store, &all)?)
}

/// [`synthetic_layer`], remembered (`castore`'s `store::memo`): it is a
/// pure function of the composed tree and the world's `/etc` files, and
/// working it out (the alternatives of every package) took ~10 ms of a
/// toolchain build.
fn remembered_layer(
    store: &LocalStore,
    first: &castore::Composition,
    world: &World,
    mount_points: &[&str],
) -> Result<Option<Digest>, Error> {
    const MEMO: &str = "view-layer";
    let mut key = first.root.as_bytes().to_vec();
    for (name, content) in synthetic_etc(world) {
        key.extend_from_slice(name.as_bytes());
        key.push(0);
        key.extend_from_slice(content.as_bytes());
        key.push(0);
    }
    // The layer as it was before mount points, keyed as it was.
    for m in mount_points {
        key.extend_from_slice(b"mount\0");
        key.extend_from_slice(m.as_bytes());
        key.push(0);
    }
    let key = Digest::of(&key);
    let recalled = store.recall(MEMO, &key).and_then(|b| {
        let s = String::from_utf8(b).ok()?;
        match s.as_str() {
            "none" => Some(None),
            d => d
                .parse::<Digest>()
                .ok()
                .filter(|d| store.has_directory(d).unwrap_or(false))
                .map(Some),
        }
    });
    if let Some(layer) = recalled {
        return Ok(layer);
    }
    let layer = synthetic_layer(store, first, world, mount_points)?;
    let answer = layer.map_or_else(|| "none".to_owned(), |d| d.to_string());
    let _ = store.remember(MEMO, &key, answer.as_bytes());
    Ok(layer)
}

fn synthetic_layer(
    store: &LocalStore,
    first: &castore::Composition,
    world: &World,
    mount_points: &[&str],
) -> Result<Option<Digest>, Error> {
    let mut tree = TreeBuilder::default();
    let bad = |e: String| Error::Other(format!("building the view's synthetic layer: {e}"));
    for (name, content) in synthetic_etc(world) {
        let path = format!("etc/{name}");
        if castore::walk::lookup(store, &first.root, &path).is_err() {
            let digest = store.put_blob(content.as_bytes())?;
            let node = Node::File {
                digest,
                size: content.len() as u64,
                executable: false,
            };
            tree.add_leaf(&components(path.as_bytes()).map_err(bad)?, node)
                .map_err(bad)?;
        }
    }
    for (link, target) in alternative_links(store, first)? {
        let path = components(link.trim_start_matches('/').as_bytes()).map_err(bad)?;
        tree.add_symlink(&path, target.as_bytes()).map_err(bad)?;
    }
    for m in mount_points {
        if !is_directory(store, &first.root, m)? {
            let path = components(m.trim_start_matches('/').as_bytes()).map_err(bad)?;
            tree.add_dir(&path).map_err(bad)?;
        }
    }
    if tree.is_empty() {
        return Ok(None);
    }
    let txn = store.txn()?;
    let (root, _) = tree.finish(&txn)?;
    txn.commit()?;
    Ok(Some(root))
}

/// Whether `path` is a directory of the tree `root` (`false`: it is
/// missing, from some component on); an error if it, or a directory on
/// the way, is a file or a symlink, which a mount cannot be placed on or
/// through: the mount would land wherever the link points.
fn is_directory(store: &LocalStore, root: &Digest, path: &str) -> Result<bool, Error> {
    let mut dir = *root;
    let mut walked = String::new();
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        walked.push('/');
        walked.push_str(comp);
        match store.get_directory(&dir)?.get(comp.as_bytes()) {
            None => return Ok(false),
            Some(Node::Directory { digest, .. }) => dir = *digest,
            Some(other) => {
                return Err(Error::Usage(format!(
                    "an output is placed at {path}, but {walked} is {} in the view: place it at a directory (or where the view has nothing)",
                    other.kind()
                )))
            }
        }
    }
    Ok(true)
}

/// The links of every alternative with a provider in the composition (as
/// the packages' atoms keep them, under `var/lib/fhsx/alternatives/`): for
/// each name, the provider of highest priority (on a tie, the smaller
/// path) gets `LINK → /etc/alternatives/NAME → PATH`, and so does each of
/// its slaves whose path is there — dpkg's automatic mode. A link that
/// would land on an explicit file of the composition is a clash naming
/// both.
fn alternative_links(
    store: &LocalStore,
    first: &castore::Composition,
) -> Result<Vec<(String, String)>, Error> {
    let present =
        |p: &str| castore::walk::lookup(store, &first.root, p.trim_start_matches('/')).is_ok();
    let mut chosen: BTreeMap<String, (String, Alternative)> = BTreeMap::new();
    for (package, alts) in kept_alternatives(store, &first.root)? {
        for alt in alts {
            if !present(&alt.path) {
                continue;
            }
            let better = chosen.get(&alt.name).is_none_or(|(_, c)| {
                alt.priority > c.priority || (alt.priority == c.priority && alt.path < c.path)
            });
            if better {
                chosen.insert(alt.name.clone(), (package.clone(), alt));
            }
        }
    }
    let mut links = Vec::new();
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    for (package, alt) in chosen.values() {
        let mut pairs = vec![(alt.link.clone(), alt.name.clone(), alt.path.clone())];
        pairs.extend(
            alt.slaves
                .iter()
                .filter(|s| present(&s.path))
                .map(|s| (s.link.clone(), s.name.clone(), s.path.clone())),
        );
        for (link, name, path) in pairs {
            let via = format!("/etc/alternatives/{name}");
            for p in [&link, &via] {
                let clash = if present(p) {
                    Some(format!("an atom of the composition supplies {p}"))
                } else {
                    taken
                        .get(p)
                        .map(|other| format!("the alternative {other} links {p} too"))
                };
                if let Some(why) = clash {
                    return Err(Error::Usage(format!(
                        "composition clash at {p}: {why}, and the alternative {name} (provider {} of package {package}) needs it for its link; drop one of them",
                        alt.path
                    )));
                }
                taken.insert(p.clone(), name.clone());
            }
            links.push((link, via.clone()));
            links.push((via, path));
        }
    }
    Ok(links)
}

/// Every package's kept alternatives in the composed tree `root`.
fn kept_alternatives(
    store: &LocalStore,
    root: &Digest,
) -> Result<Vec<(String, Vec<Alternative>)>, Error> {
    let Ok(Node::Directory { digest, .. }) =
        castore::walk::lookup(store, root, castore::alternatives::IN_ATOM)
    else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (name, node) in store.get_directory(&digest)?.entries() {
        if let Node::File { digest, .. } = node {
            let bytes = store.read_blob(digest)?;
            out.push((name.to_string(), castore::alternatives::parse_kept(&bytes)));
        }
    }
    Ok(out)
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
                "the build observed {} as {}, which the declared closure does not hold",
                e.path,
                e.digest
                    .map_or_else(|| "absent".to_owned(), |d| d.to_string())
            )));
        }
    }
    Ok(())
}
