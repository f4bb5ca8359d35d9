//! The read set in memory: compact while a mount runs, compact after.
//!
//! A mount's inodes already form a trie of the view (parent index + name),
//! so an observed *existing* path costs one mark byte on its inode. An
//! observed *absence* is a (parent inode, escaped name) pair, stored as one
//! record in an append-only arena — `[parent u32][len u16][name]`, 6 bytes
//! plus the name, in 1 MiB chunks (no reallocation, no slack) — and
//! de-duplicated through a hash table of arena offsets (4 bytes a slot). No
//! per-entry allocation, no path string.
//!
//! [`CompactReadSet`] is the frozen form: the absence arena with its offsets
//! sorted, one small key per observed existing node (kind, access and digest
//! in a side table), and the canonical order computed by sorting keys within
//! their directory. Iterating it walks the trie depth first, which yields
//! entries in the read set's canonical order (sorted by path bytes) because
//! a directory's descendants sort exactly where `name + "/"` sorts among its
//! siblings (names never contain `/`). Encoding streams from that walk, so
//! the whole encoding is never in memory.

use std::cmp::Ordering as CmpOrdering;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use castore::store::{DirectoryStore, LocalStore};
use castore::{Digest, Node};
use hashbrown::HashTable;
use serde::Serialize;

use crate::readset::{unescape_path, Access, EntryKind, ReadSet, ReadSetEntry, FORMAT};
use crate::Error;

/// The kind and digest a read-set entry gives `node`.
pub(crate) fn kind_digest(node: &Node) -> (EntryKind, Digest) {
    match node {
        Node::Directory { digest, .. } => (EntryKind::Dir, *digest),
        Node::File {
            digest,
            executable: false,
            ..
        } => (EntryKind::File, *digest),
        Node::File {
            digest,
            executable: true,
            ..
        } => (EntryKind::Exe, *digest),
        Node::Symlink { target } => (EntryKind::Symlink, Digest::of(target.as_bytes())),
    }
}

/// The read-set spelling of a name: [`castore::compose::escape_name`],
/// without an allocation for the usual plain name.
pub(crate) fn escaped(name: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(name) {
        Ok(s) if !s.chars().any(|c| c == '%' || c.is_control()) => s.into(),
        _ => castore::compose::escape_name(name).into(),
    }
}

/// The set is full (or an arena would overflow its 32-bit offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

const CHUNK_BITS: u32 = 20;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Append-only records `[parent u32][len u16][name]` in 1 MiB chunks,
/// addressed by `chunk << 20 | offset` (so at most 4 GiB).
#[derive(Default)]
struct Arena {
    chunks: Vec<Vec<u8>>,
}

impl Arena {
    fn record(&self, off: u32) -> (u32, &[u8]) {
        let c = &self.chunks[(off >> CHUNK_BITS) as usize];
        let o = (off as usize) & (CHUNK - 1);
        let parent = u32::from_le_bytes([c[o], c[o + 1], c[o + 2], c[o + 3]]);
        let len = u16::from_le_bytes([c[o + 4], c[o + 5]]) as usize;
        (parent, &c[o + 6..o + 6 + len])
    }

    /// Append a record; its address, or `None` when 4 GiB are used.
    fn push(&mut self, parent: u32, name: &[u8]) -> Option<u32> {
        let need = 6 + name.len();
        let len = u16::try_from(name.len()).ok()?;
        if need > CHUNK {
            return None;
        }
        if self
            .chunks
            .last()
            .is_none_or(|c| c.capacity() - c.len() < need)
        {
            if self.chunks.len() >= 1 << (32 - CHUNK_BITS) {
                return None;
            }
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let ci = self.chunks.len() - 1;
        let c = self.chunks.last_mut()?;
        let off = ((ci as u32) << CHUNK_BITS) | c.len() as u32;
        c.extend_from_slice(&parent.to_le_bytes());
        c.extend_from_slice(&len.to_le_bytes());
        c.extend_from_slice(name);
        Some(off)
    }

    /// Every record's address, in the order pushed.
    fn offsets(&self) -> impl Iterator<Item = u32> + '_ {
        self.chunks.iter().enumerate().flat_map(|(ci, c)| {
            let mut o = 0usize;
            std::iter::from_fn(move || {
                if o + 6 > c.len() {
                    return None;
                }
                let here = o;
                let len = u16::from_le_bytes([c[o + 4], c[o + 5]]) as usize;
                o += 6 + len;
                Some(((ci as u32) << CHUNK_BITS) | here as u32)
            })
        })
    }

