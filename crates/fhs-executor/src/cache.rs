//! The action cache: which signed records answer an action digest.
//!
//! ```text
//! STORE/actions/ab/ab12…(action)/cd34…(record)   empty files
//! ```
//!
//! The index only says where to look; it is never trusted. A record
//! answers a build (a *hit*) only if, read back from the store, it is of
//! the current format, its signature verifies, its signer is trusted (the
//! executor's own key, plus `--trust`), it names this action digest, the
//! build succeeded with no violation, it is not a `--check` rebuild's
//! record, and every object of every output is present (or, with a remote
//! cache, held there: see [`crate::remote`]). So a stale,
//! forged or half-collected entry costs a lookup, never a wrong answer.
//!
//! Every record is indexed, failed ones too, so a `--check` of an action
//! whose last build failed can say so instead of "never built". Entries
//! are created with one `open(O_CREAT)` each: concurrent builds of one
//! action never conflict, and there is nothing to lock.
//!
//! A trusted key is compared by its bytes, and the signature must be that
//! key's. Presence is a walk of each output's directories and a `stat` per
//! blob, relative to `dirs/` and `blobs/` held open; content is verified
//! when it is served. A remote build's client trusts records signed by the
//! worker's key or a `--trust`ed one.

use std::fs;
use std::path::PathBuf;

use castore::store::{DirectoryStore, LocalStore, ObjectKind};
use castore::{Digest, Node};
use ed25519_dalek::VerifyingKey;
use executor_core::record::RECORD_FORMAT;
use executor_core::SignedRecord;

use crate::remote::RemoteCache;
use crate::validate::Listed;
use crate::{keys, sign, Error};

/// The action index of one store, and whom it trusts.
pub struct ActionCache<'s> {
    store: &'s LocalStore,
    trust: Vec<VerifyingKey>,
    /// Outputs this remote holds count as present (Build without the
    /// Bytes: they are fetched, and checked, when something needs them).
    remote: Option<&'s dyn RemoteCache>,
}

/// A record found for an action.
#[derive(Debug, Clone)]
pub struct Found {
    pub digest: Digest,
    pub record: SignedRecord,
}

/// How a rejection of a failed build's record starts: `that build failed
/// (exit code 2)`.
pub(crate) const FAILED_BUILD: &str = "that build failed ";

/// What the index holds for an action, sorted out.
#[derive(Debug, Default)]
pub struct Lookup {
    /// The first record that answers the action, if any.
    pub hit: Option<Found>,
    /// Records that do not, each with why (for messages).
    pub rejected: Vec<(Digest, String)>,
}

impl<'s> ActionCache<'s> {
    /// The cache of `store`, trusting `trust` (`ed25519:<hex>` each) and
    /// `own`.
    pub fn new(store: &'s LocalStore, own: VerifyingKey, trust: &[String]) -> Result<Self, Error> {
        let mut keys = vec![own];
        for t in trust {
            keys.push(keys::parse_public_key(t)?);
        }
        Ok(ActionCache {
            store,
            trust: keys,
            remote: None,
        })
    }

    /// The same cache, counting outputs `remote` holds as present.
    pub fn with_remote(mut self, remote: Option<&'s dyn RemoteCache>) -> Self {
        self.remote = remote;
        self
    }

