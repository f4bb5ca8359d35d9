//! All-or-nothing writes into a [`LocalStore`].
//!
//! A transaction holds a shared lock on the store from its start (so `gc`
//! never sweeps objects a writer assumed present) and, from its first write
//! on, a private staging directory under `ROOT/tmp`, with an exclusive
//! `flock` on it while alive (which is how a later writer tells a
//! live transaction from a killed one). A transaction that finds everything
//! already in the store — most of a cached or rebuilt action's — makes no
//! directory at all: creating and removing one (and its lock file) is a
//! few journalled metadata updates, a large share of a trivial build's
//! cost. `commit` makes every
//! staged object durable with one `syncfs`, renames blobs and then
//! directories into place, and syncs again so the renames are durable too:
//! temp file, fsync, rename — batched, because one `fsync` per small file
//! would make imports many times slower than `cp -a`.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use rustix::fs::{flock, FlockOperation};

use super::local::{LocalStore, ObjectKind};
use crate::error::io;
use crate::{CheckedBlob, Digest, Directory, Error, Result};

static COUNTER: AtomicU64 = AtomicU64::new(0);

pub struct Txn<'s> {
    store: &'s LocalStore,
    /// Made at the first write (see the module's doc).
    staging: OnceLock<Staging>,
    _store_lock: File,
    staged: Mutex<Staged>,
}

/// A private directory under `ROOT/tmp`, exclusively `flock`ed while alive
/// (so a cleaner can tell it from a killed writer's) and removed on drop.
pub(crate) struct Staging {
    pub(crate) dir: PathBuf,
    _lock: File,
}

impl Staging {
    pub(crate) fn create(store: &LocalStore) -> Result<Self> {
        let name = super::unique_name("txn-");
        let dir = store.tmp_dir().join(&name);
        // The directory becomes visible as `txn-*` only once its lock is
        // held: a cleaner must never see a live transaction without one.
        let fresh = store.tmp_dir().join(format!(".new-{name}"));
        fs::create_dir(&fresh).map_err(io("create staging directory", &fresh))?;
        let lock = match lock_file(&fresh.join(".lock"), FlockOperation::LockExclusive) {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_dir_all(&fresh);
                return Err(e);
            }
        };
        if let Err(e) = fs::rename(&fresh, &dir) {
            let _ = fs::remove_dir_all(&fresh);
            return Err(io("create staging directory", &dir)(e));
        }
        Ok(Staging { dir, _lock: lock })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[derive(Default)]
struct Staged {
    seen: HashSet<(bool, Digest)>,
    blobs: Vec<Digest>,
    dirs: Vec<Digest>,
    /// (staged file, destination in the store) for non-object records.
    records: Vec<(PathBuf, PathBuf)>,
}

impl<'s> Txn<'s> {
    pub(super) fn begin(store: &'s LocalStore) -> Result<Self> {
        let store_lock = lock_file(&store.lock_path(), FlockOperation::LockShared)?;
        Ok(Txn {
            store,
            staging: OnceLock::new(),
            _store_lock: store_lock,
            staged: Mutex::new(Staged::default()),
        })
    }

    /// The staging directory, made now if this is the first write.
    fn staging(&self) -> Result<&Path> {
        if let Some(s) = self.staging.get() {
            return Ok(&s.dir);
        }
        let fresh = Staging::create(self.store)?;
        // Two threads writing their first object at once: the loser's
        // directory is dropped, and so removed, unused.
        Ok(&self.staging.get_or_init(|| fresh).dir)
    }

    fn staged_path(staging: &Path, kind: ObjectKind, d: &Digest) -> PathBuf {
        let tag = match kind {
            ObjectKind::Blob => "b",
            ObjectKind::Directory => "d",
        };
        staging.join(format!("{tag}-{}", d.hex()))
    }

    /// Claim `d` for staging. False if the store or this txn already has it.
    fn claim(&self, kind: ObjectKind, d: &Digest) -> bool {
        if self.store.has(kind, d) {
            return false;
        }
        let mut s = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        s.seen.insert((kind == ObjectKind::Blob, *d))
    }

    fn record(&self, kind: ObjectKind, d: Digest) {
        let mut s = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        match kind {
            ObjectKind::Blob => s.blobs.push(d),
            ObjectKind::Directory => s.dirs.push(d),
        }
    }

    fn write_new(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(path)
            .map_err(io("create", path))?;
        f.write_all(bytes).map_err(io("write", path))
    }

    /// Whether the store or this transaction already holds the blob.
    pub fn has_blob(&self, d: &Digest) -> bool {
        self.store.has(ObjectKind::Blob, d)
            || self
                .staged
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .seen
                .contains(&(true, *d))
    }

