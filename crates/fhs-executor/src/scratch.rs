//! A build's private working area, `fhsx-build-*` in `$TMPDIR`: the
//! scratch directory (`/build` inside) and the view's mount point — and the
//! cap on how much the build may write there.
//!
//! `RLIMIT_FSIZE` bounds one file; nothing in a plain directory bounds the
//! sum, so a build writing many files could fill the host's disk. Where it
//! can (root, with loop devices), the scratch is therefore a file system of
//! its own: a sparse ext4 image of `[limits] disk` bytes (never more than
//! 90% of the free space, so the host keeps room), loop-mounted `nosuid`,
//! `nodev`. A full scratch is `ENOSPC` for the build, a clean failure, and
//! the host never notices. Elsewhere the limit is not enforced, and the
//! build says so in its log.
//!
//! Each area holds a lock file, `flock`ed while its build lives. A build
//! killed outright (SIGKILL, a crash) leaves its area behind; the next build
//! in the same `$TMPDIR` finds the lock free, detaches whatever is still
//! mounted there and removes it.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

const PREFIX: &str = "fhsx-build-";
const LOCK: &str = ".lock";

/// Whether the disk limit holds for this build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskLimit {
    /// A file system of this many bytes backs the scratch.
    Enforced(u64),
    /// Not enforced, and why.
    NotEnforced(String),
}

/// A build's working area; dropping it unmounts and removes everything.
#[derive(Debug)]
pub struct WorkArea {
    dir: Option<tempfile::TempDir>,
    scratch: PathBuf,
    mounted: bool,
    _lock: fs::File,
    pub disk: DiskLimit,
}

impl WorkArea {
    /// Create the area in `$TMPDIR` with a scratch of at most `disk_bytes`,
    /// after sweeping areas of builds that were killed.
    pub fn create(disk_bytes: u64) -> Result<WorkArea, Error> {
        let tmp = std::env::temp_dir();
        sweep_abandoned(&tmp);
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir()
            .map_err(|e| Error::io("create build directory in", &tmp, e))?;
        let lock_path = dir.path().join(LOCK);
        let lock = fs::File::create(&lock_path).map_err(|e| Error::io("create", &lock_path, e))?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(Error::io(
                "lock",
                &lock_path,
                std::io::Error::last_os_error(),
            ));
        }
        let scratch = dir.path().join("build");
        fs::create_dir(&scratch).map_err(|e| Error::io("create", &scratch, e))?;
        let mut area = WorkArea {
            dir: Some(dir),
            scratch,
            mounted: false,
            _lock: lock,
            disk: DiskLimit::NotEnforced(String::new()),
        };
        area.disk = match area.mount_quota(disk_bytes) {
            Ok(bytes) => DiskLimit::Enforced(bytes),
            Err(why) => DiskLimit::NotEnforced(why),
        };
        Ok(area)
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("/"), |d| d.path())
    }

    /// The scratch directory (`/build` inside the sandbox).
    pub fn scratch(&self) -> &Path {
        &self.scratch
    }

    /// Keep everything for inspection (`--keep-failed`): nothing is
    /// unmounted or removed, and no later build sweeps it.
    pub fn keep(mut self) -> PathBuf {
        let _ = fs::remove_file(self.path().join(LOCK));
        self.mounted = false;
        self.dir.take().map_or_else(PathBuf::new, |d| d.keep())
    }

    /// Back the scratch with its own size-capped file system; the bytes
    /// granted, or why not.
    fn mount_quota(&mut self, want: u64) -> Result<u64, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("only root can mount the size-capped scratch file system".into());
        }
        let image = self.path().join("scratch.img");
        let bytes = want.min(free_bytes(self.path()).saturating_mul(9) / 10);
        // ext4 needs a few MiB for its own metadata.
        let bytes = bytes.max(8 << 20);
        let f =
            fs::File::create(&image).map_err(|e| format!("creating {}: {e}", image.display()))?;
        f.set_len(bytes)
            .map_err(|e| format!("sizing {}: {e}", image.display()))?;
        drop(f);
        // No journal (the scratch never outlives a crash), no reserved
        // blocks, lazy init: about 30 ms even for tens of GiB.
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
            .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
            .arg(&image))?;
        run(Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"])
            .arg(&image)
            .arg(&self.scratch))?;
        self.mounted = true;
        // Space is taken from the host as the build writes; the file is
        // gone from the directory once mounted (the loop device holds it).
        let _ = fs::remove_file(&image);
        let _ = fs::remove_dir(self.scratch.join("lost+found"));
        Ok(bytes)
    }
}

impl Drop for WorkArea {
    fn drop(&mut self) {
        if self.mounted {
            let _ = detach(&self.scratch);
        }
        // The TempDir's own drop removes the directory.
    }
}

/// Run a setup command; its stderr is the error.
fn run(cmd: &mut Command) -> Result<(), String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run {name} (apt-get install e2fsprogs mount): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Bytes an unprivileged writer may still use on the file system of `p`.
fn free_bytes(p: &Path) -> u64 {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: an all-zero statvfs is a valid out-buffer; c is NUL-terminated.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut s) != 0 {
            return 0;
        }
        (s.f_bavail as u64).saturating_mul(s.f_frsize as u64)
    }
}

/// Lazily unmount `p`; "not mounted" is success.
fn detach(p: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: c is NUL-terminated.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()),
        _ => Err(e),
    }
}

/// Remove the areas of builds that died without cleaning up: their lock is
/// free. Mounts still under them (the scratch, a view whose daemon died
/// with its owner) are detached first, so nothing is deleted through them
/// into a store or a host directory.
pub fn sweep_abandoned(tmp: &Path) -> Vec<PathBuf> {
    // Views whose daemon died with its owner first: castore-fuse knows how
    // to detach them, also without root.
    let _ = castore_fuse::cleanup_stale_mounts(&castore_fuse::MountOptions::default().registry);
    let mut swept = Vec::new();
    let Ok(rd) = fs::read_dir(tmp) else {
        return swept;
    };
    for e in rd.flatten() {
        if !e.file_name().as_bytes().starts_with(PREFIX.as_bytes()) {
            continue;
        }
        let dir = e.path();
        // Only areas with a lock: one being created has none yet, and one
        // kept for inspection had it removed.
        let Ok(lock) = fs::File::open(dir.join(LOCK)) else {
            continue;
        };
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        // Deepest first; one we may not detach (another user's FUSE view,
        // say) keeps the whole area for a later sweep.
        let mut mounts = still_mounted_below(&dir);
        mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
        for m in mounts {
            let _ = detach(&m);
        }
        if still_mounted_below(&dir).is_empty() && fs::remove_dir_all(&dir).is_ok() {
            swept.push(dir);
        }
    }
    swept
}

/// Mount points at or below `dir`, from this process's mount table.
fn still_mounted_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        // Without a mount table nothing can be proven safe to delete.
        return vec![dir.to_path_buf()];
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect()
}