    /// The remote cache whose outputs count as present, if any.
    pub fn remote(&self) -> Option<&'s dyn RemoteCache> {
        self.remote
    }

    /// Note that `record` is a record of `action`.
    pub fn insert(&self, action: &Digest, record: &Digest) -> Result<(), Error> {
        index(self.store, action, record)
    }

    /// Note that `record`, a successful build, is a record of `command`.
    pub fn insert_command(&self, command: &Digest, record: &Digest) -> Result<(), Error> {
        index_command(self.store, command, record)
    }

    /// The records indexed for `action`, in a stable order.
    pub fn records(&self, action: &Digest) -> Result<Vec<Digest>, Error> {
        self.indexed(Index::Actions, action)
    }

    /// A record of the same command whose read set holds in `view`: the
    /// build would see nothing different, so its outputs answer. `Ok(None)`
    /// if none does; the rejected candidates' reasons go to `rejected`.
    pub fn validated(
        &self,
        command: &Digest,
        view: &Digest,
        rejected: &mut Vec<(Digest, String)>,
    ) -> Result<Option<Found>, Error> {
        let records = self.indexed(Index::Commands, command)?;
        self.validated_among(records, &Listed::new(), view, rejected)
    }

    /// The first of `records` (records of one command, in the store) whose
    /// read set holds in `view`, the directories their builds listed
    /// looked up in `listed` before the store.
    pub fn validated_among(
        &self,
        records: Vec<Digest>,
        listed: &Listed,
        view: &Digest,
        rejected: &mut Vec<(Digest, String)>,
    ) -> Result<Option<Found>, Error> {
        for digest in records {
            let checked = self.usable(&digest, None).and_then(|record| {
                let rs = castore_fuse::ReadSet::load(
                    self.store,
                    &record.record.observed_read_set_digest,
                )
                .map_err(|e| format!("its read set cannot be read: {}", castore::Chain(&e)))?;
                crate::validate::read_set_holds_given(self.store, listed, view, &rs)?;
                Ok(record)
            });
            match checked {
                Ok(record) => return Ok(Some(Found { digest, record })),
                Err(why) => rejected.push((digest, why)),
            }
        }
        Ok(None)
    }

    fn indexed(&self, index: Index, key: &Digest) -> Result<Vec<Digest>, Error> {
        let dir = index_dir_of(self.store, index, key);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("read", &dir, e)),
        };
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|e| Error::io("read", &dir, e))?;
            let name = e.file_name();
            // Anything that is not a digest's hex is not ours: ignore it.
            if let Some(d) = name
                .to_str()
                .and_then(|n| format!("b3:{n}").parse::<Digest>().ok())
            {
                out.push(d);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Find a record that answers `action`.
    pub fn lookup(&self, action: &Digest) -> Result<Lookup, Error> {
        Ok(self.answer(action, self.records(action)?))
    }

    /// The first of `records` (in the store, from wherever they came) that
    /// answers `action`, and why each before it does not.
    pub fn answer(&self, action: &Digest, records: Vec<Digest>) -> Lookup {
        let mut found = Lookup::default();
        for digest in records {
            match self.usable(&digest, Some(action)) {
                Ok(record) => {
                    found.hit = Some(Found { digest, record });
                    break;
                }
                Err(why) => found.rejected.push((digest, why)),
            }
        }
        found
    }

    /// The record `digest`, if it may answer a build at all — current
    /// format, a valid signature by a trusted key, a successful build that
    /// was not a check, a complete read set, every output present — and,
    /// given one, answers `action`; else why not. What the record's own
    /// fields refuse is refused before its signature is checked: an
    /// action's index gathers records that can never answer here (other
    /// signers', `--check` rebuilds', failures), and each of them used to
    /// cost an ed25519 verification — with 220 of them ahead of the hit, a
    /// cache hit took 17.7 ms, and 7.2 ms once they were refused first. A
    /// record whose claims pass still answers only if the trusted key it
    /// names signed it.
    fn usable(&self, digest: &Digest, action: Option<&Digest>) -> Result<SignedRecord, String> {
        if !self.store.has(ObjectKind::Blob, digest) {
            return Err("the record is no longer in the store".into());
        }
        let rec =
            sign::load_record(self.store, digest).map_err(|e| castore::Chain(&e).to_string())?;
        let r = &rec.record;
        if r.format != RECORD_FORMAT {
            return Err(format!(
                "it is a format-{} record; this fhsx writes format {RECORD_FORMAT}",
                r.format
            ));
        }
        let Some(key) = keys::trusted(&self.trust, &rec.public_key) else {
            return Err(format!(
                "it is signed by {}, which is not trusted (pass --trust to trust it)",
                claimed_text(&rec.public_key)
            ));
        };
        if action.is_some_and(|a| r.action_digest != *a) {
            return Err(format!("it is a record of action {}", r.action_digest));
        }
        if r.check_of.is_some() {
            return Err("it is the record of a --check rebuild".into());
        }
        if !r.succeeded() {
            return Err(format!(
                "{FAILED_BUILD}({})",
                r.failure
                    .as_deref()
                    .or(r.violations.first().map(String::as_str))
                    .map_or_else(|| r.exit.to_string(), claimed_text)
            ));
        }
        if !sign::signed_with(&rec, key) {
            return Err("its signature does not verify".into());
        }
        for (name, out) in &r.outputs {
            if self.remote.is_some_and(|remote| remote.holds(out)) {
                continue;
            }
            if let Some(missing) = first_missing(self.store, out) {
                return Err(format!(
                    "its output {name} is incomplete in the store ({missing} is missing)"
                ));
            }
        }
        Ok(rec)
    }
}