    fn heap_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.capacity()).sum()
    }
}

/// Observed absences of one mount, de-duplicated.
#[derive(Default)]
pub(crate) struct Absences {
    arena: Arena,
    table: HashTable<u32>,
    hasher: RandomState,
}

impl Absences {
    /// Record `name` (escaped) as absent below directory inode `parent`.
    /// `Ok(true)`: newly recorded; `Ok(false)`: already there; `Err(Full)`:
    /// new, but `budget` refused it (the cap) or the arena is full (counted
    /// as refused either way).
    pub(crate) fn insert(
        &mut self,
        parent: u32,
        name: &[u8],
        budget: &Budget,
    ) -> Result<bool, Full> {
        let Absences {
            arena,
            table,
            hasher,
        } = self;
        let h = hasher.hash_one((parent, name));
        if table
            .find(h, |&off| arena.record(off) == (parent, name))
            .is_some()
        {
            return Ok(false);
        }
        if !budget.reserve() {
            return Err(Full);
        }
        let Some(off) = arena.push(parent, name) else {
            budget.release();
            budget.refuse();
            return Err(Full);
        };
        let arena: &Arena = arena;
        table.insert_unique(h, off, |&o| hasher.hash_one(arena.record(o)));
        Ok(true)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// The live recorder's bookkeeping: how many entries there are, the cap,
/// and how many new ones were refused.
pub(crate) struct Budget {
    pub(crate) max: u64,
    count: AtomicU64,
    refused: AtomicU64,
    said: AtomicBool,
}

impl Budget {
    pub(crate) fn new(max: u64) -> Self {
        Budget {
            max,
            count: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            said: AtomicBool::new(false),
        }
    }

    /// Take one entry's place; false (and counted as refused) at the cap.
    pub(crate) fn reserve(&self) -> bool {
        let ok = self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < self.max).then_some(c + 1)
            })
            .is_ok();
        if !ok {
            self.refuse();
        }
        ok
    }

    /// Give back a place taken by [`reserve`](Self::reserve) but not used.
    pub(crate) fn release(&self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }

    /// Count a refused new entry (and say so once on stderr).
    pub(crate) fn refuse(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        if !self.said.swap(true, Ordering::Relaxed) {
            eprintln!(
                "fhsx: the read set is full ({} entries, MountOptions::max_read_set_entries): \
                 new paths now fail with ENOMEM and the read set is incomplete",
                self.max
            );
        }
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// What the freezer needs of a mount's inode table (index 0 is the root).
pub(crate) trait Tree {
    fn len(&self) -> usize;
    /// The parent's index (the root's is 0).
    fn parent(&self, i: u32) -> u32;
    /// The raw name (unused for the root).
    fn name(&self, i: u32) -> &[u8];
    /// What was observed of inode `i`, if anything.
    fn observed(&self, i: u32) -> Option<(EntryKind, Digest, Access)>;
}

const BLOCK: u32 = 1 << 31;

/// An existing node's place in its directory: its entry, or (`BLOCK`) the
/// run of its descendants, which sorts as `name + "/"`.
#[derive(Clone, Copy, Debug)]
struct Key {
    parent: u32,
    /// Offset of `[len u16][escaped name]` in `names`.
    name: u32,
    /// An index into `existing`, or `BLOCK | child inode`.
    what: u32,
}

#[derive(Clone, Copy, Debug)]
struct Existing {
    kind: EntryKind,
    access: Access,
    digest: Digest,
}

/// A finished mount's read set, held compactly and in canonical order. See
/// the module documentation; [`CompactReadSet::iter`] yields the entries
/// [`ReadSet::from_observations`] would, in the same order, and
/// [`CompactReadSet::write_to`] writes the same bytes as [`ReadSet::encode`].
pub struct CompactReadSet {
    root: Digest,
    root_entry: Option<Existing>,
    absent_arena: Arena,
    /// Offsets into `absent_arena`, sorted by (parent, name).
    absent: Vec<u32>,
    names: Vec<u8>,
    /// Sorted by (parent, name, block after entry).
    keys: Vec<Key>,
    existing: Vec<Existing>,
    len: u64,
}

impl std::fmt::Debug for CompactReadSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactReadSet")
            .field("root", &self.root)
            .field("entries", &self.len)
            .finish()
    }
}

