//! A mount's life: preflight, mount, serve, unmount, collect — and the
//! cleanup of mounts whose owner died.
//!
//! Every live mount has a record in a registry directory naming the owning
//! process (pid plus its start time, so a recycled pid is not mistaken for
//! the owner). [`mount`] first runs [`cleanup_stale_mounts`], so a mount left
//! by a `kill -9`ed process is detached the next time anyone mounts; the
//! kernel already aborted its FUSE connection when the process died, so such
//! a mount never served another byte.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use castore::store::{DirectoryStore, LocalStore};
use castore::Digest;
use fuser::{Config, MountOption, SessionACL};

use crate::compact::CompactReadSet;
use crate::fs::{Shared, ViewFs};
use crate::readset::ReadSet;
use crate::{Error, IntegrityFailure, Result};

/// The default [`MountOptions::max_read_set_entries`]: 4 million entries.
/// At the cap an absence flood costs the daemon about 20 bytes plus the
/// name per entry (measured: 45 bytes an entry peak RSS for 24-byte names,
/// so ~180 MB), and the stored read set is ~80 bytes plus the path per entry
/// (~330 MB for such a flood).
pub const DEFAULT_MAX_READ_SET_ENTRIES: u64 = 4_000_000;

/// The `source` field of our mounts in `/proc/self/mountinfo`.
pub const FS_NAME: &str = "fhsx-view";

/// How to serve a view.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Serving threads (each with its own `/dev/fuse` clone).
    pub threads: usize,
    /// Hand opened files to the kernel (FUSE passthrough, Linux ≥ 6.9, needs
    /// CAP_SYS_ADMIN): reads then run at native speed. Opens are still
    /// verified and logged. Falls back to daemon-served reads when refused.
    pub passthrough: bool,
    /// Let other users (a sandbox's mapped uid) use the mount. Root only.
    pub allow_other: bool,
    /// Where live mounts are registered; see [`default_registry`].
    pub registry: PathBuf,
    /// The most read-set entries (distinct observed paths, absences
    /// included) one mount records; default
    /// [`DEFAULT_MAX_READ_SET_ENTRIES`]. Past it, a request that would add
    /// a new entry fails with `ENOMEM` (so the kernel caches nothing for
    /// it), nothing more is recorded, and the outcome's
    /// `read_set_overflow` says the set is incomplete (its `check` fails).
    /// Paths already in the set keep working. `u64::MAX`: no cap.
    pub max_read_set_entries: u64,
    /// The order listings come back in (default: sorted by name bytes).
    pub readdir_order: crate::fs::ReaddirOrder,
    /// The constant time every file and directory is served with, in
    /// seconds since the epoch (default 1: 1970-01-01T00:00:01Z).
    pub mtime_secs: u64,
    /// Store files already hashed and found right: a mount does not hash
    /// such a file again (default: the table the whole process shares;
    /// give a fresh one to hash every blob at its first open in this mount).
    pub verified: Arc<crate::verified::VerifiedBlobs>,
    /// Opens without a message (the kernel's `no_open`): the first open is
    /// answered `ENOSYS`, and from then on the kernel opens files of this
    /// mount without asking (no `OPEN`, no `RELEASE`) and keeps their pages
    /// across opens. A file is then recorded as read, and verified, at its
    /// first `READ` — the first time any of its bytes are wanted, by
    /// `read` or by a page fault of a mapping — and an empty regular file
    /// at its lookup, since its attributes already show all of it. For
    /// builds, which open the same headers and tools thousands of times:
    /// a 599-unit C build spent twice the host's system time on opens
    /// otherwise. It rules out passthrough (a first read of each page goes
    /// through the daemon). Default off.
    pub zero_message_open: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 8);
        MountOptions {
            threads,
            passthrough: true,
            allow_other: is_root(),
            registry: default_registry(),
            max_read_set_entries: DEFAULT_MAX_READ_SET_ENTRIES,
            readdir_order: crate::fs::ReaddirOrder::Sorted,
            mtime_secs: 1,
            verified: crate::verified::VerifiedBlobs::process(),
            zero_message_open: false,
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `/run/fhsx/mounts` for root, else `$XDG_RUNTIME_DIR/fhsx/mounts`, else
/// `/tmp/fhsx-<uid>/mounts`: a place that does not survive a reboot, as the
/// mounts it describes do not.
pub fn default_registry() -> PathBuf {
    if is_root() {
        return PathBuf::from("/run/fhsx/mounts");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("fhsx/mounts");
    }
    // SAFETY: as above.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/tmp/fhsx-{uid}/mounts"))
}

/// Fail early, with the fix in the message, when this machine cannot mount
/// FUSE at all.
pub fn preflight() -> Result<()> {
    let dev = Path::new("/dev/fuse");
    if !dev.exists() {
        return Err(Error::FuseUnavailable("/dev/fuse does not exist".into()));
    }
    if let Err(e) = fs::File::options().read(true).write(true).open(dev) {
        // fusermount3 opens the device with the caller's permissions too,
        // so a non-root user needs the mode udev gives it on a stock host.
        return Err(Error::FuseUnavailable(format!(
            "cannot open /dev/fuse: {e}{}",
            if is_root() {
                ""
            } else {
                " (a non-root user needs it mode 0666, as udev sets it on a stock system: `chmod 0666 /dev/fuse` as root)"
            }
        )));
    }
    if !is_root() && which("fusermount3").is_none() {
        return Err(Error::FuseUnavailable(
            "not root and fusermount3 is not on PATH".into(),
        ));
    }
    Ok(())
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(prog))
            .find(|p| p.is_file())
    })
}

