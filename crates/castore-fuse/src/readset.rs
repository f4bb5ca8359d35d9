//! The read set: what a build observed of its view, as `(path, digest)`
//! entries, and its one canonical encoding.
//!
//! See the crate documentation for the format. The encoding is a function of
//! the set alone (entries de-duplicated and sorted by path bytes, fixed field
//! order, no whitespace but one final newline), so two runs that observed the
//! same things produce the same bytes and therefore the same digest.

use std::collections::BTreeMap;

use castore::store::LocalStore;
use castore::{Digest, Node};
use serde::{Deserialize, Serialize};

use crate::Error;

/// The format tag every encoded read set carries.
pub const FORMAT: &str = "fhsx-read-set/1";

/// What the path was when it was observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// Looked up and not there: the build depended on its absence.
    Absent,
    /// A directory; the digest is the Directory's.
    Dir,
    /// A regular, non-executable file; the digest is the blob's.
    File,
    /// An executable file; the digest is the blob's.
    Exe,
    /// A symlink; the digest is the BLAKE3 of its target bytes.
    Symlink,
}

/// How much of the path the build used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Resolved by name (lookup, stat, exists-checks, path traversal).
    Lookup,
    /// Its content was used: a file opened for reading (which covers
    /// `mmap`), a directory listed, a symlink read.
    Read,
}

/// One observed path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReadSetEntry {
    /// Absolute inside the view (`/` is the root), each name escaped with
    /// [`castore::compose::escape_name`].
    pub path: String,
    pub kind: EntryKind,
    /// Absent exactly when `kind` is [`EntryKind::Absent`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    pub access: Access,
}

impl ReadSetEntry {
    /// The entry describing `node` seen at `path` with `access`.
    pub fn for_node(path: String, node: &Node, access: Access) -> Self {
        let (kind, digest) = crate::compact::kind_digest(node);
        ReadSetEntry {
            path,
            kind,
            digest: Some(digest),
            access,
        }
    }

    /// The entry recording that `path` was probed and not found.
    pub fn absent(path: String) -> Self {
        ReadSetEntry {
            path,
            kind: EntryKind::Absent,
            digest: None,
            access: Access::Lookup,
        }
    }

    /// The path as the composition map spells it: no leading slash.
    pub fn map_path(&self) -> &str {
        self.path.trim_start_matches('/')
    }

    /// The path's real bytes (escapes undone), without the leading slash:
    /// what to resolve in the tree, e.g. with `castore::walk::lookup` when it
    /// is UTF-8.
    pub fn raw_path(&self) -> Vec<u8> {
        unescape_path(self.map_path())
    }
}

