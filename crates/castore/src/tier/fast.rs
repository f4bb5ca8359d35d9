//! The Fast tier: a stored tree realised as a read-only directory tree made
//! from the store's own blob files, so that deploying or trying a view costs
//! one `link(2)` per file instead of a copy of every byte.
//!
//! Per file, the cheapest way the filesystem allows, falling back in order:
//!
//! 1. **hard link** to the immutable blob file. A blob is mode 0444, so an
//!    executable file (0555) cannot share its inode; executables link to a
//!    per-store *executable twin* instead, `STORE/exec-blobs/ab/<hex>`, a
//!    0555 copy made once (hashed against its digest while copying) and
//!    reused by every later materialization. A run's new twins are made
//!    durable together, one `syncfs` once the tree is built, and only then
//!    renamed into place: an `fsync` each made a first materialization of
//!    /usr/bin several times slower. Links
//!    need the same filesystem (and, with `protected_hardlinks`, a store the
//!    caller owns); `EXDEV`/`EPERM` turn them off for the rest of the run,
//!    `EMLINK` (an inode at its link limit) for that one file;
//! 2. **reflink** (`FICLONE`), where the filesystem shares extents (btrfs,
//!    XFS, bcachefs): a private inode over shared blocks;
//! 3. **copy**, hashing as it goes, so a copied file is verified.
//!
//! The result is read-only: files 0444/0555, directories 0555. Read-only is
//! what makes sharing safe — a hard-linked file *is* the store's blob, so
//! a write through DEST would corrupt the store. Non-root users other than
//! the store's owner cannot write at all; the owner (or root) can still
//! `chmod` and write, which is what [`check`] is for: it re-hashes every file
//! against the tree and reports any difference (and `fhsx store verify` then
//! names the damaged blob).
//!
//! Next to DEST a marker, `DEST.fhsx-view`, names the tree's root digest. The
//! marker lives beside the tree, not in it, so the tree equals `store export`
//! entry for entry. Materializing the view a marker already names is a no-op
//! after a stat-only walk (kinds, modes, sizes, link targets — no reads);
//! any other view, or a tree that walk finds damaged, is built in a staging
//! sibling and swapped in with one `renameat2(RENAME_EXCHANGE)`, so DEST is
//! always either the old tree or the new one. The marker is removed before
//! the swap and written after it: a crash can leave a tree without a marker
//! (refused, never trusted), never a marker naming the wrong tree.
//!
//! Links and reflinks do not re-read the blob (that is the point); pass
//! [`FastOptions::verify`] to hash every blob (and executable twin) before
//! it is shared. A twin that fails the check is only a cache: it is remade.
//!
//! `gc` sweeps both caches: executable twins of blobs no kept root reaches,
//! and the `STORE/fast/` roots of `fhsx run --view` for views not kept.
//! `store verify` does not check them: they are caches, and a twin that
//! fails [`FastOptions::verify`] is remade.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rayon::prelude::*;

use super::{io, Error, Result};
use crate::store::{DirectoryStore, LocalStore, ObjectKind};
use crate::{Digest, Node, Progress};

/// Mode of a non-executable file in a Fast-tier tree (the store's blob mode).
pub const FILE_MODE: u32 = 0o444;
/// Mode of an executable file (its executable twin's mode).
pub const EXEC_MODE: u32 = 0o555;
/// Mode of every directory, once filled.
pub const DIR_MODE: u32 = 0o555;
/// The marker's file name is DEST's plus this suffix.
pub const MARKER_SUFFIX: &str = ".fhsx-view";
/// The store subdirectory holding executable twins of blobs.
pub const EXEC_BLOBS: &str = "exec-blobs";

static COUNTER: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone, Copy, Default)]
pub struct FastOptions {
    /// Hash every blob against its digest before linking or reflinking it
    /// (copies are always verified).
    pub verify: bool,
}

