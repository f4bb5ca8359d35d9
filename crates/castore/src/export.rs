//! Writing a stored tree back out to a directory: contents, executable bits
//! and symlinks exactly; every blob verified as it is copied.
//!
//! The tree is written into a hidden sibling of the destination and renamed
//! into place at the end, so a failed export (a corrupt blob, a full disk)
//! leaves no partial tree at the destination.
//!
//! Trees carry no times, so every exported file and directory gets the same
//! one, [`EXPORT_MTIME`] (as in Nix's store): equal times make `make`
//! consider nothing out of date, where creation order would otherwise make
//! generated files (`configure`, `aclocal.m4`) look stale.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::io;
use crate::store::{DirectoryStore, LocalStore, ObjectKind};
use crate::{Digest, Error, Node, Progress, Result};

/// The modification time of everything exported: one second after the epoch.
pub const EXPORT_MTIME: std::time::Duration = std::time::Duration::from_secs(1);

fn set_mtime(p: &Path) -> Result<()> {
    let t = std::time::UNIX_EPOCH + EXPORT_MTIME;
    let f = File::open(p).map_err(io("open", p))?;
    f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
        .map_err(io("set times of", p))
}

/// Export the directory tree `root` to `dest`, which must not exist or be an
/// empty directory.
pub fn export(
    store: &LocalStore,
    root: &Digest,
    dest: &Path,
    progress: &dyn Progress,
) -> Result<()> {
    // The walk below recurses: only over a depth it can take.
    crate::walk::check_depth(store, root, crate::fs_tree::MAX_DEPTH)?;
    if let Ok(mut rd) = fs::read_dir(dest) {
        if rd.next().is_some() {
            return Err(Error::DestinationExists(dest.to_path_buf()));
        }
    } else if fs::symlink_metadata(dest).is_ok() {
        return Err(Error::DestinationExists(dest.to_path_buf()));
    }
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = dest
        .file_name()
        .ok_or_else(|| Error::DestinationExists(dest.to_path_buf()))?;
    let staging = parent.join(format!(
        ".{}.fhsx-export-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    let result = (|| {
        fs::create_dir(&staging).map_err(io("create", &staging))?;
        write_dir(store, root, &staging, "", progress)?;
        set_mtime(&staging)?;
        if dest.is_dir() {
            fs::remove_dir(dest).map_err(io("replace empty directory", dest))?;
        }
        fs::rename(&staging, dest).map_err(io("rename into place", dest))
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

fn write_dir(
    store: &LocalStore,
    digest: &Digest,
    at: &Path,
    tree_path: &str,
    progress: &dyn Progress,
) -> Result<()> {
    let dir = store
        .get_directory(digest)
        .map_err(|e| e.at_path(tree_path))?;
    let entries: Vec<_> = dir.entries().collect();
    entries.par_iter().try_for_each(|(name, node)| {
        let p = at.join(name.as_os_str());
        let tp = if tree_path.is_empty() {
            name.to_string()
        } else {
            format!("{tree_path}/{name}")
        };
        match node {
            Node::Directory { digest, .. } => {
                fs::create_dir(&p).map_err(io("create", &p))?;
                write_dir(store, digest, &p, &tp, progress)?;
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755))
                    .map_err(io("chmod", &p))?;
                set_mtime(&p)
            }
            Node::File {
                digest,
                size,
                executable,
            } => {
                copy_blob(store, digest, &p).map_err(|e| e.at_path(&tp))?;
                let mode = if *executable { 0o755 } else { 0o644 };
                fs::set_permissions(&p, fs::Permissions::from_mode(mode))
                    .map_err(io("chmod", &p))?;
                set_mtime(&p)?;
                progress.advance(1, *size);
                Ok(())
            }
            Node::Symlink { target } => {
                std::os::unix::fs::symlink(target.as_os_str(), &p).map_err(io("symlink", &p))
            }
        }
    })
}

/// Copy a blob to a new file at `to`, hashing as it goes; a mismatch is an
/// integrity error (the partial file is left in the staging tree, which the
/// caller removes).
fn copy_blob(store: &LocalStore, digest: &Digest, to: &Path) -> Result<()> {
    let from = store.object_path(ObjectKind::Blob, digest);
    let mut src = match File::open(&from) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Missing {
                digest: *digest,
                path: None,
            })
        }
        Err(e) => return Err(io("open", &from)(e)),
    };
    let mut dst = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(io("create", to))?;
    let mut h = HashingWriter {
        inner: &mut dst,
        hasher: blake3::Hasher::new(),
    };
    std::io::copy(&mut src, &mut h).map_err(io("copy to", to))?;
    let actual: Digest = h.hasher.finalize().into();
    if actual != *digest {
        return Err(Error::Corrupt {
            digest: *digest,
            actual,
            path: None,
        });
    }
    Ok(())
}

struct HashingWriter<'a> {
    inner: &'a mut File,
    hasher: blake3::Hasher,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