/// The read set hit [`MountOptions::max_read_set_entries`]: it is
/// incomplete, and a build that ran on this mount must not be recorded as if
/// it were.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadSetOverflow {
    /// The cap that was hit (`max_read_set_entries`).
    pub max_entries: u64,
    /// Requests for new paths refused (failed with `ENOMEM`) past it.
    pub refused: u64,
}

impl std::fmt::Display for ReadSetOverflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the read set reached max_read_set_entries = {} and {} request(s) for new paths were refused",
            self.max_entries, self.refused
        )
    }
}

fn check_outcome(failures: &[IntegrityFailure], overflow: Option<ReadSetOverflow>) -> Result<()> {
    if !failures.is_empty() {
        return Err(Error::Integrity(failures.to_vec()));
    }
    match overflow {
        Some(o) => Err(Error::ReadSetIncomplete(o)),
        None => Ok(()),
    }
}

/// What a finished mount observed.
#[derive(Debug, Clone)]
pub struct MountOutcome {
    /// The canonical read set.
    pub read_set: ReadSet,
    /// The digest of its encoding, under which it is stored.
    pub read_set_digest: Digest,
    /// Blobs the view refused to serve because their bytes were wrong.
    pub integrity_failures: Vec<IntegrityFailure>,
    /// Set when the read set is incomplete (the entry cap was hit).
    pub read_set_overflow: Option<ReadSetOverflow>,
}

impl MountOutcome {
    /// `Err(Error::Integrity)` naming every refused path, if there was one;
    /// else `Err(Error::ReadSetIncomplete)` if the read set hit its cap.
    pub fn check(&self) -> Result<()> {
        check_outcome(&self.integrity_failures, self.read_set_overflow)
    }
}

/// What a finished mount observed, with the read set kept compact (about
/// 20–40 bytes an entry instead of ~150 for a [`ReadSet`]): from
/// [`MountGuard::finish_compact`].
#[derive(Debug)]
pub struct CompactOutcome {
    /// The canonical read set, compact; iterate it with `iter()`.
    pub read_set: CompactReadSet,
    /// The digest of its encoding, under which it is stored.
    pub read_set_digest: Digest,
    /// Blobs the view refused to serve because their bytes were wrong.
    pub integrity_failures: Vec<IntegrityFailure>,
    /// Set when the read set is incomplete (the entry cap was hit).
    pub read_set_overflow: Option<ReadSetOverflow>,
}

impl CompactOutcome {
    /// As [`MountOutcome::check`].
    pub fn check(&self) -> Result<()> {
        check_outcome(&self.integrity_failures, self.read_set_overflow)
    }
}

