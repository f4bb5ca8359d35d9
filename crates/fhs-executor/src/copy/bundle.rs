//! The bundle: records and their closures in one file, for a machine a
//! store cannot reach (`fhsx store copy --to file:PATH`, then `--from
//! file:PATH` there).
//!
//! ```text
//! fhsx-bundle 1\n             header: magic and format version (14 bytes)
//! frame…                     one per object, then the end frame
//!
//! frame:
//!   kind     1 byte          R a record blob, D a directory, B a blob, E the end
//!   digest  32 bytes         BLAKE3 of the body (zeros in E)
//!   length   8 bytes         big-endian: the body's length; in E, how many
//!                            frames came before it (E has no body)
//!   body     length bytes    the object's bytes (a directory: its canonical encoding)
//! ```
//!
//! Each record comes before the objects it names and each directory
//! before its children, so the receiver knows, as each frame arrives,
//! whether anything asked for it. Nothing follows the end frame.
//!
//! A bundle is read as hostile input: one frame at a time, a blob streamed
//! into the store's transaction (hashed as it is written, never whole in
//! memory), a record at most [`MAX_RECORD_BYTES`] (1 MiB, where a record
//! is a few KiB: it is parsed before its signature can be checked) and a
//! directory at most [`MAX_DIRECTORY_BYTES`] in memory, no length beyond
//! what the file has left, no recursion on the trees it carries, and
//! nothing of its bytes shown raw. A bundle is written to a temporary file
//! beside its path, synced, and renamed over it only when whole.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

use castore::store::ObjectKind;
use castore::Digest;
use tempfile::NamedTempFile;

use super::{shown_path, CopyError, Moved, Receiver, Sink};
use super::{MAX_DIRECTORY_BYTES, MAX_RECORD_BYTES};
use crate::Error;

/// The header: magic and format version.
pub const MAGIC: &[u8] = b"fhsx-bundle 1\n";

/// Kind bytes.
const RECORD: u8 = b'R';
const DIRECTORY: u8 = b'D';
const BLOB: u8 = b'B';
const END: u8 = b'E';

/// A frame's header: kind, digest, length.
const HEAD: usize = 1 + Digest::LEN + 8;

/// Writes a bundle: a [`Sink`] that wants everything.
pub struct Writer {
    out: BufWriter<NamedTempFile>,
    frames: u64,
    moved: Moved,
}

impl Writer {
    /// Start a bundle to be renamed to `path` by [`Writer::finish`].
    pub fn create(path: &Path) -> Result<Self, Error> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if path.is_dir() {
            return Err(Error::Usage(format!(
                "{} is a directory; a bundle is one file (to copy into a store there, drop the file: prefix)",
                shown_path(path)
            )));
        }
        let tmp = tempfile::Builder::new()
            .prefix(".fhsx-bundle-")
            .tempfile_in(dir)
            .map_err(|e| Error::io("create a bundle in", dir, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        out.write_all(MAGIC)
            .map_err(|e| Error::io("write", path, e))?;
        Ok(Writer {
            out,
            frames: 0,
            moved: Moved::default(),
        })
    }

    fn head(&mut self, kind: u8, d: &Digest, len: u64) -> std::io::Result<()> {
        let mut h = [0u8; HEAD];
        h[0] = kind;
        h[1..1 + Digest::LEN].copy_from_slice(d.as_bytes());
        h[1 + Digest::LEN..].copy_from_slice(&len.to_be_bytes());
        self.out.write_all(&h)
    }

    fn frame(&mut self, kind: u8, d: &Digest, bytes: &[u8]) -> Result<(), Error> {
        self.head(kind, d, bytes.len() as u64)
            .and_then(|_| self.out.write_all(bytes))
            .map_err(|e| Error::io("write", self.out.get_ref().path(), e))?;
        self.counted(bytes.len() as u64);
        Ok(())
    }

    fn counted(&mut self, len: u64) {
        self.frames += 1;
        self.moved.objects += 1;
        self.moved.bytes += len;
    }

    /// End the bundle, make it durable, and rename it to `path`.
    pub fn finish(mut self, path: &Path) -> Result<Moved, Error> {
        let end = Digest::from_bytes([0; Digest::LEN]);
        let frames = self.frames;
        let tmp_path = self.out.get_ref().path().to_path_buf();
        let io = |e| Error::io("write", &tmp_path, e);
        self.head(END, &end, frames).map_err(io)?;
        let tmp = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        tmp.as_file().sync_all().map_err(io)?;
        // Readable as any file the user writes (a temporary file is 0600).
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o644)).map_err(io)?;
        tmp.persist(path)
            .map_err(|e| Error::io("rename the bundle to", path, e.error))?;
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            // The rename itself durable too.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(self.moved)
    }
}

impl Sink for Writer {
    fn wants(&mut self, _: ObjectKind, _: &Digest) -> bool {
        true
    }

    fn record(&mut self, digest: &Digest, bytes: &[u8]) -> Result<(), Error> {
        self.moved.records.push(*digest);
        self.frame(RECORD, digest, bytes)
    }

    fn directory(&mut self, digest: &Digest, bytes: &[u8]) -> Result<(), Error> {
        self.frame(DIRECTORY, digest, bytes)
    }