fn name_at(names: &[u8], off: u32) -> &[u8] {
    let o = off as usize;
    let len = u16::from_le_bytes([names[o], names[o + 1]]) as usize;
    &names[o + 2..o + 2 + len]
}

/// Compare `a` (+ `/` if `sa`) with `b` (+ `/` if `sb`) as bytes.
fn cmp_key(a: &[u8], sa: bool, b: &[u8], sb: bool) -> CmpOrdering {
    if !sa && !sb {
        return a.cmp(b);
    }
    a.iter()
        .chain(sa.then_some(&b'/'))
        .cmp(b.iter().chain(sb.then_some(&b'/')))
}

fn bit(v: &[u64], i: usize) -> bool {
    v[i / 64] & (1 << (i % 64)) != 0
}

fn set_bit(v: &mut [u64], i: usize) {
    v[i / 64] |= 1 << (i % 64);
}

impl CompactReadSet {
    /// Freeze what a mount observed: the marked inodes of `tree` and the
    /// absences (consumed, so their memory is reused rather than copied).
    pub(crate) fn freeze(root: Digest, tree: &impl Tree, absences: Absences) -> Self {
        let n = tree.len();
        let Absences { arena, table, .. } = absences;
        // The table is only for de-duplication: drop it before anything
        // else is allocated, and list the records from the arena itself.
        let count = table.len();
        drop(table);
        let mut absent: Vec<u32> = Vec::with_capacity(count);
        absent.extend(arena.offsets());
        // Which inodes have observed descendants.
        let mut has_kids = vec![0u64; n.div_ceil(64).max(1)];
        let mark_up = |has_kids: &mut Vec<u64>, mut p: u32| {
            while (p as usize) < n && !bit(has_kids, p as usize) {
                set_bit(has_kids, p as usize);
                if p == 0 {
                    break;
                }
                p = tree.parent(p);
            }
        };
        for &off in &absent {
            mark_up(&mut has_kids, arena.record(off).0);
        }
        let mut observed = 0u64;
        for i in 1..n as u32 {
            if tree.observed(i).is_some() {
                mark_up(&mut has_kids, tree.parent(i));
            }
        }
        let mut names = Vec::new();
        let mut keys = Vec::new();
        let mut existing = Vec::new();
        let root_entry = tree.observed(0).map(|(kind, digest, access)| Existing {
            kind,
            access,
            digest,
        });
        observed += u64::from(root_entry.is_some());
        for i in 1..n as u32 {
            let obs = tree.observed(i);
            let kids = bit(&has_kids, i as usize);
            if obs.is_none() && !kids {
                continue;
            }
            let esc = escaped(tree.name(i));
            let off = names.len() as u32;
            names.extend_from_slice(&(esc.len() as u16).to_le_bytes());
            names.extend_from_slice(esc.as_bytes());
            let parent = tree.parent(i);
            if let Some((kind, digest, access)) = obs {
                keys.push(Key {
                    parent,
                    name: off,
                    what: existing.len() as u32,
                });
                existing.push(Existing {
                    kind,
                    access,
                    digest,
                });
                observed += 1;
            }
            if kids {
                keys.push(Key {
                    parent,
                    name: off,
                    what: BLOCK | i,
                });
            }
        }
        keys.sort_unstable_by(|a, b| {
            a.parent.cmp(&b.parent).then_with(|| {
                cmp_key(
                    name_at(&names, a.name),
                    a.what & BLOCK != 0,
                    name_at(&names, b.name),
                    b.what & BLOCK != 0,
                )
            })
        });
        absent.sort_unstable_by(|&a, &b| {
            let (pa, na) = arena.record(a);
            let (pb, nb) = arena.record(b);
            pa.cmp(&pb).then_with(|| na.cmp(nb))
        });
        let len = observed + absent.len() as u64;
        CompactReadSet {
            root,
            root_entry,
            absent_arena: arena,
            absent,
            names,
            keys,
            existing,
            len,
        }
    }

    /// The view the entries were observed in.
    pub fn root(&self) -> Digest {
        self.root
    }

    /// The number of entries.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes held (capacities), for measurements.
    pub fn heap_bytes(&self) -> usize {
        self.absent_arena.heap_bytes()
            + self.absent.capacity() * 4
            + self.names.capacity()
            + self.keys.capacity() * std::mem::size_of::<Key>()
            + self.existing.capacity() * std::mem::size_of::<Existing>()
    }

