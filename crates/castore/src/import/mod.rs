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

/// [`import_path`], remembering what a file imported as: an unchanged
/// archive (same device, inode, size, mtime and ctime — the test git's index
/// makes) is not read again. Directories are always imported: their own
/// metadata does not change when a file deep inside them does.
///
/// The memo lives in `ROOT/imports/<BLAKE3 of the canonical path>` and is
/// only a hint: an entry whose tree is no longer in the store is ignored,
/// and a torn or foreign entry fails to parse and is ignored too.
pub fn import_path_cached(store: &LocalStore, path: &Path) -> Result<Imported> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(io("stat", path))?;
    if !meta.is_file() {
        return import_path(store, path, &());
    }
    let canonical = std::fs::canonicalize(path).map_err(io("resolve", path))?;
    // `v3`: memos of an fhsx that did not keep .deb alternatives in the
    // atom are stale.
    let key = format!(
        "v3 {} {} {} {}.{} {}.{}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    );
    let memo = store
        .root()
        .join("imports")
        .join(Digest::of(canonical.as_os_str().as_encoded_bytes()).hex());
    if let Some(hit) = std::fs::read_to_string(&memo)
        .ok()
        .and_then(|t| parse_memo(&t, &key))
    {
        if crate::store::DirectoryStore::has_directory(store, &hit.root).unwrap_or(false) {
            return Ok(hit);
        }
    }
    let imported = import_path(store, path, &())?;
    // Best effort: a memo that cannot be written costs a re-import next time.
    let dir = store.root().join("imports");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(tmp) = tempfile_in(&store.tmp_dir()) {
        let line = format!("{key} {} {}\n", imported.root, imported.size);
        if std::fs::write(&tmp, line).is_ok() && std::fs::rename(&tmp, &memo).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(imported)
}

fn parse_memo(text: &str, key: &str) -> Option<Imported> {
    let rest = text.trim_end().strip_prefix(key)?.strip_prefix(' ')?;
    let (root, size) = rest.split_once(' ')?;
    Some(Imported {
        root: root.parse().ok()?,
        size: size.parse().ok()?,
    })
}

/// A fresh, unique name in `dir` for a file about to be renamed into place.
fn tempfile_in(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let p = dir.join(format!(
        "memo-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)?;
    Ok(p)
}
