//! Importing a directory on disk: walked with [`crate::fs_tree`] (no
//! recursion, two descriptors whatever the depth, nothing followed), each
//! file hashed and copied as a stream. What is held at once is the stack of
//! directories being gathered and one buffer, whatever the tree's shape or
//! its files' sizes; a file a build left sparse reads as zeros and is
//! stored at its apparent size.

use std::ffi::CStr;
use std::fs::File;
use std::io::{Read, Seek};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, Stat};

use super::Imported;
use crate::fs_tree::{self, Step, TreePath, Visitor};
use crate::store::Txn;
use crate::{Digest, Directory, Error, Name, Node, Progress, Result, SymlinkTarget};

/// Files up to this size are read whole, hashed, and written only if the
/// store lacks them; bigger ones are hashed in a stream first for the same
/// reason, then copied in a stream.
const SMALL: u64 = 64 << 10;

/// The streaming buffer: big enough that BLAKE3 hashes it on every core.
const CHUNK: usize = 1 << 20;

pub(super) fn import_dir(txn: &Txn<'_>, path: &Path, progress: &dyn Progress) -> Result<Imported> {
    let mut importer = Importer {
        txn,
        progress,
        base: path,
        buf: Vec::new(),
        root: None,
    };
    fs_tree::walk(path, fs_tree::MAX_DEPTH, &mut importer)?;
    importer.root.ok_or_else(|| Error::HostileInput {
        source_path: path.to_path_buf(),
        reason: "the walk ended without its root".into(),
    })
}

struct Importer<'a, 't> {
    txn: &'a Txn<'t>,
    progress: &'a dyn Progress,
    base: &'a Path,
    /// The streaming buffer, made on the first big file.
    buf: Vec<u8>,
    root: Option<Imported>,
}

impl Visitor for Importer<'_, '_> {
    type Dir = Directory;
    type Error = Error;

    fn enter(&mut self, _: &TreePath<'_>, _: BorrowedFd<'_>) -> Result<Directory> {
        Ok(Directory::new())
    }

    fn entry(
        &mut self,
        dir: &mut Directory,
        at: &TreePath<'_>,
        parent: BorrowedFd<'_>,
        name: &CStr,
        stat: &Stat,
    ) -> Result<Step> {
        let node = match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => return Ok(Step::Enter),
            FileType::Symlink => {
                let t = rustix::fs::readlinkat(parent, name, Vec::new())
                    .map_err(|e| fs_tree::io_at("read symlink", self.shown(at), e))?;
                let target = SymlinkTarget::new(t.as_bytes()).map_err(|e| self.hostile(at, e))?;
                Node::Symlink { target }
            }
            FileType::RegularFile => {
                let fd = rustix::fs::openat(
                    parent,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| fs_tree::io_at("open", self.shown(at), e))?;
                let mut f = File::from(fd);
                let (digest, size) = self.import_file(&mut f, stat.st_size as u64, at)?;
                self.progress.advance(1, size);
                Node::File {
                    digest,
                    size,
                    executable: stat.st_mode & 0o100 != 0,
                }
            }
            _ => {
                return Err(self.hostile(at, "not a regular file, directory or symlink (sockets, FIFOs and devices cannot be stored)"));
            }
        };
        let name = Name::new(name.to_bytes()).map_err(|e| self.hostile(at, e))?;
        dir.insert(name, node)?;
        Ok(Step::Skip)
    }

    fn leave(
        &mut self,
        done: Directory,
        at: &TreePath<'_>,
        parent: Option<(&mut Directory, BorrowedFd<'_>)>,
    ) -> Result<()> {
        let size = done.size();
        let digest = self.txn.put_directory(&done)?;
        drop(done);
        match (parent, at.last_name()) {
            (Some((parent, _)), Some(name)) => {
                let name = Name::new(name.to_bytes()).map_err(|e| self.hostile(at, e))?;
                parent.insert(name, Node::Directory { digest, size })?;
            }
            _ => self.root = Some(Imported { root: digest, size }),
        }
        Ok(())
    }
}

impl Importer<'_, '_> {
    fn shown(&self, at: &TreePath<'_>) -> PathBuf {
        fs_tree::where_(self.base, at)
    }

    fn hostile(&self, at: &TreePath<'_>, reason: impl ToString) -> Error {
        Error::HostileInput {
            source_path: self.shown(at),
            reason: reason.to_string(),
        }
    }

    /// Store the file `f` of `len` bytes (as it was stat'ed): small ones
    /// read whole, others hashed in a stream and copied only if the store
    /// lacks them, the copy checked to hash the same, so a file changing
    /// under the import is an error rather than a mislabelled blob.
    fn import_file(&mut self, f: &mut File, len: u64, at: &TreePath<'_>) -> Result<(Digest, u64)> {
        let base = self.base;
        let read_err = |e| Error::Io {
            op: "read",
            path: fs_tree::where_(base, at),
            source: e,
        };
        if len <= SMALL {
            let mut bytes = Vec::with_capacity(len as usize);
            f.take(SMALL + 1)
                .read_to_end(&mut bytes)
                .map_err(read_err)?;
            if bytes.len() as u64 != len {
                return Err(self.changed(at));
            }
            return Ok((self.txn.put_blob(&bytes)?, len));
        }
        if self.buf.is_empty() {
            self.buf = vec![0; CHUNK];
        }
        let mut h = blake3::Hasher::new();
        let mut n = 0u64;
        loop {
            let k = f.read(&mut self.buf).map_err(read_err)?;
            if k == 0 {
                break;
            }
            h.update_rayon(&self.buf[..k]);
            n += k as u64;
        }
        if n != len {
            return Err(self.changed(at));
        }
        let first: Digest = h.finalize().into();
        if self.txn.has_blob(&first) {
            return Ok((first, n));
        }
        f.rewind().map_err(read_err)?;
        let (d, copied) = self.txn.put_blob_reader(f)?;
        if d != first || copied != n {
            return Err(self.changed(at));
        }
        Ok((d, n))
    }

    fn changed(&self, at: &TreePath<'_>) -> Error {
        self.hostile(
            at,
            "the file changed while it was being imported; retry when it is quiet",
        )
    }
}
