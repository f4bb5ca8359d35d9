//! Importing a directory on disk, in parallel: subtrees and files are hashed
//! and staged on rayon's pool, so hashing overlaps I/O.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use rayon::prelude::*;

use super::Imported;
use crate::error::io;
use crate::store::Txn;
use crate::{Digest, Directory, Error, Name, Node, Progress, Result, SymlinkTarget};

/// Files up to this size are read whole, hashed, and written only if the
/// store lacks them; bigger files are hashed in place first for the same
/// reason, then copied.
const SMALL: u64 = 16 << 20;

pub(super) fn import_dir(txn: &Txn<'_>, path: &Path, progress: &dyn Progress) -> Result<Imported> {
    let dir = walk(txn, path, progress)?;
    let size = dir.size();
    Ok(Imported {
        root: txn.put_directory(&dir)?,
        size,
    })
}

fn walk(txn: &Txn<'_>, path: &Path, progress: &dyn Progress) -> Result<Directory> {
    let mut names = Vec::new();
    for e in fs::read_dir(path).map_err(io("read directory", path))? {
        let e = e.map_err(io("read directory", path))?;
        names.push(e.file_name());
    }
    let nodes: Vec<(Name, Node)> = names
        .par_iter()
        .map(|n| {
            let p = path.join(n);
            let name = Name::new(n.as_encoded_bytes()).map_err(|e| Error::HostileInput {
                source_path: p.clone(),
                reason: e.to_string(),
            })?;
            Ok((name, import_entry(txn, &p, progress)?))
        })
        .collect::<Result<_>>()?;
    let mut dir = Directory::new();
    for (name, node) in nodes {
        dir.insert(name, node)?;
    }
    Ok(dir)
}

fn import_entry(txn: &Txn<'_>, p: &Path, progress: &dyn Progress) -> Result<Node> {
    let meta = fs::symlink_metadata(p).map_err(io("stat", p))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        let d = walk(txn, p, progress)?;
        return Ok(Node::Directory {
            size: d.size(),
            digest: txn.put_directory(&d)?,
        });
    }
    if ft.is_symlink() {
        let t = fs::read_link(p).map_err(io("read symlink", p))?;
        let target = SymlinkTarget::new(t.as_os_str().as_encoded_bytes()).map_err(|e| {
            Error::HostileInput {
                source_path: p.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        return Ok(Node::Symlink { target });
    }
    if !ft.is_file() {
        return Err(Error::HostileInput {
            source_path: p.to_path_buf(),
            reason: "not a regular file, directory or symlink (sockets, FIFOs and devices cannot be stored)".into(),
        });
    }
    let executable = meta.mode() & 0o100 != 0;
    let mut f = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .map_err(io("open", p))?;
    let (digest, size) = if meta.len() <= SMALL {
        let mut buf = Vec::with_capacity(meta.len() as usize);
        f.read_to_end(&mut buf).map_err(io("read", p))?;
        (txn.put_blob(&buf)?, buf.len() as u64)
    } else {
        import_large(txn, p, &mut f)?
    };
    progress.advance(1, size);
    Ok(Node::File {
        digest,
        size,
        executable,
    })
}

/// Hash in place (mmap, all cores); copy only if the store lacks the blob,
/// and then check the copy hashes the same, so a file changing under us is
/// an error rather than a mislabelled blob.
fn import_large(txn: &Txn<'_>, p: &Path, f: &mut File) -> Result<(Digest, u64)> {
    let mut h = blake3::Hasher::new();
    h.update_mmap_rayon(p).map_err(io("read", p))?;
    let first: Digest = h.finalize().into();
    if txn.has_blob(&first) {
        let len = f.metadata().map_err(io("stat", p))?.len();
        return Ok((first, len));
    }
    let (d, n) = txn.put_blob_reader(f)?;
    if d != first {
        return Err(Error::HostileInput {
            source_path: p.to_path_buf(),
            reason: "the file changed while it was being imported; retry when it is quiet".into(),
        });
    }
    Ok((d, n))
}
