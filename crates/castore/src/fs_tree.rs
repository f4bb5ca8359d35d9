//! Directory trees on disk that someone else made — a build's outputs, its
//! scratch — walked and removed without recursion.
//!
//! Whoever made such a tree chose its depth and its width. A build can nest
//! directories far deeper than any path can name (each `mkdir a && cd a`
//! is relative), so a walk that recurses, or that holds one descriptor per
//! level, or that names entries by their path from the root, is the
//! build's to crash: a stack overflow, `EMFILE`, `ENAMETOOLONG`. Every walk
//! here instead
//! - keeps its own stack, one small frame per level;
//! - holds at most two file descriptors whatever the depth: the directory
//!   being read and, briefly, the one being entered. It climbs back with
//!   `..`, checked against the device and inode it left, and comes back to
//!   where it was in the parent by the kernel's directory cookie;
//! - opens every entry relative to its directory with `O_NOFOLLOW`, so no
//!   symlink is ever followed and no path is ever longer than one name;
//! - reads directories a buffer at a time, so no directory's width is ever
//!   held in memory by the walk itself;
//! - never crosses into another file system mounted in the tree.
//!
//! The callers walk a build's trees after every process of the build is
//! gone: nothing changes the tree while it is walked, and a walk that finds
//! otherwise (a `..` that is not where it came from) stops with an error.

use std::ffi::{CStr, CString, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir, SeekFrom, Stat, CWD};

pub use crate::shown::escaped;
use crate::{Error, Result};

/// How deep a tree the store takes from disk: directories nested more
/// deeply are refused at import, naming where. Deep enough for any real
/// tree (`node_modules` nests tens deep), and shallow enough that every
/// path in it fits in `PATH_MAX` (4,096 bytes) with two-byte names, so the
/// trees a store holds can always be exported and served by path.
pub const MAX_DEPTH: usize = 1024;

/// The bytes of the directory-reading buffer: one `getdents64` call's worth.
const DIR_BUFFER: usize = 32 << 10;

/// What a walk does at one entry of a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Walk into it (a directory), or go on (anything else).
    Enter,
    /// Leave it as it is.
    Skip,
}

/// Where a walk is, for messages: the names from the walk's root down.
#[derive(Debug, Clone, Copy)]
pub struct TreePath<'a> {
    names: &'a [CString],
    last: Option<&'a CStr>,
}

impl TreePath<'_> {
    /// How many directories below the walk's root this entry is (its
    /// root's entries are at depth 1).
    pub fn depth(&self) -> usize {
        self.names.len() + usize::from(self.last.is_some())
    }

    /// The entry's own name; `None` for the walk's root.
    pub fn last_name(&self) -> Option<&CStr> {
        self.last
            .or_else(|| self.names.last().map(|n| n.as_c_str()))
    }

    /// The path, escaped for a terminal (see [`escaped`]) and shortened to
    /// its first 200 bytes.
    pub fn display(&self) -> String {
        let mut raw = Vec::new();
        for n in self.names.iter().map(|n| n.as_c_str()).chain(self.last) {
            if !raw.is_empty() {
                raw.push(b'/');
            }
            raw.extend_from_slice(n.to_bytes());
            if raw.len() > 200 {
                break;
            }
        }
        let shortened = raw.len() > 200;
        raw.truncate(200);
        let mut s = escaped(&raw);
        if shortened {
            s.push('…');
        }
        s
    }
}

/// What a walk is told, directory by directory. The walk is post-order: a
/// directory is [`left`](Visitor::leave) after everything below it.
pub trait Visitor {
    /// What is gathered for one directory while its entries are read.
    type Dir;
    /// What the visitor fails with; the walk's own failures are the
    /// store's errors.
    type Error: From<Error>;

    /// A directory is entered (the walk's root first, with an empty path).
    fn enter(&mut self, at: &TreePath<'_>, dir: BorrowedFd<'_>) -> Result<Self::Dir, Self::Error>;

