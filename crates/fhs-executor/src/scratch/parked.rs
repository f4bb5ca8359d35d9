//! Scratch file systems parked in `$TMPDIR` between the builds of separate
//! processes: `fhsx build` is one process per build, so the worker's
//! in-process pool (`pool.rs`) never helps it. A disk scratch costs a loop
//! device, an ext4 mount and, at the end, their teardown (the unmount's
//! flush through the loop device, the device's release, the area's
//! directories freed on the host's disk); a parked one costs a lock and a
//! check at each end.
//!
//! An area is parked exactly when the in-process pool would park it: after
//! `pool::reset` has emptied it and found it indistinguishable from fresh.
//! It is then made root's alone (0700: no build user may pass). A new area
//! is renamed, its lock still held, to one of `max` slots per disk size,
//! `fhsx-parked-<bytes>-<n>` (`RENAME_NOREPLACE`: with every slot taken,
//! it is removed as usual), with its fresh state beside it (`.fresh`) and
//! a parked record in the mount registry; from then on the slot is used
//! in place, so re-parking it writes nothing on the host's disk but the
//! lock file's mtime.
//!
//! A build takes a slot by locking it (the same `flock` every area has),
//! and only one that is root's own private directory whose lock is the
//! slot's (not a lock renamed away meanwhile): a directory planted under
//! that name by another user of a shared `/tmp` is never touched. It then
//! checks the scratch again: still mounted from its loop device and still
//! looking fresh. Anything else — a killed build's leftovers included —
//! is taken down and removed like an abandoned area.
//!
//! Parked areas do not live forever: each is registered as parked
//! (`castore_fuse::register_parked`) for [`TTL`] after its lock file's
//! mtime, after which the next view mount anywhere detaches it (unless a
//! build holds its lock), and the next sweep of its `$TMPDIR` removes it.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{remove_area, still_mounted_below, DiskLimit, Mounted, ScratchFs, WorkArea, LOCK};
use crate::background::Background;
use crate::pool::FreshScratch;

/// Parked areas' names: `fhsx-parked-<bytes>-<slot>`.
pub(crate) const PARKED: &str = "fhsx-parked-";

/// How long a parked scratch waits for a build before it is taken down.
pub const TTL: Duration = Duration::from_secs(300);

/// A parked area's fresh state, next to its scratch (kept by the reset).
pub(crate) const FRESH: &str = ".fresh";

#[derive(serde::Serialize, serde::Deserialize)]
struct ParkedState {
    fresh: FreshScratch,
    /// The bytes the scratch file system holds (`[limits] disk`, or less
    /// where the host had less room when it was made).
    granted: u64,
}

fn slot(tmp: &Path, requested: u64, n: usize) -> PathBuf {
    tmp.join(format!("{PARKED}{requested}-{n}"))
}

fn is_slot(dir: &Path) -> bool {
    dir.file_name()
        .is_some_and(|n| n.as_bytes().starts_with(PARKED.as_bytes()))
}

/// A parked area of `requested` bytes from `$TMPDIR`, taken and checked;
/// `None` if no slot of the `max` holds a sound one. A slot found unsound
/// is taken down on a thread of its own (`retire`): an ext4 unmount and
/// its loop device's release take milliseconds this build need not wait.
pub(crate) fn take_shared(
    requested: u64,
    max: usize,
    retire: &mut Vec<Background>,
) -> Option<WorkArea> {
    let tmp = std::env::temp_dir();
    (0..max).find_map(|n| take_slot(&slot(&tmp, requested, n), requested, retire))
}

fn take_slot(dir: &Path, requested: u64, retire: &mut Vec<Background>) -> Option<WorkArea> {
    let lock = lock_own(dir)?;
    let sound = fs::read(dir.join(FRESH))
        .ok()
        .and_then(|b| serde_json::from_slice::<ParkedState>(&b).ok())
        .filter(|state| still_fresh(&dir.join("build"), state));
    let Some(state) = sound else {
        // A killed build's scratch, one detached meanwhile, or one whose
        // file system wrote too much after it was parked (the kernel
        // writes its metadata back later): its lock held until it is gone.
        let dir = dir.to_path_buf();
        retire.push(Background::start("fhsx-retire", move || {
            take_down(&dir);
            drop(lock);
        }));
        return None;
    };
    Some(WorkArea {
        fs: ScratchFs::Ready(Mounted {
            mounted: true,
            // The slot's parked record covers it while its lock is held.
            registration: None,
            disk: DiskLimit::Enforced(state.granted),
            fresh: Some(state.fresh),
        }),
        dir: Some(dir.to_path_buf()),
        scratch: dir.join("build"),
        lock: Some(lock),
        disk: DiskLimit::Enforced(state.granted),
        requested,
        pool: None,
        user: None,
    })
}