/// A live mount. Dropping it unmounts (lazily) and discards the read set;
/// [`MountGuard::finish`] unmounts and returns it.
pub struct MountGuard {
    mountpoint: PathBuf,
    shared: Arc<Shared>,
    session: Option<fuser::BackgroundSession>,
    /// The prefill thread (mounts without opens), joined after the serving
    /// threads.
    prefill: Option<std::thread::JoinHandle<()>>,
    /// The child and thread warming the mount ([`MountGuard::warm`]),
    /// ended at the unmount.
    warming: Option<crate::warm::Warming>,
    record: Option<PathBuf>,
    /// An `O_PATH` descriptor of the mount's root, held until the
    /// connection has been ended: while it is open the superblock lives,
    /// so the connection number `conn` names this mount and no other
    /// (see [`MountGuard::unmount`]).
    pin: Option<std::os::fd::OwnedFd>,
    /// The FUSE connection number (fusectl's directory name), when known.
    conn: Option<u64>,
    /// Keep `pin` past the unmount ([`MountGuard::finish_deferred`]).
    keep_superblock: bool,
}

/// The superblock of an ended mount ([`MountGuard::finish_deferred`]):
/// freed when this is dropped.
#[derive(Debug)]
pub struct Teardown {
    _superblock: Option<std::os::fd::OwnedFd>,
}

impl std::fmt::Debug for MountGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountGuard")
            .field("mountpoint", &self.mountpoint)
            .field("root", &self.shared.root())
            .finish()
    }
}

/// Mount the tree `root` of `store` read-only at `mountpoint` (an existing
/// directory). Returns once the kernel has accepted the mount.
pub fn mount(
    store: &LocalStore,
    root: &Digest,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<MountGuard> {
    preflight()?;
    // Leftovers of killed owners go first: one of them may sit right here.
    let _ = cleanup_stale_mounts(&opts.registry);
    let mountpoint = fs::canonicalize(mountpoint).map_err(|e| Error::BadMountpoint {
        path: mountpoint.to_path_buf(),
        reason: e.to_string(),
    })?;
    if !mountpoint.is_dir() {
        return Err(Error::BadMountpoint {
            path: mountpoint,
            reason: "not a directory".into(),
        });
    }
    // The root must be a directory the store holds, verified, before the
    // kernel ever asks for it.
    let root_dir = store.get_directory(root)?;
    let shared = Arc::new(Shared::new(store.clone(), *root, root_dir.size(), opts));

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(FS_NAME.into()),
        MountOption::Subtype("fhsx".into()),
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
    ];
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;

    fs::create_dir_all(&opts.registry).map_err(|source| Error::Registry {
        path: opts.registry.clone(),
        source,
    })?;
    let session = fuser::Session::new(
        ViewFs {
            shared: shared.clone(),
        },
        &mountpoint,
        &config,
    )
    .map_err(|source| Error::Mount {
        path: mountpoint.clone(),
        source,
    })?;
    let record = write_record(&opts.registry, &mountpoint, None).ok();
    let session = session.spawn().map_err(|source| Error::Mount {
        path: mountpoint.clone(),
        source,
    })?;
    let prefill = if shared.wants_prefill() {
        // Without it the view still works: pages then come by `READ`.
        crate::prefill::Prefill::start(session.notifier())
            .ok()
            .map(|(p, thread)| {
                shared.set_prefill(Some(p));
                thread
            })
    } else {
        None
    };
    // Only now is anyone serving: a stat before this would wait forever.
    let pin = pin_root(&mountpoint);
    let conn = pin.as_ref().and_then(connection_of);
    Ok(MountGuard {
        mountpoint,
        shared,
        session: Some(session),
        prefill,
        warming: None,
        record,
        pin,
        conn,
        keep_superblock: false,
    })
}

impl MountGuard {
    /// Warm this mount for the build about to run on it (see `warm.rs`):
    /// a child lists the root and then reads the first byte of what `find`
    /// (run on a thread of the mount's, which also verifies those blobs)
    /// names — the command the build starts with and its interpreter —
    /// so the sandbox's set-up never looks up a root entry through the
    /// daemon and its first exec finds its file verified and in the page
    /// cache. Wait for the listing with [`root_listed`](Self::root_listed)
    /// before the sandbox looks at the view. Once per mount.
    pub fn warm(
        &mut self,
        find: impl FnOnce() -> Vec<crate::warm::FirstOpen> + Send + 'static,
    ) -> std::io::Result<()> {
        if self.warming.is_some() {
            return Ok(());
        }
        self.warming = Some(crate::warm::Warming::start(
            &self.mountpoint,
            Box::new(find),
        )?);
        Ok(())
    }

