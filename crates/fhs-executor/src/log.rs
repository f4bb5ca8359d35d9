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
//! fhsx's memory stays flat whatever the build prints: one 64 KiB buffer.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use castore::store::LocalStore;
use castore::{BlobWriter, Digest, TempRoots};

use crate::Error;

/// A build's log being written.
pub struct BuildLog {
    blob: BlobWriter,
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
            cap,
            kept: 0,
            dropped: 0,
            failed: None,
        })
    }

    fn keep(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            if let Err(e) = self.blob.write_all(bytes) {
                self.failed = Some(e);
            }
        }
    }

    /// One of fhsx's own lines, to the log and the live sink.
    pub fn note(&mut self, line: &str, live: &mut dyn Write) {
        let line = format!("{line}\n");
        let _ = live.write_all(line.as_bytes());
        self.keep(line.as_bytes());
    }

    /// Copy the build's output from `pipe` until it closes. Past the cap,
    /// `stop` is set (the caller's sandbox stops the build) and the rest is
    /// drained unkept.
    pub fn tee(&mut self, pipe: &mut dyn Read, live: &mut dyn Write, stop: &AtomicBool) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let room = self.cap.saturating_sub(self.kept) as usize;
            let take = n.min(room);
            if take > 0 {
                let _ = live.write_all(&castore::shown::terminal_safe(&buf[..take]));
                self.keep(&buf[..take]);
                self.kept += take as u64;
            }
            if take < n {
                self.dropped += (n - take) as u64;
                stop.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Whether the build went past `[limits] log`.
    pub fn exceeded(&self) -> bool {
        self.dropped > 0
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Store the log, rooted in `roots`.
    pub fn finish(self, roots: &TempRoots) -> Result<Digest, Error> {
        if let Some(e) = self.failed {
            return Err(Error::Other(format!(
                "writing the build log to the store: {e}"
            )));
        }
        Ok(self.blob.finish_rooted(roots)?.0)
    }
}
