//! A build's private working area, `fhsx-build-*` in `$TMPDIR`: the
//! scratch directory (`/build` inside) and the view's mount point — and the
//! cap on how much the build may write there.
//!
//! `RLIMIT_FSIZE` bounds one file; nothing in a plain directory bounds the
//! sum, so a build writing many files could fill the host's disk. Where it
//! can (root, with loop devices), the scratch is therefore a file system of
//! its own: a sparse ext4 image of `[limits] disk` bytes (never more than
//! 90% of the free space, so the host keeps room), on an autoclearing loop
//! device, mounted `nosuid`, `nodev`. A full scratch is `ENOSPC` for the build, a clean failure, and
//! the host never notices. Elsewhere the limit is not enforced, and the
//! build says so in its log.
//!
//! As root, each build runs as a build user of its own (see
//! `executor_sandbox::users`), which the area holds for as long as it
//! lives: the area's directory is root's, passable by the build user's
//! group alone (0710), and the scratch, its file system's root included,
//! belongs to the build user ([`WorkArea::hand_over`]). Without root the
//! build runs as the caller, who owns the scratch already. No directory is
//! ever made world-writable.
//!
//! Each area holds a lock file, `flock`ed while its build lives, and is
//! made under a staging name and renamed into place only once locked, so
//! no other build ever sees an unlocked live area. A build killed outright
//! (SIGKILL, a crash) leaves its area behind; the next build in the same
//! `$TMPDIR` finds the lock free, detaches whatever is still mounted there
//! and removes it.
//!
//! The area is made under a staging name (`.fhsx-new-*`), locked, then
//! renamed, and removed lock file last; so a build killed at any moment
//! leaves an area with a free lock or an empty directory, which the sweep
//! takes, with staging directories older than ten minutes. A kept area
//! (lock removed on purpose, `--keep-failed`) is never empty and stays. As
//! root the area holds its build user until it is removed or kept; the
//! scratch's entries are `lchown`ed to it once the source and `/build/home`
//! are in place (directories `u+rwx`, files `u+rw`).
//!
//! `--scratch memory` (on `fhsx build` and `fhsx worker`) mounts a tmpfs
//! instead ([`ScratchMedium::Memory`]); it is never pooled, and without
//! root it is the plain directory too. Its pages are charged to the build's
//! memory cgroup, which has no swap
//! (`hostile::host_isolation_a_memory_scratch_counts_against_limits_memory`).

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use executor_sandbox::{BuildUser, BuildUsers};

use crate::Error;

const PREFIX: &str = "fhsx-build-";
pub(crate) const LOCK: &str = ".lock";
/// The view's mount point in an area.
pub(crate) const VIEW: &str = "view";

/// What backs a build's scratch, where fhsx can give it a file system of
/// its own (as root): the operator's choice, as Bazel's `--sandbox_base`
/// is, never the action's (it changes no output, so no digest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScratchMedium {
    /// A sparse ext4 image on a loop device, in `$TMPDIR`: room for builds
    /// that write tens of GiB; mounting and unmounting it costs several
    /// milliseconds per build (the loop device's set-up and teardown).
    #[default]
    Disk,
    /// A tmpfs of the given size: its pages are charged to whoever writes
    /// them, the build's memory cgroup, so the scratch counts against
    /// `[limits] memory` and the host's memory is never at risk; mounting it
    /// costs a few microseconds. For the many small actions of a build
    /// graph (one compile each).
    Memory,
}

/// Whether the disk limit holds for this build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskLimit {
    /// A file system of this many bytes backs the scratch.
    Enforced(u64),
    /// Not enforced, and why.
    NotEnforced(String),
}

/// A build's working area; dropping it unmounts and removes everything.
///
/// Its scratch file system is mounted and filled on a thread of its own
/// (see [`WorkArea::create`]): the caller goes on mounting the view and
/// composing the sandbox meanwhile, and [`WorkArea::ready`] waits for it.
#[derive(Debug)]
pub struct WorkArea {
    /// `None` once kept.
    dir: Option<PathBuf>,
    scratch: PathBuf,
    /// The scratch's file system, once [`ready`](WorkArea::ready).
    fs: ScratchFs,
    /// Held while the area is in use or parked; `None` only once moved out.
    lock: Option<fs::File>,
    /// Whether the scratch's size is capped; known once ready.
    pub disk: DiskLimit,
    /// The `[limits] disk` asked for: the pool's key for this area.
    requested: u64,
    /// Where the area goes back when [`released`](WorkArea::release), if
    /// it can be made as new. Dropped otherwise (a build that failed, an
    /// error on the way), it is removed.
    pool: Option<std::sync::Arc<crate::pool::ScratchPool>>,
    /// The build's jobserver FIFO in the area, once opened.
    jobserver: Option<crate::jobserver::Jobserver>,
    /// As root: the build user the build runs as, held while the area
    /// lives (declared last: released only once the area is gone).
    user: Option<BuildUser>,
}

/// What the scratch directory holds for a build before it starts (its
/// home, the source tree), made on the scratch's own thread once it is
/// mounted; given the scratch's path.
pub type Fill = Box<dyn FnOnce(&Path) -> Result<(), Error> + Send>;

/// The scratch's file system: being mounted and filled, or done.
#[derive(Debug, Default)]
enum ScratchFs {
    /// On its thread; joined by `ready` (or by the drop, before anything
    /// is unmounted or removed).
    Pending(std::thread::JoinHandle<(Mounted, Result<(), Error>)>),
    Ready(Mounted),
    /// Kept, or moved into a parked area.
    #[default]
    Gone,
}