    /// Wait for the root's listing ([`warm`](Self::warm)); at once if the
    /// mount is not being warmed.
    pub fn root_listed(&mut self) -> std::io::Result<()> {
        match &mut self.warming {
            Some(w) => w.root_listed(&self.mountpoint),
            None => Ok(()),
        }
    }

    /// The FUSE connection number (fusectl's name for it), when known.
    pub fn connection(&self) -> Option<u64> {
        self.conn
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn root(&self) -> Digest {
        self.shared.root()
    }

    /// Whether reads are served by the kernel from the blob files.
    pub fn passthrough_active(&self) -> bool {
        self.shared.passthrough_active()
    }

    /// Whether the kernel connection is still up (false once someone
    /// unmounted the view from outside, or the connection was aborted).
    pub fn is_serving(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    /// Integrity failures so far (the mount keeps serving everything else).
    pub fn integrity_failures(&self) -> Vec<IntegrityFailure> {
        self.shared.failures()
    }

    /// Unmount, wait for the serving threads, and store the read set in
    /// `store`. Integrity failures and an overflowing read set are reported
    /// in the outcome (see [`MountOutcome::check`]), not as an error: the
    /// read set is still wanted. Materialises the whole set as a
    /// [`ReadSet`]; [`finish_compact`](Self::finish_compact) does not.
    pub fn finish(self, store: &LocalStore) -> Result<MountOutcome> {
        let c = self.finish_compact(store)?;
        Ok(MountOutcome {
            read_set: c.read_set.to_read_set(),
            read_set_digest: c.read_set_digest,
            integrity_failures: c.integrity_failures,
            read_set_overflow: c.read_set_overflow,
        })
    }

    /// [`finish`](Self::finish) without materialising the read set: it
    /// stays compact, and its encoding is streamed into the store.
    pub fn finish_compact(self, store: &LocalStore) -> Result<CompactOutcome> {
        self.finish_with(store, None)
    }

    /// [`finish_compact`](Self::finish_compact), rooting the stored read
    /// set in `roots` before any gc can see it.
    pub fn finish_rooted(
        self,
        store: &LocalStore,
        roots: &castore::TempRoots,
    ) -> Result<CompactOutcome> {
        self.finish_with(store, Some(roots))
    }

    /// [`finish_rooted`](Self::finish_rooted), leaving the last of the
    /// unmount to the caller: the connection is ended and every serving
    /// thread gone (so the read set is whole), but the superblock — its
    /// inodes and page cache, ~0.3–0.5 ms to free after a build that
    /// exec'd a 2 MB binary — goes only when the returned [`Teardown`] is
    /// dropped, which the caller can do on a thread of its own while it
    /// goes on. Where the connection could not be aborted, the superblock
    /// had to go for it to end, and the teardown holds nothing.
    pub fn finish_deferred(
        mut self,
        store: &LocalStore,
        roots: &castore::TempRoots,
    ) -> Result<(CompactOutcome, Teardown)> {
        self.keep_superblock = true;
        self.unmount()?;
        let teardown = Teardown {
            _superblock: self.pin.take(),
        };
        self.finish_with(store, Some(roots)).map(|c| (c, teardown))
    }

    fn finish_with(
        mut self,
        store: &LocalStore,
        roots: Option<&castore::TempRoots>,
    ) -> Result<CompactOutcome> {
        self.unmount()?;
        let read_set = self.shared.freeze();
        let read_set_digest = match roots {
            Some(r) => read_set.store_rooted(store, r)?,
            None => read_set.store(store)?,
        };
        let (refused, max_entries) = self.shared.refused();
        Ok(CompactOutcome {
            read_set,
            read_set_digest,
            integrity_failures: self.shared.failures(),
            read_set_overflow: (refused > 0).then_some(ReadSetOverflow {
                max_entries,
                refused,
            }),
        })
    }

    /// New paths refused so far because the read set is full (cheap; a
    /// watchdog can end the build as soon as this is non-zero).
    pub fn read_set_refused(&self) -> u64 {
        self.shared.refused().0
    }

    fn unmount(&mut self) -> Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // Warming still at work ends first, while the daemon serves it: its
        // child holds the mount's root open (the connection would outlive
        // the detach), and what it reads is the build's to record.
        if let Some(w) = self.warming.take() {
            w.finish();
        }
        let r = detach(&self.mountpoint);
        // The connection is ended by its number while the pin keeps the
        // superblock alive: the number is ours until the pin is dropped.
        // Once the superblock is gone the kernel hands the number to the
        // next mount, and an abort by number would end some other build's
        // view (seen with 150 builds at once: a view read ENOTCONN).
        let aborted = self.conn.is_some_and(abort_connection);
        // Without the abort only the superblock's end ends the connection.
        if !(aborted && self.keep_superblock) {
            self.pin = None;
        }

        // Nothing offers files from here on: the prefill thread drains its
        // queue (every store fails fast on an ended connection) and ends
        // while the serving threads do.
        self.shared.set_prefill(None);
        // Without fusectl, the detach ends the connection once nothing below
        // it is open; something still holding a file keeps it alive.
        let limit = if aborted {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(2)
        };
        let r = if wait_finished(&session.guard, limit) {
            let _ = session.join();
            if let Some(t) = self.prefill.take() {
                let _ = t.join();
            }
            r
        } else {
            // Leave the threads to the kernel rather than hang the caller.
            drop(session);
            Err(std::io::Error::other(if aborted {
                "the FUSE connection was aborted but its serving threads did not end; they are left running"
            } else {
                "a file in the view is still open and the FUSE connection could not be aborted (is fusectl mountable?); its serving threads are left running"
            }))
        };
        if let Some(rec) = self.record.take() {
            let _ = fs::remove_file(rec);
        }
        r.map_err(|source| Error::Unmount {
            path: self.mountpoint.clone(),
            source,
        })
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = self.unmount();
    }
}

fn wait_finished(t: &std::thread::JoinHandle<std::io::Result<()>>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !t.is_finished() {
        if Instant::now() >= deadline {
            return false;
        }
        // Short naps: the threads end within ~0.1 ms of the abort, and
        // this wait is on every build's way out.
        std::thread::sleep(Duration::from_micros(20));
    }
    true
}

/// Lazily unmount `path` (any mount; without root only a FUSE mount of
/// ours, through `fusermount3`); "not mounted" is success.
pub fn detach(path: &Path) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()),
        // Not root: only the setuid fusermount3 may unmount, and it checks
        // that the mount is a FUSE mount of ours before it does.
        Some(libc::EPERM) => fusermount_detach(path),
        _ => Err(e),
    }
}

