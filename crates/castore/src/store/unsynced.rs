//! Commits that are visible before they are durable, and what a crash
//! leaves of them: the store may forget such an object, never lie about it.
//!
//! A worker receiving a client's upload answers each batch as soon as it
//! is in the store's page cache, as `cp -r` would; making every batch
//! durable first (one `syncfs` each) bounded an upload by the disk's write
//! speed, about half of what the client could send. What it receives can
//! always be sent again, so losing it in a crash costs a re-upload, while
//! keeping a damaged object under its digest would be a lie every later
//! reader trusts. Buildbarn's local blobstore makes the same trade with
//! its persistent epochs.
//!
//! How, per [`LocalStore`] handle:
//! - Before the first such commit, a log `ROOT/unsynced/log-*` is created,
//!   `flock`ed for as long as the handle lives, and made durable.
//! - Each commit appends the kind and digest of what it stages to the log
//!   and `fdatasync`s it *before* renaming the objects into place, so the
//!   log names every object that may be lost. A writer that knows what is
//!   coming names it ahead ([`LocalStore::intend_unsynced`]: a worker, the
//!   blobs a client claimed), in one append and one `fdatasync`; a commit
//!   of objects the log already names then writes nothing and waits for no
//!   disk. On a disk where a flush costs milliseconds, one per batch of an
//!   upload was most of its time.
//!   [`LocalStore::put_blobs_unsynced`] goes one step further for blobs:
//!   named first, each is then linked into place as soon as it is written
//!   whole, with no staging at all. Each log starts with the machine's boot
//!   id: a recovery in the same boot (the writer was killed, the machine
//!   stayed up, so whatever it renamed into place is still there) takes a
//!   named object that is absent for one that never came.
//! - [`LocalStore::flush_unsynced`] `syncfs`es the file system and removes
//!   the log: from then on its objects are as durable as any other.
//! - [`recover`], on every open, takes each log whose lock is free (its
//!   writer is gone) and re-hashes what it names. A damaged or vanished
//!   object is removed, and then so is every directory that names a
//!   missing object, until none does: a durable tree may have reused such
//!   an object, and a tree with a hole is forgotten whole. If every named
//!   object is intact or, in the same boot, absent (the usual case: the
//!   writer was killed but the machine stayed up), nothing else is scanned.
//!
//! A worker flushes once uploads pause for a second, and at shutdown. A
//! blob is linked into place with `linkat(AT_EMPTY_PATH)` from an unnamed
//! file (`O_TMPFILE`) in its shard, which needs `CAP_DAC_READ_SEARCH`;
//! without it the commit is a transaction. Recovery takes the store lock
//! exclusively without waiting; when it cannot, a later open does it.
//!
//! Not covered: a file system lost and remounted within one boot (an absent
//! object then looks like one never sent; `fhsx store verify` finds the
//! holes).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

use rustix::fs::{flock, FlockOperation};

use super::local::{LocalStore, ObjectKind};
use crate::error::io;
use crate::{Digest, Directory, Error, Node, Result};

/// The subdirectory of the store that holds the logs.
const DIR: &str = "unsynced";

/// One handle's open log, if it has unsynced commits.
#[derive(Debug, Default)]
pub(crate) struct Unsynced {
    /// Commits hold it shared from their log append to their last rename;
    /// a flush holds it exclusive, so no rename slips past its `syncfs`.
    gate: RwLock<()>,
    log: Mutex<Option<Log>>,
}

#[derive(Debug)]
struct Log {
    /// Open and `flock`ed: how [`recover`] tells a live writer's log.
    file: File,
    path: PathBuf,
    /// What this log names durably (up to [`NAMED_MAX`]): a commit of
    /// these appends nothing. Goes with the log at a flush, so an object
    /// is never taken as named by a log that is gone.
    named: HashSet<(ObjectKind, Digest)>,
}

/// Names a log remembers: about 50 MiB at most. Past it, commits append
/// their names again: slower, never wrong.
const NAMED_MAX: usize = 1 << 20;

