//! Streaming blob writes: [`BlobWriter`] takes bytes as they arrive (a
//! build's log from a pipe), hashes them on the way to a private temp file,
//! and makes them a blob only at [`BlobWriter::finish`]. [`CappedWriter`]
//! bounds how much of a stream reaches any writer.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use super::local::{LocalStore, ObjectKind};
use super::txn::{lock_shared, Staging};
use crate::error::io;
use crate::roots::TempRoots;
use crate::{Digest, Error, Result};

/// A blob being written. `std::io::Write` in, `(digest, size)` out of
/// [`finish`](BlobWriter::finish).
///
/// The bytes go to a temp file in a private staging directory under
/// `ROOT/tmp` (flocked, like a [`Txn`](super::Txn)'s), never visible in the
/// store before `finish`. Dropping an unfinished writer deletes the temp
/// file; a killed process's leftover is removed by the next
/// [`LocalStore::open`]. The writer does not hold the store lock while
/// writing — a build-long log must not hold off `gc` for the whole build —
/// only for the rename inside `finish`.
pub struct BlobWriter {
    store: LocalStore,
    staging: Staging,
    tmp: PathBuf,
    file: BufWriter<File>,
    hasher: blake3::Hasher,
    len: u64,
}

impl std::fmt::Debug for BlobWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobWriter")
            .field("tmp", &self.tmp)
            .field("len", &self.len)
            .finish()
    }
}

impl LocalStore {
    /// Start a streamed blob; see [`BlobWriter`].
    pub fn blob_writer(&self) -> Result<BlobWriter> {
        let staging = Staging::create(self)?;
        let tmp = staging.dir.join("blob");
        let file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        Ok(BlobWriter {
            store: self.clone(),
            staging,
            tmp,
            file: BufWriter::with_capacity(256 * 1024, file),
            hasher: blake3::Hasher::new(),
            len: 0,
        })
    }
}

impl BlobWriter {
    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Make the bytes a blob: flushed, fsynced, renamed into the store (or
    /// dropped if the store already has that blob). Returns its digest and
    /// size. The blob is durable when this returns, but — like anything a
    /// writer just created — only a root keeps it from the next `gc`: use
    /// [`finish_rooted`](Self::finish_rooted) unless the caller roots it
    /// some other way before a gc can run.
    pub fn finish(self) -> Result<(Digest, u64)> {
        self.finish_inner(None)
    }

    /// [`finish`](Self::finish), adding the blob to `roots` before the store
    /// lock is released: no gc can come between the rename and the root.
    pub fn finish_rooted(self, roots: &TempRoots) -> Result<(Digest, u64)> {
        self.finish_inner(Some(roots))
    }

    fn finish_inner(self, roots: Option<&TempRoots>) -> Result<(Digest, u64)> {
        let BlobWriter {
            store,
            staging,
            tmp,
            file,
            hasher,
            len,
        } = self;
        let file = file.into_inner().map_err(|e| Error::Io {
            op: "write",
            path: tmp.clone(),
            source: e.into_error(),
        })?;
        let digest: Digest = hasher.finalize().into();
        let _lock = lock_shared(&store)?;
        if let Some(r) = roots {
            r.add_locked(&[digest])?;
        }
        if !store.has(ObjectKind::Blob, &digest) {
            file.sync_all().map_err(io("fsync", &tmp))?;
            drop(file);
            let dst = store.object_path(ObjectKind::Blob, &digest);
            std::fs::rename(&tmp, &dst).map_err(io("rename into store", &dst))?;
            if let Some(shard) = dst.parent() {
                if let Ok(d) = File::open(shard) {
                    d.sync_all().map_err(io("fsync", shard))?;
                }
            }
        }
        drop(staging);
        Ok((digest, len))
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Passes at most `max` bytes on to `inner` and silently drops the rest
/// (counting them), so a tee keeps draining its pipe; [`is_full`] tells
/// the caller when to act (end the build, or keep a tail elsewhere). The
/// policy is the caller's: this only bounds what reaches `inner`.
///
/// [`is_full`]: CappedWriter::is_full
#[derive(Debug)]
pub struct CappedWriter<W> {
    inner: W,
    max: u64,
    written: u64,
    dropped: u64,
}

impl<W: Write> CappedWriter<W> {
    pub fn new(inner: W, max: u64) -> Self {
        CappedWriter {
            inner,
            max,
            written: 0,
            dropped: 0,
        }
    }

    /// Bytes passed on to the inner writer.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes dropped past the cap.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether the cap is reached (everything from now on is dropped).
    pub fn is_full(&self) -> bool {
        self.written >= self.max
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for CappedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = self.max.saturating_sub(self.written);
        let take = (buf.len() as u64).min(room) as usize;
        if take > 0 {
            let n = self.inner.write(&buf[..take])?;
            self.written += n as u64;
            if n < take {
                // A short write: report it, the caller retries the rest.
                return Ok(n);
            }
        }
        self.dropped += (buf.len() - take) as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