/// A record's own words in a message. They are read before its signature
/// is checked (that is the costly step, and what it refuses it refuses
/// either way), so they may be anyone's — a remote cache's: a control
/// character anywhere has the whole text escaped. fhsx's own records'
/// words, already escaped where they name what a build chose, show as
/// they are.
fn claimed_text(text: &str) -> String {
    match text.chars().any(char::is_control) {
        true => castore::shown::escaped(text.as_bytes()),
        false => text.to_owned(),
    }
}

/// The two indexes: by action digest (exact hits) and by command digest
/// (candidates for a read-set-validated hit).
#[derive(Clone, Copy)]
enum Index {
    Actions,
    Commands,
}

fn index_dir_of(store: &LocalStore, index: Index, key: &Digest) -> PathBuf {
    let hex = key.hex();
    let base = match index {
        Index::Actions => "actions",
        Index::Commands => "commands",
    };
    store.root().join(base).join(&hex[..2]).join(hex)
}

/// Note in `store`'s index that `record` is a record of `action` (a record
/// downloaded from a worker, say). Idempotent.
pub fn index(store: &LocalStore, action: &Digest, record: &Digest) -> Result<(), Error> {
    index_in(store, Index::Actions, action, record)
}

/// Note in `store`'s command index that `record`, a successful build that
/// is neither a check nor a reuse, is a record of `command` (a record
/// received by `fhsx store copy`, say). Idempotent.
pub fn index_command(store: &LocalStore, command: &Digest, record: &Digest) -> Result<(), Error> {
    index_in(store, Index::Commands, command, record)
}

fn index_in(store: &LocalStore, index: Index, key: &Digest, record: &Digest) -> Result<(), Error> {
    let dir = index_dir_of(store, index, key);
    fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
    let entry = dir.join(record.hex());
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&entry)
        .map_err(|e| Error::io("create", &entry, e))?;
    Ok(())
}

/// Forget that `record` answers `action`; the record itself stays in the
/// store (an REAPI `do_not_cache` action's record: signed and kept, never
/// a cache hit). Idempotent.
pub fn unindex(store: &LocalStore, action: &Digest, record: &Digest) -> Result<(), Error> {
    let mut entries = vec![index_dir_of(store, Index::Actions, action).join(record.hex())];
    // Nor may it answer another action of the same command.
    if let Ok(rec) = sign::load_record(store, record) {
        if let Ok(command) = crate::prune::recorded_command(store, &rec.record) {
            entries.push(index_dir_of(store, Index::Commands, &command).join(record.hex()));
        }
    }
    for entry in entries {
        match fs::remove_file(&entry) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &entry, e)),
        }
    }
    Ok(())
}

/// The first object of the tree `root` that is not in the store. Presence
/// only: the content is verified when it is served or checked, not here, so
/// a hit costs a walk of the output's directories and a `stat` per blob.
fn first_missing(store: &LocalStore, root: &Digest) -> Option<Digest> {
    let mut stack = vec![*root];
    while let Some(d) = stack.pop() {
        let Ok(dir) = store.get_directory(&d) else {
            return Some(d);
        };
        for (_, node) in dir.entries() {
            match node {
                Node::Directory { digest, .. } => stack.push(*digest),
                Node::File { digest, .. } if !store.has(ObjectKind::Blob, digest) => {
                    return Some(*digest)
                }
                _ => {}
            }
        }
    }
    None
}