impl Unsynced {
    /// Log `objects` durably, then run `publish` (the renames) while no
    /// flush can run. The caller has made nothing visible yet.
    pub(crate) fn commit(
        &self,
        store: &LocalStore,
        objects: &[(ObjectKind, Digest)],
        publish: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let _gate = self.gate.read().unwrap_or_else(|p| p.into_inner());
        self.name(store, objects)?;
        publish()
    }

    /// Name `objects` in the log, durably, unless it does already.
    pub(crate) fn name(&self, store: &LocalStore, objects: &[(ObjectKind, Digest)]) -> Result<()> {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let log = match &mut *log {
            Some(l) => l,
            None => log.insert(Log::create(store)?),
        };
        log.append(objects)
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Make every logged object durable and drop the log. False if there
    /// was nothing to flush.
    pub(crate) fn flush(&self) -> Result<bool> {
        let _gate = self.gate.write().unwrap_or_else(|p| p.into_inner());
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let Some(l) = log.as_ref() else {
            return Ok(false);
        };
        rustix::fs::syncfs(&l.file).map_err(|e| Error::Io {
            op: "syncfs",
            path: l.path.clone(),
            source: e.into(),
        })?;
        // A removal lost in a crash only costs the next open a re-hash.
        // A log already gone (removed by hand, or the store's directory
        // mounted over) names nothing a later open could check: done too,
        // rather than failing every flush from now on.
        match fs::remove_file(&l.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &l.path)(e)),
        }
        *log = None;
        Ok(true)
    }
}