/// `fusermount3 -u -z -- PATH`, the unprivileged owner's lazy unmount;
/// "no longer mounted" counts as done.
fn fusermount_detach(path: &Path) -> std::io::Result<()> {
    let out = std::process::Command::new("fusermount3")
        .args(["-u", "-z", "-q", "--"])
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()?;
    if out.status.success() || !live_mounts().iter().any(|m| m == path) {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "fusermount3 -u {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// An `O_PATH` descriptor of the root of the mount at `path` (no request
/// reaches the daemon for it: the root is not looked up, and `O_PATH`
/// neither opens nor checks permissions).
fn pin_root(path: &Path) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is NUL-terminated; the fd returned is ours alone.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    // SAFETY: a non-negative fd from open is owned by no one else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The FUSE connection number of the file system `fd` is on: its device
/// minor, which is fusectl's name for the connection. Asked with
/// `AT_STATX_DONT_SYNC`, so no request reaches the daemon: this process
/// serves the mount and must never wait on it itself (killed during such a
/// wait, its serving threads die first and the wait never ends).
fn connection_of(fd: &std::os::fd::OwnedFd) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statx is a valid out-buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, the path is an empty C string, st is writable.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            0,
            &mut st,
        )
    };
    (r == 0).then_some(u64::from(st.stx_dev_minor))
}