    /// An entry `name` of the directory `parent`, which `dir` gathers: any
    /// kind, not followed. For a directory, [`Step::Enter`] walks into it
    /// (having made it readable first, if it had to).
    fn entry(
        &mut self,
        dir: &mut Self::Dir,
        at: &TreePath<'_>,
        parent: BorrowedFd<'_>,
        name: &CStr,
        stat: &Stat,
    ) -> Result<Step, Self::Error>;

    /// The directory `name` is done. `parent` is its parent's gatherings
    /// and descriptor, `None` for the walk's root.
    fn leave(
        &mut self,
        done: Self::Dir,
        at: &TreePath<'_>,
        parent: Option<(&mut Self::Dir, BorrowedFd<'_>)>,
    ) -> Result<(), Self::Error>;
}

/// One directory on the walk's stack.
struct Frame<D> {
    /// Its device and inode, to know `..` brought the walk back to it.
    id: (u64, u64),
    /// Where to go on reading it: the cookie after the last entry read.
    cookie: u64,
    gathered: D,
}

/// Walk the tree at `root` (a directory, not followed if a symlink),
/// refusing directories nested more than `max_depth` below it.
pub fn walk<V: Visitor>(root: &Path, max_depth: usize, v: &mut V) -> Result<(), V::Error> {
    let mut cur = open_dir(CWD, root.as_os_str(), root)?;
    let root_id = id_of(&cur, root)?;
    let mut names: Vec<CString> = Vec::new();
    let first = v.enter(
        &TreePath {
            names: &names,
            last: None,
        },
        cur.as_fd(),
    )?;
    let mut frames = vec![Frame {
        id: root_id,
        cookie: 0,
        gathered: first,
    }];
    let mut buf = vec![MaybeUninit::<u8>::uninit(); DIR_BUFFER];
    loop {
        let Some(top) = frames.last_mut() else {
            return Ok(());
        };
        let into = read_on(&cur, top, &names, &mut buf, v, root)?;
        if let Some(child) = into {
            let at = TreePath {
                names: &names,
                last: Some(&child),
            };
            if at.depth() > max_depth {
                return Err(Error::TooDeep {
                    root: root.to_path_buf(),
                    prefix: at.display(),
                    limit: max_depth,
                }
                .into());
            }
            let next = open_dir(&cur, child.as_c_str(), &where_(root, &at))?;
            let id = id_of(&next, &where_(root, &at))?;
            if id.0 != root_id.0 {
                // Never into another file system: nothing is read or
                // deleted through a mount left in the tree.
                return Err(Error::Io {
                    op: "walk into",
                    path: where_(root, &at),
                    source: std::io::Error::other("another file system is mounted there"),
                }
                .into());
            }
            names.push(child);
            let gathered = v.enter(
                &TreePath {
                    names: &names,
                    last: None,
                },
                next.as_fd(),
            )?;
            frames.push(Frame {
                id,
                cookie: 0,
                gathered,
            });
            cur = next;
            continue;
        }
        // Everything in `cur` is read: leave it for its parent.
        let Some(done) = frames.pop() else {
            return Ok(());
        };
        let Some(parent) = frames.last_mut() else {
            return v.leave(
                done.gathered,
                &TreePath {
                    names: &names,
                    last: None,
                },
                None,
            );
        };
        let here = where_(
            root,
            &TreePath {
                names: &names,
                last: None,
            },
        );
        let up = open_dir(&cur, c"..", &here)?;
        if id_of(&up, &here)? != parent.id {
            return Err(Error::Io {
                op: "walk back up from",
                path: here,
                source: std::io::Error::other("its parent changed during the walk"),
            }
            .into());
        }
        cur = up;
        let Some(name) = names.pop() else {
            return Ok(());
        };
        let at = TreePath {
            names: &names,
            last: Some(&name),
        };
        v.leave(
            done.gathered,
            &at,
            Some((&mut parent.gathered, cur.as_fd())),
        )?;
    }
}

/// Read `dir` on from `top`'s cookie, telling `v` of each entry, until a
/// subdirectory is to be entered (its name) or the directory ends (`None`).
fn read_on<V: Visitor>(
    dir: &OwnedFd,
    top: &mut Frame<V::Dir>,
    names: &[CString],
    buf: &mut [MaybeUninit<u8>],
    v: &mut V,
    root: &Path,
) -> Result<Option<CString>, V::Error> {
    let here = || where_(root, &TreePath { names, last: None });
    rustix::fs::seek(dir, SeekFrom::Start(top.cookie)).map_err(|e| io_at("seek in", here(), e))?;
    let mut entries = RawDir::new(dir, buf);
    while let Some(e) = entries.next() {
        let e = e.map_err(|e| io_at("read directory", here(), e))?;
        let name = e.file_name();
        top.cookie = e.next_entry_cookie();
        if name == c"." || name == c".." {
            continue;
        }
        let at = TreePath {
            names,
            last: Some(name),
        };
        let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|err| io_at("stat", where_(root, &at), err))?;
        let step = v.entry(&mut top.gathered, &at, dir.as_fd(), name, &stat)?;
        if step == Step::Enter && FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            return Ok(Some(name.to_owned()));
        }
    }
    Ok(None)
}