/// Garbage collection that keeps the records of kept outputs: what
/// [`castore::gc::gc`] keeps, plus — for every indexed record whose every
/// output is kept — the record and its
/// [`kept_blobs`](executor_core::BuildRecord::kept_blobs): log, stderr,
/// read set, interface manifest, fetch lock and action (not its view: that
/// would keep whole toolchains alive).
/// Index entries whose record is gone afterwards are removed, so records of
/// collected outputs go with them.
pub fn gc(store: &LocalStore, keep: &[Digest]) -> Result<castore::gc::GcReport, Error> {
    let report = castore::gc::gc_with(store, keep, &|live| {
        let mut more = Vec::new();
        for (_, record) in indexed(store) {
            let Ok(rec) = sign::load_record(store, &record) else {
                continue;
            };
            let r = &rec.record;
            if r.outputs.is_empty() || !r.outputs.values().all(|o| live.has_directory(o)) {
                continue;
            }
            more.push(record);
            // With the action itself, stored under its digest (for --prune).
            more.extend(r.kept_blobs());
        }
        more
    })?;
    for (entry, record) in indexed(store)
        .into_iter()
        .chain(indexed_in(store, "commands"))
    {
        if !store.has(ObjectKind::Blob, &record) {
            let _ = fs::remove_file(&entry);
        }
    }
    Ok(report)
}

/// Every action-index entry: its path and the record it names.
fn indexed(store: &LocalStore) -> Vec<(PathBuf, Digest)> {
    indexed_in(store, "actions")
}

fn indexed_in(store: &LocalStore, index: &str) -> Vec<(PathBuf, Digest)> {
    let mut out = Vec::new();
    let base = store.root().join(index);
    for shard in fs::read_dir(&base).into_iter().flatten().flatten() {
        for action in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
            for e in fs::read_dir(action.path()).into_iter().flatten().flatten() {
                let d = e
                    .file_name()
                    .to_str()
                    .and_then(|n| format!("b3:{n}").parse::<Digest>().ok());
                if let Some(d) = d {
                    out.push((e.path(), d));
                }
            }
        }
    }
    out
}

/// A successful record of `action`, unsigned, with no outputs, each other
/// digest it must name `blob`: for tests.
#[cfg(test)]
pub(crate) fn test_record(action: Digest, blob: Digest) -> executor_core::BuildRecord {
    use executor_core::record::{ExitStatus, ResourceUse};
    executor_core::BuildRecord {
        format: RECORD_FORMAT,
        action_digest: action,
        closure_digest: blob,
        toolchain_digest: blob,
        view_digest: blob,
        fetch_lock_digest: None,
        outputs: std::collections::BTreeMap::new(),
        interface_manifest_digest: None,
        observed_read_set_digest: blob,
        read_set_size: 0,
        read_set_complete: true,
        log_digest: blob,
        stderr_digest: None,
        exit: ExitStatus::Exited { code: 0 },
        violations: Vec::new(),
        failure: None,
        check_of: None,
        reused: None,
        pruned_from: None,
        variations: std::collections::BTreeMap::new(),
        diffoscope: None,
        resources: ResourceUse::default(),
        executor: "test".into(),
    }
}

#[cfg(test)]
mod tests {
    use castore::store::BlobStore;
    use ed25519_dalek::SigningKey;
    use executor_core::BuildRecord;

    use super::*;

    fn record(action: Digest) -> BuildRecord {
        test_record(action, Digest::of(b"anything"))
    }

    /// What gc keeps and a remote cache is sent with a record, what a copy
    /// carries and what verification checks: each from one list.
    #[test]
    fn a_record_keeps_its_own_blobs_and_carries_the_records_it_names() {
        let d = |s: &str| Digest::of(s.as_bytes());
        let r = BuildRecord {
            view_digest: d("view"),
            observed_read_set_digest: d("read set"),
            log_digest: d("log"),
            stderr_digest: Some(d("stderr")),
            interface_manifest_digest: Some(d("manifest")),
            fetch_lock_digest: Some(d("lock")),
            check_of: Some(d("checked")),
            diffoscope: Some(d("diffoscope")),
            outputs: [("out".parse().unwrap(), d("out"))].into(),
            ..test_record(d("action"), d("lists"))
        };
        let sorted = |mut v: Vec<Digest>| {
            v.sort();
            v
        };
        let kept = ["read set", "log", "lock", "stderr", "manifest", "action"].map(d);
        assert_eq!(sorted(r.kept_blobs()), sorted(kept.to_vec()));
        let mut named = kept.to_vec();
        named.extend(["checked", "diffoscope"].map(d));
        assert_eq!(sorted(r.named_blobs()), sorted(named));
        let verified: Vec<Digest> = r.digests().into_iter().map(|(_, x)| x).collect();
        let mut all = kept[..5].to_vec();
        all.extend(["view", "checked", "diffoscope", "out"].map(d));
        assert_eq!(sorted(verified), sorted(all));
    }