impl Drop for Unsynced {
    /// A handle that goes away cleanly leaves nothing to recover.
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

impl Log {
    fn create(store: &LocalStore) -> Result<Log> {
        let dir = store.root().join(DIR);
        fs::create_dir_all(&dir).map_err(io("create store directory", &dir))?;
        // Visible as `log-*` only once locked: recovery must never take a
        // live writer's log for a dead one's. A recovery can still take the
        // `.new-*` file in the instant between its creation and our lock
        // (it removes unlocked ones); then the rename finds it gone and a
        // fresh name is tried.
        let mut attempt = 0;
        let (file, path) = loop {
            let name = super::unique_name("log-");
            let fresh = dir.join(format!(".new-{name}"));
            let path = dir.join(&name);
            // Written only under `Unsynced::log`'s mutex, so each append
            // lands at the end.
            let file = super::txn::lock_file(&fresh, FlockOperation::LockExclusive)?;
            match fs::rename(&fresh, &path) {
                Ok(()) => break (file, path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempt < 3 => attempt += 1,
                Err(e) => return Err(io("rename", &path)(e)),
            }
        };
        // Which boot wrote it: after a kill on a machine that stayed up,
        // a named object that is not there never came (see `recover`).
        // Made durable by the first append's `fdatasync`, before any
        // object it names is renamed into place; a log that lost it is
        // read as another boot's, the careful way.
        if let Some(boot) = boot_id() {
            (&file)
                .write_all(format!("boot {boot}\n").as_bytes())
                .map_err(io("append to", &path))?;
        }
        // The log must outlive a crash before any object it will name does.
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync", &dir))?;
        Ok(Log {
            file,
            path,
            named: HashSet::new(),
        })
    }

    /// Append what the log does not name yet, and `fdatasync` it.
    fn append(&mut self, objects: &[(ObjectKind, Digest)]) -> Result<()> {
        let new: Vec<&(ObjectKind, Digest)> =
            objects.iter().filter(|o| !self.named.contains(o)).collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut lines = String::with_capacity(new.len() * 68);
        for (kind, d) in &new {
            lines.push_str(match kind {
                ObjectKind::Blob => "b ",
                ObjectKind::Directory => "d ",
            });
            lines.push_str(&d.hex());
            lines.push('\n');
        }
        self.file
            .write_all(lines.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(io("append to", &self.path))?;
        for o in new {
            if self.named.len() >= NAMED_MAX {
                break;
            }
            self.named.insert(*o);
        }
        Ok(())
    }
}

/// This boot of the machine, as the kernel names it; `None` if it does not.
fn boot_id() -> Option<String> {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_string())
}

/// What [`recover`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Logs of writers that are gone.
    pub logs: usize,
    /// Objects they named that were re-hashed and found intact.
    pub intact: usize,
    /// Objects they named ahead that never came: absent, in a log written
    /// in this boot of the machine, so nothing that was renamed into the
    /// store can have been lost (the page cache kept it).
    pub never_came: usize,
    /// Objects removed: damaged or vanished ones they named, then every
    /// directory left naming a missing object.
    pub removed: Vec<Digest>,
}

/// Take the logs of writers that are gone and make the store tell the
/// truth about what they named (see the module's doc). Skipped, to be
/// done by a later open, while any writer or gc holds the store lock.
pub(crate) fn recover(store: &LocalStore) -> Result<Recovery> {
    let dir = store.root().join(DIR);
    let mut out = Recovery::default();
    let Ok(rd) = fs::read_dir(&dir) else {
        return Ok(out);
    };
    let mut dead: Vec<(PathBuf, File)> = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.as_encoded_bytes();
        let Ok(f) = File::options().read(true).write(true).open(e.path()) else {
            continue;
        };
        if flock(&f, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue; // a live writer's
        }
        if name.starts_with(b".new-") {
            // Its writer died before naming anything in it.
            let _ = fs::remove_file(e.path());
        } else if name.starts_with(b"log-") {
            dead.push((e.path(), f));
        }
    }
    if dead.is_empty() {
        return Ok(out);
    }
    // Exclusive, as gc: no writer may commit a tree over an object this
    // is about to remove.
    let Ok(_store_lock) =
        super::txn::lock_file(&store.lock_path(), FlockOperation::NonBlockingLockExclusive)
    else {
        return Ok(out);
    };
    let mut lost = false;
    let this_boot = boot_id();
    for (path, f) in &mut dead {
        let mut text = String::new();
        f.read_to_string(&mut text)
            .map_err(io("read", path.as_path()))?;
        let same_boot = this_boot.is_some()
            && text.lines().next().and_then(|l| l.strip_prefix("boot ")) == this_boot.as_deref();
        // A torn last line named an object not yet renamed into place.
        for (kind, d) in text.lines().filter_map(parse_line) {
            match look(store, kind, &d) {
                Found::Intact => {
                    out.intact += 1;
                    continue;
                }
                Found::Absent if same_boot => {
                    out.never_came += 1;
                    continue;
                }
                Found::Absent | Found::Damaged => {}
            }
            if remove_object(store, kind, &d)? {
                out.removed.push(d);
            }
            lost = true;
        }
        out.logs += 1;
    }
    if lost {
        out.removed.extend(remove_trees_with_holes(store)?);
    }
    // Last: a recovery cut short is done again by the next open.
    for (path, _) in &dead {
        fs::remove_file(path).map_err(io("remove", path.as_path()))?;
    }
    Ok(out)
}

fn parse_line(line: &str) -> Option<(ObjectKind, Digest)> {
    let (tag, hex) = line.split_once(' ')?;
    let kind = match tag {
        "b" => ObjectKind::Blob,
        "d" => ObjectKind::Directory,
        _ => return None,
    };
    let d = format!("b3:{hex}").parse::<Digest>().ok()?;
    Some((kind, d))
}

/// What one look at a named object found.
enum Found {
    Intact,
    Absent,
    /// Other bytes, undecodable, or unreadable.
    Damaged,
}

fn look(store: &LocalStore, kind: ObjectKind, d: &Digest) -> Found {
    let path = store.object_path(kind, d);
    let intact = match kind {
        ObjectKind::Blob => LocalStore::hash_file(&path).map(|(actual, _)| actual == *d),
        ObjectKind::Directory => fs::read(&path)
            .map(|bytes| Digest::of(&bytes) == *d && Directory::decode(&bytes).is_ok()),
    };
    match intact {
        Ok(true) => Found::Intact,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Absent,
        Ok(false) | Err(_) => Found::Damaged,
    }
}

