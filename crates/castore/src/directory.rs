//! The Directory object and its canonical encoding: the snix castore
//! `Directory` protobuf (directories=1, files=2, symlinks=3), proto3 canonical,
//! each list strictly ascending by name, names unique across lists.
//!
//! [`Directory`] keeps its entries in one ordered map keyed by [`Name`], so a
//! value cannot hold duplicate or unsorted names; [`Directory::decode`]
//! validates everything and rejects any non-canonical byte string by
//! re-encoding and comparing. A store therefore never holds an invalid or
//! ambiguous directory.

use std::collections::BTreeMap;

use crate::{Digest, Error, Name, Node, SymlinkTarget};

#[cfg(test)]
mod pb {
    //! The wire types, as prost's derive writes them (no protoc needed):
    //! the reference the direct encoder and decoder are held to.

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Directory {
        #[prost(message, repeated, tag = "1")]
        pub directories: Vec<DirectoryNode>,
        #[prost(message, repeated, tag = "2")]
        pub files: Vec<FileNode>,
        #[prost(message, repeated, tag = "3")]
        pub symlinks: Vec<SymlinkNode>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DirectoryNode {
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub digest: Vec<u8>,
        #[prost(uint64, tag = "3")]
        pub size: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileNode {
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub digest: Vec<u8>,
        #[prost(uint64, tag = "3")]
        pub size: u64,
        #[prost(bool, tag = "4")]
        pub executable: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SymlinkNode {
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub target: Vec<u8>,
    }
}

/// A directory: a set of named nodes.
#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct Directory {
    entries: BTreeMap<Name, Node>,
}

impl Directory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an entry; a second entry under the same name is an error.
    pub fn insert(&mut self, name: Name, node: Node) -> Result<(), Error> {
        use std::collections::btree_map::Entry;
        match self.entries.entry(name) {
            Entry::Occupied(o) => Err(Error::InvalidDirectory(format!(
                "duplicate name {:?}",
                o.key()
            ))),
            Entry::Vacant(v) => {
                v.insert(node);
                Ok(())
            }
        }
    }

    pub fn get(&self, name: &[u8]) -> Option<&Node> {
        // Names in the map are valid; an invalid probe simply is not there.
        Name::new(name).ok().and_then(|n| self.entries.get(&n))
    }

    pub fn entries(&self) -> impl ExactSizeIterator<Item = (&Name, &Node)> {
        self.entries.iter()
    }

    /// The entries, by name, owned: for a walk that keeps its place in a
    /// directory without holding a borrow of it.
    pub fn into_entries(self) -> impl ExactSizeIterator<Item = (Name, Node)> {
        self.entries.into_iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of entries below this directory, recursively: the `size` a
    /// parent records for it.
    pub fn size(&self) -> u64 {
        self.entries
            .values()
            .map(|n| match n {
                Node::Directory { size, .. } => 1 + size,
                _ => 1,
            })
            .sum()
    }

    /// The canonical encoding, written straight from the entries (what
    /// prost writes for the wire types above, without building them: a
    /// directory of a million entries would otherwise be held three times
    /// over — entries, wire types, bytes — where it is now held twice).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_each(&mut |bytes| {
            out.extend_from_slice(bytes);
            true
        });
        out
    }

    /// Hand the canonical encoding to `sink` an entry at a time, until it
    /// answers false; whether it took every entry.
    fn encode_each(&self, sink: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        let mut entry = Vec::new();
        for list in 1..=3 {
            for (name, node) in self.entries.iter().filter(|(_, n)| list_of(n) == list) {
                entry.clear();
                let out = &mut entry;
                put_bytes_header(out, list, message_len(name, node));
                put_bytes(out, 1, name.as_bytes());
                match node {
                    Node::Directory { digest, size } => {
                        put_bytes(out, 2, digest.as_bytes());
                        put_varint_field(out, 3, *size);
                    }
                    Node::File {
                        digest,
                        size,
                        executable,
                    } => {
                        put_bytes(out, 2, digest.as_bytes());
                        put_varint_field(out, 3, *size);
                        put_varint_field(out, 4, u64::from(*executable));
                    }
                    Node::Symlink { target } => put_bytes(out, 2, target.as_bytes()),
                }
                if !sink(&entry) {
                    return false;
                }
            }
        }
        true
    }

    /// Whether `bytes` are exactly this directory's canonical encoding,
    /// compared an entry at a time (no second copy of a big directory).
    fn encodes_to(&self, bytes: &[u8]) -> bool {
        let mut at = 0;
        self.encode_each(&mut |chunk| {
            let same = bytes.get(at..at + chunk.len()) == Some(chunk);
            at += chunk.len();
            same
        }) && at == bytes.len()
    }

    /// The length of [`Directory::encode`]'s bytes.
    fn encoded_len(&self) -> usize {
        self.entries
            .iter()
            .map(|(name, node)| {
                let m = message_len(name, node);
                1 + prost::encoding::encoded_len_varint(m as u64) + m
            })
            .sum()
    }

    /// The digest naming this directory: BLAKE3 of [`Directory::encode`].
    pub fn digest(&self) -> Digest {
        Digest::of(&self.encode())
    }

    /// Decode and validate. Rejects anything that is not exactly the canonical
    /// encoding of a valid directory.
    ///
    /// Read straight into entries (no wire types in between: a directory
    /// of a million entries is held as its bytes and its entries, not also
    /// as a third copy), field by field; whatever the reading accepts is
    /// then held to the canonical encoding below, so the reader need only
    /// be right about valid input.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let bad = |why: String| Error::InvalidDirectory(why);
        let mut out = Directory::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let key = take_varint(&mut rest)?;
            let (list, wire) = (key >> 3, key & 7);
            if wire != 2 || !(1..=3).contains(&list) {
                return Err(bad(format!(
                    "not a Directory protobuf: field {list} of wire type {wire}"
                )));
            }
            let message = take_bytes(&mut rest)?;
            let (name, node) = decode_entry(list, message)?;
            out.insert(Name::new(name.to_vec())?, node)?;
        }
        // Order, duplicate defaults, unknown fields, field order: any of them
        // makes the re-encoding differ. One comparison covers them all.
        if !out.encodes_to(bytes) {
            return Err(bad(
                "encoding is not canonical (unsorted lists, explicit defaults, unknown or reordered fields)".into(),
            ));
        }
        Ok(out)
    }
}