/// What a materialization did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FastReport {
    pub root: Digest,
    pub dest: PathBuf,
    pub marker: PathBuf,
    /// DEST already held this view: nothing was written.
    pub unchanged: bool,
    /// DEST held another view (or a damaged one), now replaced.
    pub replaced: bool,
    pub files: u64,
    pub bytes: u64,
    pub linked: u64,
    pub reflinked: u64,
    pub copied: u64,
    pub exec_twins_created: u64,
}

/// One difference between a Fast-tier tree and the tree its marker names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// Relative to DEST; empty for DEST itself.
    pub path: String,
    pub problem: String,
}

/// The outcome of [`check`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    pub root: Digest,
    pub dest: PathBuf,
    pub files_hashed: u64,
    pub bytes_hashed: u64,
    pub problems: Vec<Problem>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    tier: String,
    root: Digest,
}

/// The marker file of a Fast-tier tree at `dest`: `DEST.fhsx-view`.
pub fn marker_path(dest: &Path) -> Result<PathBuf> {
    let (parent, name) = split(dest)?;
    let mut n = name.to_os_string();
    n.push(MARKER_SUFFIX);
    Ok(parent.join(n))
}

fn split(dest: &Path) -> Result<(PathBuf, std::ffi::OsString)> {
    let name = dest.file_name().ok_or_else(|| {
        Error::BadRequest(format!(
            "{}: the destination must end in a file name",
            dest.display()
        ))
    })?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_os_string()))
}

/// The view the marker next to `dest` names, if there is a valid one.
pub fn read_marker(dest: &Path) -> Result<Option<Digest>> {
    let p = marker_path(dest)?;
    let bytes = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read marker", &p)(e)),
    };
    match serde_json::from_slice::<Marker>(&bytes) {
        Ok(m) if m.tier == "fast" => Ok(Some(m.root)),
        Ok(m) => Err(Error::NotMaterialized {
            path: dest.to_path_buf(),
            reason: format!("{} names tier {:?}, not \"fast\"", p.display(), m.tier),
        }),
        Err(e) => Err(Error::NotMaterialized {
            path: dest.to_path_buf(),
            reason: format!("{} is not a valid marker: {e}", p.display()),
        }),
    }
}

