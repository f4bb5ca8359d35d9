//! Scratch file systems kept mounted between the builds of one process —
//! a worker, or the actions of one graph build — so that a build does not
//! pay for a loop device and an ext4 mount, nor for their teardown. A pool
//! lives exactly as long as the process that owns it: what it holds is
//! taken down when it is dropped, and a process that is killed leaves its
//! areas to the next sweep of its `$TMPDIR`, as any killed build does.
//! Nothing is parked for another process: a mount that outlives its owner
//! outlives everyone's attention too.
//!
//! Reuse must not let one build see anything of another: a parked scratch
//! must be indistinguishable, through every interface a build has, from a
//! fresh one. So an area is parked only after
//! - everything in it is removed (the scratch's content, the view's mount
//!   point, the proxy's socket) and nothing but the scratch is mounted below
//!   it;
//! - the scratch's root is reset: owner root, mode 0755, no extended
//!   attribute (so no ACL), the inode flags it was created with (a build
//!   owning `/build` may set `noatime`, `sync`, `dirsync`… on it, which new
//!   files inherit); its times are pinned when it is handed to the next
//!   build, as a fresh one's are (`scratch::hand_over`);
//! - the inodes the build freed are given out again as a fresh file system
//!   gives them (its journal: see `scratch::make_ext4`), so a new file's
//!   inode number tells nothing of how many the build before made;
//! - and then the root's mode, owner, size and link count, the inode flags
//!   and the file system's free blocks and free inodes are exactly what they
//!   were right after the fresh mount. A build that grew `/build` past one
//!   block, or left anything the removal could not take, fails this check
//!   and its area is removed instead.
//!
//! The host pays for what a scratch ever wrote until it is unmounted
//! (freed blocks stay allocated in the sparse image), so a scratch that has
//! written more than [`MAX_WRITTEN_KIB`] over its life is not parked again.
//! Parked areas keep their lock and mount registration: a killed worker's
//! are swept and detached like any killed build's.
//!
//! Sizes: a worker keeps up to `--scratch-pool N` areas (default its
//! `--jobs`), `fhsx build` up to `--scratch-pool N` (`FHSX_SCRATCH_POOL`,
//! default 2) for the later actions of its graph. Areas named
//! `fhsx-parked-*`, which earlier versions parked across processes, are
//! swept like any area whose lock is free. `/build`'s atime and mtime are
//! pinned to the epoch's first second whenever a scratch is handed to a
//! build, fresh or recycled (the build owns `/build` and may set them).
//!
//! The littering tests (`worker::a_recycled_scratch_shows_nothing_of_the_build_before`,
//! `scratch_pool::a_recycled_scratch_shows_nothing_of_the_build_before`)
//! find what a build sees of a recycled scratch — its entries, modes,
//! flags, xattrs, `/build`'s times, free blocks and inodes, the next file's
//! inode number — byte for byte a fresh one's. What they do not compare is
//! `/build`'s ctime (set by the reset itself: it tells when the reset ran,
//! nothing the build chose) and where new data lands on the device (visible
//! only through `FIEMAP`).

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::scratch::{empty, statvfs, still_mounted_below, WorkArea, LOCK, VIEW};

/// A scratch whose file system has written more than this over its life
/// (64 MiB) is removed rather than parked again.
pub const MAX_WRITTEN_KIB: u64 = 64 << 10;

/// Areas parked between builds, at most `max` at once.
#[derive(Debug)]
pub struct ScratchPool {
    parked: Mutex<Vec<WorkArea>>,
    max: usize,
    reused: AtomicU64,
}

impl ScratchPool {
    /// A pool that parks at most `max` areas in this process, for its
    /// later builds (a worker: its job count); they go when it ends.
    pub fn new(max: usize) -> Arc<ScratchPool> {
        Arc::new(ScratchPool {
            parked: Mutex::new(Vec::new()),
            max,
            reused: AtomicU64::new(0),
        })
    }