/// The protobuf list (field of `Directory`) a node is written in:
/// directories 1, files 2, symlinks 3.
fn list_of(n: &Node) -> u8 {
    match n {
        Node::Directory { .. } => 1,
        Node::File { .. } => 2,
        Node::Symlink { .. } => 3,
    }
}

/// The encoded length of one entry's message (without its own header).
fn message_len(name: &Name, node: &Node) -> usize {
    let bytes = |n: usize| {
        if n == 0 {
            0
        } else {
            1 + prost::encoding::encoded_len_varint(n as u64) + n
        }
    };
    let varint = |v: u64| {
        if v == 0 {
            0
        } else {
            1 + prost::encoding::encoded_len_varint(v)
        }
    };
    bytes(name.as_bytes().len())
        + match node {
            Node::Directory { digest, size } => bytes(digest.as_bytes().len()) + varint(*size),
            Node::File {
                digest,
                size,
                executable,
            } => bytes(digest.as_bytes().len()) + varint(*size) + varint(u64::from(*executable)),
            Node::Symlink { target } => bytes(target.as_bytes().len()),
        }
}

/// A varint, taken off the front of `rest`.
fn take_varint(rest: &mut &[u8]) -> Result<u64, Error> {
    prost::encoding::decode_varint(rest)
        .map_err(|e| Error::InvalidDirectory(format!("not a Directory protobuf: {e}")))
}

/// A length-delimited field's bytes, taken off the front of `rest`.
fn take_bytes<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], Error> {
    let len = take_varint(rest)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= rest.len())
        .ok_or_else(|| {
            Error::InvalidDirectory("not a Directory protobuf: a field runs past its end".into())
        })?;
    let (field, after) = rest.split_at(len);
    *rest = after;
    Ok(field)
}

/// One entry of list `list` (1 directories, 2 files, 3 symlinks): its name
/// and node. Absent fields are proto3's defaults, as prost reads them.
fn decode_entry(list: u64, mut m: &[u8]) -> Result<(&[u8], Node), Error> {
    let bad = |why: String| Error::InvalidDirectory(why);
    let (mut name, mut second, mut size, mut executable): (&[u8], &[u8], u64, u64) =
        (&[], &[], 0, 0);
    while !m.is_empty() {
        let key = take_varint(&mut m)?;
        match (key >> 3, key & 7) {
            (1, 2) => name = take_bytes(&mut m)?,
            (2, 2) => second = take_bytes(&mut m)?,
            (3, 0) if list != 3 => size = take_varint(&mut m)?,
            (4, 0) if list == 2 => executable = take_varint(&mut m)?,
            (field, wire) => {
                return Err(bad(format!(
                    "not a Directory protobuf: entry field {field} of wire type {wire}"
                )))
            }
        }
    }
    let digest = |b: &[u8]| {
        Digest::from_slice(b).ok_or_else(|| bad(format!("digest is {} bytes, not 32", b.len())))
    };
    let node = match list {
        1 => Node::Directory {
            digest: digest(second)?,
            size,
        },
        2 => Node::File {
            digest: digest(second)?,
            size,
            executable: executable != 0,
        },
        _ => Node::Symlink {
            target: SymlinkTarget::new(second.to_vec())?,
        },
    };
    Ok((name, node))
}