/// Open the directory `name` in `at`, not following a symlink.
fn open_dir<P: rustix::path::Arg>(at: impl AsFd, name: P, shown: &Path) -> Result<OwnedFd> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_at("open directory", shown.to_path_buf(), e))
}

fn id_of(fd: &OwnedFd, shown: &Path) -> Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd).map_err(|e| io_at("stat", shown.to_path_buf(), e))?;
    Ok((st.st_dev, st.st_ino))
}

/// The escaped path of `at` below `root`, for an error.
pub(crate) fn where_(root: &Path, at: &TreePath<'_>) -> PathBuf {
    if at.depth() == 0 {
        root.to_path_buf()
    } else {
        root.join(at.display())
    }
}

pub(crate) fn io_at(op: &'static str, path: PathBuf, e: rustix::io::Errno) -> Error {
    Error::Io {
        op,
        path,
        source: e.into(),
    }
}

/// Give the entry `name` in `parent` the mode bits `need` its owner lacks
/// (an unprivileged walker cannot read a file, nor read or empty a
/// directory, the build left at mode 000). Only for a file or a directory,
/// which the walker has just seen it is: `chmod` would follow a symlink.
pub fn open_up(parent: BorrowedFd<'_>, name: &CStr, stat: &Stat, need: u32) -> Result<()> {
    let mode = stat.st_mode & 0o7777;
    if mode & need == need {
        return Ok(());
    }
    rustix::fs::chmodat(
        parent,
        name,
        Mode::from_raw_mode(mode | need),
        AtFlags::empty(),
    )
    .map_err(|e| io_at("chmod", PathBuf::from(escaped(name.to_bytes())), e))
}

/// Remove everything in the directory `dir` but the entries of its own
/// that `keep` names, whatever the depth and the modes left in it; the
/// directory itself stays. Directories nested more than [`FLATTEN_AT`]
/// deep are first moved up to `dir` under a fresh name, so the walk's
/// stack stays shallow.
pub fn empty_dir(dir: &Path, keep: &dyn Fn(&OsStr) -> bool) -> Result<()> {
    let root = open_dir(CWD, dir.as_os_str(), dir)?;
    // A pass may leave what it moved up behind its reading position in
    // `dir`; the next pass takes it. Passes go on until one finds nothing
    // to remove, and each removes at least one subtree it reached.
    loop {
        let mut remover = Remover {
            root: root.as_fd(),
            keep,
            moved: 0,
            removed: 0,
        };
        walk(dir, FLATTEN_AT, &mut remover)?;
        if remover.removed == 0 {
            return Ok(());
        }
    }
}

