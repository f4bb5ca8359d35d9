//! Whether an earlier build's read set holds in another view: the test
//! that lets a record of the same command answer an action whose closure
//! or toolchain changed in ways the build never saw.
//!
//! Why it is sound: the FUSE view is the only source of every byte the
//! build could read from its root (the mount layout and the sandbox see to
//! that, and `reads ⊆ declared` is proved on it), and it logs everything a
//! build can learn from it — every lookup (and so every absence), every
//! open, every listing, every symlink read, every digest attribute read.
//! What a build sees of the view is therefore a function of exactly the
//! entries of its read set. If, in the new view, every path it read holds
//! the same node (same kind, same content digest), every absence is still
//! absent, every symlink points at the same target and every directory it
//! listed lists the same names with the same kinds, the build sees the same
//! view and, being hermetic, does the same thing. Attributes the view
//! serves (modes, sizes, times, owners) are functions of the nodes
//! compared; inode numbers are not, and a build that embeds them in its
//! output is not reproducible in the first place.

use std::collections::HashMap;

use castore::store::DirectoryStore;
use castore::{Digest, Directory, Node};
use castore_fuse::{Access, EntryKind, ReadSet};

/// Resolves paths in one view, each directory read once.
struct Resolver<'s> {
    store: &'s dyn DirectoryStore,
    root: Digest,
    dirs: HashMap<Digest, Directory>,
}

impl Resolver<'_> {
    fn dir(&mut self, d: &Digest) -> Result<&Directory, String> {
        if !self.dirs.contains_key(d) {
            let dir = self
                .store
                .get_directory(d)
                .map_err(|e| format!("directory {d} cannot be read: {}", castore::Chain(&e)))?;
            self.dirs.insert(*d, dir);
        }
        self.dirs
            .get(d)
            .ok_or_else(|| format!("directory {d} vanished"))
    }

    /// The node at `path` (raw bytes), without following symlinks; `None`
    /// when absent (or under something that is not a directory).
    fn lookup(&mut self, path: &[u8]) -> Result<Option<Node>, String> {
        let mut node = Node::Directory {
            digest: self.root,
            size: 0,
        };
        for comp in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
            let Node::Directory { digest, .. } = node else {
                return Ok(None);
            };
            match self.dir(&digest)?.get(comp) {
                Some(n) => node = n.clone(),
                None => return Ok(None),
            }
        }
        Ok(Some(node))
    }
}

/// `(name, kind)` of a directory's entries, as a listing shows them
/// (d_type: an executable and a plain file are both regular files).
fn listing(d: &Directory) -> Vec<(Vec<u8>, u8)> {
    d.entries()
        .map(|(n, node)| {
            let t = match node {
                Node::Directory { .. } => b'd',
                Node::File { .. } => b'f',
                Node::Symlink { .. } => b'l',
            };
            (n.as_bytes().to_vec(), t)
        })
        .collect()
}

/// Check `rs` (observed in some view) against the view `view`: `Ok` if the
/// build would have seen the same, else the first path where it would not,
/// with why.
pub fn read_set_holds(
    store: &dyn DirectoryStore,
    view: &Digest,
    rs: &ReadSet,
) -> Result<(), String> {
    read_set_holds_given(store, &Listed::new(), view, rs)
}

/// Directories of an earlier view, each under the digest of its own
/// encoding: what a remote cache sends of the directories a build listed,
/// so a store that never held that view can still compare listings (they
/// are never stored: they are not whole trees).
pub type Listed = HashMap<Digest, Directory>;