/// A scratch file system as mounted (or not, without root).
#[derive(Debug)]
struct Mounted {
    mounted: bool,
    /// The scratch mount in the mount registry, so that it does not outlive
    /// a killed fhsx (see `castore_fuse::register_mount`).
    registration: Option<castore_fuse::Registration>,
    disk: DiskLimit,
    /// The scratch file system as it was when freshly mounted: what a
    /// recycled one must again look like (see `pool.rs`).
    fresh: Option<crate::pool::FreshScratch>,
}

impl Mounted {
    /// Detach the scratch file system (lazily: whatever still holds it
    /// lets go when it ends) and drop its registration.
    fn unmount(&mut self, scratch: &Path) {
        if std::mem::replace(&mut self.mounted, false) {
            let _ = castore_fuse::detach(scratch);
        }
        self.registration = None;
    }
}

/// Where an area is made before it is locked: a name no sweeper looks at.
const STAGING: &str = ".fhsx-new-";

impl WorkArea {
    /// Create the area in `$TMPDIR` with a scratch of at most `disk_bytes`,
    /// after sweeping areas of builds that were killed. The scratch's file
    /// system is mounted, `fill`ed and handed to the build user
    /// ([`hand_over`]) on a thread of its own: what the caller does next
    /// (mount the view, compose the sandbox) overlaps with it, and
    /// [`ready`](WorkArea::ready) waits for it.
    ///
    /// An area is made under a staging name, locked, and only then renamed
    /// to `fhsx-build-*`: a sweeper (another build starting) sees only
    /// areas that are locked while their build lives, so it can never take
    /// a fresh area for a dead one, nor hold the lock its owner is about to
    /// take.
    pub fn create(disk_bytes: u64, medium: ScratchMedium, fill: Fill) -> Result<WorkArea, Error> {
        let mut area = WorkArea::locked(disk_bytes)?;
        fs::create_dir(&area.scratch).map_err(|e| Error::io("create", &area.scratch, e))?;
        let (dir, scratch) = (area.path().to_path_buf(), area.scratch.clone());
        let owner = area.owner();
        area.fs = area.spawn(move || {
            let mounted = match medium {
                ScratchMedium::Disk => mount_quota(&dir, &scratch, disk_bytes),
                ScratchMedium::Memory => mount_memory(&scratch, disk_bytes),
            };
            let filled = fill(&scratch).and_then(|()| hand_over(&scratch, owner));
            (mounted, filled)
        })?;
        Ok(area)
    }