    /// The entries in canonical order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            cur: Cursor::new(self),
        }
    }

    /// Materialise as a [`ReadSet`] (about 100 bytes per entry more).
    pub fn to_read_set(&self) -> ReadSet {
        ReadSet {
            format: FORMAT.to_owned(),
            root: self.root,
            entries: self.iter().collect(),
        }
    }

    /// Write the canonical encoding (byte for byte [`ReadSet::encode`]),
    /// streamed from the walk.
    pub fn write_to(&self, mut w: impl Write) -> io::Result<()> {
        #[derive(Serialize)]
        struct EntryRef<'a> {
            path: &'a str,
            kind: EntryKind,
            #[serde(skip_serializing_if = "Option::is_none")]
            digest: Option<&'a Digest>,
            access: Access,
        }
        w.write_all(b"{\"format\":")?;
        serde_json::to_writer(&mut w, FORMAT)?;
        w.write_all(b",\"root\":")?;
        serde_json::to_writer(&mut w, &self.root)?;
        w.write_all(b",\"entries\":[")?;
        let mut cur = Cursor::new(self);
        let mut first = true;
        while let Some((path, kind, digest, access)) = cur.next_ref() {
            if !first {
                w.write_all(b",")?;
            }
            first = false;
            serde_json::to_writer(
                &mut w,
                &EntryRef {
                    path,
                    kind,
                    digest: digest.as_ref(),
                    access,
                },
            )?;
        }
        w.write_all(b"]}\n")
    }

    /// The canonical encoding in memory (for small sets and tests).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write_to(&mut v);
        v
    }

    /// The digest of the canonical encoding, computed without holding it.
    pub fn digest(&self) -> Digest {
        let mut h = blake3::Hasher::new();
        let _ = self.write_to(io::BufWriter::with_capacity(1 << 16, &mut h));
        h.finalize().into()
    }

    /// Stream the canonical encoding into `store` as a blob; its digest.
    pub fn store(&self, store: &LocalStore) -> Result<Digest, Error> {
        self.store_with(store, None)
    }

    /// [`store`](Self::store), rooting the blob in `roots` before gc can
    /// see it.
    pub fn store_rooted(
        &self,
        store: &LocalStore,
        roots: &castore::TempRoots,
    ) -> Result<Digest, Error> {
        self.store_with(store, Some(roots))
    }

    fn store_with(
        &self,
        store: &LocalStore,
        roots: Option<&castore::TempRoots>,
    ) -> Result<Digest, Error> {
        let mut w = io::BufWriter::with_capacity(1 << 16, store.blob_writer()?);
        let path = store.root().join("tmp");
        let io_err = |e: io::Error| {
            Error::Store(Box::new(castore::Error::Io {
                op: "write the read set into",
                path: path.clone(),
                source: e,
            }))
        };
        self.write_to(&mut w).map_err(io_err)?;
        let w = w.into_inner().map_err(|e| io_err(e.into_error()))?;
        let (d, _) = match roots {
            Some(r) => w.finish_rooted(r)?,
            None => w.finish()?,
        };
        Ok(d)
    }
}

/// The entries of a [`CompactReadSet`], in canonical order.
pub struct Iter<'a> {
    cur: Cursor<'a>,
}

impl Iterator for Iter<'_> {
    type Item = ReadSetEntry;

    fn next(&mut self) -> Option<ReadSetEntry> {
        let (path, kind, digest, access) = self.cur.next_ref()?;
        Some(ReadSetEntry {
            path: path.to_owned(),
            kind,
            digest,
            access,
        })
    }
}

struct Frame {
    a: usize,
    a_end: usize,
    k: usize,
    k_end: usize,
    /// Length of the directory's path in `Cursor::path` ("" for the root).
    prefix: usize,
}

/// One step of the walk.
enum Step {
    /// An entry at `Cursor::path`.
    Entry(EntryKind, Option<Digest>, Access),
    /// Into the directory at `Cursor::path` (named `Cursor::name`).
    Enter,
    /// Out of the current directory.
    Leave,
    Done,
}