    /// Copied as it is hashed: a blob the source store holds damaged is
    /// refused here, not written for the receiver to refuse.
    fn blob(&mut self, digest: &Digest, len: u64, r: &mut dyn BufRead) -> Result<(), Error> {
        let tmp_path = self.out.get_ref().path().to_path_buf();
        self.head(BLOB, digest, len)
            .map_err(|e| Error::io("write", &tmp_path, e))?;
        let mut h = blake3::Hasher::new();
        let mut left = len;
        while left > 0 {
            let chunk = match r.fill_buf() {
                Ok([]) => break,
                Ok(c) => &c[..c.len().min(usize::try_from(left).unwrap_or(usize::MAX))],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("read the blob", &blob_name(digest), e)),
            };
            h.update(chunk);
            self.out
                .write_all(chunk)
                .map_err(|e| Error::io("write", &tmp_path, e))?;
            let n = chunk.len();
            r.consume(n);
            left -= n as u64;
        }
        let actual: Digest = h.finalize().into();
        // A short file hashes to something else too.
        if left > 0 || actual != *digest {
            return Err(castore::Error::Corrupt {
                digest: *digest,
                actual,
                path: None,
            }
            .into());
        }
        self.counted(len);
        Ok(())
    }
}

fn blob_name(d: &Digest) -> std::path::PathBuf {
    std::path::PathBuf::from(d.to_string())
}

/// Read as much of `buf` as `r` has; how much that was.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Read the bundle at `path` into `rx`, frame by frame.
pub fn read(path: &Path, rx: &mut Receiver<'_>) -> Result<(), Error> {
    let from = format!("the bundle {}", shown_path(path));
    let malformed = |why: String| -> Error {
        CopyError::Malformed {
            from: from.clone(),
            why,
        }
        .into()
    };
    let truncated = |at: String| -> Error {
        CopyError::Truncated {
            from: from.clone(),
            at,
        }
        .into()
    };
    let f = File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::Usage(format!("there is no bundle at {}", shown_path(path)))
        } else {
            Error::io("open", path, e)
        }
    })?;
    let meta = f.metadata().map_err(|e| Error::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::Usage(format!(
            "{} is not a file; a bundle is one file (to copy from a store directory, drop the file: prefix)",
            shown_path(path)
        )));
    }
    let total = meta.len();
    let mut r = BufReader::with_capacity(1 << 20, f);
    let io = |e| Error::io("read", path, e);

    let mut magic = [0u8; MAGIC.len()];
    let n = read_full(&mut r, &mut magic).map_err(io)?;
    if n < MAGIC.len() || magic != MAGIC {
        let begins = castore::shown::escaped(&magic[..n]);
        let magic_shown = castore::shown::escaped(MAGIC);
        return Err(if n < MAGIC.len() && magic[..n] == MAGIC[..n] {
            truncated("inside its header".into())
        } else if magic[..n].starts_with(b"fhsx-bundle ") {
            malformed(format!(
                "its header is \"{begins}\", and this fhsx reads \"{magic_shown}\" (a bundle of another fhsx version?)"
            ))
        } else {
            malformed(format!("it begins \"{begins}\", not \"{magic_shown}\""))
        });
    }
    let mut at = MAGIC.len() as u64;
    let mut frames = 0u64;
    loop {
        let mut head = [0u8; HEAD];
        let n = read_full(&mut r, &mut head).map_err(io)?;
        if n == 0 {
            return Err(truncated(format!(
                "after {frames} objects, at byte {at}, with no end frame"
            )));
        }
        if n < HEAD {
            return Err(truncated(format!(
                "inside the header of frame {frames}, at byte {at}"
            )));
        }
        let kind = head[0];
        let digest = Digest::from_slice(&head[1..1 + Digest::LEN])
            .unwrap_or_else(|| Digest::from_bytes([0; Digest::LEN]));
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&head[1 + Digest::LEN..]);
        let len = u64::from_be_bytes(len_bytes);
        at += HEAD as u64;
        let left = total.saturating_sub(at);
        let max = match kind {
            RECORD => MAX_RECORD_BYTES,
            DIRECTORY => MAX_DIRECTORY_BYTES,
            BLOB => u64::MAX,
            END => {
                if len != frames {
                    return Err(malformed(format!(
                        "its end frame counts {len} objects, and {frames} came before it"
                    )));
                }
                let mut more = [0u8; 1];
                if read_full(&mut r, &mut more).map_err(io)? != 0 {
                    return Err(malformed(format!(
                        "bytes follow its end frame at byte {at}"
                    )));
                }
                return Ok(());
            }
            other => {
                return Err(malformed(format!(
                    "frame {frames} at byte {} is of kind \"{}\", not R, D, B or E",
                    at - HEAD as u64,
                    castore::shown::escaped(&[other])
                )))
            }
        };
        if len > max {
            return Err(malformed(format!(
                "frame {frames} at byte {} claims {len} bytes, more than the {max} a {} may have",
                at - HEAD as u64,
                if kind == RECORD {
                    "record"
                } else {
                    "directory"
                }
            )));
        }
        if len > left {
            return Err(truncated(format!(
                "inside {digest}, frame {frames}: it claims {len} bytes and {left} are left"
            )));
        }
        match kind {
            BLOB => rx.blob(&digest, len, &mut r)?,
            _ => {
                // At most MAX_DIRECTORY_BYTES, and no more than the file has.
                let mut body = vec![0u8; len as usize];
                let got = read_full(&mut r, &mut body).map_err(io)?;
                if got < body.len() {
                    return Err(truncated(format!(
                        "inside {digest}, frame {frames}, after {got} of its {len} bytes"
                    )));
                }
                if kind == RECORD {
                    rx.record(&digest, &body)?;
                } else {
                    rx.directory(&digest, &body)?;
                }
            }
        }
        at += len;
        frames += 1;
    }
}