    /// The area itself, locked and renamed into place, holding its build
    /// user; no scratch yet.
    fn locked(disk_bytes: u64) -> Result<WorkArea, Error> {
        let user = build_user_for_caller()?;
        let tmp = std::env::temp_dir();
        sweep_abandoned(&tmp);
        let staging = tempfile::Builder::new()
            .prefix(STAGING)
            .tempdir_in(&tmp)
            .map_err(|e| Error::io("create build directory in", &tmp, e))?;
        let lock_path = staging.path().join(LOCK);
        let lock = fs::File::create(&lock_path).map_err(|e| Error::io("create", &lock_path, e))?;
        // SAFETY: flock on an fd we own. No one else knows the staging
        // name, so this cannot be contended.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(Error::io(
                "lock",
                &lock_path,
                std::io::Error::last_os_error(),
            ));
        }
        let suffix = staging
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().trim_start_matches(STAGING).to_owned())
            .unwrap_or_default();
        let dir = tmp.join(format!("{PREFIX}{suffix}"));
        fs::rename(staging.path(), &dir).map_err(|e| Error::io("rename into place", &dir, e))?;
        // Renamed away: the staging guard must not remove anything now.
        let _ = staging.keep();
        let scratch = dir.join("build");
        let area = WorkArea {
            dir: Some(dir),
            scratch,
            fs: ScratchFs::Gone,
            lock: Some(lock),
            disk: DiskLimit::NotEnforced(String::new()),
            requested: disk_bytes,
            pool: None,
            jobserver: None,
            user,
        };
        area.admit_user()?;
        Ok(area)
    }

    /// As [`create`](Self::create), but taking an area `pool` holds for
    /// this disk size when it has one; dropped, the area goes back to the
    /// pool if it can be made exactly as new (else it is removed as usual).
    pub fn create_pooled(
        disk_bytes: u64,
        pool: &std::sync::Arc<crate::pool::ScratchPool>,
        fill: Fill,
    ) -> Result<WorkArea, Error> {
        let mut area = match pool.take(disk_bytes) {
            Some(mut parked) => {
                parked.user = build_user_for_caller()?;
                parked.admit_user()?;
                let mounted = match std::mem::take(&mut parked.fs) {
                    ScratchFs::Ready(m) => m,
                    // A parked area is always ready: never pending.
                    other => return Err(Error::Other(format!("a parked scratch was {other:?}"))),
                };
                let (scratch, owner) = (parked.scratch.clone(), parked.owner());
                parked.fs = parked.spawn(move || {
                    let filled = fill(&scratch).and_then(|()| hand_over(&scratch, owner));
                    (mounted, filled)
                })?;
                parked
            }
            None => WorkArea::create(disk_bytes, ScratchMedium::Disk, fill)?,
        };
        area.pool = Some(pool.clone());
        Ok(area)
    }

    /// Run `job` (mount and fill the scratch) on a thread of its own.
    fn spawn(
        &self,
        job: impl FnOnce() -> (Mounted, Result<(), Error>) + Send + 'static,
    ) -> Result<ScratchFs, Error> {
        std::thread::Builder::new()
            .name("fhsx-scratch".into())
            .spawn(job)
            .map(ScratchFs::Pending)
            .map_err(|e| Error::io("start a thread to mount", &self.scratch, e))
    }

    /// Wait until the scratch is mounted, filled and handed over; its
    /// filling's error, if it failed (the area is removed when dropped,
    /// as ever).
    pub fn ready(&mut self) -> Result<(), Error> {
        if let ScratchFs::Pending(_) = &self.fs {
            let ScratchFs::Pending(job) = std::mem::take(&mut self.fs) else {
                unreachable!("matched as pending just above")
            };
            let (mounted, filled) = job.join().unwrap_or_else(|_| {
                // A panic on the thread: whether anything was mounted is
                // unknown, so the drop detaches the path anyway.
                (
                    Mounted {
                        mounted: true,
                        registration: None,
                        disk: DiskLimit::NotEnforced("the scratch's thread panicked".into()),
                        fresh: None,
                    },
                    Err(Error::Other(
                        "preparing the scratch panicked; see the message above".into(),
                    )),
                )
            });
            self.disk = mounted.disk.clone();
            self.fs = ScratchFs::Ready(mounted);
            return filled;
        }
        Ok(())
    }

    /// The build user's uid and gid, as root.
    fn owner(&self) -> Option<(u32, u32)> {
        self.user.as_ref().map(|u| (u.uid(), u.gid()))
    }

    /// As root, make the area root's and passable by the build user's
    /// group alone: it reaches its scratch, the view and the proxy's socket
    /// and CA here, but lists or creates nothing.
    fn admit_user(&self) -> Result<(), Error> {
        if let Some(u) = &self.user {
            let dir = self.path().to_path_buf();
            std::os::unix::fs::lchown(&dir, Some(0), Some(u.gid()))
                .map_err(|e| Error::io("chown", &dir, e))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o710))
                .map_err(|e| Error::io("chmod", &dir, e))?;
        }
        Ok(())
    }

    /// This area, emptied and checked to be as new, as a parked area with
    /// no build user (the caller's is released with it); `None` if it
    /// cannot be (then the caller removes it as usual).
    fn recycled(&mut self) -> Option<WorkArea> {
        let _ = self.ready();
        let ScratchFs::Ready(m) = &self.fs else {
            return None;
        };
        let fresh = m.fresh.as_ref()?;
        let dir = self.dir.as_deref()?;
        if !m.mounted || !crate::pool::reset(dir, &self.scratch, fresh) {
            return None;
        }
        Some(WorkArea {
            dir: self.dir.take(),
            scratch: std::mem::take(&mut self.scratch),
            fs: std::mem::take(&mut self.fs),
            lock: self.lock.take(),
            disk: self.disk.clone(),
            requested: self.requested,
            pool: None,
            jobserver: None,
            user: None,
        })
    }

    /// The `[limits] disk` this area was made for.
    pub(crate) fn requested(&self) -> u64 {
        self.requested
    }

    pub fn path(&self) -> &Path {
        self.dir.as_deref().unwrap_or(Path::new("/"))
    }

    /// The scratch directory (`/build` inside the sandbox).
    pub fn scratch(&self) -> &Path {
        &self.scratch
    }

    /// The build user the build runs as (as root), held by this area.
    pub fn build_user(&self) -> Option<&BuildUser> {
        self.user.as_ref()
    }

    /// Make the build's jobserver for `lease` in this area, the build
    /// user's (see [`crate::jobserver`]); the lease removes it.
    pub fn open_jobserver(&mut self, lease: &mut crate::jobserver::Lease) -> Result<(), Error> {
        let owner = self.user.as_ref().map(|u| (u.uid(), u.gid()));
        self.jobserver = Some(lease.open_jobserver(self.path(), owner)?);
        Ok(())
    }

    /// The build's jobserver, once opened.
    pub fn jobserver(&self) -> Option<&crate::jobserver::Jobserver> {
        self.jobserver.as_ref()
    }

    /// Keep everything for inspection (`--keep-failed`): nothing is
    /// unmounted or removed, and no later build sweeps it.
    pub fn keep(mut self) -> PathBuf {
        let _ = self.ready();
        let _ = fs::remove_file(self.path().join(LOCK));
        // Kept on purpose: no later cleanup may take it away (the
        // registration goes, the mount stays).
        if let ScratchFs::Ready(m) = &mut self.fs {
            m.mounted = false;
            m.registration = None;
        }
        self.dir.take().unwrap_or_default()
    }
}

impl Drop for WorkArea {
    fn drop(&mut self) {
        // Whatever the scratch's thread is doing ends before anything is
        // unmounted or removed under it.
        let _ = self.ready();
        self.remove();
    }
}

impl WorkArea {
    /// The end of a build that succeeded: back to its pool if it has one
    /// and can be made exactly as new, else removed. (Dropped instead,
    /// after a failure, it is always removed: a failed build leaves no
    /// mount.)
    pub fn release(mut self) {
        let _ = self.ready();
        if let Some(pool) = self.pool.take() {
            if let Some(parked) = self.recycled() {
                pool.park(parked);
            }
        }
    }

    /// Unmount the scratch and remove the area.
    fn remove(&mut self) {
        if let ScratchFs::Ready(m) = &mut self.fs {
            m.unmount(&self.scratch);
        }
        if let Some(dir) = self.dir.take() {
            // Never through a mount: what is still mounted (a detach that
            // failed) keeps the area for a later sweep.
            if still_mounted_below(&dir).is_empty() {
                remove_area(&dir);
            }
        }
    }
}