/// Undo [`castore::compose::escape_name`] over a whole path: every `%XX` is
/// the byte `0xXX` (a literal `%` is always escaped, so there is no ambiguity).
pub fn unescape_path(p: &str) -> Vec<u8> {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A de-duplicated, sorted read set of one view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadSet {
    /// Always [`FORMAT`].
    pub format: String,
    /// The root digest of the view the entries were observed in.
    pub root: Digest,
    /// Sorted by path bytes, one entry per path.
    pub entries: Vec<ReadSetEntry>,
}

impl ReadSet {
    /// Build the canonical set from raw observations: one entry per path (a
    /// path seen both by lookup and by read keeps `read`), sorted by path.
    pub fn from_observations(root: Digest, obs: impl IntoIterator<Item = ReadSetEntry>) -> Self {
        let mut by_path: BTreeMap<String, ReadSetEntry> = BTreeMap::new();
        for e in obs {
            match by_path.get_mut(&e.path) {
                Some(have) => {
                    if e.access > have.access {
                        have.access = e.access;
                    }
                }
                None => {
                    by_path.insert(e.path.clone(), e);
                }
            }
        }
        ReadSet {
            format: FORMAT.to_owned(),
            root,
            entries: by_path.into_values().collect(),
        }
    }

    /// The canonical encoding: compact JSON plus one newline.
    pub fn encode(&self) -> Vec<u8> {
        // Serialising plain structs of strings and enums cannot fail.
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Parse and check an encoded read set: format tag, sorted unique paths,
    /// digests present exactly for non-absent entries. Any JSON spelling is
    /// accepted; [`ReadSet::encode`] gives the canonical one back.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let rs: ReadSet = serde_json::from_slice(bytes)
            .map_err(|e| Error::BadReadSet(format!("not a read set: {e}")))?;
        if rs.format != FORMAT {
            return Err(Error::BadReadSet(format!(
                "format is {:?}, expected {FORMAT:?}",
                rs.format
            )));
        }
        for w in rs.entries.windows(2) {
            if w[0].path.as_bytes() >= w[1].path.as_bytes() {
                return Err(Error::BadReadSet(format!(
                    "entries not strictly sorted by path at {:?}",
                    w[1].path
                )));
            }
        }
        for e in &rs.entries {
            if (e.kind == EntryKind::Absent) != e.digest.is_none() {
                return Err(Error::BadReadSet(format!(
                    "{}: a digest must be given exactly for entries that exist",
                    e.path
                )));
            }
            if !e.path.starts_with('/') {
                return Err(Error::BadReadSet(format!(
                    "{}: path is not absolute",
                    e.path
                )));
            }
        }
        Ok(rs)
    }

    /// The digest of the canonical encoding.
    pub fn digest(&self) -> Digest {
        Digest::of(&self.encode())
    }

    /// Store the canonical encoding as a blob; returns its digest.
    pub fn store(&self, store: &LocalStore) -> Result<Digest, Error> {
        let txn = store.txn()?;
        let d = txn.put_blob(&self.encode())?;
        txn.commit()?;
        Ok(d)
    }

    /// Load a read set from the store by its digest (verified).
    pub fn load(store: &LocalStore, digest: &Digest) -> Result<Self, Error> {
        Self::decode(&store.read_blob(digest)?)
    }

    pub fn get(&self, path: &str) -> Option<&ReadSetEntry> {
        self.entries
            .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()))
            .ok()
            .map(|i| &self.entries[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_and_round_trips() {
        let root = Digest::of(b"root");
        let f = Node::File {
            digest: Digest::of(b"x"),
            size: 1,
            executable: false,
        };
        let a = ReadSet::from_observations(
            root,
            [
                ReadSetEntry::for_node("/b".into(), &f, Access::Lookup),
                ReadSetEntry::absent("/a".into()),
                ReadSetEntry::for_node("/b".into(), &f, Access::Read),
                ReadSetEntry::for_node("/b".into(), &f, Access::Lookup),
            ],
        );
        let b = ReadSet::from_observations(
            root,
            [
                ReadSetEntry::for_node("/b".into(), &f, Access::Read),
                ReadSetEntry::absent("/a".into()),
            ],
        );
        assert_eq!(a.encode(), b.encode());
        assert_eq!(a.entries.len(), 2);
        assert_eq!(a.entries[1].access, Access::Read);
        let text = String::from_utf8(a.encode()).unwrap();
        assert!(
            text.starts_with(r#"{"format":"fhsx-read-set/1","root":"b3:"#),
            "{text}"
        );
        assert!(
            text.contains(r#"{"path":"/a","kind":"absent","access":"lookup"}"#),
            "{text}"
        );
        assert_eq!(ReadSet::decode(&a.encode()).unwrap(), a);
    }

    #[test]
    fn unescape_inverts_escape_name() {
        for name in [
            &b"plain"[..],
            b"100%.txt",
            b"ctl\x01\x7f",
            b"bad\xff\xfeutf8",
            b"\xc3\xbc ok",
        ] {
            let e = castore::compose::escape_name(name);
            assert_eq!(unescape_path(&e), name, "{e}");
            let entry = ReadSetEntry::absent(format!("/dir/{e}"));
            let mut want = b"dir/".to_vec();
            want.extend_from_slice(name);
            assert_eq!(entry.raw_path(), want);
        }
        // Not from escape_name, but must not panic either.
        assert_eq!(unescape_path("%ü%"), "%ü%".as_bytes());
    }

    #[test]
    fn decode_rejects_non_canonical_sets() {
        let root = Digest::of(b"root");
        for bad in [
            format!(r#"{{"format":"x","root":"{root}","entries":[]}}"#),
            format!(
                r#"{{"format":"{FORMAT}","root":"{root}","entries":[{{"path":"/b","kind":"absent","access":"lookup"}},{{"path":"/a","kind":"absent","access":"lookup"}}]}}"#
            ),
            format!(
                r#"{{"format":"{FORMAT}","root":"{root}","entries":[{{"path":"/a","kind":"file","access":"lookup"}}]}}"#
            ),
            format!(
                r#"{{"format":"{FORMAT}","root":"{root}","entries":[{{"path":"a","kind":"absent","access":"lookup"}}]}}"#
            ),
            "nonsense".to_owned(),
        ] {
            assert!(ReadSet::decode(bad.as_bytes()).is_err(), "accepted {bad}");
        }
    }
}