/// Remove every directory that names a missing object, until none does.
fn remove_trees_with_holes(store: &LocalStore) -> Result<Vec<Digest>> {
    let blobs: HashSet<Digest> = crate::verify::all_objects(store, ObjectKind::Blob)?
        .into_iter()
        .map(|(d, _)| d)
        .collect();
    let mut dirs: HashMap<Digest, Directory> = HashMap::new();
    for (d, p) in crate::verify::all_objects(store, ObjectKind::Directory)? {
        // An undecodable directory is `store verify`'s to report, not ours.
        if let Ok(dir) = fs::read(&p)
            .map_err(|_| ())
            .and_then(|b| Directory::decode(&b).map_err(|_| ()))
        {
            dirs.insert(d, dir);
        }
    }
    let mut removed = Vec::new();
    loop {
        let holed: Vec<Digest> = dirs
            .iter()
            .filter(|(_, dir)| {
                dir.entries().any(|(_, n)| match n {
                    Node::Directory { digest, .. } => !dirs.contains_key(digest),
                    Node::File { digest, .. } => !blobs.contains(digest),
                    Node::Symlink { .. } => false,
                })
            })
            .map(|(d, _)| *d)
            .collect();
        if holed.is_empty() {
            return Ok(removed);
        }
        for d in holed {
            dirs.remove(&d);
            if remove_object(store, ObjectKind::Directory, &d)? {
                removed.push(d);
            }
        }
    }
}