/// Give the scratch to whoever the build runs as, once it is filled
/// (the source tree, `home`): every directory gets `u+rwx` and every
/// file `u+rw` (a source exported read-only must be writable to its
/// build), and as root (`owner`) everything, the scratch itself and its
/// file system's root included, becomes the build user's (`lchown`: no
/// symlink is followed). Without root the caller is the sandbox user and
/// owns it all already. Nothing is made writable for anyone else.
fn hand_over(scratch: &Path, owner: Option<(u32, u32)>) -> Result<(), Error> {
    let mut stack = vec![scratch.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p).map_err(|e| Error::io("stat", &p, e))?;
        let add = if meta.is_dir() {
            0o700
        } else if meta.is_file() {
            0o600
        } else {
            0
        };
        let mode = meta.permissions().mode() & 0o7777;
        if add != 0 && mode & add != add {
            fs::set_permissions(&p, fs::Permissions::from_mode(mode | add))
                .map_err(|e| Error::io("chmod", &p, e))?;
        }
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::lchown(&p, Some(uid), Some(gid))
                .map_err(|e| Error::io("chown", &p, e))?;
        }
        if meta.is_dir() {
            for e in fs::read_dir(&p).map_err(|e| Error::io("read", &p, e))? {
                stack.push(e.map_err(|e| Error::io("read", &p, e))?.path());
            }
        }
    }
    pin_times(scratch)
}

/// When `/build` itself was last read and changed, as every build sees
/// it: one fixed instant (the Unix epoch's first second, as Nix gives
/// everything in its store). A build may set them (it owns `/build`) and
/// the file system keeps them, so a recycled scratch would otherwise hand
/// the previous build's choice to the next — and a fresh one, the time of
/// its making. What the fill made below keeps its times: each build gets
/// those anew.
fn pin_times(scratch: &Path) -> Result<(), Error> {
    let at = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        scratch,
        &at,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| Error::io("set the times of", scratch, e.into()))
}

/// Put the scratch, mounted from `source`, in the mount registry.
fn register(scratch: &Path, source: &str) -> Option<castore_fuse::Registration> {
    // The mount table names the path with symlinks resolved.
    let at = fs::canonicalize(scratch).unwrap_or_else(|_| scratch.to_path_buf());
    castore_fuse::register_mount(&castore_fuse::default_registry(), &at, source).ok()
}

/// A scratch that is the plain directory: its size is not enforced, why.
fn unmounted(why: String) -> Mounted {
    Mounted {
        mounted: false,
        registration: None,
        disk: DiskLimit::NotEnforced(why),
        fresh: None,
    }
}

/// Back the scratch with a tmpfs of `bytes` ([`ScratchMedium::Memory`]).
fn mount_memory(scratch: &Path, bytes: u64) -> Mounted {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return unmounted("only root can mount the size-capped scratch file system".into());
    }
    let bytes = bytes.max(1 << 20);
    // One inode per 16 KiB of room, as mkfs.ext4 gives the disk scratch
    // (tmpfs's own default, half the host's pages, is not the build's
    // to take); at least 4096, so a tiny scratch still holds a tree.
    let inodes = (bytes / (16 << 10)).max(4096);
    if let Err(why) = mount_tmpfs(scratch, bytes, inodes) {
        return unmounted(why);
    }
    Mounted {
        mounted: true,
        registration: register(scratch, TMPFS_SOURCE),
        disk: DiskLimit::Enforced(bytes),
        fresh: None,
    }
}

/// Back the scratch (in the area `dir`) with its own size-capped file
/// system of at most `want` bytes.
fn mount_quota(dir: &Path, scratch: &Path, want: u64) -> Mounted {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return unmounted("only root can mount the size-capped scratch file system".into());
    }
    let room = free_bytes(dir).saturating_mul(9) / 10;
    // Clamped sizes are rounded down to whole GiB, so a host short of
    // space reuses a few templates rather than making one per build.
    let bytes = if want <= room {
        want
    } else if room >= 1 << 30 {
        room & !((1 << 30) - 1)
    } else {
        room
    };
    // ext4 needs a few MiB for its own metadata.
    let bytes = bytes.max(8 << 20);
    let dev = match attach_ext4(dir, scratch, bytes) {
        Ok(dev) => dev,
        Err(why) => return unmounted(why),
    };
    Mounted {
        mounted: true,
        // Registered before anything else can fail or kill us: a dead
        // fhsx's scratch is then detached by the next mount anywhere, not
        // only by a build in this same $TMPDIR.
        registration: register(scratch, &dev.to_string_lossy()),
        disk: DiskLimit::Enforced(bytes),
        // Space is taken from the host as the build writes.
        fresh: crate::pool::FreshScratch::read(scratch, &dev),
    }
}

/// A fresh ext4 of `bytes` on a loop device over an unnamed image in
/// `dir`, mounted at `scratch`; its device.
fn attach_ext4(dir: &Path, scratch: &Path, bytes: u64) -> Result<PathBuf, String> {
    let template = template(&std::env::temp_dir().join("fhsx-0"), bytes)?;
    let image = empty_image(dir, bytes)?;
    // The device's fd stays open until the mount holds the device:
    // autoclear detaches it at the last close of an unmounted device.
    let (dev, dev_fd) = loopdev::attach(&image)?;
    drop(image);
    // The template goes onto the device, not into the image: see
    // `empty_image`.
    copy_extents(&template, &dev_fd)
        .map_err(|e| format!("writing the scratch template onto {}: {e}", dev.display()))?;
    mount_ext4(&dev, scratch)?;
    Ok(dev)
}

/// As root, a build user of its own for the next build; else none (the
/// build runs as the caller).
fn build_user_for_caller() -> Result<Option<BuildUser>, Error> {
    // SAFETY: geteuid has no preconditions.
    Ok(match unsafe { libc::geteuid() } {
        0 => Some(BuildUsers::from_env()?.allocate()?),
        _ => None,
    })
}

