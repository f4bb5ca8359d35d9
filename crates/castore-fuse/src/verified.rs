//! Which store files this process has already hashed and found right, so
//! that a blob opened by many mounts (a worker's jobs, the actions of one
//! graph) is hashed once, not once per mount.
//!
//! A store object is written once, renamed into place and never written
//! again; anything that changes its bytes through the file system (a write,
//! a truncate, a replacement by rename) changes its inode's `ctime`, or the
//! inode itself. So a verdict is kept per file identity — device, inode,
//! size, `mtime` and `ctime` — and a file whose identity differs in any of
//! them is hashed again. What this gives up, within one process only, is
//! noticing bytes that change under the file system (the medium itself
//! rotting): the same as a page the kernel keeps cached within one mount.
//! A process that must hash every open afresh gives each mount a fresh
//! [`VerifiedBlobs`].

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use castore::Digest;

/// At most this many verdicts are kept (about 100 bytes each, so under
/// 7 MB); past it the table starts again empty.
pub const MAX_VERIFIED: usize = 65_536;

/// The identity of one open file, as `fstat` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileId {
    pub(crate) fn of(f: &File) -> Option<FileId> {
        let m = f.metadata().ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// Files found to hold their digest's bytes, shared by the mounts given
/// the same table (see [`crate::MountOptions::verified`]).
#[derive(Debug, Default)]
pub struct VerifiedBlobs {
    files: Mutex<HashMap<Digest, FileId>>,
    hits: AtomicU64,
}

impl VerifiedBlobs {
    /// The table every mount of this process shares by default.
    pub fn process() -> Arc<VerifiedBlobs> {
        static PROCESS: OnceLock<Arc<VerifiedBlobs>> = OnceLock::new();
        PROCESS.get_or_init(Arc::default).clone()
    }

    /// Whether the file `id` is the very file found to hold `digest`'s bytes.
    pub(crate) fn holds(&self, digest: &Digest, id: FileId) -> bool {
        let held = self.lock().get(digest) == Some(&id);
        if held {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        held
    }

    /// How many opens took their verdict from this table (no hashing).
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Remember that the file `id` was hashed and holds `digest`'s bytes.
    pub(crate) fn insert(&self, digest: Digest, id: FileId) {
        let mut files = self.lock();
        if files.len() >= MAX_VERIFIED {
            files.clear();
        }
        files.insert(digest, id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, FileId>> {
        // A panic elsewhere cannot leave a wrong verdict in here: entries
        // are inserted whole.
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }
}
