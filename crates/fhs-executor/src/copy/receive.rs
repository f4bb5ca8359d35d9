//! The receiving side of a copy: every object checked on arrival, staged
//! in one transaction, committed and indexed only when the whole copy
//! holds (see the parent module for what is checked).

use std::collections::HashMap;
use std::io::{BufRead, Read};

use castore::store::{DirectoryStore, LocalStore, ObjectKind, Txn};
use castore::{CheckedBlob, Digest, Directory, Node};
use ed25519_dalek::VerifyingKey;
use executor_core::SignedRecord;

use super::{parse_record, CopyError, Moved, Sink};
use super::{MAX_DIRECTORY_BYTES, MAX_RECORD_BYTES};
use crate::{cache, keys, prune, sign, Error};

/// At most this many records in one copy: each is held until the end.
const MAX_RECORDS: usize = 1 << 16;

/// An object named and not yet received.
#[derive(Debug, Clone, Copy, Default)]
struct Want {
    /// A file's size, as the directory naming it gives it.
    size: Option<u64>,
    /// The output it lies below (an index into `Receiver::outputs`): the
    /// copy is incomplete without it. `None`: a record's other blobs,
    /// taken where the source has them.
    output: Option<usize>,
}

/// Takes a copy into one store. Made with [`Receiver::new`], fed objects
/// (as a [`Sink`], or by the bundle reader), ended with
/// [`Receiver::finish`]; dropped before that, it leaves the store as it
/// was.
pub struct Receiver<'s> {
    store: &'s LocalStore,
    txn: Txn<'s>,
    trust: Vec<VerifyingKey>,
    /// Where the objects come from, for messages.
    from: String,
    expected: HashMap<(ObjectKind, Digest), Want>,
    /// Received objects, with their lengths.
    received: HashMap<(ObjectKind, Digest), u64>,
    /// Each received directory's subdirectories (for the depth check).
    subdirs: HashMap<Digest, Vec<Digest>>,
    /// (record, output name, output root) of every output expected.
    outputs: Vec<(Digest, String, Digest)>,
    records: Vec<(Digest, SignedRecord)>,
    moved: Moved,
}

fn kind_name(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Blob => "blob",
        ObjectKind::Directory => "directory",
    }
}

/// Text the sender chose (a key a record names, a parser's complaint
/// quoting a field name), as a message may show it: escaped, and cut
/// short past `max` characters.
fn shown(text: &str, max: usize) -> String {
    let cut: String = text.chars().take(max).collect();
    let mut s = castore::shown::escaped(cut.as_bytes());
    if cut.len() < text.len() {
        s.push('…');
    }
    s
}

fn shown_key(k: &str) -> String {
    shown(k, 100)
}

/// How many records a message lists.
const SHOWN_RECORDS: usize = 5;

/// `items`, comma-separated: the first `max`, then how many more.
fn listed<T: std::fmt::Display>(items: impl ExactSizeIterator<Item = T>, max: usize) -> String {
    let n = items.len();
    let mut s: Vec<String> = items.take(max).map(|i| i.to_string()).collect();
    if n > max {
        s.push(format!("and {} more", n - max));
    }
    s.join(", ")
}

impl<'s> Receiver<'s> {
    /// Receive into `store`, trusting its own key (if it has one yet) and
    /// `trust` (`ed25519:<hex>` each); `from` names the source in messages.
    pub fn new(store: &'s LocalStore, trust: &[String], from: String) -> Result<Self, Error> {
        let mut keys = Vec::new();
        let own = keys::key_path(store.root());
        if own.exists() {
            keys.push(keys::load(&own)?.verifying_key());
        }
        for t in trust {
            keys.push(keys::parse_public_key(t)?);
        }
        Ok(Receiver {
            store,
            txn: store.txn()?,
            trust: keys,
            from,
            expected: HashMap::new(),
            received: HashMap::new(),
            subdirs: HashMap::new(),
            outputs: Vec::new(),
            records: Vec::new(),
            moved: Moved::default(),
        })
    }

    /// Note that `kind` `d` is named (by a record, or a directory below
    /// output `output`).
    fn expect(
        &mut self,
        kind: ObjectKind,
        d: Digest,
        size: Option<u64>,
        output: Option<usize>,
    ) -> Result<(), Error> {
        let wrong_size = |expected: u64, got: u64| CopyError::WrongSize {
            digest: d,
            expected,
            got,
            from: self.from.clone(),
        };
        if let Some(&len) = self.received.get(&(kind, d)) {
            return match size {
                Some(s) if s != len => Err(wrong_size(s, len).into()),
                _ => Ok(()),
            };
        }
        let want = self.expected.entry((kind, d)).or_default();
        match (want.size, size) {
            (Some(a), Some(b)) if a != b => return Err(wrong_size(a, b).into()),
            (None, Some(b)) => want.size = Some(b),
            _ => {}
        }
        if want.output.is_none() {
            want.output = output;
        }
        Ok(())
    }