/// Remove the area `dir`, its lock file last: killed half-way, the remover
/// leaves an area that still has its (now free) lock, which the next sweep
/// takes; only an empty directory can be left without one, and the sweep
/// removes those too.
fn remove_area(dir: &Path) -> bool {
    let lock = dir.join(LOCK);
    empty(dir, |p| p == lock) && {
        let _ = fs::remove_file(&lock);
        fs::remove_dir(dir).is_ok()
    }
}

/// Remove every entry of `dir` but those `keep` names (given their full
/// path), whatever a build left there: any depth, any modes (see
/// [`castore::fs_tree::empty_dir`]).
pub(crate) fn empty(dir: &Path, keep: impl Fn(&Path) -> bool) -> bool {
    castore::fs_tree::empty_dir(dir, &|name| keep(&dir.join(name))).is_ok()
}

/// Remove `dir` and everything below it, whatever a build left there.
pub(crate) fn remove_all(dir: &Path) -> bool {
    castore::fs_tree::remove_tree(dir).is_ok()
}

/// The empty ext4 of `bytes` every scratch of that size starts as (~72
/// KiB of metadata for 32 GiB), made once with mkfs (~10 ms) into the
/// cache, root's private runtime directory; opened for reading.
fn template(cache: &Path, bytes: u64) -> Result<fs::File, String> {
    // The name carries the mkfs options' version: a template made with other
    // options is never taken for one of these.
    let template = cache.join(format!("scratch-v5-{bytes}.ext4"));
    if !template.exists() {
        fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(cache)
            .map_err(|e| format!("creating {}: {e}", cache.display()))?;
        // Unique per call: two builds of one process (a worker's jobs) may
        // both find the template missing, and two mkfs runs writing one
        // file make an image whose blocks disagree (CI caught this).
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = cache.join(format!(
            "scratch-v5-{bytes}.ext4.tmp{}-{n}",
            std::process::id()
        ));
        let made = make_ext4(&tmp, bytes).and_then(|()| {
            fs::rename(&tmp, &template)
                .map_err(|e| format!("installing {}: {e}", template.display()))
        });
        if made.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        made?;
        sweep_templates(cache, &template);
    }
    fs::File::open(&template).map_err(|e| format!("opening {}: {e}", template.display()))
}

/// A sparse file of `bytes` in `dir` with nothing written in it and no
/// name (`O_TMPFILE`): the loop device's backing file, which the host
/// frees as the device lets go of it, so that not even a build killed
/// outright leaves an image behind.
///
/// Nothing is written into it: `LOOP_CONFIGURE` fsyncs its backing file,
/// and on ext4 without a journal a named file's fsync also writes out its
/// directory entry and a copy's dirty pages, a write to the host's disk
/// and a cache flush each. The template goes onto the attached device
/// instead, into the device's page cache, where the mount reads it; it
/// reaches the image only as the file system is unmounted.
///
/// Where `$TMPDIR`'s file system has no `O_TMPFILE` (overlayfs before
/// Linux 6.6, NFS), the image is a named file unlinked at once: the fd
/// holds it, and only a build killed in between leaves it, in its area,
/// for the next build's sweep.
fn empty_image(dir: &Path, bytes: u64) -> Result<fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut open = fs::File::options();
    open.read(true).write(true).mode(0o600);
    let f = match open.clone().custom_flags(libc::O_TMPFILE).open(dir) {
        Ok(f) => f,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let named = dir.join("scratch.img");
            let f = (open.create_new(true).open(&named))
                .map_err(|e| format!("creating {}: {e}", named.display()))?;
            let _ = fs::remove_file(&named);
            f
        }
        Err(e) => {
            return Err(format!(
                "creating an unnamed file in {}: {e}",
                dir.display()
            ))
        }
    };
    f.set_len(bytes)
        .map_err(|e| format!("sizing the scratch image in {}: {e}", dir.display()))?;
    Ok(f)
}

/// Templates of other sizes not used for a week go when a new one is made.
fn sweep_templates(cache: &Path, keep: &Path) {
    let Ok(rd) = fs::read_dir(cache) else { return };
    let week = std::time::Duration::from_secs(7 * 24 * 3600);
    for e in rd.flatten() {
        let p = e.path();
        let is_template = e.file_name().to_string_lossy().starts_with("scratch-");
        let old = e
            .metadata()
            .and_then(|m| m.accessed())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > week);
        if is_template && p != keep && old {
            let _ = fs::remove_file(p);
        }
    }
}