/// Root's own directory `dir` (no one else may write in it: 0700 parked,
/// 0710 while a build used it), its lock taken; `None` for anything else
/// (someone else's, a link) or a lock held elsewhere.
fn lock_own(dir: &Path) -> Option<fs::File> {
    let m = fs::symlink_metadata(dir).ok()?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o7022 != 0 {
        return None;
    }
    let path = dir.join(LOCK);
    let lock = fs::File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .ok()?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return None;
    }
    // Still this directory's lock, not one renamed away with its area
    // between the open and the flock.
    let (held, named) = (lock.metadata().ok()?, fs::symlink_metadata(&path).ok()?);
    (held.dev() == named.dev() && held.ino() == named.ino()).then_some(lock)
}

/// `scratch` is still the file system of the recorded loop device (its
/// `st_dev` the device's `st_rdev`) and still looks as it did fresh.
fn still_fresh(scratch: &Path, state: &ParkedState) -> bool {
    let dev = state.fresh.device();
    let on_dev = match (fs::metadata(dev), fs::symlink_metadata(scratch)) {
        (Ok(d), Ok(s)) => d.file_type().is_block_device() && s.dev() == d.rdev(),
        _ => false,
    };
    on_dev && FreshScratch::read(scratch, dev).is_some_and(|now| now.same_as_fresh(&state.fresh))
}

/// Park `area` — emptied, checked as fresh and holding no build user (see
/// `WorkArea::recycled`): in place if it is a slot already, else in a free
/// one of `max`; with none free it is removed as usual.
pub(crate) fn park_shared(mut area: WorkArea, max: usize) {
    let Some(dir) = area.dir.clone() else { return };
    let private = std::os::unix::fs::lchown(&dir, Some(0), Some(0)).is_ok()
        && fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).is_ok();
    if !private {
        return;
    }
    // Its idle time starts now (the registry's and the sweep's clock).
    let touched = area
        .lock
        .as_ref()
        .is_some_and(|l| l.set_modified(SystemTime::now()).is_ok());
    if is_slot(&dir) {
        if touched {
            // Stays parked: nothing of it may be unmounted or removed.
            area.dir = None;
            area.fs = ScratchFs::Gone;
        }
        return;
    }
    let (dev, state) = match &area.fs {
        ScratchFs::Ready(Mounted {
            fresh: Some(fresh),
            disk: DiskLimit::Enforced(granted),
            ..
        }) => (
            fresh.device().to_path_buf(),
            ParkedState {
                fresh: fresh.clone(),
                granted: *granted,
            },
        ),
        _ => return,
    };
    let written = serde_json::to_vec(&state)
        .ok()
        .is_some_and(|b| fs::write(dir.join(FRESH), b).is_ok());
    if !touched || !written {
        return;
    }
    let tmp = std::env::temp_dir();
    let Some(parked) = (0..max)
        .map(|n| slot(&tmp, area.requested, n))
        .find(|to| rename_noreplace(&dir, to))
    else {
        return;
    };
    // The area now lives under the slot's name: nothing of the old one may
    // be unmounted or removed by the drop; its registration goes.
    area.dir = None;
    area.fs = ScratchFs::Gone;
    let _ = castore_fuse::register_parked(
        &castore_fuse::default_registry(),
        &fs::canonicalize(parked.join("build")).unwrap_or_else(|_| parked.join("build")),
        &dev.to_string_lossy(),
        &parked.join(LOCK),
        TTL,
    );
    // The lock goes last, with the area: only now may a build take it.
}

/// `rename(2)` without replacing what is at `to`.
fn rename_noreplace(from: &Path, to: &Path) -> bool {
    let (Ok(f), Ok(t)) = (
        std::ffi::CString::new(from.as_os_str().as_bytes()),
        std::ffi::CString::new(to.as_os_str().as_bytes()),
    ) else {
        return false;
    };
    // SAFETY: both are NUL-terminated paths that outlive the call.
    unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        ) == 0
    }
}

/// Take down the parked area `dir` if its time is up and no one holds it:
/// the sweep's part for parked areas.
pub(super) fn sweep_parked(dir: &Path) -> bool {
    // Not while its time runs (whether it is still sound is the taker's
    // check: the sweep runs at every build and must stay cheap).
    let expired = fs::metadata(dir.join(LOCK))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|idle| idle > TTL);
    if !expired {
        return false;
    }
    let Some(_lock) = lock_own(dir) else {
        return false;
    };
    take_down(dir)
}

/// Detach whatever is mounted below the slot `dir` (its lock held) and
/// remove it.
fn take_down(dir: &Path) -> bool {
    let mut mounts = still_mounted_below(dir);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in mounts {
        let _ = castore_fuse::detach(&m);
    }
    still_mounted_below(dir).is_empty() && remove_area(dir)
}