/// The depth-first walk behind iteration, encoding and checking.
struct Cursor<'a> {
    set: &'a CompactReadSet,
    stack: Vec<Frame>,
    path: String,
    /// The escaped name of the last entry or directory stepped to.
    name: &'a [u8],
    root_pending: bool,
}

impl<'a> Cursor<'a> {
    fn new(set: &'a CompactReadSet) -> Self {
        let mut c = Cursor {
            set,
            stack: Vec::new(),
            path: String::new(),
            name: b"",
            root_pending: set.root_entry.is_some(),
        };
        c.enter(0, 0);
        c
    }

    fn enter(&mut self, dir: u32, prefix: usize) {
        let s = self.set;
        let a = s
            .absent
            .partition_point(|&o| s.absent_arena.record(o).0 < dir);
        let a_end = a + s.absent[a..].partition_point(|&o| s.absent_arena.record(o).0 == dir);
        let k = s.keys.partition_point(|key| key.parent < dir);
        let k_end = k + s.keys[k..].partition_point(|key| key.parent == dir);
        self.stack.push(Frame {
            a,
            a_end,
            k,
            k_end,
            prefix,
        });
    }

    fn set_name(&mut self, prefix: usize, name: &'a [u8]) {
        self.name = name;
        self.path.truncate(prefix);
        self.path.push('/');
        // Names were stored from `&str`s.
        self.path.push_str(&String::from_utf8_lossy(name));
    }

    fn step(&mut self) -> Step {
        let s = self.set;
        if self.root_pending {
            self.root_pending = false;
            self.path.clear();
            self.path.push('/');
            self.name = b"";
            if let Some(e) = s.root_entry {
                return Step::Entry(e.kind, Some(e.digest), e.access);
            }
        }
        let Some(f) = self.stack.last_mut() else {
            return Step::Done;
        };
        let absent = (f.a < f.a_end).then(|| s.absent_arena.record(s.absent[f.a]).1);
        let key = (f.k < f.k_end).then(|| s.keys[f.k]);
        let take_absent = match (absent, key) {
            (None, None) => {
                self.stack.pop();
                return Step::Leave;
            }
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(an), Some(k)) => {
                cmp_key(an, false, name_at(&s.names, k.name), k.what & BLOCK != 0)
                    == CmpOrdering::Less
            }
        };
        let prefix = f.prefix;
        match (take_absent, absent, key) {
            (true, Some(name), _) => {
                f.a += 1;
                self.set_name(prefix, name);
                Step::Entry(EntryKind::Absent, None, Access::Lookup)
            }
            (false, _, Some(k)) => {
                f.k += 1;
                self.set_name(prefix, name_at(&s.names, k.name));
                if k.what & BLOCK != 0 {
                    let len = self.path.len();
                    self.enter(k.what & !BLOCK, len);
                    return Step::Enter;
                }
                let e = s.existing[k.what as usize];
                Step::Entry(e.kind, Some(e.digest), e.access)
            }
            // Unreachable by construction: the side taken is non-empty.
            _ => Step::Done,
        }
    }

    fn next_ref(&mut self) -> Option<(&str, EntryKind, Option<Digest>, Access)> {
        loop {
            match self.step() {
                Step::Entry(kind, digest, access) => {
                    return Some((&self.path, kind, digest, access))
                }
                Step::Enter | Step::Leave => continue,
                Step::Done => return None,
            }
        }
    }
}