fn make_ext4(image: &Path, bytes: u64) -> Result<(), String> {
    let f = fs::File::create(image).map_err(|e| format!("creating {}: {e}", image.display()))?;
    f.set_len(bytes)
        .map_err(|e| format!("sizing {}: {e}", image.display()))?;
    drop(f);
    // A small journal (see below): not for crashes (the scratch never outlives one) but
    // because ext4 without one, picking a new inode, skips those freed in
    // an earlier second whose inode-table block is cached — so on a
    // recycled scratch the next build's first file would get an inode
    // number telling how many the build before made and removed (see
    // `pool.rs`). Mounted `data=writeback`, it cost nothing measurable on
    // a tree of 3,000 files and this workspace's sources copied and
    // removed (204 against 220 ms). No reserved blocks, lazy init: about
    // 10 ms even for tens of GiB. No blocks reserved for
    // growing it online (it is never resized) and no superblock backups
    // (nothing ever repairs a scratch): the template's data shrinks from
    // 4.5 MiB to ~72 KiB for 32 GiB, which each build writes onto its
    // loop device. Every bitmap and inode table packed at the start of the
    // device: the template is 4 extents instead of 21, and where the host
    // discards freed blocks synchronously (ext4 without a journal mounted
    // `discard`), freeing it at the end of the build took 3.7–4.4 ms with
    // them spread and takes 1.3 ms packed. And one flex group for the
    // whole device (a block group is 128 MiB): the allocator keeps a
    // build's inodes, directories and data together rather than spread
    // over groups, and a trivial build leaves the image 6 extents (each
    // one discarded when it is freed) instead of 17.
    let flex_groups = bytes.div_ceil(128 << 20).next_power_of_two().max(16);
    // A MiB of journal per 64 MiB of scratch, at least 1 (1,024 of the
    // small file system's 1 KiB blocks, mkfs's floor) and at most 16: the
    // room it takes from `[limits] disk`, and the most a scratch writes to
    // the host's disk for it, stay small.
    let journal_mib = (bytes >> 26).clamp(1, 16);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0"])
        .args(["-G", &flex_groups.to_string()])
        .args(["-O", "has_journal,^resize_inode,sparse_super2"])
        .args(["-J", &format!("size={journal_mib}")])
        .args([
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,nodiscard,packed_meta_blocks=1,num_backup_sb=0",
        ])
        .arg(image))?;
    // Made once here rather than removed by every build: a scratch's root
    // starts empty, and a build does not pay an rmdir (an inode and a block
    // freed in the fresh file system) before it starts.
    run(Command::new("debugfs")
        .args(["-w", "-R", "rmdir lost+found"])
        .arg(image))
}

/// Write the data extents of `from` (SEEK_DATA/SEEK_HOLE) onto `to` at
/// the same offsets; `to` may be a block device (which `copy_file_range`
/// does not write), and its ranges under `from`'s holes are left alone.
fn copy_extents(from: &fs::File, to: &fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let src = from.as_raw_fd();
    let mut buf = Vec::new();
    let mut off: i64 = 0;
    loop {
        // SAFETY: lseek on an fd we own.
        let data = unsafe { libc::lseek64(src, off, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                return Ok(());
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek64(src, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error());
        }
        buf.resize((hole - data) as usize, 0);
        from.read_exact_at(&mut buf, data as u64)?;
        to.write_all_at(&buf, data as u64)?;
        off = hole;
    }
}

/// mount(2) the ext4 on `dev` at `at`, `nosuid,nodev,noatime,noinit_itable,nobarrier,data=writeback`,
/// and turn off the allocator's bitmap prefetch.
fn mount_ext4(dev: &Path, at: &Path) -> Result<(), String> {
    // Never zero the inode tables in the background: a scratch of tens of
    // GiB would otherwise write hundreds of MiB of zeros to the host's disk
    // during every build. Nor prefetch the block bitmaps: that starts a
    // kernel thread per mount reading every group's bitmap while the build
    // runs. Kernels before 5.8 know only the first option. And no cache
    // flushes (`nobarrier`): the scratch is thrown away after the build and
    // never has to survive a crash, yet every flush the loop device gets
    // becomes an fsync of its image on the host's disk — the unmount's own
    // took ~1 ms of every build, and a build's fsyncs inside its scratch
    // paid one each.
    let mut r = Ok(());
    for opts in [
        "noinit_itable,no_prefetch_block_bitmaps,nobarrier,data=writeback",
        "noinit_itable,nobarrier,data=writeback",
    ] {
        r = mount_scratch(dev.as_os_str().as_bytes(), at, "ext4", opts);
        if !matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
            break;
        }
    }
    r.map_err(|e| format!("mounting {} at {}: {e}", dev.display(), at.display()))?;
    no_allocator_prefetch(dev);
    Ok(())
}

/// Stop mballoc from prefetching block bitmaps when it allocates
/// (`/sys/fs/ext4/DEV/mb_prefetch` = 0). The scratch's first block
/// allocation (the first directory made in it) scanned and prefetched the
/// bitmaps of the groups that the packed inode tables fill, ~4 ms of every
/// build; without the prefetch it takes ~0.06 ms, and the bitmaps it then
/// reads on demand sit in the host's page cache with the template's copy.
/// Only speed depends on it, so a host without that file (an old kernel,
/// no sysfs) goes on without it.
fn no_allocator_prefetch(dev: &Path) {
    if let Some(name) = dev.file_name() {
        let knob = Path::new("/sys/fs/ext4").join(name).join("mb_prefetch");
        let _ = fs::write(knob, b"0");
    }
}

/// The source of a memory scratch in the mount table: what the mount
/// registry checks before it detaches a dead build's scratch.
const TMPFS_SOURCE: &str = "fhsx-scratch";

/// Mount a tmpfs of `bytes` and `inodes` at `at`, root's and 0755 until
/// [`WorkArea::hand_over`] gives it to the build user.
fn mount_tmpfs(at: &Path, bytes: u64, inodes: u64) -> Result<(), String> {
    let opts = format!("size={bytes},nr_inodes={inodes},mode=0755,uid=0,gid=0,huge=never");
    mount_scratch(TMPFS_SOURCE.as_bytes(), at, "tmpfs", &opts)
        .map_err(|e| format!("mounting a tmpfs at {}: {e}", at.display()))
}