/// Realise the tree `root` at `dest` (see the module docs). `dest` must not
/// exist, be an empty directory, or be a Fast-tier tree (any view).
pub fn materialize(
    store: &LocalStore,
    root: &Digest,
    dest: &Path,
    opts: &FastOptions,
    progress: &dyn Progress,
) -> Result<FastReport> {
    let marker = marker_path(dest)?;
    let mut report = FastReport {
        root: *root,
        dest: dest.to_path_buf(),
        marker: marker.clone(),
        unchanged: false,
        replaced: false,
        files: 0,
        bytes: 0,
        linked: 0,
        reflinked: 0,
        copied: 0,
        exec_twins_created: 0,
    };
    // Also proves the root is present before anything is written.
    store.get_directory(root)?;
    let previous = read_marker(dest);
    let dest_meta = fs::symlink_metadata(dest).ok();
    match (&previous, &dest_meta) {
        (Ok(Some(d)), Some(m)) if d == root && m.is_dir() => {
            if compare(store, root, dest, false)?.0.is_empty() {
                report.unchanged = true;
                return Ok(report);
            }
            report.replaced = true;
        }
        (Ok(Some(_)), Some(_)) => report.replaced = true,
        (_, None) => {}
        (_, Some(m)) => {
            let empty_dir = m.is_dir()
                && fs::read_dir(dest)
                    .map(|mut rd| rd.next().is_none())
                    .unwrap_or(false);
            if !empty_dir {
                return Err(Error::DestinationExists {
                    path: dest.to_path_buf(),
                    marker,
                });
            }
        }
    }

    // Only now, when it is to be written: the walk below recurses, so only
    // over a depth it can take (a tree a remote client uploaded can be of
    // any). A destination already holding this root (above) was written,
    // and so checked, before; its comparison costs no second walk.
    crate::walk::check_depth(store, root, crate::fs_tree::MAX_DEPTH)?;
    // Held shared for the whole run: gc (exclusive) never sweeps a blob
    // between our lookup and our link.
    let _txn = store.txn()?;
    let (parent, name) = split(dest)?;
    let staging = parent.join(format!(
        ".{}.fhsx-fast-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let ctx = Ctx::new(store, &parent, opts);
    let built = (|| {
        fs::create_dir(&staging).map_err(io("create", &staging))?;
        ctx.write_dir(root, &staging, "", progress)?;
        finish_dir(&staging)
    })();
    ctx.publish_twins(built.is_ok());
    if let Err(e) = built {
        let _ = remove_tree(&staging);
        return Err(e);
    }
    let installed = install(&staging, dest, &marker, dest_meta.is_some());
    if let Err(e) = installed {
        let _ = remove_tree(&staging);
        return Err(e);
    }
    let tmp_marker = parent.join(format!(
        ".{}.fhsx-marker-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let body = serde_json::to_vec(&Marker {
        tier: "fast".into(),
        root: *root,
    })
    .map_err(|e| Error::BadRequest(format!("encoding the marker: {e}")))?;
    write_synced(&tmp_marker, &body, 0o444)?;
    fs::rename(&tmp_marker, &marker).map_err(io("rename marker into place", &marker))?;

    report.files = ctx.files.load(Ordering::Relaxed);
    report.bytes = ctx.bytes.load(Ordering::Relaxed);
    report.linked = ctx.linked.load(Ordering::Relaxed);
    report.reflinked = ctx.reflinked.load(Ordering::Relaxed);
    report.copied = ctx.copied.load(Ordering::Relaxed);
    report.exec_twins_created = ctx.twins_created.load(Ordering::Relaxed);
    Ok(report)
}

/// Put the finished staging tree at `dest`: a no-replace rename if `dest`
/// is absent, else an exchange and removal of what was there (after its
/// marker is gone, so no marker ever names the wrong tree).
fn install(staging: &Path, dest: &Path, marker: &Path, exists: bool) -> Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    if !exists {
        return match renameat_with(CWD, staging, CWD, dest, RenameFlags::NOREPLACE) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOSYS) => {
                // A filesystem without renameat2 flags.
                if fs::symlink_metadata(dest).is_ok() {
                    return Err(io("rename into place", dest)(
                        std::io::ErrorKind::AlreadyExists.into(),
                    ));
                }
                fs::rename(staging, dest).map_err(io("rename into place", dest))
            }
            Err(e) => Err(io("rename into place", dest)(e.into())),
        };
    }
    match fs::remove_file(marker) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove old marker", marker)(e)),
    }
    match renameat_with(CWD, staging, CWD, dest, RenameFlags::EXCHANGE) {
        Ok(()) => remove_tree(staging),
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOSYS) => {
            let mut old = staging.as_os_str().to_os_string();
            old.push(".old");
            let old = PathBuf::from(old);
            fs::rename(dest, &old).map_err(io("move aside", dest))?;
            fs::rename(staging, dest).map_err(io("rename into place", dest))?;
            remove_tree(&old)
        }
        Err(e) => Err(io("swap into place", dest)(e.into())),
    }
}

/// Remove a (read-only) tree this module made: directories are made
/// writable on the way down; files need no permission to be unlinked.
pub fn remove_tree(p: &Path) -> Result<()> {
    let m = match fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("stat", p)(e)),
    };
    if m.is_dir() {
        fs::set_permissions(p, fs::Permissions::from_mode(0o700)).map_err(io("chmod", p))?;
        let children: Vec<_> = fs::read_dir(p)
            .map_err(io("read", p))?
            .flatten()
            .map(|e| e.path())
            .collect();
        children.par_iter().try_for_each(|c| remove_tree(c))?;
        fs::remove_dir(p).map_err(io("remove", p))
    } else {
        fs::remove_file(p).map_err(io("remove", p))
    }
}