/// Remove `dir` and everything below it (see [`empty_dir`]).
pub fn remove_tree(dir: &Path) -> Result<()> {
    empty_dir(dir, &|_| false)?;
    std::fs::remove_dir(dir).map_err(|e| Error::Io {
        op: "remove directory",
        path: dir.to_path_buf(),
        source: e,
    })
}

/// How deep a removal walks before it moves a directory up to its root.
pub const FLATTEN_AT: usize = 64;

struct Remover<'a> {
    root: BorrowedFd<'a>,
    keep: &'a dyn Fn(&OsStr) -> bool,
    /// Directories moved up to the root this pass.
    moved: u64,
    /// Entries removed this pass.
    removed: u64,
}

impl Visitor for Remover<'_> {
    type Dir = ();
    type Error = Error;

    fn enter(&mut self, _: &TreePath<'_>, _: BorrowedFd<'_>) -> Result<()> {
        Ok(())
    }

    fn entry(
        &mut self,
        (): &mut (),
        at: &TreePath<'_>,
        parent: BorrowedFd<'_>,
        name: &CStr,
        stat: &Stat,
    ) -> Result<Step> {
        if at.depth() == 1 && (self.keep)(OsStr::from_bytes(name.to_bytes())) {
            return Ok(Step::Skip);
        }
        if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
            rustix::fs::unlinkat(parent, name, AtFlags::empty())
                .map_err(|e| io_at("remove", PathBuf::from(at.display()), e))?;
            self.removed += 1;
            return Ok(Step::Skip);
        }
        open_up(parent, name, stat, 0o700)?;
        if at.depth() < FLATTEN_AT {
            return Ok(Step::Enter);
        }
        self.move_up(parent, name, at)?;
        Ok(Step::Skip)
    }

    fn leave(
        &mut self,
        (): (),
        at: &TreePath<'_>,
        parent: Option<(&mut (), BorrowedFd<'_>)>,
    ) -> Result<()> {
        let (Some((_, parent)), Some(name)) = (parent, at.last) else {
            return Ok(());
        };
        rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
            .map_err(|e| io_at("remove directory", PathBuf::from(at.display()), e))?;
        self.removed += 1;
        Ok(())
    }
}