    /// Stage bytes as a blob.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<Digest> {
        let blob = CheckedBlob::new(bytes);
        self.put_checked_blob(&blob)?;
        Ok(*blob.digest())
    }

    /// Stage a blob whose bytes were hashed already.
    pub fn put_checked_blob<B: AsRef<[u8]>>(&self, blob: &CheckedBlob<B>) -> Result<()> {
        let d = *blob.digest();
        if self.claim(ObjectKind::Blob, &d) {
            self.write_new(
                &Self::staged_path(self.staging()?, ObjectKind::Blob, &d),
                blob.bytes(),
            )?;
            self.record(ObjectKind::Blob, d);
        }
        Ok(())
    }

    /// Stage a blob streamed from `r`, hashing as it is written: bounded
    /// memory for any size. Returns the digest and the byte count.
    pub fn put_blob_reader(&self, r: &mut dyn Read) -> Result<(Digest, u64)> {
        let mut buf = StreamBuf::take();
        self.put_blob_buffered(&mut Borrowed {
            inner: r,
            buf: &mut buf.0,
            pos: 0,
            len: 0,
        })
    }

    /// Stage a blob from what `r` holds, each slice it fills hashed and
    /// written as it is, with no copy buffer of this side's: a reader that
    /// already holds its bytes (a worker's upload stream, in chunks) needs
    /// none, and a thread waiting on a stalled one holds only its chunk.
    /// With [`Txn::put_blob_reader`]'s 1 MiB per thread, 520 stalled upload
    /// streams made the worker 297 MiB bigger.
    pub fn put_blob_buffered(&self, r: &mut dyn BufRead) -> Result<(Digest, u64)> {
        let staging = self.staging()?;
        let tmp = staging.join(format!(
            "stream-{}",
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        let mut h = blake3::Hasher::new();
        let mut n = 0u64;
        loop {
            let slice = match r.fill_buf() {
                Ok([]) => break,
                Ok(slice) => slice,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = fs::remove_file(&tmp);
                    return Err(Error::Io {
                        op: "read input for",
                        path: tmp,
                        source: e,
                    });
                }
            };
            h.update(slice);
            f.write_all(slice).map_err(io("write", &tmp))?;
            let k = slice.len();
            r.consume(k);
            n += k as u64;
        }
        drop(f);
        let d: Digest = h.finalize().into();
        if self.claim(ObjectKind::Blob, &d) {
            let dst = Self::staged_path(staging, ObjectKind::Blob, &d);
            fs::rename(&tmp, &dst).map_err(io("rename", &tmp))?;
            self.record(ObjectKind::Blob, d);
        } else {
            fs::remove_file(&tmp).map_err(io("remove", &tmp))?;
        }
        Ok((d, n))
    }

    /// Stage a directory object.
    pub fn put_directory(&self, dir: &Directory) -> Result<Digest> {
        let bytes = dir.encode();
        let d = Digest::of(&bytes);
        if self.claim(ObjectKind::Directory, &d) {
            let staging = self.staging()?;
            self.write_new(
                &Self::staged_path(staging, ObjectKind::Directory, &d),
                &bytes,
            )?;
            self.record(ObjectKind::Directory, d);
        }
        Ok(d)
    }

    /// Stage an arbitrary file to be renamed to `dest` (inside the store) at
    /// commit, after every object. Used for small records such as
    /// compositions.
    pub fn put_record(&self, dest: &Path, bytes: &[u8]) -> Result<()> {
        let tmp = self
            .staging()?
            .join(format!("rec-{}", COUNTER.fetch_add(1, Ordering::Relaxed)));
        self.write_new(&tmp, bytes)?;
        let mut s = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        s.records.push((tmp, dest.to_path_buf()));
        Ok(())
    }

    /// Make everything staged durable and visible.
    pub fn commit(self) -> Result<()> {
        let Some((staging, staged_files)) = self.staged_files()? else {
            return Ok(());
        };
        let durable = if staged_files.len() <= FSYNC_EACH_MAX {
            Durability::EachFile
        } else {
            Durability::WholeFileSystem
        };
        durable.sync(staging, staged_files.iter().map(|(from, _)| from.as_path()))?;
        Self::publish(&staged_files)?;
        let parents: std::collections::BTreeSet<&Path> = staged_files
            .iter()
            .filter_map(|(_, to)| to.parent())
            .collect();
        durable.sync(staging, parents.into_iter())?;
        Ok(())
    }

    /// Make everything staged visible now and durable at the store's next
    /// [`LocalStore::flush_unsynced`]: for objects a client can send again.
    /// A crash before then may lose them, and the next open removes what
    /// was lost (see `unsynced`). A transaction with records (which no
    /// recovery re-checks) is committed durably instead.
    pub fn commit_unsynced(self) -> Result<()> {
        let objects: Vec<(ObjectKind, Digest)> = {
            let s = self.staged.lock().unwrap_or_else(|p| p.into_inner());
            if !s.records.is_empty() {
                drop(s);
                return self.commit();
            }
            (s.blobs.iter().map(|d| (ObjectKind::Blob, *d)))
                .chain(s.dirs.iter().map(|d| (ObjectKind::Directory, *d)))
                .collect()
        };
        let Some((_, staged_files)) = self.staged_files()? else {
            return Ok(());
        };
        self.store
            .unsynced()
            .commit(self.store, &objects, || Self::publish(&staged_files))
    }

    /// (staged file, place in the store) of everything staged, in the
    /// order they must appear; `None` if nothing was.
    fn staged_files(&self) -> Result<Option<(&Path, Vec<Move>)>> {
        let staged = std::mem::take(&mut *self.staged.lock().unwrap_or_else(|p| p.into_inner()));
        if staged.blobs.is_empty() && staged.dirs.is_empty() && staged.records.is_empty() {
            // Everything was already in the store: nothing to make durable,
            // and a syncfs would flush every other writer's dirty data too.
            // (A staging directory, if a streamed blob made one, goes when
            // the transaction is dropped.)
            return Ok(None);
        }
        let staging = self.staging()?;
        let staged_files: Vec<Move> = [
            (ObjectKind::Blob, &staged.blobs),
            (ObjectKind::Directory, &staged.dirs),
        ]
        .into_iter()
        .flat_map(|(kind, list)| {
            list.iter().map(move |d| {
                (
                    Self::staged_path(staging, kind, d),
                    self.store.object_path(kind, d),
                )
            })
        })
        // Blobs before the directories that name them, records last: a
        // reader that sees a directory can always find its children.
        .chain(staged.records.iter().cloned())
        .collect();
        Ok(Some((staging, staged_files)))
    }

    fn publish(staged_files: &[Move]) -> Result<()> {
        for (from, to) in staged_files {
            fs::rename(from, to).map_err(io("rename into store", to))?;
        }
        Ok(())
    }
}

/// (staged file, its place in the store): one rename of a commit.
type Move = (PathBuf, PathBuf);

/// Up to this many files a commit `fsync`s each (and then each directory
/// it renamed into); past it one `syncfs` is cheaper. A `syncfs` also
/// flushes every other writer's dirty data on the file system — on a busy
/// host a record's commit then waited hundreds of milliseconds for a
/// compiler's output — while a few `fsync`s wait for those files only.
const FSYNC_EACH_MAX: usize = 16;

/// How a commit makes what it wrote durable.
#[derive(Clone, Copy)]
enum Durability {
    EachFile,
    WholeFileSystem,
}

impl Durability {
    /// Make `paths` (files, or directories whose entries changed) durable:
    /// each `fsync`ed, or the whole file system `staging` is on synced.
    fn sync<'p>(self, staging: &Path, paths: impl Iterator<Item = &'p Path>) -> Result<()> {
        let fsync = |p: &Path, syncfs: bool| -> Result<()> {
            let f = File::open(p).map_err(io("open", p))?;
            let r = if syncfs {
                rustix::fs::syncfs(&f).map_err(std::io::Error::from)
            } else {
                f.sync_all()
            };
            r.map_err(|e| Error::Io {
                op: if syncfs { "syncfs" } else { "fsync" },
                path: p.to_path_buf(),
                source: e,
            })
        };
        match self {
            Durability::WholeFileSystem => fsync(staging, true),
            Durability::EachFile => paths.into_iter().try_for_each(|p| fsync(p, false)),
        }
    }
}