fn finish_dir(p: &Path) -> Result<()> {
    let f = File::open(p).map_err(io("open", p))?;
    let t = std::time::UNIX_EPOCH + crate::export::EXPORT_MTIME;
    f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
        .map_err(io("set times of", p))?;
    f.set_permissions(fs::Permissions::from_mode(DIR_MODE))
        .map_err(io("chmod", p))
}

fn write_synced(p: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let _ = fs::remove_file(p);
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(p)
        .map_err(io("create", p))?;
    f.write_all(bytes).map_err(io("write", p))?;
    f.sync_all().map_err(io("sync", p))
}

fn tree_path(parent: &str, name: &impl std::fmt::Display) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// How one run places files, and what it has learnt the filesystem refuses.
struct Ctx<'s> {
    store: &'s LocalStore,
    verify: bool,
    links: AtomicBool,
    reflinks: AtomicBool,
    twins: AtomicBool,
    files: AtomicU64,
    bytes: AtomicU64,
    linked: AtomicU64,
    reflinked: AtomicU64,
    copied: AtomicU64,
    twins_created: AtomicU64,
    /// Twins made by this run, still under their temporary names.
    pending: std::sync::Mutex<std::collections::HashMap<Digest, PathBuf>>,
}

enum Placed {
    Linked,
    Reflinked,
    Copied,
}

impl<'s> Ctx<'s> {
    fn new(store: &'s LocalStore, dest_parent: &Path, opts: &FastOptions) -> Self {
        // Links and reflinks both need one filesystem; skip a failing
        // syscall per file when the devices already say no.
        let same_dev = match (
            fs::metadata(store.root().join(ObjectKind::Blob.dir_name())),
            fs::metadata(dest_parent),
        ) {
            (Ok(a), Ok(b)) => a.dev() == b.dev(),
            _ => false,
        };
        Ctx {
            store,
            verify: opts.verify,
            links: AtomicBool::new(same_dev),
            reflinks: AtomicBool::new(same_dev),
            twins: AtomicBool::new(same_dev),
            files: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            linked: AtomicU64::new(0),
            reflinked: AtomicU64::new(0),
            copied: AtomicU64::new(0),
            twins_created: AtomicU64::new(0),
            pending: Default::default(),
        }
    }

