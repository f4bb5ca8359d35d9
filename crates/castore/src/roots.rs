//! What `gc` must keep: persistent roots, named by the user, and temporary
//! roots, held by running processes for what they read and write.
//!
//! ```text
//! ROOT/roots/NAME          persistent: one digest per line (`b3:…`)
//! ROOT/temproots/PID-…     temporary: one digest per line, flocked by its
//!                          holder for as long as it is alive
//! ```
//!
//! A root digest keeps what it names: a blob, a directory tree, or a
//! composed view (its atoms and map too) — see [`crate::gc`].
//!
//! # Temporary roots
//!
//! [`LocalStore::temp_roots`] creates a file under `ROOT/temproots/` and holds
//! an exclusive `flock` on it until the [`TempRoots`] is dropped (then the
//! file is removed). `gc` holds the store lock exclusively; it reads every
//! temp-roots file whose flock is held and removes the ones whose flock is
//! free — their holder is dead (a `kill -9` releases the flock with the
//! process).
//!
//! Registering (creating the file, [`TempRoots::add`]) takes the store lock
//! shared, which is what every writer holds, so it is ordered against any gc:
//! either the gc ran entirely before it (and whatever it deleted is gone —
//! the holder's read then fails with [`Error::Missing`](crate::Error::Missing),
//! it never sees a half-deleted tree), or every later gc sees the root.
//! Hence the guarantee: **anything present when a digest is added survives
//! for as long as the guard lives**.
//!
//! Objects a process is *creating* are covered by the same lock: a
//! [`Txn`](crate::store::Txn) holds the store lock shared from begin to
//! commit, so a holder that [`add`](TempRoots::add)s what it wrote before the
//! transaction is committed (or dropped) closes the window between "written"
//! and "rooted". For code that writes through its own transaction (an
//! import, [`compose`](crate::compose)), [`TempRoots::rooted`] holds the
//! lock across the call and the registration; [`BlobWriter::finish_rooted`]
//! does the same for a streamed blob.
//!
//! [`BlobWriter::finish_rooted`]: crate::store::BlobWriter::finish_rooted

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rustix::fs::{flock, FlockOperation};

use crate::compose::composition_path;
use crate::error::io;
use crate::store::{lock_shared, LocalStore, ObjectKind};
use crate::{Digest, Error, Result};

/// Persistent roots' directory inside the store.
pub const ROOTS_DIR: &str = "roots";
/// Temporary roots' directory inside the store.
pub const TEMP_ROOTS_DIR: &str = "temproots";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// One persistent root: a name and the digests it keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Root {
    pub name: String,
    pub digests: Vec<Digest>,
}

/// Whether `name` can name a persistent root: 1–200 bytes of
/// `[A-Za-z0-9._+@=-]`, not starting with `.`.
pub fn valid_root_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+@=-".contains(&b))
}

/// Holds off `gc` while alive (the store lock, shared). From
/// [`LocalStore::hold_gc`].
#[derive(Debug)]
pub struct GcHold {
    _lock: File,
}

/// Temporary gc roots held by this process; see the module documentation.
/// Dropping it releases them.
#[derive(Debug)]
pub struct TempRoots {
    store: LocalStore,
    path: PathBuf,
    inner: Mutex<Held>,
}

#[derive(Debug)]
struct Held {
    /// Holds the exclusive flock; appended to.
    file: File,
    have: HashSet<Digest>,
}

impl LocalStore {
    fn roots_dir(&self) -> PathBuf {
        self.root().join(ROOTS_DIR)
    }

    fn temp_roots_dir(&self) -> PathBuf {
        self.root().join(TEMP_ROOTS_DIR)
    }

    /// Whether the store holds an object (blob, directory or composition
    /// record) named `d`.
    pub fn has_any(&self, d: &Digest) -> bool {
        self.has(ObjectKind::Blob, d)
            || self.has(ObjectKind::Directory, d)
            || composition_path(self, d).exists()
    }

    /// Hold off every `gc` until the returned guard is dropped (it takes the
    /// store lock shared, like a writer). For the window between creating
    /// objects and rooting them; prefer [`TempRoots::rooted`].
    pub fn hold_gc(&self) -> Result<GcHold> {
        Ok(GcHold {
            _lock: lock_shared(self)?,
        })
    }

