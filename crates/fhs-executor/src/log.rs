//! The build log: what the build prints, streamed into the store as it
//! arrives and teed to the live sink, never held whole in memory.
//!
//! `[limits] log` caps the build's own output. Past it fhsx stops the build
//! — as Nix's `max-build-log-size` does — and the build fails as a limit
//! failure naming the limit: a log that was cut is a build whose output
//! nobody can read whole, so it is not one to trust or cache. Until the
//! sandbox is down the pipe is still drained (and discarded), so the build
//! never blocks on a full pipe while it is being stopped. fhsx's own lines
//! (notes, violations) are not counted against the cap.
//!
//! The live sink (a terminal, a remote client's) gets the output with its
//! control bytes escaped (`castore::shown::terminal_safe`); the log in the
//! store keeps them as the build wrote them.
//!
//! Kept apart (`BuildRequest::split_streams`, an REAPI action), stdout is
//! the log and stderr a second blob, with fhsx's own lines; the cap counts
//! both together.
//!
//! fhsx's memory stays flat whatever the build prints: one 64 KiB buffer
//! per stream.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use castore::store::LocalStore;
use castore::{BlobWriter, Digest, TempRoots};

use crate::Error;

/// A build's log being written.
pub struct BuildLog {
    blob: BlobWriter,
    /// Kept apart: stderr (and fhsx's own lines).
    stderr: Option<BlobWriter>,
    cap: u64,
    /// The build's own output bytes kept so far.
    kept: u64,
    /// Output bytes past the cap, drained and discarded.
    dropped: u64,
    /// The first failure to write the blob (a full disk): reported at
    /// `finish`, the build's output still drained meanwhile.
    failed: Option<std::io::Error>,
}

impl BuildLog {
    pub fn new(store: &LocalStore, cap: u64) -> Result<BuildLog, Error> {
        Ok(BuildLog {
            blob: store.blob_writer()?,
            stderr: None,
            cap,
            kept: 0,
            dropped: 0,
            failed: None,
        })
    }

    /// A log that keeps stdout and stderr apart.
    pub fn split(store: &LocalStore, cap: u64) -> Result<BuildLog, Error> {
        let mut log = Self::new(store, cap)?;
        log.stderr = Some(store.blob_writer()?);
        Ok(log)
    }

    pub fn is_split(&self) -> bool {
        self.stderr.is_some()
    }

    fn keep(&mut self, stream: Stream, bytes: &[u8]) {
        let blob = match (stream, &mut self.stderr) {
            (Stream::Err, Some(err)) => err,
            _ => &mut self.blob,
        };
        if self.failed.is_none() {
            if let Err(e) = blob.write_all(bytes) {
                self.failed = Some(e);
            }
        }
    }

    /// One of fhsx's own lines, to the log (stderr, kept apart) and the
    /// live sink.
    pub fn note(&mut self, line: &str, live: &mut dyn Write) {
        let line = format!("{line}\n");
        let _ = live.write_all(line.as_bytes());
        self.keep(Stream::Err, line.as_bytes());
    }

    /// Copy the build's output from `pipe` until it closes. Past the cap,
    /// `stop` is set (the caller's sandbox stops the build) and the rest is
    /// drained unkept.
    pub fn tee(&mut self, pipe: &mut dyn Read, live: &mut dyn Write, stop: &AtomicBool) {
        let shared = Mutex::new((self, live));
        pump(&shared, pipe, Stream::Out, stop);
    }

    /// [`tee`](Self::tee) of a log kept apart: stdout from `out`, stderr
    /// from `err`, each read on a thread of its own until both close.
    pub fn tee_split(
        &mut self,
        out: &mut (dyn Read + Send),
        err: &mut (dyn Read + Send),
        live: &mut (dyn Write + Send),
        stop: &AtomicBool,
    ) {
        let shared = Mutex::new((self, live));
        std::thread::scope(|s| {
            s.spawn(|| pump(&shared, err, Stream::Err, stop));
            pump(&shared, out, Stream::Out, stop);
        });
    }

    /// One chunk of the build's output: kept up to the cap, past it
    /// counted, dropped and the build stopped.
    fn take(&mut self, stream: Stream, chunk: &[u8], live: &mut dyn Write, stop: &AtomicBool) {
        let room = self.cap.saturating_sub(self.kept) as usize;
        let take = chunk.len().min(room);
        if take > 0 {
            let _ = live.write_all(&castore::shown::terminal_safe(&chunk[..take]));
            self.keep(stream, &chunk[..take]);
            self.kept += take as u64;
        }
        if take < chunk.len() {
            self.dropped += (chunk.len() - take) as u64;
            stop.store(true, Ordering::SeqCst);
        }
    }

    /// Whether the build went past `[limits] log`.
    pub fn exceeded(&self) -> bool {
        self.dropped > 0
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Store the log, rooted in `roots`: its digest, and stderr's when
    /// kept apart.
    pub fn finish(self, roots: &TempRoots) -> Result<(Digest, Option<Digest>), Error> {
        if let Some(e) = self.failed {
            return Err(Error::Other(format!(
                "writing the build log to the store: {e}"
            )));
        }
        let err = match self.stderr {
            Some(b) => Some(b.finish_rooted(roots)?.0),
            None => None,
        };
        Ok((self.blob.finish_rooted(roots)?.0, err))
    }
}

/// Which of the build's streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Out,
    Err,
}

/// Read `pipe` until it closes, each chunk into the shared log.
fn pump<W: Write + ?Sized>(
    shared: &Mutex<(&mut BuildLog, &mut W)>,
    pipe: &mut (dyn Read + '_),
    stream: Stream,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut held = shared.lock().unwrap_or_else(|p| p.into_inner());
        let (log, live) = &mut *held;
        let mut live: &mut W = live;
        log.take(stream, &buf[..n], &mut live, stop);
    }
}