impl CompactReadSet {
    /// The proof of `reads ⊆ declared` in one pass: every entry resolves in
    /// the tree `view` of `store` to exactly the node it records (kind and
    /// digest), and every absence is absent there. Each directory on the
    /// walk is loaded (and verified) once, so this costs one directory read
    /// per observed directory, not one path walk per entry.
    pub fn check_within(&self, store: &dyn DirectoryStore, view: &Digest) -> Result<(), Error> {
        let outside = |path: &str, what: String| Error::OutsideView {
            path: path.to_owned(),
            observed: what,
        };
        if self.root != *view {
            return Err(outside(
                "/",
                format!(
                    "observed in view {}, not in the declared view {view}",
                    self.root
                ),
            ));
        }
        let mut dirs = vec![store.get_directory(view)?];
        let mut cur = Cursor::new(self);
        loop {
            match cur.step() {
                Step::Done => return Ok(()),
                Step::Leave => {
                    dirs.pop();
                }
                Step::Enter => {
                    let raw = unescape_path(&String::from_utf8_lossy(cur.name));
                    let node = dirs.last().and_then(|d| d.get(&raw).cloned());
                    let Some(Node::Directory { digest, .. }) = node else {
                        return Err(outside(
                            &cur.path,
                            "a directory with observed entries below it".into(),
                        ));
                    };
                    dirs.push(store.get_directory(&digest)?);
                }
                Step::Entry(kind, digest, _) => {
                    let found = if cur.path == "/" {
                        Some((EntryKind::Dir, *view))
                    } else {
                        let raw = unescape_path(&String::from_utf8_lossy(cur.name));
                        dirs.last().and_then(|d| d.get(&raw)).map(kind_digest)
                    };
                    let ok = match (found, digest) {
                        (None, None) => kind == EntryKind::Absent,
                        (Some((k, d)), Some(want)) => k == kind && d == want,
                        _ => false,
                    };
                    if !ok {
                        let what = match digest {
                            Some(d) => format!("{kind:?} {d}"),
                            None => "absent".into(),
                        };
                        return Err(outside(&cur.path, what));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake inode table: (parent, name, observed).
    type Observed = Option<(EntryKind, Digest, Access)>;

    struct Fake(Vec<(u32, Vec<u8>, Observed)>);

    impl Tree for Fake {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn parent(&self, i: u32) -> u32 {
            self.0[i as usize].0
        }
        fn name(&self, i: u32) -> &[u8] {
            &self.0[i as usize].1
        }
        fn observed(&self, i: u32) -> Option<(EntryKind, Digest, Access)> {
            self.0[i as usize].2
        }
    }

    fn path_of(f: &Fake, i: u32) -> String {
        if i == 0 {
            return "/".into();
        }
        let mut parts = Vec::new();
        let mut c = i;
        while c != 0 {
            parts.push(escaped(f.name(c)).into_owned());
            c = f.parent(c);
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    /// A tiny deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a>(&mut self, v: &'a [&'a [u8]]) -> &'a [u8] {
            v[(self.next() % v.len() as u64) as usize]
        }
    }

    /// Random trees with names chosen to collide around `/` in byte order
    /// (`a`, `a-b`, `a.b`, `a0`, `a/`-adjacent bytes, escapes, non-UTF-8):
    /// the compact set equals `ReadSet::from_observations` byte for byte.
    #[test]
    fn compact_encoding_equals_the_reference_encoding() {
        let pool: &[&[u8]] = &[
            b"a",
            b"a-b",
            b"a.b",
            b"a0",
            b"ab",
            b"a!",
            b"b",
            b"%x",
            b"\x01",
            b"\xff",
            b"\xc3\xbc",
            b"a\x7f",
            b"zz",
            b"a-",
            b"a.",
            b"\xc2\x85",
        ];
        for seed in 1..200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut inodes: Vec<(u32, Vec<u8>, Observed)> = vec![(0, Vec::new(), None)];
            let mut dirs = vec![0u32];
            let mut used: std::collections::HashSet<(u32, Vec<u8>)> = Default::default();
            let mut abs = Absences::default();
            let budget = Budget::new(u64::MAX);
            let mut want = Vec::new();
            let mut expected_count = 0;
            for _ in 0..(rng.next() % 60) {
                let parent = dirs[(rng.next() % dirs.len() as u64) as usize];
                let name = rng.pick(pool).to_vec();
                if !used.insert((parent, name.clone())) {
                    continue;
                }
                let r = rng.next() % 4;
                if r == 0 {
                    // An absence.
                    assert_eq!(
                        abs.insert(parent, escaped(&name).as_bytes(), &budget),
                        Ok(true)
                    );
                    assert_eq!(
                        abs.insert(parent, escaped(&name).as_bytes(), &budget),
                        Ok(false)
                    );
                    let mut p = path_of(&Fake(inodes.clone()), parent);
                    if p != "/" {
                        p.push('/');
                    }
                    p.push_str(&escaped(&name));
                    want.push(ReadSetEntry::absent(p));
                    expected_count += 1;
                    continue;
                }
                let d = Digest::of(&rng.next().to_le_bytes());
                let kind = [
                    EntryKind::Dir,
                    EntryKind::File,
                    EntryKind::Exe,
                    EntryKind::Symlink,
                ][(rng.next() % 4) as usize];
                let obs = match rng.next() % 3 {
                    0 => None,
                    1 => Some((kind, d, Access::Lookup)),
                    _ => Some((kind, d, Access::Read)),
                };
                inodes.push((parent, name, obs));
                let i = inodes.len() as u32 - 1;
                if kind == EntryKind::Dir {
                    dirs.push(i);
                }
            }
            if rng.next() & 1 == 0 {
                inodes[0].2 = Some((EntryKind::Dir, Digest::of(b"root"), Access::Read));
            }
            let fake = Fake(inodes.clone());
            for (i, (_, _, obs)) in inodes.iter().enumerate() {
                if let Some((kind, digest, access)) = obs {
                    want.push(ReadSetEntry {
                        path: path_of(&fake, i as u32),
                        kind: *kind,
                        digest: Some(*digest),
                        access: *access,
                    });
                    expected_count += 1;
                }
            }
            let root = Digest::of(b"root");
            let reference = ReadSet::from_observations(root, want);
            let compact = CompactReadSet::freeze(root, &fake, abs);
            assert_eq!(compact.len(), expected_count, "seed {seed}");
            assert_eq!(
                String::from_utf8_lossy(&compact.encode()),
                String::from_utf8_lossy(&reference.encode()),
                "seed {seed}"
            );
            assert_eq!(compact.to_read_set(), reference, "seed {seed}");
            assert_eq!(compact.digest(), reference.digest(), "seed {seed}");
        }
    }

    #[test]
    fn empty_set_encodes_like_the_reference() {
        let root = Digest::of(b"r");
        let fake = Fake(vec![(0, Vec::new(), None)]);
        let c = CompactReadSet::freeze(root, &fake, Absences::default());
        assert!(c.is_empty());
        assert_eq!(c.encode(), ReadSet::from_observations(root, []).encode());
    }

    #[test]
    fn check_within_accepts_what_the_view_holds_and_nothing_else() {
        let tmp = tempfile::TempDir::new().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("d/f"), b"x").unwrap();
        std::fs::write(src.join("d/100%"), b"y").unwrap();
        let store = LocalStore::open(tmp.path().join("store")).unwrap();
        let root = castore::import::import_path(&store, &src, &())
            .unwrap()
            .root;
        let d = castore::walk::lookup(&store, &root, "d").unwrap();
        let (dk, dd) = kind_digest(&d);
        let build = |f_digest: Digest, absent: &[u8]| {
            let fake = Fake(vec![
                (0, Vec::new(), Some((EntryKind::Dir, root, Access::Read))),
                (0, b"d".to_vec(), Some((dk, dd, Access::Lookup))),
                (
                    1,
                    b"f".to_vec(),
                    Some((EntryKind::File, f_digest, Access::Read)),
                ),
                (
                    1,
                    b"100%".to_vec(),
                    Some((EntryKind::File, Digest::of(b"y"), Access::Lookup)),
                ),
            ]);
            let budget = Budget::new(u64::MAX);
            let mut abs = Absences::default();
            abs.insert(1, escaped(absent).as_bytes(), &budget).unwrap();
            CompactReadSet::freeze(root, &fake, abs)
        };
        build(Digest::of(b"x"), b"g")
            .check_within(&store, &root)
            .unwrap();
        // A wrong digest, an "absence" of something present, another view.
        let e = build(Digest::of(b"z"), b"g")
            .check_within(&store, &root)
            .unwrap_err();
        assert!(e.to_string().contains("/d/f"), "{e}");
        let e = build(Digest::of(b"x"), b"f")
            .check_within(&store, &root)
            .unwrap_err();
        assert!(matches!(e, Error::OutsideView { .. }), "{e}");
        assert!(build(Digest::of(b"x"), b"g")
            .check_within(&store, &dd)
            .is_err());
    }

    #[test]
    fn budget_refuses_past_the_cap() {
        let b = Budget::new(2);
        let mut abs = Absences::default();
        assert_eq!(abs.insert(0, b"x", &b), Ok(true));
        assert_eq!(abs.insert(0, b"y", &b), Ok(true));
        // Known entries are still fine at the cap; new ones are not.
        assert_eq!(abs.insert(0, b"x", &b), Ok(false));
        assert_eq!(abs.insert(0, b"z", &b), Err(Full));
        assert_eq!(abs.insert(1, b"x", &b), Err(Full));
        assert_eq!(b.refused(), 2);
        assert_eq!(abs.len(), 2);
    }
}