    /// The wish for `kind` `d`, taken: refused if nothing named it.
    fn take(&mut self, kind: ObjectKind, d: &Digest) -> Result<Want, Error> {
        self.expected.remove(&(kind, *d)).ok_or_else(|| {
            CopyError::Unnamed {
                kind: kind_name(kind),
                digest: *d,
                from: self.from.clone(),
            }
            .into()
        })
    }

    /// Count an object staged (or found present) of `len` bytes.
    fn count(&mut self, present: bool, len: u64) {
        if present {
            self.moved.present += 1;
        } else {
            self.moved.objects += 1;
            self.moved.bytes += len;
        }
    }

    fn altered(&self, kind: &'static str, digest: Digest, actual: Digest) -> Error {
        CopyError::Altered {
            kind,
            digest,
            actual,
            from: self.from.clone(),
        }
        .into()
    }

    /// Check that `d`'s `bytes` are a current record signed by a trusted
    /// key, stage it, and expect what it names.
    fn take_record(&mut self, d: &Digest, bytes: &[u8]) -> Result<(), Error> {
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(Error::BadRecord(format!(
                "{d} from {} is {} bytes, more than a record's {MAX_RECORD_BYTES}",
                self.from,
                bytes.len()
            )));
        }
        let blob = CheckedBlob::expecting(d, bytes).map_err(|a| self.altered("record", *d, a))?;
        if self.records.iter().any(|(r, _)| r == d) {
            return Ok(());
        }
        if self.records.len() >= MAX_RECORDS {
            return Err(CopyError::Malformed {
                from: self.from.clone(),
                why: format!("it holds more than {MAX_RECORDS} records; copy fewer at once"),
            }
            .into());
        }
        let rec = parse_record(d, bytes).map_err(|e| match e {
            // The parser's complaint may quote the sender's field names.
            Error::BadRecord(why) => Error::BadRecord(shown(&why, 300)),
            other => other,
        })?;
        let Some(key) = keys::trusted(&self.trust, &rec.public_key) else {
            return Err(CopyError::Untrusted {
                record: *d,
                signer: shown_key(&rec.public_key),
                store: super::store_name(self.store),
            }
            .into());
        };
        if !sign::signed_with(&rec, key) {
            return Err(CopyError::BadSignature {
                record: *d,
                signer: shown_key(&rec.public_key),
                from: self.from.clone(),
            }
            .into());
        }
        let present = self.store.has(ObjectKind::Blob, d) || self.txn.has_blob(d);
        self.txn.put_checked_blob(&blob)?;
        self.count(present, bytes.len() as u64);
        // Named by another record already (as its `check_of`, say): here.
        self.expected.remove(&(ObjectKind::Blob, *d));
        self.received
            .insert((ObjectKind::Blob, *d), bytes.len() as u64);
        for (name, root) in &rec.record.outputs {
            self.outputs.push((*d, name.as_str().to_owned(), *root));
            let i = self.outputs.len() - 1;
            self.expect(ObjectKind::Directory, *root, None, Some(i))?;
        }
        for b in rec.record.named_blobs() {
            self.expect(ObjectKind::Blob, b, None, None)?;
        }
        self.moved.records.push(*d);
        self.records.push((*d, rec));
        Ok(())
    }

    fn take_directory(&mut self, d: &Digest, bytes: &[u8]) -> Result<(), Error> {
        let want = self.take(ObjectKind::Directory, d)?;
        if bytes.len() as u64 > MAX_DIRECTORY_BYTES {
            return Err(CopyError::Malformed {
                from: self.from.clone(),
                why: format!(
                    "the directory {d} is {} bytes, more than the {MAX_DIRECTORY_BYTES} a copy takes",
                    bytes.len()
                ),
            }
            .into());
        }
        let actual = Digest::of(bytes);
        if actual != *d {
            return Err(self.altered("directory", *d, actual));
        }
        let dir = Directory::decode(bytes)?;
        let mut subdirs = Vec::new();
        for (_, node) in dir.entries() {
            match node {
                Node::Directory { digest, .. } => {
                    subdirs.push(*digest);
                    self.expect(ObjectKind::Directory, *digest, None, want.output)?;
                }
                Node::File { digest, size, .. } => {
                    self.expect(ObjectKind::Blob, *digest, Some(*size), want.output)?
                }
                Node::Symlink { .. } => {}
            }
        }
        self.subdirs.insert(*d, subdirs);
        let present = self.store.has(ObjectKind::Directory, d);
        self.txn.put_directory(&dir)?;
        self.count(present, bytes.len() as u64);
        self.received
            .insert((ObjectKind::Directory, *d), bytes.len() as u64);
        Ok(())
    }

    fn take_blob(&mut self, d: &Digest, len: u64, r: &mut dyn BufRead) -> Result<(), Error> {
        let want = self.take(ObjectKind::Blob, d)?;
        if let Some(size) = want.size.filter(|s| *s != len) {
            return Err(CopyError::WrongSize {
                digest: *d,
                expected: size,
                got: len,
                from: self.from.clone(),
            }
            .into());
        }
        let present = self.store.has(ObjectKind::Blob, d) || self.txn.has_blob(d);
        // Hashed as it is staged; staged under what it hashes to, which
        // must be its name (else the transaction, dropped, takes it away).
        let (actual, n) = self.txn.put_blob_buffered(&mut r.take(len))?;
        if n < len {
            return Err(CopyError::Truncated {
                from: self.from.clone(),
                at: format!("inside the blob {d}, after {n} of its {len} bytes"),
            }
            .into());
        }
        if actual != *d {
            return Err(self.altered("blob", *d, actual));
        }
        self.count(present, len);
        self.received.insert((ObjectKind::Blob, *d), len);
        Ok(())
    }

    /// Records received so far.
    pub fn records(&self) -> impl Iterator<Item = &Digest> {
        self.records.iter().map(|(d, _)| d)
    }

    /// Check that the copy is whole — each of `want` received, every
    /// object of every output here, no output deeper than the store takes
    /// — then commit it and index each record. What it moved.
    pub fn finish(self, want: &[Digest]) -> Result<Moved, Error> {
        if self.records.is_empty() {
            return Err(CopyError::Malformed {
                from: self.from.clone(),
                why: "it holds no record".into(),
            }
            .into());
        }
        for w in want {
            if !self.records.iter().any(|(r, _)| r == w) {
                return Err(Error::Usage(format!(
                    "{} does not hold record {w}; it holds {}",
                    self.from,
                    listed(self.records.iter().map(|(d, _)| d), SHOWN_RECORDS)
                )));
            }
        }
        let mut missing: Vec<(&(ObjectKind, Digest), &Want)> = self
            .expected
            .iter()
            .filter(|((kind, d), w)| w.output.is_some() && !self.store.has(*kind, d))
            .collect();
        missing.sort_by_key(|((_, d), w)| (w.output, *d));
        if let Some(((kind, d), w)) = missing.first() {
            let (record, output, _) = &self.outputs[w.output.unwrap_or_default()];
            return Err(CopyError::Incomplete {
                record: *record,
                output: output.clone(),
                kind: kind_name(*kind),
                digest: *d,
                from: self.from.clone(),
            }
            .into());
        }
        self.check_depth(castore::fs_tree::MAX_DEPTH)?;
        // No gc between the commit and the index entries.
        let _hold = self.store.hold_gc()?;
        self.txn.commit()?;
        for (d, rec) in &self.records {
            index(self.store, d, rec)?;
        }
        Ok(self.moved)
    }

    /// Refuse an output that nests deeper than `limit` counting what it
    /// names below it in the store: each directory received, over
    /// whatever the store already has (measured there, so stacking
    /// received directories on a deep tree there is refused too). An
    /// output not received is the store's own, which passed this check on
    /// its way in. One walk for every output: each directory once.
    fn check_depth(&self, limit: usize) -> Result<(), Error> {
        let received = self
            .outputs
            .iter()
            .map(|(_, _, root)| *root)
            .filter(|root| self.subdirs.contains_key(root));
        castore::walk::check_depth_with(received, limit, |d| match self.subdirs.get(d) {
            Some(children) => Ok(children.clone()),
            None => Ok(castore::walk::subdirectories(&self.store.get_directory(d)?)),
        })?;
        Ok(())
    }
}