/// [`read_set_holds`], with the earlier view's listed directories looked
/// up in `listed` before the store.
pub fn read_set_holds_given(
    store: &dyn DirectoryStore,
    listed: &Listed,
    view: &Digest,
    rs: &ReadSet,
) -> Result<(), String> {
    let mut new = Resolver {
        store,
        root: *view,
        dirs: HashMap::new(),
    };
    let mut old = Resolver {
        store,
        root: rs.root,
        dirs: listed.clone(),
    };
    for e in &rs.entries {
        let path = e.raw_path();
        let found = new.lookup(&path)?;
        let was = match e.kind {
            EntryKind::Absent => "absent",
            EntryKind::Dir => "a directory",
            EntryKind::File => "a file",
            EntryKind::Exe => "an executable file",
            EntryKind::Symlink => "a symlink",
        };
        let differs = |now: &str| Err(format!("{} was {was} and is now {now}", e.path));
        match (e.kind, &found, e.digest) {
            (EntryKind::Absent, None, _) => {}
            (EntryKind::Absent, Some(n), _) => return differs(n.kind()),
            (_, None, _) => return differs("absent"),
            (
                EntryKind::File,
                Some(Node::File {
                    digest,
                    executable: false,
                    ..
                }),
                Some(d),
            )
            | (
                EntryKind::Exe,
                Some(Node::File {
                    digest,
                    executable: true,
                    ..
                }),
                Some(d),
            ) if *digest == d => {}
            (EntryKind::Symlink, Some(Node::Symlink { target }), Some(d))
                if Digest::of(target.as_bytes()) == d => {}
            (EntryKind::Dir, Some(Node::Directory { digest, .. }), Some(d)) => {
                // Traversed: a directory is all it needs to be. Listed: the
                // same names of the same kinds.
                if e.access == Access::Read && *digest != d {
                    let was = listing(old.dir(&d)?);
                    let now = listing(new.dir(digest)?);
                    if was != now {
                        return differs("a directory listing other entries");
                    }
                }
            }
            (_, Some(n), _) => return differs(&n.describe()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use castore::store::{BlobStore, LocalStore};
    use castore::{Name, SymlinkTarget};
    use castore_fuse::ReadSetEntry;

    fn put(s: &LocalStore, entries: Vec<(&str, Node)>) -> Node {
        let mut d = Directory::new();
        for (n, node) in entries {
            d.insert(Name::new(n).unwrap(), node).unwrap();
        }
        Node::Directory {
            size: d.size(),
            digest: s.put_directory(&d).unwrap(),
        }
    }

    fn file(s: &LocalStore, b: &[u8]) -> Node {
        Node::File {
            digest: s.put_blob(b).unwrap(),
            size: b.len() as u64,
            executable: false,
        }
    }

    #[test]
    fn reads_absences_links_and_listings_must_hold() {
        let t = tempfile::tempdir().unwrap();
        let s = LocalStore::open(t.path()).unwrap();
        let link = Node::Symlink {
            target: SymlinkTarget::new("a").unwrap(),
        };
        let view = |extra: Vec<(&str, Node)>, a: &[u8], listed: Vec<(&str, Node)>| {
            let mut top = vec![
                ("a", file(&s, a)),
                ("l", link.clone()),
                ("listed", put(&s, listed)),
            ];
            top.extend(extra);
            *put(&s, top).digest().unwrap()
        };
        let old = view(vec![], b"A", vec![("x", file(&s, b"x"))]);
        let dig = |n: &Node| match n {
            Node::Symlink { target } => Digest::of(target.as_bytes()),
            n => *n.digest().unwrap(),
        };
        let rs = ReadSet {
            format: castore_fuse::readset::FORMAT.into(),
            root: old,
            entries: vec![
                ReadSetEntry::for_node("/a".into(), &file(&s, b"A"), Access::Read),
                ReadSetEntry {
                    path: "/gone".into(),
                    kind: EntryKind::Absent,
                    digest: None,
                    access: Access::Lookup,
                },
                ReadSetEntry::for_node("/l".into(), &link, Access::Read),
                ReadSetEntry {
                    path: "/listed".into(),
                    kind: EntryKind::Dir,
                    digest: Some(dig(&put(&s, vec![("x", file(&s, b"x"))]))),
                    access: Access::Read,
                },
            ],
        };
        assert_eq!(read_set_holds(&s, &old, &rs), Ok(()));
        // Something unread added, a listed entry's content changed: holds.
        let same = view(
            vec![("unused", file(&s, b"u"))],
            b"A",
            vec![("x", file(&s, b"y"))],
        );
        assert_eq!(read_set_holds(&s, &same, &rs), Ok(()));
        // A read file changed.
        let e = read_set_holds(&s, &view(vec![], b"B", vec![("x", file(&s, b"x"))]), &rs);
        assert!(e.unwrap_err().contains("/a"));
        // An absence now present.
        let e = read_set_holds(
            &s,
            &view(
                vec![("gone", file(&s, b"g"))],
                b"A",
                vec![("x", file(&s, b"x"))],
            ),
            &rs,
        );
        assert!(e.unwrap_err().contains("/gone"));
        // A listed directory gained an entry.
        let e = read_set_holds(
            &s,
            &view(
                vec![],
                b"A",
                vec![("x", file(&s, b"x")), ("y", file(&s, b"y"))],
            ),
            &rs,
        );
        assert!(e.unwrap_err().contains("/listed"));
    }
}