/// Remove an object's file; false if it was already gone.
fn remove_object(store: &LocalStore, kind: ObjectKind, d: &Digest) -> Result<bool> {
    let p = store.object_path(kind, d);
    match fs::remove_file(&p) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io("remove", &p)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DirectoryStore;
    use crate::{Directory, Name, Node};
    use std::os::unix::fs::PermissionsExt;

    fn logs(store: &LocalStore) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(store.root().join(DIR))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// A log's text without its first line, the boot it was written in.
    fn named_in(store: &LocalStore, log: &str) -> String {
        let text = fs::read_to_string(store.root().join(DIR).join(log)).unwrap();
        let (boot, rest) = text.split_once('\n').unwrap();
        assert_eq!(
            Some(boot),
            boot_id().map(|b| format!("boot {b}")).as_deref()
        );
        rest.to_string()
    }

    /// What a writer that died left: its log, named `name`, holding `text`.
    fn dead_log(store: &LocalStore, name: &str, text: &str) {
        let dir = store.root().join(DIR);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(name), text).unwrap();
    }

    fn dir_of(entries: &[(&str, Node)]) -> Directory {
        let mut dir = Directory::new();
        for (n, node) in entries {
            dir.insert(Name::new(n.as_bytes()).unwrap(), node.clone())
                .unwrap();
        }
        dir
    }

    fn file(d: Digest, size: u64) -> Node {
        Node::File {
            digest: d,
            size,
            executable: false,
        }
    }

    #[test]
    fn an_unsynced_commit_is_visible_at_once_logged_and_durable_after_a_flush() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let txn = store.txn().unwrap();
        let d = txn.put_blob(b"sent by a client").unwrap();
        txn.commit_unsynced().unwrap();
        assert!(
            store.has(ObjectKind::Blob, &d),
            "not visible before the flush"
        );
        assert!(store.has_unsynced());
        let names = logs(&store);
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(named_in(&store, &names[0]), format!("b {}\n", d.hex()));

        // Another handle on the store takes a live writer's log for none.
        let other = LocalStore::open(store.root()).unwrap();
        assert!(other.has(ObjectKind::Blob, &d));
        assert_eq!(logs(&store).len(), 1);

        assert!(store.flush_unsynced().unwrap());
        assert!(!store.has_unsynced());
        assert!(logs(&store).is_empty());
        assert!(!store.flush_unsynced().unwrap());
    }

    #[test]
    fn a_flush_whose_log_is_already_gone_succeeds_and_forgets_it() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let txn = store.txn().unwrap();
        txn.put_blob(b"sent").unwrap();
        txn.commit_unsynced().unwrap();
        let names = logs(&store);
        assert_eq!(names.len(), 1, "{names:?}");
        fs::remove_file(store.root().join(DIR).join(&names[0])).unwrap();
        assert!(store.flush_unsynced().unwrap());
        assert!(!store.has_unsynced());
        assert!(!store.flush_unsynced().unwrap());
    }

    #[test]
    fn objects_named_ahead_are_committed_without_another_write_to_the_log() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let coming = Digest::of(b"coming");
        let never = Digest::of(b"claimed, never sent");
        store
            .intend_unsynced(&[(ObjectKind::Blob, coming), (ObjectKind::Blob, never)])
            .unwrap();
        let names = logs(&store);
        assert_eq!(names.len(), 1, "{names:?}");
        let named = named_in(&store, &names[0]);
        assert_eq!(named, format!("b {}\nb {}\n", coming.hex(), never.hex()));

        let txn = store.txn().unwrap();
        txn.put_blob(b"coming").unwrap();
        txn.commit_unsynced().unwrap();
        assert!(store.has(ObjectKind::Blob, &coming));
        assert_eq!(named_in(&store, &names[0]), named, "named twice");
        // What the log did not name is appended, as without intent.
        let txn = store.txn().unwrap();
        let other = txn.put_blob(b"unannounced").unwrap();
        txn.commit_unsynced().unwrap();
        assert_eq!(
            named_in(&store, &names[0]),
            format!("{named}b {}\n", other.hex())
        );

        // A flush forgets the names with the log: a later commit of the
        // same object must name it in a new one, or a crash could lose it
        // unnamed.
        assert!(store.flush_unsynced().unwrap());
        fs::remove_file(store.object_path(ObjectKind::Blob, &coming)).unwrap();
        let txn = store.txn().unwrap();
        txn.put_blob(b"coming").unwrap();
        txn.commit_unsynced().unwrap();
        let names = logs(&store);
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(named_in(&store, &names[0]), format!("b {}\n", coming.hex()));
    }

    /// What an unsynced put leaves: each of `digests` read-only under its
    /// name, all named in one log in this order, nothing staged in `tmp/`.
    fn assert_put_unsynced(store: &LocalStore, kind: ObjectKind, digests: &[Digest]) {
        for d in digests {
            let path = store.object_path(kind, d);
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o444, "{}", path.display());
        }
        let names = logs(store);
        assert_eq!(names.len(), 1, "{names:?}");
        let letter = match kind {
            ObjectKind::Blob => 'b',
            ObjectKind::Directory => 'd',
        };
        let named: String = digests
            .iter()
            .map(|d| format!("{letter} {}\n", d.hex()))
            .collect();
        assert_eq!(named_in(store, &names[0]), named);
        let left: Vec<_> = fs::read_dir(store.root().join("tmp")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn blobs_put_unsynced_appear_whole_under_their_names_and_are_named_first() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let small = crate::CheckedBlob::new(b"claimed ahead".to_vec());
        let large = crate::CheckedBlob::new(vec![7u8; 300_000]);
        store
            .intend_unsynced(&[(ObjectKind::Blob, *small.digest())])
            .unwrap();
        store
            .put_blobs_unsynced(&[small.clone(), large.clone()])
            .unwrap();
        for b in [&small, &large] {
            assert_eq!(store.read_blob(b.digest()).unwrap(), b.bytes());
        }
        // Named before they appeared: the one claimed ahead once, the
        // other appended. No staging, no probe left behind.
        assert_put_unsynced(
            &store,
            ObjectKind::Blob,
            &[*small.digest(), *large.digest()],
        );

        // Again: what is there is kept, nothing fails.
        let before = fs::metadata(store.object_path(ObjectKind::Blob, large.digest()))
            .unwrap()
            .modified()
            .unwrap();
        store
            .put_blobs_unsynced(std::slice::from_ref(&large))
            .unwrap();
        let after = fs::metadata(store.object_path(ObjectKind::Blob, large.digest()))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(before, after);

        assert!(store.flush_unsynced().unwrap());
        assert!(logs(&store).is_empty());
        assert_eq!(store.read_blob(large.digest()).unwrap(), large.bytes());
    }

    #[test]
    fn directories_put_unsynced_appear_whole_children_first_and_are_named_first() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let txn = store.txn().unwrap();
        let blob = txn.put_blob(b"leaf").unwrap();
        txn.commit().unwrap();
        let child = dir_of(&[("f", file(blob, 4))]);
        let child_digest = child.digest();
        let parent = dir_of(&[(
            "d",
            Node::Directory {
                digest: child_digest,
                size: child.size(),
            },
        )]);
        let parent_digest = parent.digest();
        store
            .put_directories_unsynced(&[child.clone(), parent.clone()])
            .unwrap();
        for (d, dir) in [(&child_digest, &child), (&parent_digest, &parent)] {
            assert_eq!(&store.get_directory(d).unwrap(), dir);
        }
        assert_put_unsynced(
            &store,
            ObjectKind::Directory,
            &[child_digest, parent_digest],
        );
        // Again: kept, nothing fails.
        store
            .put_directories_unsynced(std::slice::from_ref(&parent))
            .unwrap();
        assert!(store.flush_unsynced().unwrap());
        assert!(logs(&store).is_empty());
        assert_eq!(store.get_directory(&parent_digest).unwrap(), parent);
    }

    /// A tree with a hole no log names (not recovery's to touch unless it
    /// scans), and a log that names `absent` ahead, written in `boot`.
    fn holed_tree_and_a_log_naming_absent(store: &LocalStore, boot: &str) -> (Digest, Digest) {
        let txn = store.txn().unwrap();
        let kept = txn.put_blob(b"kept").unwrap();
        let absent = Digest::of(b"claimed, never sent");
        let holed = txn
            .put_directory(&dir_of(&[("k", file(kept, 4)), ("x", file(absent, 19))]))
            .unwrap();
        txn.commit().unwrap();
        dead_log(
            store,
            "log-4-5-6",
            &format!("boot {boot}\nb {}\nb {}\n", kept.hex(), absent.hex()),
        );
        (kept, holed)
    }

    #[test]
    fn after_a_kill_what_was_named_and_never_came_costs_no_scan() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let boot = boot_id().expect("this kernel names its boot");
        let (kept, holed) = holed_tree_and_a_log_naming_absent(&store, &boot);
        let r = recover(&store).unwrap();
        assert_eq!((r.logs, r.intact, r.never_came), (1, 1, 1), "{r:?}");
        assert!(r.removed.is_empty(), "{r:?}");
        assert!(store.has(ObjectKind::Blob, &kept));
        assert!(
            store.has(ObjectKind::Directory, &holed),
            "the store was scanned for holes"
        );
        assert!(logs(&store).is_empty());
    }

    #[test]
    fn in_the_same_boot_a_damaged_named_object_is_still_removed_with_its_trees() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let txn = store.txn().unwrap();
        let torn = txn.put_blob(b"written whole").unwrap();
        let tree = txn
            .put_directory(&dir_of(&[("t", file(torn, 13))]))
            .unwrap();
        txn.commit().unwrap();
        let boot = boot_id().expect("this kernel names its boot");
        dead_log(
            &store,
            "log-7-8-9",
            &format!("boot {boot}\nb {}\n", torn.hex()),
        );
        let p = store.object_path(ObjectKind::Blob, &torn);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&p, b"half of it").unwrap();
        let r = recover(&store).unwrap();
        assert_eq!((r.intact, r.never_came), (0, 0), "{r:?}");
        let mut removed = r.removed.clone();
        removed.sort();
        let mut want = vec![torn, tree];
        want.sort();
        assert_eq!(removed, want);
        let report = crate::verify::verify(&store, None, &()).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }

    #[test]
    fn after_a_reboot_an_absent_named_object_may_have_been_lost_and_trees_naming_it_go() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let (kept, holed) = holed_tree_and_a_log_naming_absent(&store, "another-boot");
        let r = recover(&store).unwrap();
        assert_eq!((r.logs, r.intact, r.never_came), (1, 1, 0), "{r:?}");
        assert_eq!(r.removed, vec![holed]);
        assert!(store.has(ObjectKind::Blob, &kept));
        let report = crate::verify::verify(&store, None, &()).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }

    #[test]
    fn recovery_forgets_what_a_crash_lost_and_every_tree_that_names_it() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        // Committed durably: two blobs, a tree that reuses `lost` (as a
        // build's output may reuse an uploaded blob), a tree above it, and
        // a tree of `kept` only.
        let txn = store.txn().unwrap();
        let kept = txn.put_blob(b"kept").unwrap();
        let lost = txn.put_blob(b"lost in the crash").unwrap();
        let inner = txn
            .put_directory(&dir_of(&[("f", file(lost, 17)), ("g", file(kept, 4))]))
            .unwrap();
        let outer = txn
            .put_directory(&dir_of(&[(
                "sub",
                Node::Directory {
                    digest: inner,
                    size: 2,
                },
            )]))
            .unwrap();
        let apart = txn.put_directory(&dir_of(&[("g", file(kept, 4))])).unwrap();
        txn.commit().unwrap();
        // A dead writer's log named both blobs (and, last, a line torn by
        // the crash); the crash left `lost` with other bytes.
        dead_log(
            &store,
            "log-1-2-3",
            &format!("b {}\nb {}\nd 12ab", kept.hex(), lost.hex()),
        );
        let p = store.object_path(ObjectKind::Blob, &lost);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&p, b"zeroes after a crash").unwrap();

        let r = recover(&store).unwrap();
        assert_eq!(r.logs, 1);
        assert_eq!(r.intact, 1, "only `kept` was intact: {r:?}");
        let mut removed = r.removed.clone();
        removed.sort();
        let mut want = vec![lost, inner, outer];
        want.sort();
        assert_eq!(removed, want);
        assert!(store.has(ObjectKind::Blob, &kept));
        assert!(store.has(ObjectKind::Directory, &apart));
        assert!(logs(&store).is_empty(), "the log outlived its recovery");
        let report = crate::verify::verify(&store, None, &()).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!(recover(&store).unwrap(), Recovery::default());
    }

    #[test]
    fn recovery_of_an_intact_log_scans_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let txn = store.txn().unwrap();
        let a = txn.put_blob(b"a").unwrap();
        txn.commit().unwrap();
        // A tree with a hole that no log names: not recovery's to touch.
        let txn = store.txn().unwrap();
        let holed = txn
            .put_directory(&dir_of(&[("x", file(Digest::of(b"never stored"), 12))]))
            .unwrap();
        txn.commit().unwrap();
        dead_log(&store, "log-9-9-9", &format!("b {}\n", a.hex()));
        let r = recover(&store).unwrap();
        assert_eq!((r.logs, r.intact, r.removed.len()), (1, 1, 0));
        assert!(store.has(ObjectKind::Directory, &holed));
    }

    /// A handle dropped with unsynced commits flushes them: a clean exit
    /// leaves nothing for recovery.
    #[test]
    fn a_dropped_handle_leaves_no_log() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let txn = store.txn().unwrap();
        txn.put_blob(b"x").unwrap();
        txn.commit_unsynced().unwrap();
        let root = store.root().to_path_buf();
        assert_eq!(logs(&store).len(), 1);
        drop(store);
        let again = LocalStore::open(&root).unwrap();
        assert!(logs(&again).is_empty(), "{:?}", logs(&again));
    }

    /// While a writer holds the store lock, recovery waits (it would
    /// remove objects a commit may be building on): the dead log stays,
    /// and the first open after the writer is done takes it. A dead
    /// writer's `.new-*` log, which names nothing yet, is removed at once.
    #[test]
    fn recovery_waits_for_writers_and_a_later_open_does_it() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("s")).unwrap();
        let gone = Digest::of(b"vanished in the crash");
        dead_log(&store, "log-4-5-6", &format!("b {}\n", gone.hex()));
        dead_log(&store, ".new-log-4-5-7", "");
        let txn = store.txn().unwrap();
        assert_eq!(
            recover(&store).unwrap(),
            Recovery::default(),
            "recovered under a live writer's lock"
        );
        assert_eq!(logs(&store), vec!["log-4-5-6".to_string()]);
        drop(txn);
        let r = recover(&store).unwrap();
        assert_eq!((r.logs, r.intact), (1, 0), "{r:?}");
        assert!(logs(&store).is_empty(), "{:?}", logs(&store));
    }
}
