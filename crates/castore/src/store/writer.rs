//! Streaming blob writes: [`BlobWriter`] takes bytes as they arrive (a
//! build's log from a pipe), hashes them on the way to memory and, past
//! 64 KiB, to a private temp file, and makes them a blob only at
//! [`BlobWriter::finish`]. [`CappedWriter`]
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
/// The first 64 KiB (`IN_MEMORY`) are kept in memory; a blob that grows
/// past that goes to a temp file in a private staging directory under
/// `ROOT/tmp` (flocked, like a [`Txn`](super::Txn)'s), never visible in the
/// store before `finish`. A small blob the store already holds (a rebuilt
/// action's log and read set, as a rule) then costs no file at all: a
/// staging directory, its lock, the temp file and their removal were five
/// inodes made and freed for nothing. Dropping an unfinished writer deletes
/// the temp file, if any; a killed process's leftover is removed by the
/// next [`LocalStore::open`]. The writer does not hold the store lock while
/// writing — a build-long log must not hold off `gc` for the whole build —
/// only for the rename inside `finish`.
pub struct BlobWriter {
    store: LocalStore,
    sink: Sink,
    hasher: blake3::Hasher,
    len: u64,
}

/// How many bytes a [`BlobWriter`] keeps in memory before it spills them
/// to a temp file.
pub(crate) const IN_MEMORY: usize = 64 << 10;

/// Where a [`BlobWriter`]'s bytes are so far.
enum Sink {
    Memory(Vec<u8>),
    File(Spilled),
}

struct Spilled {
    staging: Staging,
    tmp: PathBuf,
    file: BufWriter<File>,
}

impl Spilled {
    /// A temp file in a fresh staging directory, holding `head`.
    fn create(store: &LocalStore, head: &[u8]) -> Result<Spilled> {
        let staging = Staging::create(store)?;
        let tmp = staging.dir.join("blob");
        let file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        let mut file = BufWriter::with_capacity(256 * 1024, file);
        file.write_all(head).map_err(io("write", &tmp))?;
        Ok(Spilled { staging, tmp, file })
    }
}

impl std::fmt::Debug for BlobWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tmp = match &self.sink {
            Sink::Memory(_) => None,
            Sink::File(f) => Some(&f.tmp),
        };
        f.debug_struct("BlobWriter")
            .field("tmp", &tmp)
            .field("len", &self.len)
            .finish()
    }
}

impl LocalStore {
    /// Start a streamed blob; see [`BlobWriter`].
    pub fn blob_writer(&self) -> Result<BlobWriter> {
        Ok(BlobWriter {
            store: self.clone(),
            sink: Sink::Memory(Vec::new()),
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
            sink,
            hasher,
            len,
        } = self;
        let digest: Digest = hasher.finalize().into();
        let _lock = lock_shared(&store)?;
        if let Some(r) = roots {
            r.add_locked(&[digest])?;
        }
        if store.has(ObjectKind::Blob, &digest) {
            return Ok((digest, len));
        }
        let spilled = match sink {
            Sink::File(f) => f,
            Sink::Memory(bytes) => Spilled::create(&store, &bytes)?,
        };
        let Spilled { staging, tmp, file } = spilled;
        let file = file.into_inner().map_err(|e| Error::Io {
            op: "write",
            path: tmp.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(io("fsync", &tmp))?;
        drop(file);
        let dst = store.object_path(ObjectKind::Blob, &digest);
        std::fs::rename(&tmp, &dst).map_err(io("rename into store", &dst))?;
        if let Some(shard) = dst.parent() {
            if let Ok(d) = File::open(shard) {
                d.sync_all().map_err(io("fsync", shard))?;
            }
        }
        drop(staging);
        Ok((digest, len))
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = match &mut self.sink {
            Sink::Memory(bytes) if bytes.len() + buf.len() <= IN_MEMORY => {
                bytes.extend_from_slice(buf);
                buf.len()
            }
            Sink::Memory(bytes) => {
                let spilled = Spilled::create(&self.store, bytes).map_err(io::Error::other)?;
                self.sink = Sink::File(spilled);
                return self.write(buf);
            }
            Sink::File(f) => f.file.write(buf)?,
        };
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Memory(_) => Ok(()),
            Sink::File(f) => f.file.flush(),
        }
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