/// Index `record` in `store` as the build that made it indexed it there:
/// under its action, and, for a successful build that is neither a check
/// nor a reuse, under its command (when its action came with it: the
/// command digest is computed from the action).
fn index(store: &LocalStore, digest: &Digest, rec: &SignedRecord) -> Result<(), Error> {
    let r = &rec.record;
    cache::index(store, &r.action_digest, digest)?;
    if !(r.succeeded() && r.check_of.is_none() && r.reused.is_none()) {
        return Ok(());
    }
    // Without its action (or one that does not parse): no command entry.
    let Ok(command) = prune::recorded_command(store, r) else {
        return Ok(());
    };
    cache::index_command(store, &command, digest)
}

impl Sink for Receiver<'_> {
    fn wants(&mut self, kind: ObjectKind, digest: &Digest) -> bool {
        let has = self.store.has(kind, digest);
        if has {
            self.moved.present += 1;
        }
        !has
    }

    fn record(&mut self, digest: &Digest, bytes: &[u8]) -> Result<(), Error> {
        self.take_record(digest, bytes)
    }

    fn directory(&mut self, digest: &Digest, bytes: &[u8]) -> Result<(), Error> {
        self.take_directory(digest, bytes)
    }

    fn blob(&mut self, digest: &Digest, len: u64, r: &mut dyn BufRead) -> Result<(), Error> {
        self.take_blob(digest, len, r)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use castore::store::DirectoryStore;
    use castore::Name;
    use ed25519_dalek::SigningKey;
    use executor_core::BuildRecord;

    use super::*;
    use crate::copy::{self, CopyError};

    /// A source store and a receiving store, in `t`.
    fn stores(t: &tempfile::TempDir) -> (LocalStore, LocalStore) {
        (
            LocalStore::open(t.path().join("a")).unwrap(),
            LocalStore::open(t.path().join("b")).unwrap(),
        )
    }

    /// A successful record of `output`, signed by `key`, stored in `store`.
    fn record(store: &LocalStore, key: &SigningKey, output: Digest) -> Digest {
        record_of(store, key, Digest::of(b"an action not stored"), output)
    }

    /// [`record`] of the action `action`.
    fn record_of(store: &LocalStore, key: &SigningKey, action: Digest, output: Digest) -> Digest {
        let log = store.txn().and_then(|t| {
            let d = t.put_blob(b"a log")?;
            t.commit().map(|_| d)
        });
        let r = BuildRecord {
            view_digest: Digest::of(b"a view never copied"),
            outputs: BTreeMap::from([("out".parse().unwrap(), output)]),
            ..cache::test_record(action, log.unwrap())
        };
        sign::store_record(store, &sign::sign(r, key)).unwrap()
    }

    /// Directories nested `depth` deep, a file at the bottom: the top's digest.
    fn chain(store: &LocalStore, depth: usize) -> Digest {
        let txn = store.txn().unwrap();
        let blob = txn.put_blob(b"bottom").unwrap();
        let mut dir = Directory::new();
        dir.insert(
            Name::new(b"f").unwrap(),
            Node::File {
                digest: blob,
                size: 6,
                executable: false,
            },
        )
        .unwrap();
        let mut d = txn.put_directory(&dir).unwrap();
        for _ in 0..depth {
            let mut up = Directory::new();
            up.insert(
                Name::new(b"d").unwrap(),
                Node::Directory { digest: d, size: 1 },
            )
            .unwrap();
            d = txn.put_directory(&up).unwrap();
        }
        txn.commit().unwrap();
        d
    }

    fn trust(key: &SigningKey) -> Vec<String> {
        vec![keys::public_key_string(&key.verifying_key())]
    }

    #[test]
    fn a_shallow_output_is_received_and_indexed() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = stores(&t);
        let key = SigningKey::from_bytes(&[3; 32]);
        let top = chain(&src, 40);
        let rec = record(&src, &key, top);
        let moved = copy::to_store(&src, &dst, &[rec], &trust(&key)).unwrap();
        // The record, the log, 41 directories, the file.
        assert_eq!((moved.records, moved.objects), (vec![rec], 44));
        assert!(dst.get_directory(&top).is_ok());
        let cache = cache::ActionCache::new(&dst, key.verifying_key(), &[]).unwrap();
        let hit = cache.lookup(&Digest::of(b"an action not stored")).unwrap();
        assert_eq!(hit.hit.map(|h| h.digest), Some(rec));
        // Again: nothing moves.
        let again = copy::to_store(&src, &dst, &[rec], &trust(&key)).unwrap();
        assert_eq!((again.objects, again.bytes), (0, 0));
    }

    #[test]
    fn a_message_lists_a_few_records_and_counts_the_rest() {
        let d = |i: u8| Digest::of(&[i]);
        let few: Vec<Digest> = (0..3).map(d).collect();
        assert_eq!(
            listed(few.iter(), 5),
            format!("{}, {}, {}", d(0), d(1), d(2))
        );
        let many: Vec<Digest> = (0..40).map(d).collect();
        let shown = listed(many.iter(), 5);
        assert!(shown.starts_with(&d(0).to_string()), "{shown}");
        assert!(shown.ends_with(", and 35 more"), "{shown}");
        assert!(!shown.contains(&d(5).to_string()), "{shown}");
    }

    #[test]
    fn an_output_deeper_than_the_store_takes_is_refused_and_nothing_lands() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = stores(&t);
        let key = SigningKey::from_bytes(&[3; 32]);
        let top = chain(&src, castore::fs_tree::MAX_DEPTH + 1);
        let rec = record(&src, &key, top);
        match copy::to_store(&src, &dst, &[rec], &trust(&key)) {
            Err(Error::Store(castore::Error::TreeTooDeep { root, .. })) => assert_eq!(root, top),
            other => panic!("{other:?}"),
        }
        assert!(!dst.has(ObjectKind::Blob, &rec));
        assert!(!dst.has(ObjectKind::Directory, &top));
        assert!(!dst.root().join("actions").exists());
    }

    /// The directories a copy brings count what they name below them in
    /// the receiving store: one over a tree there as deep as the store
    /// takes is one too many.
    #[test]
    fn an_output_stacked_on_a_deep_tree_the_store_has_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = stores(&t);
        let key = SigningKey::from_bytes(&[3; 32]);
        let deep = chain(&src, castore::fs_tree::MAX_DEPTH);
        let a = record(&src, &key, deep);
        copy::to_store(&src, &dst, &[a], &trust(&key)).unwrap();
        assert!(dst.get_directory(&deep).is_ok());
        // B's output: one directory over A's.
        let mut up = Directory::new();
        up.insert(
            Name::new(b"d").unwrap(),
            Node::Directory {
                digest: deep,
                size: 1,
            },
        )
        .unwrap();
        let over = src.put_directory(&up).unwrap();
        let action = Digest::of(b"another action");
        let b = record_of(&src, &key, action, over);
        for (what, copied) in [
            (
                "store to store",
                copy::to_store(&src, &dst, &[b], &trust(&key)),
            ),
            ("by bundle", {
                let p = t.path().join("b.bundle");
                copy::to_bundle(&src, &[b], &p).unwrap();
                copy::from_bundle(&p, &dst, &[b], &trust(&key))
            }),
        ] {
            match copied {
                Err(Error::Store(castore::Error::TreeTooDeep { root, .. })) => {
                    assert_eq!(root, over, "{what}")
                }
                other => panic!("{what}: {other:?}"),
            }
            assert!(!dst.has(ObjectKind::Blob, &b), "{what}");
            assert!(!dst.has(ObjectKind::Directory, &over), "{what}");
            let cache = cache::ActionCache::new(&dst, key.verifying_key(), &[]).unwrap();
            let found = cache.lookup(&action).unwrap();
            assert!(found.hit.is_none() && found.rejected.is_empty(), "{what}");
        }
    }

    /// A record is a few KiB: one past a mebibyte is refused before it is
    /// parsed.
    #[test]
    fn a_record_past_a_mebibyte_is_refused_unparsed() {
        assert_eq!(MAX_RECORD_BYTES, 1 << 20);
        let t = tempfile::tempdir().unwrap();
        let (_, dst) = stores(&t);
        let mut rx = Receiver::new(&dst, &[], "a test".into()).unwrap();
        let bytes = vec![b' '; MAX_RECORD_BYTES as usize + 1];
        match rx.record(&Digest::of(&bytes), &bytes) {
            Err(Error::BadRecord(why)) => assert!(why.contains("more than a record's"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_source_missing_an_output_object_is_refused_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = stores(&t);
        let key = SigningKey::from_bytes(&[3; 32]);
        let gone = Digest::of(b"a directory never stored");
        let rec = record(&src, &key, gone);
        match copy::to_store(&src, &dst, &[rec], &trust(&key)) {
            Err(Error::Copy(e)) if matches!(*e, CopyError::SourceIncomplete { .. }) => {
                assert!(e.to_string().contains(&gone.to_string()), "{e}");
                assert!(e.to_string().contains("output out"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!dst.has(ObjectKind::Blob, &rec));
    }
}