/// `mount(2)` of a scratch file system: `nosuid`, `nodev`, `noatime`.
fn mount_scratch(source: &[u8], at: &Path, fstype: &str, opts: &str) -> std::io::Result<()> {
    let c = |b: &[u8]| {
        std::ffi::CString::new(b).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a NUL byte in a mount argument",
            )
        })
    };
    let (src, dst) = (c(source)?, c(at.as_os_str().as_bytes())?);
    let (fstype, opts) = (c(fstype.as_bytes())?, c(opts.as_bytes())?);
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
            opts.as_ptr().cast(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Loop devices by ioctl (the `mount` binary costs more than the mount).
mod loopdev {
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::path::{Path, PathBuf};

    const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
    const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;

    #[repr(C)]
    struct LoopInfo64 {
        device: u64,
        inode: u64,
        rdevice: u64,
        offset: u64,
        sizelimit: u64,
        number: u32,
        encrypt_type: u32,
        encrypt_key_size: u32,
        flags: u32,
        file_name: [u8; 64],
        crypt_name: [u8; 64],
        encrypt_key: [u8; 32],
        init: [u64; 2],
    }

    #[repr(C)]
    struct LoopConfig {
        fd: u32,
        block_size: u32,
        info: LoopInfo64,
        reserved: [u64; 8],
    }

    /// Bind `backing` to a free loop device that detaches itself once the
    /// file system on it is unmounted (autoclear); returns the device and
    /// its fd, to be held until the device is mounted.
    pub(super) fn attach(backing: &File) -> Result<(PathBuf, File), String> {
        let open_rw = |p: &Path| File::options().read(true).write(true).open(p);
        let ctl = open_rw(Path::new("/dev/loop-control"))
            .map_err(|e| format!("opening /dev/loop-control (modprobe loop): {e}"))?;
        // Another process may take the device between GET_FREE and
        // CONFIGURE (EBUSY): ask again.
        for _ in 0..16 {
            // SAFETY: a plain ioctl without argument.
            let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if n < 0 {
                return Err(format!(
                    "no free loop device: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let dev = PathBuf::from(format!("/dev/loop{n}"));
            let f = open_rw(&dev).map_err(|e| format!("opening {}: {e}", dev.display()))?;
            // SAFETY: all-zero is a valid LoopConfig (no flags, no offset).
            let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
            cfg.fd = backing.as_raw_fd() as u32;
            cfg.info.flags = LO_FLAGS_AUTOCLEAR;
            // SAFETY: cfg is a valid loop_config for the call.
            if unsafe { libc::ioctl(f.as_raw_fd(), LOOP_CONFIGURE, &cfg) } == 0 {
                return Ok((dev, f));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(format!("configuring {}: {e}", dev.display()));
            }
        }
        Err("every free loop device was taken before it could be configured".into())
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
        .map_err(|e| format!("cannot run {name} (apt-get install e2fsprogs): {e}"))?;
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
    statvfs(p).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize))
}

/// `statvfs(2)` of the file system holding `p`.
pub(crate) fn statvfs(p: &Path) -> Option<libc::statvfs> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid out-buffer; c is NUL-terminated.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut s) == 0).then_some(s)
    }
}

/// Remove the areas of builds that died without cleaning up: their lock is
/// free. Mounts still under them (the scratch, a view whose daemon died
/// with its owner) are detached first (`castore_fuse::detach`, which also
/// works without root for our views), so nothing is deleted through them
/// into a store or a host directory.
pub fn sweep_abandoned(tmp: &Path) -> Vec<PathBuf> {
    let mut swept = Vec::new();
    let Ok(rd) = fs::read_dir(tmp) else {
        return swept;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if name.as_bytes().starts_with(STAGING.as_bytes()) {
            // A creator killed between mkdir and rename; a live one renames
            // within microseconds.
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 600);
            if stale {
                remove_all(&e.path());
            }
            continue;
        }
        // `fhsx-parked-*`: scratch file systems that earlier versions parked
        // for later processes, swept like any area whose owner is gone.
        if !name.as_bytes().starts_with(PREFIX.as_bytes())
            && !name.as_bytes().starts_with(b"fhsx-parked-")
        {
            continue;
        }
        let dir = e.path();
        // Only areas with a lock: one kept for inspection had it removed
        // (an area is locked before it gets this name). An empty one
        // without a lock is what a remover killed at the very end left.
        let Ok(lock) = fs::File::open(dir.join(LOCK)) else {
            let _ = fs::remove_dir(&dir);
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
            let _ = castore_fuse::detach(&m);
        }
        if still_mounted_below(&dir).is_empty() && remove_area(&dir) {
            swept.push(dir);
        }
    }
    swept
}