pub(crate) fn lock_file(path: &Path, op: FlockOperation) -> Result<File> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io("open lock", path))?;
    flock(&f, op).map_err(|e| Error::Io {
        op: "lock",
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    Ok(f)
}

/// Remove staging directories whose transaction is gone (its process was
/// killed): their lock is free.
pub(super) fn remove_stale_staging(tmp: &Path) {
    let Ok(rd) = fs::read_dir(tmp) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.as_encoded_bytes();
        if name.starts_with(b".new-") {
            // A writer killed between creating its directory and locking
            // it; a live one renames it away within microseconds.
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 600);
            if old {
                let _ = fs::remove_dir_all(&p);
            }
            continue;
        }
        if !name.starts_with(b"txn-") {
            continue;
        }
        let Ok(f) = File::open(p.join(".lock")) else {
            continue;
        };
        if flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() {
            let _ = fs::remove_dir_all(&p);
        }
    }
}

/// Take the store lock exclusively (for gc): waits for every writer.
pub(crate) fn lock_exclusive(store: &LocalStore) -> Result<File> {
    lock_file(&store.lock_path(), FlockOperation::LockExclusive)
}

/// Take the store lock shared (as every writer does): no gc runs while it
/// is held.
pub(crate) fn lock_shared(store: &LocalStore) -> Result<File> {
    lock_file(&store.lock_path(), FlockOperation::LockShared)
}