    fn write_dir(
        &self,
        digest: &Digest,
        at: &Path,
        tp: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        let dir = self
            .store
            .get_directory(digest)
            .map_err(|e| e.at_path(tp))?;
        let entries: Vec<_> = dir.entries().collect();
        entries.par_iter().try_for_each(|(name, node)| {
            let p = at.join(name.as_os_str());
            let tp = tree_path(tp, name);
            match node {
                Node::Directory { digest, .. } => {
                    fs::create_dir(&p).map_err(io("create", &p))?;
                    self.write_dir(digest, &p, &tp, progress)?;
                    finish_dir(&p)
                }
                Node::File {
                    digest,
                    size,
                    executable,
                } => {
                    let how = self.place(digest, *size, *executable, &p, &tp)?;
                    let counter = match how {
                        Placed::Linked => &self.linked,
                        Placed::Reflinked => &self.reflinked,
                        Placed::Copied => &self.copied,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    self.files.fetch_add(1, Ordering::Relaxed);
                    self.bytes.fetch_add(*size, Ordering::Relaxed);
                    progress.advance(1, *size);
                    Ok(())
                }
                Node::Symlink { target } => {
                    std::os::unix::fs::symlink(target.as_os_str(), &p).map_err(io("symlink", &p))
                }
            }
        })
    }

    fn place(&self, d: &Digest, size: u64, exec: bool, at: &Path, tp: &str) -> Result<Placed> {
        let blob = self.store.object_path(ObjectKind::Blob, d);
        let missing = || {
            Error::Store(crate::Error::Missing {
                digest: *d,
                path: Some(tp.to_owned()),
            })
        };
        if self.verify {
            verify_file(&blob, d).map_err(|e| match e {
                Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    missing()
                }
                Error::Store(e) => Error::Store(e.at_path(tp)),
                e => e,
            })?;
        }
        // The file whose inode a link would share: the blob, or for an
        // executable its twin (None: twins unavailable, so no link).
        let shareable = if exec {
            self.twin(d, size, &blob).map_err(|e| match e {
                Error::Store(e) => Error::Store(e.at_path(tp)),
                e => e,
            })?
        } else {
            Some(blob.clone())
        };
        if let Some(src) = &shareable {
            if self.links.load(Ordering::Relaxed) {
                match fs::hard_link(src, at) {
                    Ok(()) => {
                        if self.linked_mode_ok(at, exec) {
                            return Ok(Placed::Linked);
                        }
                    }
                    Err(e) => match e.raw_os_error() {
                        Some(libc::EXDEV) | Some(libc::EPERM) => {
                            self.links.store(false, Ordering::Relaxed)
                        }
                        Some(libc::EMLINK) => {}
                        Some(libc::ENOENT) if fs::symlink_metadata(src).is_err() => {
                            return Err(missing())
                        }
                        _ => return Err(io("hard-link", at)(e)),
                    },
                }
            }
        }
        let mode = if exec { EXEC_MODE } else { FILE_MODE };
        let mut src = match File::open(&blob) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
            Err(e) => return Err(io("open", &blob)(e)),
        };
        let mut dst = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(at)
            .map_err(io("create", at))?;
        let mut how = Placed::Copied;
        if self.reflinks.load(Ordering::Relaxed) {
            match rustix::fs::ioctl_ficlone(&dst, &src) {
                Ok(()) => how = Placed::Reflinked,
                Err(_) => self.reflinks.store(false, Ordering::Relaxed),
            }
        }
        if let Placed::Copied = how {
            let actual = copy_hashing(&mut src, &mut dst, at)?;
            if actual != *d {
                return Err(Error::Store(crate::Error::Corrupt {
                    digest: *d,
                    actual,
                    path: Some(tp.to_owned()),
                }));
            }
        }
        let t = std::time::UNIX_EPOCH + crate::export::EXPORT_MTIME;
        dst.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
            .map_err(io("set times of", at))?;
        dst.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io("chmod", at))?;
        Ok(how)
    }

    /// A hard link shares the blob's inode, mode included: if someone
    /// loosened it (a `chmod` through an earlier tree), put the store's mode
    /// back rather than hand it on; if that is not allowed, drop the link
    /// (false) and let the caller copy.
    fn linked_mode_ok(&self, at: &Path, exec: bool) -> bool {
        let want = if exec { EXEC_MODE } else { FILE_MODE };
        match fs::symlink_metadata(at) {
            Ok(m) if m.mode() & 0o7777 == want => true,
            _ => {
                fs::set_permissions(at, fs::Permissions::from_mode(want)).is_ok()
                    || fs::remove_file(at).is_err()
            }
        }
    }

    /// The executable twin of blob `d`, made (verified) if absent. None if
    /// this store cannot hold twins for this caller (read-only, not ours).
    fn twin(&self, d: &Digest, size: u64, blob: &Path) -> Result<Option<PathBuf>> {
        if !self.twins.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let p = twin_path(self.store, d);
        if let Ok(m) = fs::symlink_metadata(&p) {
            // With --verify the twin is re-hashed too: it is what gets shared.
            if m.is_file()
                && m.mode() & 0o7777 == EXEC_MODE
                && m.len() == size
                && (!self.verify || verify_file(&p, d).is_ok())
            {
                return Ok(Some(p));
            }
            // Not what a twin must be: it is only a cache, so rebuild it.
            let _ = fs::remove_file(&p);
        }
        let shard = match p.parent() {
            Some(s) => s.to_path_buf(),
            None => return Ok(None),
        };
        if let Err(e) = fs::create_dir_all(&shard) {
            return self.no_twins(e, &shard);
        }
        let tmp = shard.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut src = match File::open(blob) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Store(crate::Error::Missing {
                    digest: *d,
                    path: None,
                }))
            }
            Err(e) => return Err(io("open", blob)(e)),
        };
        let mut dst = match File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => f,
            Err(e) => return self.no_twins(e, &tmp),
        };
        let made = (|| {
            let actual = copy_hashing(&mut src, &mut dst, &tmp)?;
            if actual != *d {
                return Err(Error::Store(crate::Error::Corrupt {
                    digest: *d,
                    actual,
                    path: None,
                }));
            }
            dst.set_permissions(fs::Permissions::from_mode(EXEC_MODE))
                .map_err(io("chmod", &tmp))
        })();
        if made.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        made?;
        // Shared from its temporary name for now; published (one syncfs for
        // all, then renames) once the tree is built — see `publish_twins`.
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(other) = pending.get(d) {
            let _ = fs::remove_file(&tmp);
            return Ok(Some(other.clone()));
        }
        pending.insert(*d, tmp.clone());
        self.twins_created.fetch_add(1, Ordering::Relaxed);
        Ok(Some(tmp))
    }

    /// Make this run's new twins durable with one `syncfs` and rename them
    /// into place (best effort: they are a cache; the tree's links to them
    /// stay valid either way). With `keep` false they are removed instead.
    fn publish_twins(&self, keep: bool) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if pending.is_empty() {
            return;
        }
        let synced = keep
            && File::open(self.store.root().join(EXEC_BLOBS))
                .ok()
                .is_some_and(|f| rustix::fs::syncfs(&f).is_ok());
        for (d, tmp) in pending {
            if !synced || fs::rename(&tmp, twin_path(self.store, &d)).is_err() {
                let _ = fs::remove_file(&tmp);
            }
        }
    }

    fn no_twins(&self, e: std::io::Error, at: &Path) -> Result<Option<PathBuf>> {
        match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
                self.twins.store(false, Ordering::Relaxed);
                Ok(None)
            }
            _ => Err(io("create executable twin", at)(e)),
        }
    }
}