/// Abort FUSE connection `conn` through fusectl, mounting fusectl (once
/// per process, as root) if it is not. The caller must hold the
/// connection's superblock (a pin), or the number may already be another
/// mount's.
fn abort_connection(conn: u64) -> bool {
    static MOUNT_FUSECTL: std::sync::Once = std::sync::Once::new();
    let base = Path::new("/sys/fs/fuse/connections");
    let abort = base.join(conn.to_string()).join("abort");
    // SAFETY: geteuid has no preconditions.
    if !abort.exists() && unsafe { libc::geteuid() } == 0 {
        MOUNT_FUSECTL.call_once(|| mount_fusectl(base));
    }
    fs::write(abort, b"1").is_ok()
}

fn mount_fusectl(base: &Path) {
    let _ = std::process::Command::new("mount")
        .args(["-t", "fusectl", "fusectl"])
        .arg(base)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    mountpoint: PathBuf,
    pid: u32,
    start_time: u64,
    /// For a [`register_mount`]ed mount: its source in the mount table
    /// (`/dev/loop3`), so cleanup detaches only that mount, never whatever
    /// else came to sit there. None: one of our views.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    /// A parked mount (a scratch file system kept between builds, see
    /// [`register_parked`]): owned by no process, it lives while anyone
    /// holds its `lock`, and for `ttl_secs` after the lock file's mtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parked: Option<ParkedRecord>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ParkedRecord {
    lock: PathBuf,
    ttl_secs: u64,
}

fn record_path(registry: &Path, mountpoint: &Path) -> PathBuf {
    let d = Digest::of(mountpoint.as_os_str().as_bytes());
    registry.join(format!("{}.json", &d.hex()[..32]))
}

/// Another mount this process owns (the executor's size-capped scratch)
/// recorded in the same registry as the views, so that if the process dies
/// without unmounting it, the next [`mount`] or [`cleanup_stale_mounts`]
/// anywhere detaches it. Dropping the registration forgets the mount —
/// after unmounting it, or to keep it on purpose.
#[derive(Debug)]
pub struct Registration(PathBuf);

/// Record `mountpoint` (already mounted from `source`, as the mount table
/// names it) as this process's in `registry`.
pub fn register_mount(registry: &Path, mountpoint: &Path, source: &str) -> Result<Registration> {
    fs::create_dir_all(registry).map_err(|source| Error::Registry {
        path: registry.to_path_buf(),
        source,
    })?;
    write_record(registry, mountpoint, Some(source)).map(Registration)
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Record `mountpoint` (mounted from `source`) as parked: no process owns
/// it, and cleanup leaves it alone while anyone holds the `flock` on `lock`
/// (a build using the mount holds it) and for `ttl` after the lock file
/// was last modified (whoever parks the mount again touches it: the
/// record itself is written once). Past both, the next [`mount`] or
/// [`cleanup_stale_mounts`] anywhere detaches it, so a parked mount never
/// outlives its time by more than one fhsx run.
pub fn register_parked(
    registry: &Path,
    mountpoint: &Path,
    source: &str,
    lock: &Path,
    ttl: Duration,
) -> Result<()> {
    fs::create_dir_all(registry).map_err(|source| Error::Registry {
        path: registry.to_path_buf(),
        source,
    })?;
    let rec = Record {
        mountpoint: mountpoint.to_path_buf(),
        pid: 0,
        start_time: 0,
        source: Some(source.to_owned()),
        parked: Some(ParkedRecord {
            lock: lock.to_path_buf(),
            ttl_secs: ttl.as_secs(),
        }),
    };
    put_record(registry, &rec).map(|_| ())
}

fn write_record(registry: &Path, mountpoint: &Path, source: Option<&str>) -> Result<PathBuf> {
    let pid = std::process::id();
    put_record(
        registry,
        &Record {
            mountpoint: mountpoint.to_path_buf(),
            pid,
            start_time: start_time(pid).unwrap_or(0),
            source: source.map(str::to_owned),
            parked: None,
        },
    )
}

/// Write `rec` in place of whatever named its mount point (atomically).
fn put_record(registry: &Path, rec: &Record) -> Result<PathBuf> {
    let p = record_path(registry, &rec.mountpoint);
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    let bytes = serde_json::to_vec(rec).unwrap_or_default();
    fs::write(&tmp, bytes)
        .and_then(|_| fs::rename(&tmp, &p))
        .map_err(|source| Error::Registry {
            path: p.clone(),
            source,
        })?;
    Ok(p)
}

/// The start time (clock ticks since boot) of `pid`, from `/proc/PID/stat`.
fn start_time(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is parenthesised and may contain anything: skip it.
    let rest = s.get(s.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

fn owner_alive(rec: &Record) -> bool {
    match start_time(rec.pid) {
        Some(t) => rec.start_time == 0 || t == rec.start_time,
        None => false,
    }
}

enum Parked {
    Live,
    /// Up for cleanup; the lock, held, if its file is still there (it
    /// moves away with a mount that was taken).
    Expired(Option<fs::File>),
}

/// Whether a parked mount's time is up and no one holds its lock.
fn parked_expired(p: &ParkedRecord) -> Parked {
    use std::os::fd::AsRawFd;
    let Ok(lock) = fs::File::open(&p.lock) else {
        return Parked::Expired(None);
    };
    let idle = lock
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok());
    if idle.is_some_and(|idle| idle.as_secs() < p.ttl_secs) {
        return Parked::Live;
    }
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Parked::Live;
    }
    Parked::Expired(Some(lock))
}

/// Whether `mountpoint` is mounted from `source` in this mount namespace.
fn mounted_from(mountpoint: &Path, source: &str) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        let Some((pre, post)) = l.split_once(" - ") else {
            return false;
        };
        pre.split(' ')
            .nth(4)
            .is_some_and(|mp| Path::new(&unescape_mountinfo(mp)) == mountpoint)
            && post.split(' ').nth(1) == Some(source)
    })
}