/// A reader seen through a buffer it does not own (the thread's
/// [`StreamBuf`]), as [`std::io::BufReader`] sees one through its own.
struct Borrowed<'a> {
    inner: &'a mut dyn Read,
    buf: &'a mut [u8],
    pos: usize,
    len: usize,
}

impl Read for Borrowed<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        read_from_buffer(self, out)
    }
}

/// `Read::read` of a reader that holds its bytes (a `BufRead`): a copy of
/// what it holds. `BufRead` asks for a `Read`; the readers
/// [`Txn::put_blob_buffered`] takes are read through their buffers.
pub fn read_from_buffer(r: &mut (impl BufRead + ?Sized), out: &mut [u8]) -> std::io::Result<usize> {
    let held = r.fill_buf()?;
    let n = held.len().min(out.len());
    out[..n].copy_from_slice(&held[..n]);
    r.consume(n);
    Ok(n)
}

impl BufRead for Borrowed<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.pos >= self.len {
            self.len = self.inner.read(self.buf)?;
            self.pos = 0;
        }
        Ok(&self.buf[self.pos..self.len])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.len);
    }
}

/// The copy buffer of [`Txn::put_blob_reader`]: 1 MiB, kept per thread.
/// A fresh one per blob was a zeroed 1 MiB for every file imported,
/// however small, and the first one of a process a fresh mapping to fault
/// in (1.8 ms). A nested use on the same thread (a reader that itself
/// stages a blob) finds the slot empty and makes its own.
struct StreamBuf(Vec<u8>);

thread_local! {
    static STREAM_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

impl StreamBuf {
    const LEN: usize = 1 << 20;

    fn take() -> StreamBuf {
        let mut v = STREAM_BUF.take();
        if v.len() != Self::LEN {
            v = vec![0u8; Self::LEN];
        }
        StreamBuf(v)
    }
}

impl Drop for StreamBuf {
    fn drop(&mut self) {
        STREAM_BUF.set(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_makes_its_staging_directory_only_when_it_writes() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("store")).unwrap();
        let staging_dirs = || fs::read_dir(store.tmp_dir()).unwrap().count();
        let txn = store.txn().unwrap();
        let old = txn.put_blob(b"old").unwrap();
        assert_eq!(staging_dirs(), 1);
        txn.commit().unwrap();
        assert_eq!(staging_dirs(), 0);

        let txn = store.txn().unwrap();
        assert_eq!(txn.put_blob(b"old").unwrap(), old);
        assert_eq!(staging_dirs(), 0, "nothing new, yet a staging directory");
        let new = txn.put_blob(b"new").unwrap();
        assert_eq!(staging_dirs(), 1);
        txn.commit().unwrap();
        assert_eq!(staging_dirs(), 0);
        assert!(store.has(ObjectKind::Blob, &new));

        // Dropped uncommitted: what it staged goes, nothing lands.
        let txn = store.txn().unwrap();
        let lost = txn.put_blob(b"lost").unwrap();
        drop(txn);
        assert_eq!(staging_dirs(), 0);
        assert!(!store.has(ObjectKind::Blob, &lost));
    }

    #[test]
    fn a_checked_blob_is_filed_under_the_digest_of_its_bytes_and_no_other() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("store")).unwrap();
        let right = Digest::of(b"sent");
        let wrong = Digest::of(b"claimed");
        // Claimed under another digest: refused, with the one it has.
        assert_eq!(
            CheckedBlob::expecting(&wrong, b"sent".to_vec()).unwrap_err(),
            right
        );
        let blob = CheckedBlob::expecting(&right, b"sent".to_vec()).unwrap();
        let txn = store.txn().unwrap();
        txn.put_checked_blob(&blob).unwrap();
        txn.commit().unwrap();
        assert_eq!(store.read_blob(&right).unwrap(), b"sent");
        assert!(!store.has(ObjectKind::Blob, &wrong));
    }
}