/// Where `fhsx run --view` keeps the Fast-tier root of a view: one per view
/// per store, `STORE/fast/<hex>`, made once and reused (re-materializing it
/// is a stat-only walk).
pub fn cached_root_path(store: &LocalStore, root: &Digest) -> PathBuf {
    store.root().join("fast").join(root.hex())
}

/// Materialize `root` at [`cached_root_path`] (a no-op if already there)
/// and return that path.
pub fn cached_root(store: &LocalStore, root: &Digest, progress: &dyn Progress) -> Result<PathBuf> {
    let dest = cached_root_path(store, root);
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    match materialize(store, root, &dest, &FastOptions::default(), progress) {
        Ok(_) => Ok(dest),
        // Another process materialized it at the same moment.
        Err(_) if read_marker(&dest).ok().flatten() == Some(*root) => Ok(dest),
        Err(e) => Err(e),
    }
}

/// Where the executable (0555) twin of blob `d` lives.
pub fn twin_path(store: &LocalStore, d: &Digest) -> PathBuf {
    let hex = d.hex();
    store.root().join(EXEC_BLOBS).join(&hex[..2]).join(hex)
}

fn copy_hashing(src: &mut File, dst: &mut File, at: &Path) -> Result<Digest> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match std::io::Read::read(src, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io("read blob for", at)(e)),
        };
        h.update(&buf[..n]);
        dst.write_all(&buf[..n]).map_err(io("write", at))?;
    }
    Ok(h.finalize().into())
}

/// Files at least this large are hashed through a memory map on all cores.
const MMAP_HASH_MIN: u64 = 4 << 20;

