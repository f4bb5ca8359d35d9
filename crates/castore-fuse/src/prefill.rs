//! Prefill: in a mount without opens ([`crate::MountOptions::zero_message_open`]),
//! a file's first `READ` hands the rest of it — already verified — to the
//! kernel's page cache in a few writes (`FUSE_NOTIFY_STORE`), so the page
//! faults of an `execve`d or `mmap`ped file find their pages instead of each
//! coming back to the daemon as a `READ` of its own.
//!
//! Why: an exec faults its binary in at random offsets, a few pages at a
//! time; each miss is a round trip through the daemon in series with the
//! program. The trivial build's 2 MB busybox came in as ~25 `READ`s over
//! ~7 ms. Storing what the daemon has just hashed costs one copy of it.
//!
//! Why a thread of its own: a store waits for each page's lock, and the
//! pages of a `READ` in flight stay locked until a serving thread answers
//! it. A serving thread that stored could wait on a `READ` only it would
//! answer. This thread answers nothing, so it can wait: every page it waits
//! on is released by a serving thread that never waits on it.
//!
//! What it does not change: the read set (a file is stored only after its
//! first `READ` has recorded and verified it) and what is served (the bytes
//! come from the same verified store file a `READ` would read). Bounded:
//! files up to [`MAX_FILE`], at most [`QUEUE`] files waiting (each holds
//! its open store file), one [`CHUNK`] buffer; when the queue is full a file
//! is not stored and its pages come by `READ` as before.
//!
//! The stored pages are clean cache charged to fhsx's cgroup, not the
//! build's: up to [`MAX_FILE`] resident per file read, reclaimable.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use fuser::{INodeNo, Notifier};

/// The largest file stored whole: the files the serving thread hashes
/// itself (larger ones are hashed on rayon's threads and are mostly read in
/// order, where readahead already asks for large ranges).
pub(crate) const MAX_FILE: u64 = 8 << 20;
/// How many files may wait for the thread.
pub(crate) const QUEUE: usize = 16;
/// How much one store carries.
const CHUNK: usize = 256 << 10;

/// One file to store: its inode, its verified store file, its size.
struct Job {
    ino: u64,
    file: Arc<File>,
    size: u64,
}

/// The serving threads' end: offer a file, never wait.
pub(crate) struct Prefill {
    tx: SyncSender<Job>,
}

impl Prefill {
    /// Start the thread storing into the mount `notifier` talks to. It
    /// ends when the returned [`Prefill`] is dropped and the queue is
    /// drained, or at the first store the kernel refuses for good (the
    /// connection ended).
    pub(crate) fn start(
        notifier: Notifier,
    ) -> std::io::Result<(Prefill, std::thread::JoinHandle<()>)> {
        let (tx, rx) = sync_channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("fhsx-prefill".into())
            .spawn(move || store_all(&notifier, &rx))?;
        Ok((Prefill { tx }, thread))
    }

    /// Queue `file` (inode `ino`, `size` bytes) to be stored, if there is
    /// room; otherwise leave it to `READ`s.
    pub(crate) fn offer(&self, ino: u64, file: Arc<File>, size: u64) {
        // Full or gone: the file's pages come by `READ`, as without this.
        let _ = self.tx.try_send(Job { ino, file, size });
    }
}

fn store_all(notifier: &Notifier, rx: &Receiver<Job>) {
    // Allocated at the first file, not at the thread's start (which is on
    // the way to the build's start): a mount may never need it.
    let mut buf = Vec::new();
    while let Ok(job) = rx.recv() {
        buf.resize(CHUNK, 0);
        if store_file(notifier, &job, &mut buf).is_err_and(|e| connection_gone(&e)) {
            return;
        }
    }
}

/// Store `job`'s file from its start to its end. A read error (a file
/// shorter than verified included) or a refused store ends this file only:
/// its remaining pages come by `READ`.
fn store_file(notifier: &Notifier, job: &Job, buf: &mut [u8]) -> std::io::Result<()> {
    let mut offset = 0u64;
    while offset < job.size {
        let want = buf.len().min((job.size - offset) as usize);
        let chunk = &mut buf[..want];
        job.file.read_exact_at(chunk, offset)?;
        notifier.store(INodeNo(job.ino), offset, chunk)?;
        offset += chunk.len() as u64;
    }
    Ok(())
}

/// Whether a store failed because the mount's connection is gone (so every
/// later one would too).
fn connection_gone(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENODEV) | Some(libc::ECONNABORTED) | Some(libc::ENOTCONN) | Some(libc::EBADF)
    )
}