    /// Register `digests` as temporary roots of this process, alive until
    /// the returned guard is dropped (or the process dies).
    pub fn temp_roots(&self, digests: &[Digest]) -> Result<TempRoots> {
        let dir = self.temp_roots_dir();
        fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let _lock = lock_shared(self)?;
        let name = crate::store::unique_name("");
        let path = dir.join(&name);
        let file = File::options()
            .read(true)
            .append(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(io("create", &path))?;
        // gc cannot run while we hold the store lock shared, so it never
        // sees this file before its flock is taken.
        flock(&file, FlockOperation::LockExclusive).map_err(|e| Error::Io {
            op: "lock",
            path: path.clone(),
            source: e.into(),
        })?;
        let roots = TempRoots {
            store: self.clone(),
            path,
            inner: Mutex::new(Held {
                file,
                have: HashSet::new(),
            }),
        };
        roots.add_locked(digests)?;
        Ok(roots)
    }

    /// Add (or replace) the persistent root `name`, keeping `digests`.
    /// Every digest must name an object the store holds.
    pub fn add_root(&self, name: &str, digests: &[Digest]) -> Result<()> {
        if !valid_root_name(name) {
            return Err(Error::BadRootName(name.to_owned()));
        }
        let dir = self.roots_dir();
        fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        // Checked under the lock: no gc can delete them between the check
        // and the root becoming visible.
        let _lock = lock_shared(self)?;
        for d in digests {
            if !self.has_any(d) {
                return Err(Error::Missing {
                    digest: *d,
                    path: None,
                });
            }
        }
        let mut text = String::new();
        for d in digests {
            text.push_str(&d.to_string());
            text.push('\n');
        }
        let dst = dir.join(name);
        let tmp = dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &dst)?;
            File::open(&dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            io("write root", &dst)(e)
        })
    }

    /// Remove the persistent root `name`. False if there was none.
    pub fn remove_root(&self, name: &str) -> Result<bool> {
        if !valid_root_name(name) {
            return Err(Error::BadRootName(name.to_owned()));
        }
        let p = self.roots_dir().join(name);
        match fs::remove_file(&p) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io("remove", &p)(e)),
        }
    }

    /// Every persistent root, sorted by name.
    pub fn roots(&self) -> Result<Vec<Root>> {
        let dir = self.roots_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("read", &dir)(e)),
        };
        let mut out = Vec::new();
        for e in rd {
            let e = e.map_err(io("read", &dir))?;
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !valid_root_name(&name) {
                // `.tmp-*` of a writer, or something that is not ours.
                continue;
            }
            let p = e.path();
            let text = match fs::read_to_string(&p) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io("read", &p)(e)),
            };
            let digests = parse_digests(&text, &p)?;
            out.push(Root { name, digests });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

fn parse_digests(text: &str, path: &Path) -> Result<Vec<Digest>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse::<Digest>().map_err(|_| Error::BadRootFile {
                path: path.to_path_buf(),
                line: l.chars().take(80).collect(),
            })
        })
        .collect()
}

impl TempRoots {
    /// Add `digests` (no-op for those already held). Anything present now
    /// survives every gc until the guard is dropped.
    pub fn add(&self, digests: &[Digest]) -> Result<()> {
        let _lock = lock_shared(&self.store)?;
        self.add_locked(digests)
    }

    /// `add` for a caller that already holds the store lock shared (a
    /// transaction or a writer's `finish`).
    pub(crate) fn add_locked(&self, digests: &[Digest]) -> Result<()> {
        let mut held = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = String::new();
        for d in digests {
            if held.have.insert(*d) {
                text.push_str(&d.to_string());
                text.push('\n');
            }
        }
        if text.is_empty() {
            return Ok(());
        }
        // One append of whole lines; gc never reads while we write (it
        // holds the store lock exclusively, we hold it shared).
        held.file
            .write_all(text.as_bytes())
            .map_err(io("write", &self.path))
    }

    /// Run `make` (which creates objects, e.g. an import or a compose) with
    /// gc held off, then root what `roots_of` names in its result before
    /// letting gc run again.
    pub fn rooted<T, E>(
        &self,
        make: impl FnOnce() -> std::result::Result<T, E>,
        roots_of: impl FnOnce(&T) -> Vec<Digest>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        let _lock = lock_shared(&self.store)?;
        let v = make()?;
        self.add_locked(&roots_of(&v))?;
        Ok(v)
    }

    /// The digests held.
    pub fn digests(&self) -> Vec<Digest> {
        let held = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<Digest> = held.have.iter().copied().collect();
        v.sort();
        v
    }

    /// The temp-roots file (for diagnostics).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempRoots {
    fn drop(&mut self) {
        // Removed before the flock goes (with the file, after this): a gc
        // never mistakes a live file for a dead one.
        let _ = fs::remove_file(&self.path);
    }
}

/// What gc learned from `ROOT/temproots`.
#[derive(Debug, Default)]
pub(crate) struct TempRootScan {
    pub digests: Vec<Digest>,
    /// Files of live holders read.
    pub live_files: u64,
    /// Files of dead holders removed.
    pub reclaimed_files: u64,
}

/// Read every live temp-roots file and remove dead ones. Call only with the
/// store lock held exclusively (`_exclusive` is that lock).
pub(crate) fn scan_temp_roots(store: &LocalStore, _exclusive: &File) -> Result<TempRootScan> {
    let dir = store.temp_roots_dir();
    let mut scan = TempRootScan::default();
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(scan),
        Err(e) => return Err(io("read", &dir)(e)),
    };
    for e in rd {
        let e = e.map_err(io("read", &dir))?;
        let p = e.path();
        let f = match File::open(&p) {
            Ok(f) => f,
            // Its holder dropped it just now.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("open", &p)(e)),
        };
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                // Nobody holds it: the holder is dead (or dropped it and is
                // about to remove it). Either way its roots are void.
                let _ = fs::remove_file(&p);
                scan.reclaimed_files += 1;
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                for line in BufReader::new(&f).lines() {
                    let line = line.map_err(io("read", &p))?;
                    text.push_str(&line);
                    text.push('\n');
                }
                scan.digests.extend(parse_digests(&text, &p)?);
                scan.live_files += 1;
            }
            Err(e) => {
                return Err(Error::Io {
                    op: "lock",
                    path: p,
                    source: e.into(),
                })
            }
        }
    }
    Ok(scan)
}

/// Every persistent root's digests, for gc.
pub(crate) fn persistent_digests(store: &LocalStore) -> Result<Vec<Digest>> {
    Ok(store.roots()?.into_iter().flat_map(|r| r.digests).collect())
}