fn hash_file(p: &Path) -> Result<(Digest, u64)> {
    let mut f = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .map_err(io("open", p))?;
    let len = f.metadata().map_err(io("stat", p))?.len();
    let mut h = blake3::Hasher::new();
    if len >= MMAP_HASH_MIN {
        h.update_mmap_rayon(p).map_err(io("read", p))?;
    } else {
        std::io::copy(&mut f, &mut h).map_err(io("read", p))?;
    }
    Ok((h.finalize().into(), len))
}

fn verify_file(p: &Path, d: &Digest) -> Result<()> {
    let (actual, _) = hash_file(p)?;
    if actual != *d {
        return Err(Error::Store(crate::Error::Corrupt {
            digest: *d,
            actual,
            path: None,
        }));
    }
    Ok(())
}

/// Re-check a Fast-tier tree against the tree its marker names: every
/// entry's kind, mode, size and link target, every file's content hashed,
/// nothing missing and nothing extra.
pub fn check(store: &LocalStore, dest: &Path) -> Result<CheckReport> {
    let root = read_marker(dest)?.ok_or_else(|| Error::NotMaterialized {
        path: dest.to_path_buf(),
        reason: format!(
            "no marker {} (was it made by `fhsx materialize --tier fast`?)",
            marker_path(dest)
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ),
    })?;
    let (problems, files_hashed, bytes_hashed) = compare(store, &root, dest, true)?;
    Ok(CheckReport {
        root,
        dest: dest.to_path_buf(),
        files_hashed,
        bytes_hashed,
        problems,
    })
}

type Compared = (Vec<Problem>, u64, u64);

/// Walk the stored tree and `dest` side by side. With `hash`, every file's
/// content is hashed too; without, this is a stat-only walk.
fn compare(store: &LocalStore, root: &Digest, dest: &Path, hash: bool) -> Result<Compared> {
    let problems = std::sync::Mutex::new(Vec::new());
    let files = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let w = Walker {
        store,
        hash,
        problems: &problems,
        files: &files,
        bytes: &bytes,
    };
    match fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => {
            if m.mode() & 0o7777 != DIR_MODE {
                w.problem(
                    "",
                    format!("directory mode {:o}, want {DIR_MODE:o}", m.mode() & 0o7777),
                );
            }
            w.dir(root, dest, "")?;
        }
        Ok(_) => w.problem("", "not a directory".into()),
        Err(e) => w.problem("", format!("cannot stat: {e}")),
    }
    let mut p = problems.into_inner().unwrap_or_else(|e| e.into_inner());
    p.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((p, files.into_inner(), bytes.into_inner()))
}

struct Walker<'a> {
    store: &'a LocalStore,
    hash: bool,
    problems: &'a std::sync::Mutex<Vec<Problem>>,
    files: &'a AtomicU64,
    bytes: &'a AtomicU64,
}

