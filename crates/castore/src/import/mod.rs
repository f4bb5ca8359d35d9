//! Turning things on disk into trees: a directory, a tarball (plain, gzip,
//! xz, zstd or bzip2) or a Debian package. The format is sniffed from the
//! bytes, not the file name. Out: zip, 7z, lzip, lzma-alone and compress
//! (`.Z`) — no upstream source in Debian's archive needs them that a `.tar`
//! variant does not also offer.
//!
//! Every import runs in one [`Txn`]: if anything is wrong with the input —
//! a hostile archive, a truncated stream, a file that changed under us — the
//! error names it and the store is left exactly as it was.

mod archive;
mod dir;
mod tree;

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::io;
use crate::store::{LocalStore, Txn};
use crate::{Digest, Error, Progress, Result};

pub use archive::Limits;

/// What an import produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    /// The root directory's digest: the atom's name.
    pub root: Digest,
    /// Entries below the root, recursively.
    pub size: u64,
}

/// Import `path` into `store` with default limits.
pub fn import_path(store: &LocalStore, path: &Path, progress: &dyn Progress) -> Result<Imported> {
    import_path_with(store, path, &Limits::default(), progress)
}

pub fn import_path_with(
    store: &LocalStore,
    path: &Path,
    limits: &Limits,
    progress: &dyn Progress,
) -> Result<Imported> {
    let meta = std::fs::symlink_metadata(path).map_err(io("stat", path))?;
    let txn = store.txn()?;
    let imported = if meta.is_dir() {
        dir::import_dir(&txn, path, progress)?
    } else if meta.is_file() {
        let mut f = File::open(path).map_err(io("open", path))?;
        let mut magic = [0u8; 512];
        let n = read_prefix(&mut f, &mut magic).map_err(io("read", path))?;
        let f = File::open(path).map_err(io("open", path))?;
        import_stream(&txn, path, &magic[..n], f, limits, progress)?
    } else {
        return Err(Error::UnknownFormat(path.to_path_buf()));
    };
    txn.commit()?;
    Ok(imported)
}

fn import_stream(
    txn: &Txn<'_>,
    path: &Path,
    magic: &[u8],
    f: File,
    limits: &Limits,
    progress: &dyn Progress,
) -> Result<Imported> {
    if magic.starts_with(b"!<arch>\n") {
        return archive::import_deb(txn, path, f, limits, progress);
    }
    match archive::Compression::sniff(magic) {
        Some(c) => archive::import_tar(txn, path, c, f, limits, progress),
        None => Err(Error::UnknownFormat(path.to_path_buf())),
    }
}

fn read_prefix(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