/// A length-delimited field's key and length.
fn put_bytes_header(out: &mut Vec<u8>, field: u8, len: usize) {
    out.push(field << 3 | 2);
    prost::encoding::encode_varint(len as u64, out);
}

/// A bytes field, left out when empty (proto3's default).
fn put_bytes(out: &mut Vec<u8>, field: u8, b: &[u8]) {
    if !b.is_empty() {
        put_bytes_header(out, field, b.len());
        out.extend_from_slice(b);
    }
}

/// A varint field, left out when zero (proto3's default).
fn put_varint_field(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        out.push(field << 3);
        prost::encoding::encode_varint(v, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// What prost writes for the wire types: the reference the direct
    /// encoder must match byte for byte.
    fn prost_encoding(d: &Directory) -> Vec<u8> {
        let mut w = pb::Directory::default();
        for (name, node) in d.entries() {
            let name = name.as_bytes().to_vec();
            match node {
                Node::Directory { digest, size } => w.directories.push(pb::DirectoryNode {
                    name,
                    digest: digest.as_bytes().to_vec(),
                    size: *size,
                }),
                Node::File {
                    digest,
                    size,
                    executable,
                } => w.files.push(pb::FileNode {
                    name,
                    digest: digest.as_bytes().to_vec(),
                    size: *size,
                    executable: *executable,
                }),
                Node::Symlink { target } => w.symlinks.push(pb::SymlinkNode {
                    name,
                    target: target.as_bytes().to_vec(),
                }),
            }
        }
        w.encode_to_vec()
    }

    #[test]
    fn the_direct_encoding_is_prosts() {
        let mut d = Directory::new();
        assert_eq!(d.encode(), prost_encoding(&d));
        let dg = Digest::of(b"x");
        for i in 0u64..300 {
            let name =
                Name::new(format!("n{i:03}-{}", "x".repeat((i % 200) as usize)).into_bytes())
                    .unwrap();
            let node = match i % 3 {
                0 => Node::Directory {
                    digest: dg,
                    size: i * 1000,
                },
                1 => Node::File {
                    digest: dg,
                    size: i << (i % 40),
                    executable: i % 2 == 0,
                },
                _ => Node::Symlink {
                    target: SymlinkTarget::new(vec![b'/'; 1 + i as usize * 13]).unwrap(),
                },
            };
            d.insert(name, node).unwrap();
            assert_eq!(d.encode(), prost_encoding(&d), "after {i} entries");
        }
        assert_eq!(Directory::decode(&d.encode()).unwrap(), d);
    }

    #[test]
    fn empty_directory_is_blake3_of_nothing() {
        assert_eq!(
            Directory::new().digest().to_string(),
            "b3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn one_empty_keep_file_matches_hand_written_protobuf() {
        let empty = Digest::of(b"");
        let mut d = Directory::new();
        d.insert(
            Name::new(".keep").unwrap(),
            Node::File {
                digest: empty,
                size: 0,
                executable: false,
            },
        )
        .unwrap();
        // files = 2 (LEN) { name = 1 (LEN) ".keep", digest = 2 (LEN) 32 bytes }
        // size 0 and executable false are proto3 defaults and are omitted.
        let mut by_hand = vec![0x12, 41, 0x0a, 5];
        by_hand.extend_from_slice(b".keep");
        by_hand.extend_from_slice(&[0x12, 32]);
        by_hand.extend_from_slice(empty.as_bytes());
        assert_eq!(d.encode(), by_hand);
        assert_eq!(d.digest(), Digest::of(&by_hand));
        assert_eq!(Directory::decode(&by_hand).unwrap(), d);
    }

    fn file(name: &[u8]) -> pb::FileNode {
        pb::FileNode {
            name: name.to_vec(),
            digest: vec![7; 32],
            size: 1,
            executable: false,
        }
    }

    #[test]
    fn decode_rejects_invalid_trees() {
        let cases: Vec<(&str, pb::Directory)> = vec![
            (
                "unsorted",
                pb::Directory {
                    files: vec![file(b"b"), file(b"a")],
                    ..Default::default()
                },
            ),
            (
                "duplicate",
                pb::Directory {
                    files: vec![file(b"a"), file(b"a")],
                    ..Default::default()
                },
            ),
            (
                "slash",
                pb::Directory {
                    files: vec![file(b"a/b")],
                    ..Default::default()
                },
            ),
            (
                "nul",
                pb::Directory {
                    files: vec![file(b"a\0b")],
                    ..Default::default()
                },
            ),
            (
                "dotdot",
                pb::Directory {
                    files: vec![file(b"..")],
                    ..Default::default()
                },
            ),
            (
                "empty",
                pb::Directory {
                    files: vec![file(b"")],
                    ..Default::default()
                },
            ),
            (
                "long",
                pb::Directory {
                    files: vec![file(&[b'x'; 256])],
                    ..Default::default()
                },
            ),
            (
                "dup-across-lists",
                pb::Directory {
                    files: vec![file(b"a")],
                    symlinks: vec![pb::SymlinkNode {
                        name: b"a".to_vec(),
                        target: b"x".to_vec(),
                    }],
                    ..Default::default()
                },
            ),
            (
                "short-digest",
                pb::Directory {
                    files: vec![pb::FileNode {
                        digest: vec![1; 31],
                        ..file(b"a")
                    }],
                    ..Default::default()
                },
            ),
            (
                "empty-target",
                pb::Directory {
                    symlinks: vec![pb::SymlinkNode {
                        name: b"a".to_vec(),
                        target: vec![],
                    }],
                    ..Default::default()
                },
            ),
        ];
        for (what, d) in cases {
            assert!(
                Directory::decode(&d.encode_to_vec()).is_err(),
                "{what} accepted"
            );
        }
        // An explicit default (size = 0 written out) is not canonical.
        let mut bytes = vec![0x12, 41 + 2, 0x0a, 1, b'a', 0x12, 32];
        bytes.extend_from_slice(&[7; 32]);
        bytes.extend_from_slice(&[0x18, 0]);
        bytes[1] = (bytes.len() - 2) as u8;
        assert!(
            Directory::decode(&bytes).is_err(),
            "explicit default accepted"
        );
        assert!(Directory::decode(&[0xff, 0xff]).is_err());
    }

    /// The hand-written reader, tried as an attacker would: every prefix
    /// and every single-byte change of a valid encoding is refused or is
    /// exactly the canonical encoding of what it decodes to; and the
    /// malformed shapes the reader itself must catch are refused.
    #[test]
    fn decode_accepts_only_canonical_bytes() {
        let mut d = Directory::new();
        let digest = Digest::of(b"x");
        d.insert(
            Name::new(b"a").unwrap(),
            Node::File {
                digest,
                size: 5,
                executable: true,
            },
        )
        .unwrap();
        d.insert(
            Name::new(b"d").unwrap(),
            Node::Directory { digest, size: 3 },
        )
        .unwrap();
        d.insert(
            Name::new(b"s").unwrap(),
            Node::Symlink {
                target: SymlinkTarget::new(b"t").unwrap(),
            },
        )
        .unwrap();
        let good = d.encode();
        assert_eq!(Directory::decode(&good).unwrap(), d);
        let canonical_or_refused = |bytes: &[u8]| {
            if let Ok(back) = Directory::decode(bytes) {
                assert_eq!(back.encode(), bytes, "non-canonical bytes accepted");
            }
        };
        for n in 0..good.len() {
            canonical_or_refused(&good[..n]);
        }
        for i in 0..good.len() {
            for b in [
                0x00, 0x01, 0x02, 0x08, 0x0a, 0x10, 0x12, 0x18, 0x1a, 0x22, 0x7f, 0x80, 0xff,
            ] {
                let mut m = good.clone();
                m[i] = b;
                canonical_or_refused(&m);
            }
        }
        let symlink = |fields: &[u8]| {
            let mut v = vec![0x1a, fields.len() as u8];
            v.extend_from_slice(fields);
            v
        };
        for (what, bytes) in [
            (
                "a size on a symlink",
                symlink(&[0x0a, 1, b's', 0x12, 1, b't', 0x18, 1]),
            ),
            (
                "a name twice",
                symlink(&[0x0a, 1, b's', 0x0a, 1, b's', 0x12, 1, b't']),
            ),
            (
                "an unknown field in an entry",
                symlink(&[0x0a, 1, b's', 0x12, 1, b't', 0x28, 1]),
            ),
            ("a varint at the top", vec![0x08, 1]),
            ("a fourth list", vec![0x22, 0]),
            ("a length past the end", vec![0x1a, 5, 0x0a]),
            ("a varint that never ends", vec![0x1a, 0x80, 0x80, 0x80]),
        ] {
            assert!(Directory::decode(&bytes).is_err(), "{what} accepted");
        }
    }
}