/// Mount points at or below `dir`, from this process's mount table.
pub(crate) fn still_mounted_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        // Without a mount table nothing can be proven safe to delete.
        return vec![dir.to_path_buf()];
    };
    executor_sandbox::probe::parse_mountinfo(&info)
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|m| m.starts_with(dir))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// As root the disk scratch is mounted `nobarrier` (it never has to
    /// survive a crash) and its allocator does not prefetch block bitmaps
    /// (with them, the first directory made in it took ~4 ms). Without
    /// root there is no scratch file system to tune.
    #[test]
    fn a_disk_scratch_skips_flushes_and_bitmap_prefetch() {
        let mut area =
            WorkArea::create(64 << 20, ScratchMedium::Disk, Box::new(|_| Ok(()))).unwrap();
        area.ready().unwrap();
        let mounted = matches!(&area.fs, ScratchFs::Ready(m) if m.mounted);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(!mounted, "a scratch file system without root");
            return;
        }
        assert!(mounted, "no scratch file system as root");
        let at = area.scratch().to_str().unwrap().to_owned();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mountinfo
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(at.as_str()))
            .unwrap_or_else(|| panic!("{at} is not a mount point:\n{mountinfo}"));
        let (_, tail) = line.split_once(" - ").unwrap();
        let fields: Vec<&str> = tail.split(' ').collect();
        assert_eq!(fields[0], "ext4", "{line}");
        assert!(fields[2].split(',').any(|o| o == "nobarrier"), "{line}");
        let dev = Path::new(fields[1]).file_name().unwrap().to_string_lossy();
        let knob = format!("/sys/fs/ext4/{dev}/mb_prefetch");
        let value = fs::read_to_string(&knob).unwrap_or_else(|e| panic!("{knob}: {e}"));
        assert_eq!(value.trim(), "0", "{knob}");
        // The image has no name: nothing for a killed build to leave.
        let backing = format!("/sys/block/{dev}/loop/backing_file");
        let backing = fs::read_to_string(&backing).unwrap_or_else(|e| panic!("{backing}: {e}"));
        assert!(backing.trim_end().ends_with("(deleted)"), "{backing}");
        let names: Vec<_> = (fs::read_dir(area.path()).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| n == "build" || n == LOCK), "{names:?}");
        // The template written onto the device is what the mount found: an
        // ext4 whose root holds nothing (the template has no lost+found).
        assert_eq!(fs::read_dir(area.scratch()).unwrap().count(), 0);
    }

    /// What a build killed while removing its own area can leave, and
    /// what a sweep then does: an area still holding its (free) lock is
    /// taken, whatever is left in it; an empty one without a lock (killed
    /// between the lock and the directory) is taken; a kept area (content,
    /// its lock removed on purpose) stays; a live area (lock held) stays.
    #[test]
    fn a_sweep_takes_what_a_killed_remover_left_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let area = |name: &str| {
            let d = tmp.path().join(format!("{PREFIX}{name}"));
            fs::create_dir_all(d.join("build/deep")).unwrap();
            fs::write(d.join("build/deep/f"), b"x").unwrap();
            d
        };
        let half = area("half");
        fs::write(half.join(LOCK), b"").unwrap();
        let bare = tmp.path().join(format!("{PREFIX}bare"));
        fs::create_dir(&bare).unwrap();
        let kept = area("kept");
        let live = area("live");
        let held = fs::File::create(live.join(LOCK)).unwrap();
        // SAFETY: flock on an fd we own.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
        // A scratch an earlier version parked, its lock free: swept too.
        let parked = tmp.path().join("fhsx-parked-old");
        fs::create_dir_all(parked.join("build")).unwrap();
        fs::write(parked.join(LOCK), b"").unwrap();
        // A creator killed before its rename, ten minutes ago; one at work.
        let staged = |name: &str, age: u64| {
            let d = tmp.path().join(format!("{STAGING}{name}"));
            fs::create_dir_all(d.join("x")).unwrap();
            let then = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            fs::File::open(&d).unwrap().set_modified(then).unwrap();
            d
        };
        let (old_staged, new_staged) = (staged("old", 601), staged("new", 0));
        let mut swept = sweep_abandoned(tmp.path());
        swept.sort();
        assert_eq!(swept, vec![half.clone(), parked.clone()]);
        assert!(
            !half.exists() && !bare.exists(),
            "a killed remover's area is left"
        );
        assert!(
            !old_staged.exists(),
            "a dead creator's staging area is left"
        );
        assert!(
            new_staged.exists(),
            "a creator at work lost its staging area"
        );
        assert!(kept.join("build/deep/f").exists(), "a kept area was swept");
        assert!(live.join("build/deep/f").exists(), "a live area was swept");
        // Removed by its owner, the lock goes last.
        drop(held);
        assert!(remove_area(&live) && !live.exists());
    }

    /// Builds of one worker start at once and all find the template
    /// missing: every image they get is a sound ext4 (`e2fsck -fn`).
    #[test]
    fn concurrent_first_images_are_all_sound() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        let images: Vec<PathBuf> = (0..4).map(|i| d.path().join(format!("img{i}"))).collect();
        std::thread::scope(|s| {
            for img in &images {
                let cache = &cache;
                s.spawn(move || {
                    let template = template(cache, 64 << 20).unwrap();
                    let to = fs::File::create(img).unwrap();
                    to.set_len(64 << 20).unwrap();
                    copy_extents(&template, &to).unwrap();
                });
            }
        });
        for img in &images {
            let o = Command::new("e2fsck")
                .args(["-f", "-n"])
                .arg(img)
                .output()
                .expect("e2fsck is needed: apt-get install e2fsprogs");
            assert!(
                o.status.success(),
                "{} is not a sound ext4: {}{}",
                img.display(),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    /// Data extents arrive byte for byte, holes stay holes (the copy onto a
    /// mostly empty 64 MiB file takes about as much disk as its data).
    #[test]
    fn copy_extents_keeps_data_and_holes() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let mut f = fs::File::create(&a).unwrap();
        f.set_len(64 << 20).unwrap();
        for (off, byte) in [(0u64, b'x'), (16 << 20, b'y'), ((64 << 20) - 4096, b'z')] {
            f.seek(SeekFrom::Start(off)).unwrap();
            f.write_all(&[byte; 4096]).unwrap();
        }
        f.sync_all().unwrap();
        let from = fs::File::open(&a).unwrap();
        let to = fs::File::create(&b).unwrap();
        to.set_len(64 << 20).unwrap();
        copy_extents(&from, &to).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        fs::File::open(&a).unwrap().read_to_end(&mut x).unwrap();
        fs::File::open(&b).unwrap().read_to_end(&mut y).unwrap();
        assert!(x == y, "the copy differs");
        use std::os::unix::fs::MetadataExt;
        let blocks = fs::metadata(&b).unwrap().blocks() * 512;
        assert!(
            blocks < 8 << 20,
            "the copy filled its holes: {blocks} bytes on disk"
        );
    }
}