    /// How many builds got a parked area instead of a new one.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// How many areas are parked now.
    pub fn parked(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn take(&self, requested: u64) -> Option<WorkArea> {
        let area = {
            let mut parked = self.lock();
            let i = parked.iter().position(|a| a.requested() == requested)?;
            parked.swap_remove(i)
        };
        self.reused.fetch_add(1, Ordering::Relaxed);
        Some(area)
    }

    /// Park `area`, or remove it (dropped outside the lock) if the pool is full.
    pub(crate) fn park(&self, area: WorkArea) {
        let mut parked = self.lock();
        if parked.len() < self.max {
            parked.push(area);
            return;
        }
        drop(parked);
        drop(area);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<WorkArea>> {
        // A panic while holding it leaves a whole Vec: keep using it.
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a freshly mounted scratch looks like, as far as a build can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreshScratch {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    flags: libc::c_int,
    xattr_bytes: isize,
    free_blocks: u64,
    free_inodes: u64,
    /// The kernel's count of what the file system has written over its
    /// life, mkfs included (not compared: what a scratch adds to it is
    /// bounded by [`MAX_WRITTEN_KIB`]).
    written_kib: u64,
    /// Its loop device, `/dev/loopN`.
    dev: PathBuf,
}

impl FreshScratch {
    /// `scratch`'s state now; `dev` is its loop device (`/dev/loopN`).
    pub(crate) fn read(scratch: &Path, dev: &Path) -> Option<FreshScratch> {
        // The kernel names an ext4 in sysfs after its device.
        let written_at = Path::new("/sys/fs/ext4")
            .join(dev.file_name()?)
            .join("lifetime_write_kbytes");
        let m = fs::symlink_metadata(scratch).ok()?;
        let root = fs::File::open(scratch).ok()?;
        let vfs = statvfs(scratch)?;
        let c = std::ffi::CString::new(scratch.as_os_str().as_bytes()).ok()?;
        // SAFETY: c is NUL-terminated; a null buffer of size 0 asks for the
        // length of the list only.
        let xattr_bytes = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
        Some(FreshScratch {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            size: m.size(),
            nlink: m.nlink(),
            flags: inode_flags(&root)?,
            xattr_bytes,
            free_blocks: vfs.f_bfree,
            free_inodes: vfs.f_ffree,
            written_kib: fs::read_to_string(&written_at).ok()?.trim().parse().ok()?,
            dev: dev.to_path_buf(),
        })
    }

    /// Everything a build could tell apart, the same as `other`'s, and no
    /// more than [`MAX_WRITTEN_KIB`] written since `other` was read.
    pub(crate) fn same_as_fresh(&self, other: &FreshScratch) -> bool {
        self.looks_like(other)
            && self.written_kib.saturating_sub(other.written_kib) <= MAX_WRITTEN_KIB
    }

    /// Everything a build could tell apart, the same as `other`'s.
    fn looks_like(&self, other: &FreshScratch) -> bool {
        (
            self.mode,
            self.uid,
            self.gid,
            self.size,
            self.nlink,
            self.flags,
            self.xattr_bytes,
            self.free_blocks,
            self.free_inodes,
        ) == (
            other.mode,
            other.uid,
            other.gid,
            other.size,
            other.nlink,
            other.flags,
            other.xattr_bytes,
            other.free_blocks,
            other.free_inodes,
        )
    }
}

/// Empty the area `dir` and its `scratch` and reset the scratch's root;
/// true if it now looks exactly like `fresh` (see the module docs).
pub(crate) fn reset(dir: &Path, scratch: &Path, fresh: &FreshScratch) -> bool {
    let Ok(scratch_real) = fs::canonicalize(scratch) else {
        return false;
    };
    // Nothing may be deleted through a mount: only the scratch may be left.
    if still_mounted_below(dir) != [scratch_real] {
        return false;
    }
    // The view's mount point stays if it is an empty directory (the host
    // pays for a directory made and removed: see `runner.rs`).
    let emptied = empty(dir, |p| {
        p == scratch || p.file_name() == Some(LOCK.as_ref()) || is_empty_dir(p, VIEW)
    }) && empty(scratch, |_| false);
    emptied
        && reset_root(scratch, fresh)
        && FreshScratch::read(scratch, &fresh.dev).is_some_and(|now| now.same_as_fresh(fresh))
}

/// Whether `p` is named `name` and is an empty directory (not a link).
fn is_empty_dir(p: &Path, name: &str) -> bool {
    p.file_name() == Some(name.as_ref())
        && fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
        && fs::read_dir(p).is_ok_and(|mut d| d.next().is_none())
}

/// Owner root, mode 0755, no extended attribute, the fresh inode flags.
fn reset_root(scratch: &Path, fresh: &FreshScratch) -> bool {
    if std::os::unix::fs::lchown(scratch, Some(0), Some(0)).is_err()
        || fs::set_permissions(scratch, fs::Permissions::from_mode(0o755)).is_err()
    {
        return false;
    }
    let Ok(c) = std::ffi::CString::new(scratch.as_os_str().as_bytes()) else {
        return false;
    };
    let mut names = vec![0u8; 64 << 10];
    // SAFETY: names is valid for its length; c is NUL-terminated.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        return false;
    }
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let Ok(name) = std::ffi::CString::new(name) else {
            return false;
        };
        // SAFETY: both are NUL-terminated.
        if unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) } != 0 {
            return false;
        }
    }
    let Ok(root) = fs::File::open(scratch) else {
        return false;
    };
    match inode_flags(&root) {
        Some(f) if f == fresh.flags => true,
        Some(_) => {
            // SAFETY: FS_IOC_SETFLAGS reads one long from the pointer.
            unsafe { libc::ioctl(root.as_raw_fd(), FS_IOC_SETFLAGS, &fresh.flags) == 0 }
        }
        None => false,
    }
}

const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;

/// The inode flags (`lsattr`) of an open file.
fn inode_flags(f: &fs::File) -> Option<libc::c_int> {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one long to the pointer.
    (unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) } == 0).then_some(flags)
}