    /// A replay action's command digest covers its lock: unindexing its
    /// record takes the entry the build made under that digest too.
    #[test]
    fn unindexing_a_replay_record_removes_its_command_entry() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let key = SigningKey::from_bytes(&[1; 32]);
        let closure = store.put_blob(b"a closure").unwrap();
        let action = executor_core::Action::parse(
            &format!(
                "[inputs]\nclosure = [\"{closure}\"]\n[run]\ncommand = [\"x\"]\n[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n"
            ),
            std::path::Path::new("a.toml"),
        )
        .unwrap();
        let lock = store.put_blob(b"a fetch lock").unwrap();
        // Stored, signed and indexed as a build does it (`build.rs`).
        let stored = store.put_blob(&action.canonical(Some(&lock))).unwrap();
        assert_eq!(stored, action.digest(Some(&lock)));
        let command = action.command_digest(Some(&lock));
        let r = BuildRecord {
            fetch_lock_digest: Some(lock),
            ..test_record(stored, closure)
        };
        let rec = sign::store_record(&store, &sign::sign(r.clone(), &key)).unwrap();
        assert_eq!(crate::prune::recorded_command(&store, &r).unwrap(), command);
        let cache = ActionCache::new(&store, key.verifying_key(), &[]).unwrap();
        cache.insert(&stored, &rec).unwrap();
        cache.insert_command(&command, &rec).unwrap();
        let entries = [
            index_dir_of(&store, Index::Actions, &stored).join(rec.hex()),
            index_dir_of(&store, Index::Commands, &command).join(rec.hex()),
        ];
        assert!(entries.iter().all(|e| e.exists()));
        unindex(&store, &stored, &rec).unwrap();
        for e in &entries {
            assert!(!e.exists(), "{} is left", e.display());
        }
    }

    /// The trust list is consulted before any signature, so a record must
    /// not pass by naming a trusted key: it answers only if that key signed
    /// it.
    #[test]
    fn a_record_naming_a_trusted_key_answers_only_if_that_key_signed_it() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let own = SigningKey::from_bytes(&[1; 32]);
        let other = SigningKey::from_bytes(&[2; 32]);
        let action = Digest::of(b"an action");
        let cache = ActionCache::new(&store, own.verifying_key(), &[]).unwrap();

        let mut forged = sign::sign(record(action), &other);
        forged.public_key = keys::public_key_string(&own.verifying_key());
        let forged = sign::store_record(&store, &forged).unwrap();
        let theirs = sign::store_record(&store, &sign::sign(record(action), &other)).unwrap();
        cache.insert(&action, &forged).unwrap();
        cache.insert(&action, &theirs).unwrap();
        let found = cache.lookup(&action).unwrap();
        assert!(found.hit.is_none(), "{:?}", found.hit);
        let why = |d: &Digest| {
            found
                .rejected
                .iter()
                .find(|(r, _)| r == d)
                .map(|(_, w)| w.clone())
                .unwrap_or_default()
        };
        assert_eq!(why(&forged), "its signature does not verify");
        assert!(
            why(&theirs).contains("which is not trusted"),
            "{}",
            why(&theirs)
        );

        let mine = sign::store_record(&store, &sign::sign(record(action), &own)).unwrap();
        cache.insert(&action, &mine).unwrap();
        let found = cache.lookup(&action).unwrap();
        assert_eq!(found.hit.map(|h| h.digest), Some(mine));
        // Of another action, even if signed and trusted: no answer.
        let elsewhere = Digest::of(b"another action");
        cache.insert(&elsewhere, &mine).unwrap();
        let found = cache.lookup(&elsewhere).unwrap();
        assert!(found.hit.is_none());
        assert!(found.rejected[0].1.contains("a record of action"));
    }
}