impl Walker<'_> {
    fn problem(&self, path: &str, problem: String) {
        self.problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Problem {
                path: path.to_owned(),
                problem,
            });
    }

    fn dir(&self, digest: &Digest, at: &Path, tp: &str) -> Result<()> {
        let dir = self
            .store
            .get_directory(digest)
            .map_err(|e| Error::Store(e.at_path(tp)))?;
        match fs::read_dir(at) {
            Ok(rd) => {
                for e in rd.flatten() {
                    let n = e.file_name();
                    if dir.get(n.as_encoded_bytes()).is_none() {
                        self.problem(
                            &tree_path(tp, &n.to_string_lossy()),
                            "not in the tree (added)".into(),
                        );
                    }
                }
            }
            Err(e) => {
                self.problem(tp, format!("cannot list: {e}"));
                return Ok(());
            }
        }
        let entries: Vec<_> = dir.entries().collect();
        entries.par_iter().try_for_each(|(name, node)| {
            let p = at.join(name.as_os_str());
            let tp = tree_path(tp, name);
            let m = match fs::symlink_metadata(&p) {
                Ok(m) => m,
                Err(e) => {
                    self.problem(&tp, format!("missing: {e}"));
                    return Ok(());
                }
            };
            let mode = m.mode() & 0o7777;
            match node {
                Node::Directory { digest, .. } => {
                    if !m.is_dir() {
                        self.problem(&tp, "should be a directory".into());
                        return Ok(());
                    }
                    if mode != DIR_MODE {
                        self.problem(&tp, format!("directory mode {mode:o}, want {DIR_MODE:o}"));
                    }
                    self.dir(digest, &p, &tp)
                }
                Node::File {
                    digest,
                    size,
                    executable,
                } => {
                    if !m.is_file() {
                        self.problem(&tp, "should be a regular file".into());
                        return Ok(());
                    }
                    let want = if *executable { EXEC_MODE } else { FILE_MODE };
                    if mode != want {
                        self.problem(&tp, format!("mode {mode:o}, want {want:o}"));
                    }
                    if m.len() != *size {
                        self.problem(&tp, format!("size {}, want {size}", m.len()));
                        return Ok(());
                    }
                    if self.hash {
                        match hash_file(&p) {
                            Ok((actual, n)) => {
                                self.files.fetch_add(1, Ordering::Relaxed);
                                self.bytes.fetch_add(n, Ordering::Relaxed);
                                if actual != *digest {
                                    self.problem(
                                        &tp,
                                        format!("content hashes to {actual}, want {digest}"),
                                    );
                                }
                            }
                            Err(e) => {
                                self.problem(&tp, format!("cannot read: {}", crate::Chain(&e)))
                            }
                        }
                    }
                    Ok(())
                }
                Node::Symlink { target } => {
                    match fs::read_link(&p) {
                        Ok(t) if t.as_os_str() == target.as_os_str() => {}
                        Ok(t) => {
                            self.problem(&tp, format!("symlink to {}, want {target}", t.display()))
                        }
                        Err(_) => self.problem(&tp, "should be a symlink".into()),
                    }
                    Ok(())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree(at: &Path) {
        fs::create_dir_all(at.join("bin")).unwrap();
        fs::write(at.join("bin/x"), b"same").unwrap();
        fs::set_permissions(at.join("bin/x"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(at.join("doc"), b"same").unwrap();
        std::os::unix::fs::symlink("bin/x", at.join("link")).unwrap();
    }

    #[test]
    fn marker_sits_beside_dest() {
        assert_eq!(
            marker_path(Path::new("/opt/app")).unwrap(),
            Path::new("/opt/app.fhsx-view")
        );
        assert_eq!(
            marker_path(Path::new("app")).unwrap(),
            Path::new("./app.fhsx-view")
        );
        assert!(marker_path(Path::new("/")).is_err());
    }

    #[test]
    fn materialize_check_noop_and_tamper() {
        let t = tempfile::tempdir().unwrap();
        let store = LocalStore::open(t.path().join("store")).unwrap();
        tree(&t.path().join("src"));
        let root = crate::import::import_path(&store, &t.path().join("src"), &())
            .unwrap()
            .root;
        let dest = t.path().join("out");
        let r = materialize(&store, &root, &dest, &FastOptions::default(), &()).unwrap();
        assert_eq!((r.files, r.linked, r.exec_twins_created), (2, 2, 1));
        assert_eq!(read_marker(&dest).unwrap(), Some(root));
        assert!(check(&store, &dest).unwrap().is_clean());
        let again = materialize(&store, &root, &dest, &FastOptions::default(), &()).unwrap();
        assert!(again.unchanged);
        // Replace the symlink: --check names it; materializing repairs it.
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o755)).unwrap();
        fs::remove_file(dest.join("link")).unwrap();
        std::os::unix::fs::symlink("elsewhere", dest.join("link")).unwrap();
        let c = check(&store, &dest).unwrap();
        let paths: Vec<_> = c.problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["", "link"]);
        let fixed = materialize(&store, &root, &dest, &FastOptions::default(), &()).unwrap();
        assert!(fixed.replaced);
        assert!(check(&store, &dest).unwrap().is_clean());
        remove_tree(&dest).unwrap();
        assert!(!dest.exists());
    }
}