/// The mount points of live `fhsx-view` mounts in this mount namespace.
pub fn live_mounts() -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mp = pre.split(' ').nth(4)?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let source = post.next()?;
            (fstype.starts_with("fuse") && source == FS_NAME)
                .then(|| PathBuf::from(unescape_mountinfo(mp)))
        })
        .collect()
}

fn unescape_mountinfo(s: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// Detach every registered mount whose owner is gone and drop its record.
/// Returns the mount points it detached. Safe to run at any time: a live
/// owner's mounts are left alone.
pub fn cleanup_stale_mounts(registry: &Path) -> Result<Vec<PathBuf>> {
    let rd = match fs::read_dir(registry) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Registry {
                path: registry.to_path_buf(),
                source,
            })
        }
    };
    // Read lazily: most calls find nothing stale.
    let mut live: Option<Vec<PathBuf>> = None;
    let mut cleaned = Vec::new();
    for ent in rd.flatten() {
        let p = ent.path();
        if p.extension().and_then(|e| e.to_str()) != Some("json") {
            // A torn temp file of a killed writer — but a live writer's is
            // renamed within microseconds, and removing it would leave its
            // mount unregistered (and so never cleaned up): only old ones.
            let old = ent
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(60));
            if old
                && p.extension()
                    .is_some_and(|e| e.to_string_lossy().starts_with("tmp"))
            {
                let _ = fs::remove_file(&p);
            }
            continue;
        }
        let Ok(bytes) = fs::read(&p) else { continue };
        let Ok(rec) = serde_json::from_slice::<Record>(&bytes) else {
            let _ = fs::remove_file(&p);
            continue;
        };
        // A parked mount: its time not yet up, or someone holding its lock
        // (taking it), keeps it. The lock held here for the detach keeps
        // anyone from taking it meanwhile.
        let _parked_lock = match &rec.parked {
            Some(parked) => match parked_expired(parked) {
                Parked::Live => continue,
                Parked::Expired(lock) => lock,
            },
            None if owner_alive(&rec) => continue,
            None => None,
        };
        // Only ever detach what is still the mount recorded — one of our
        // views, or a registered mount from its source (stacked leftovers
        // too, but never loop on a path the kernel will not let go).
        let ours = |rec: &Record| match &rec.source {
            None => live_mounts().contains(&rec.mountpoint),
            Some(src) => mounted_from(&rec.mountpoint, src),
        };
        let present = match &rec.source {
            None => live
                .get_or_insert_with(live_mounts)
                .contains(&rec.mountpoint),
            Some(_) => ours(&rec),
        };
        if present {
            for _ in 0..16 {
                if detach(&rec.mountpoint).is_err() || !ours(&rec) {
                    break;
                }
            }
            cleaned.push(rec.mountpoint.clone());
        }
        let _ = fs::remove_file(&p);
    }
    Ok(cleaned)
}