impl Remover<'_> {
    /// Move the directory `name` (in `parent`, deep down) to the root,
    /// under a name nothing there has.
    fn move_up(&mut self, parent: BorrowedFd<'_>, name: &CStr, at: &TreePath<'_>) -> Result<()> {
        loop {
            let fresh = format!(".fhsx-deep-{}-{}", std::process::id(), self.moved);
            self.moved += 1;
            match rustix::fs::renameat_with(
                parent,
                name,
                self.root,
                fresh.as_str(),
                rustix::fs::RenameFlags::NOREPLACE,
            ) {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(io_at("move up", PathBuf::from(at.display()), e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A chain of `n` directories named `d` below `root`, made relative to
    /// each other (no path is ever longer than one name).
    pub(crate) fn chain(root: &Path, n: usize) {
        let mut cur = open_dir(CWD, root.as_os_str(), root).unwrap();
        for _ in 0..n {
            rustix::fs::mkdirat(&cur, c"d", Mode::from_raw_mode(0o755)).unwrap();
            cur = open_dir(&cur, c"d", root).unwrap();
        }
        let f = rustix::fs::openat(
            &cur,
            c"f",
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        drop(f);
    }

    struct Count {
        entries: u64,
        deepest: usize,
        /// The most descriptors open under `root` at any one entry.
        most_open: usize,
        root: PathBuf,
    }

    impl Visitor for Count {
        type Dir = ();
        type Error = Error;
        fn enter(&mut self, at: &TreePath<'_>, _: BorrowedFd<'_>) -> Result<()> {
            self.deepest = self.deepest.max(at.depth());
            self.most_open = self.most_open.max(open_under(&self.root));
            Ok(())
        }
        fn entry(
            &mut self,
            (): &mut (),
            _: &TreePath<'_>,
            _: BorrowedFd<'_>,
            _: &CStr,
            _: &Stat,
        ) -> Result<Step> {
            self.entries += 1;
            Ok(Step::Enter)
        }
        fn leave(
            &mut self,
            (): (),
            _: &TreePath<'_>,
            _: Option<(&mut (), BorrowedFd<'_>)>,
        ) -> Result<()> {
            Ok(())
        }
    }

    /// This process's descriptors open on anything under `dir` (other
    /// tests' descriptors, elsewhere, do not count).
    fn open_under(dir: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
            .count()
    }

    #[test]
    fn a_walk_goes_as_deep_as_it_may_on_two_descriptors_and_refuses_deeper() {
        let t = tempfile::tempdir().unwrap();
        chain(t.path(), 3000);
        let mut c = Count {
            entries: 0,
            deepest: 0,
            most_open: 0,
            root: t.path().to_path_buf(),
        };
        walk(t.path(), 3000, &mut c).unwrap();
        assert_eq!((c.entries, c.deepest), (3001, 3000));
        assert!(c.most_open <= 2, "{} descriptors open at once", c.most_open);
        let err = walk(t.path(), 100, &mut c).unwrap_err().to_string();
        assert!(err.contains("more than 100"), "{err}");
        assert!(err.contains("d/d/d"), "{err}");
        // Nothing is left open by either walk.
        walk(t.path(), 3000, &mut c).unwrap();
        assert_eq!(open_under(t.path()), 0);
    }

    #[test]
    fn removal_takes_any_depth_and_modes_and_keeps_what_it_is_told() {
        let t = tempfile::tempdir().unwrap();
        chain(t.path(), 20_000);
        std::fs::create_dir_all(t.path().join("x/locked/inner")).unwrap();
        std::fs::write(t.path().join("x/locked/inner/f"), b"f").unwrap();
        std::fs::set_permissions(
            t.path().join("x/locked"),
            std::fs::Permissions::from_mode(0o000),
        )
        .unwrap();
        std::fs::write(t.path().join(".lock"), b"").unwrap();
        std::os::unix::fs::symlink("/etc", t.path().join("link")).unwrap();
        empty_dir(t.path(), &|n| n == ".lock").unwrap();
        let left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [".lock"]);
        assert!(
            Path::new("/etc/passwd").exists(),
            "the link was not followed"
        );
        remove_tree(t.path()).unwrap();
        assert!(!t.path().exists());
    }

    /// A file system mounted inside a tree (a tmpfs, as root) is never
    /// walked into, nor emptied through: the walk stops there, and the
    /// mount's file survives the attempt to empty the tree.
    #[test]
    fn no_walk_crosses_into_a_mounted_file_system() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "mounting a tmpfs in a test tree needs root: run the tests as root"
        );
        let t = tempfile::tempdir().unwrap();
        let inner = t.path().join("a/mnt");
        std::fs::create_dir_all(&inner).unwrap();
        let c = std::ffi::CString::new(inner.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated strings; a tmpfs of our own.
        let r = unsafe {
            libc::mount(
                c"none".as_ptr(),
                c.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "mount: {}", std::io::Error::last_os_error());
        std::fs::write(inner.join("kept"), b"x").unwrap();
        let mut c_count = Count {
            entries: 0,
            deepest: 0,
            most_open: 0,
            root: t.path().to_path_buf(),
        };
        let walked = crate::Chain(&walk(t.path(), 100, &mut c_count).unwrap_err()).to_string();
        let emptied = crate::Chain(&empty_dir(t.path(), &|_| false).unwrap_err()).to_string();
        let kept = inner.join("kept").exists();
        // SAFETY: as above.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        assert!(
            walked.contains("another file system is mounted there"),
            "{walked}"
        );
        assert!(
            emptied.contains("another file system is mounted there"),
            "{emptied}"
        );
        assert!(kept, "the walk deleted through a mount");
    }
}
