//! Build users: as root, each run of a build gets a host uid/gid of its
//! own from a configured range, so that no build runs as host uid 0 and
//! no two builds running at once share a uid (Nix's `auto-allocate-uids`
//! model, one uid per build).
//!
//! The range is [`DEFAULT_BUILD_UID_START`]`..+`[`DEFAULT_BUILD_UID_COUNT`]
//! (65536 uids from 872415232, Nix's default), or what
//! [`BUILD_UIDS_ENV`] (`FHSX_BUILD_UIDS=START:COUNT`) says. The gid is the
//! same number as the uid. No uid of the range may belong to a user or a
//! group in `/etc/passwd` or `/etc/group`: a build user must be nobody
//! else.
//!
//! A uid is held by an exclusive `flock` on its lock file in
//! [`BUILD_UID_LOCK_DIR`] (`/run/fhsx/build-uids/<uid>`), a host-global
//! directory, so every fhsx process on the host shares the allocation
//! whatever its store or `$TMPDIR`. The lock is held by the
//! [`BuildUser`] value and released when it is dropped or its process
//! dies (the kernel drops the flock), and then the uid is free again.
//! A uid is also skipped while any process runs as it (the processes of
//! a holder killed an instant ago are still being torn down, and no
//! process outside fhsx should ever have such a uid). Finding that out
//! takes reading every host process's `/proc/PID/status` (~1 ms for 70
//! processes, more on a busy host), so a holder that saw its runs end
//! ([`BuildUser::run_ended`]) says so in the lock file as it lets go, and
//! the next holder of that uid skips the scan. A holder that died, or
//! whose runs it could not see end, leaves the file saying `held`, and
//! the next holder scans.
//!
//! Allocation takes the lowest free uid, so the lock directory holds as
//! many files as builds ever ran at once.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use executor_core::SandboxError;

/// The variable that sets the build users' range: `START:COUNT`.
pub const BUILD_UIDS_ENV: &str = "FHSX_BUILD_UIDS";
/// The first uid of the default range (Nix's `start-id`, `0x34000000`).
pub const DEFAULT_BUILD_UID_START: u32 = 872_415_232;
/// How many uids the default range holds (at most that many builds at
/// once).
pub const DEFAULT_BUILD_UID_COUNT: u32 = 65_536;
/// Where the per-uid lock files live: host-global, root's.
pub const BUILD_UID_LOCK_DIR: &str = "/run/fhsx/build-uids";

/// capability(7) numbers.
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

/// The uid the kernel reports for an unmapped id (and `nobody`): never a
/// build user.
const OVERFLOW_ID: u32 = 65_534;

/// A range of build users and where their locks are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildUsers {
    start: u32,
    count: u32,
    lock_dir: PathBuf,
}

/// One build user, held until dropped: uid and gid (the same number),
/// exclusively this holder's while it lives.
#[derive(Debug)]
pub struct BuildUser {
    uid: u32,
    lock: fs::File,
    runs: AtomicU8,
}

/// [`BuildUser::runs`]: no run has ended yet, every run that ended was
/// seen to leave nothing behind, or one was not.
const NO_RUN: u8 = 0;
const ALL_EMPTIED: u8 = 1;
const ONE_NOT_SEEN: u8 = 2;

/// What a lock file says while held, and after a holder that died.
const HELD: &[u8] = b"held\n";
/// What a lock file says after a holder that saw every process of its
/// runs end.
const RELEASED_IDLE: &[u8] = b"idle\n";

impl BuildUser {
    /// Note that a run as this user ended, and whether it was seen to
    /// leave no process behind
    /// ([`RunReport::sandbox_emptied`](crate::RunReport::sandbox_emptied)).
    /// Released after runs that all were, the uid is taken again without
    /// a scan of the host's processes; one run that was not (or a run
    /// never noted) and the next holder scans. Pass `true` only with that
    /// proof: a uid released idle while something still runs as it would
    /// go to the next build with that process alive.
    pub fn run_ended(&self, emptied: bool) {
        if emptied {
            let _ =
                self.runs
                    .compare_exchange(NO_RUN, ALL_EMPTIED, Ordering::SeqCst, Ordering::SeqCst);
        } else {
            self.runs.store(ONE_NOT_SEEN, Ordering::SeqCst);
        }
    }

    /// The host uid the build runs as.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The host gid the build runs as (the same number as the uid).
    pub fn gid(&self) -> u32 {
        self.uid
    }
}

fn bad(value: &str, reason: impl Into<String>) -> SandboxError {
    SandboxError::BadBuildUsers {
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl BuildUsers {
    /// `count` uids from `start`. Refused: an empty range, one holding
    /// uid 0 or the overflow id 65534, one past `u32::MAX - 1`.
    pub fn new(start: u32, count: u32) -> Result<BuildUsers, SandboxError> {
        let value = format!("{start}:{count}");
        if count == 0 {
            return Err(bad(&value, "the range is empty"));
        }
        if start == 0 {
            return Err(bad(&value, "it holds uid 0 (root)"));
        }
        let Some(last) = start.checked_add(count - 1).filter(|&l| l < u32::MAX) else {
            return Err(bad(&value, "it goes past the largest uid, 4294967294"));
        };
        if (start..=last).contains(&OVERFLOW_ID) {
            return Err(bad(&value, "it holds 65534, the overflow uid (nobody)"));
        }
        Ok(BuildUsers {
            start,
            count,
            lock_dir: PathBuf::from(BUILD_UID_LOCK_DIR),
        })
    }

    /// The range from [`BUILD_UIDS_ENV`] if it is set, else the default.
    pub fn from_env() -> Result<BuildUsers, SandboxError> {
        match std::env::var_os(BUILD_UIDS_ENV) {
            None => Self::new(DEFAULT_BUILD_UID_START, DEFAULT_BUILD_UID_COUNT),
            Some(v) => Self::parse(&v.to_string_lossy()),
        }
    }

    /// `START:COUNT`, both decimal.
    pub fn parse(s: &str) -> Result<BuildUsers, SandboxError> {
        let (a, b) = s
            .split_once(':')
            .ok_or_else(|| bad(s, "it is not START:COUNT"))?;
        let num = |t: &str, what: &str| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| bad(s, format!("{what} {t:?} is not a number up to 4294967295")))
        };
        Self::new(num(a, "START")?, num(b, "COUNT")?)
    }

    /// Keep the lock files in `dir` instead of [`BUILD_UID_LOCK_DIR`]
    /// (tests; every fhsx on a host must use the same one).
    pub fn with_lock_dir(mut self, dir: impl Into<PathBuf>) -> BuildUsers {
        self.lock_dir = dir.into();
        self
    }

    /// The first uid and how many.
    pub fn range(&self) -> (u32, u32) {
        (self.start, self.count)
    }

    /// Whether `uid` is one of this range's.
    pub fn contains(&self, uid: u32) -> bool {
        uid >= self.start && uid - self.start < self.count
    }

    /// Take the lowest free uid of the range. Root only (the lock
    /// directory is root's). Fails when the range holds someone's uid or
    /// gid, or when every uid is taken.
    pub fn allocate(&self) -> Result<BuildUser, SandboxError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(no_user(
                "only root runs builds as build users (without root a build runs as its caller)"
                    .into(),
            ));
        }
        let value = format!("{}:{}", self.start, self.count);
        // Becoming a build user takes CAP_SETUID and CAP_SETGID (root in
        // a container may lack them) and ids mapped in our user namespace.
        if !has_caps(&[CAP_SETGID, CAP_SETUID]) {
            return Err(no_user(
                "this root lacks CAP_SETUID or CAP_SETGID (a container that dropped them?), which becoming a build user takes; run fhsx as an unprivileged user there".into(),
            ));
        }
        let last = self.start + (self.count - 1);
        for (file, what) in [("/proc/self/uid_map", "uid"), ("/proc/self/gid_map", "gid")] {
            if !mapped(Path::new(file), self.start, last) {
                return Err(bad(
                    &value,
                    format!("not every {what} of it is mapped in this user namespace ({file}); pick a range inside the mapping"),
                ));
            }
        }
        for (file, what) in [("/etc/passwd", "user"), ("/etc/group", "group")] {
            if let Some((name, id)) = taken_ids(Path::new(file)).find(|(_, id)| self.contains(*id))
            {
                return Err(bad(
                    &value,
                    format!("{file} has {what} {name} with id {id} in it, and a build user must be nobody else; pick a range no account uses"),
                ));
            }
        }
        lock_dir(&self.lock_dir)?;
        // Read only when a free uid's last holder did not release it idle.
        let mut running = None;
        for uid in self.start..=last {
            let path = self.lock_dir.join(uid.to_string());
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| no_user(format!("opening {}: {e}", path.display())))?;
            // SAFETY: flock on an fd we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(no_user(format!("locking {}: {e}", path.display())));
                }
                continue;
            }
            if !says(&f, RELEASED_IDLE) && running.get_or_insert_with(running_uids).contains(&uid) {
                // Dropping the file lets go of the lock.
                continue;
            }
            // Until released idle, the next holder scans.
            write_state(&f, HELD)
                .map_err(|e| no_user(format!("writing {}: {e}", path.display())))?;
            return Ok(BuildUser {
                uid,
                lock: f,
                runs: AtomicU8::new(NO_RUN),
            });
        }
        Err(no_user(format!(
            "all {} uids of the range {value} are taken by builds running now; wait for one to end, or give {BUILD_UIDS_ENV}=START:COUNT a larger range",
            self.count
        )))
    }
}

impl Drop for BuildUser {
    fn drop(&mut self) {
        // Before the lock goes with the file; if this fails the file still
        // says `held`, and the next holder scans.
        if self.runs.load(Ordering::SeqCst) == ALL_EMPTIED {
            let _ = write_state(&self.lock, RELEASED_IDLE);
        }
    }
}

/// Whether the lock file `f` says exactly `state`.
fn says(f: &fs::File, state: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 16];
    f.read_at(&mut buf, 0)
        .is_ok_and(|n| n == state.len() && &buf[..n] == state)
}

/// Make the lock file `f` say `state`.
fn write_state(f: &fs::File, state: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(state, 0)?;
    f.set_len(state.len() as u64)
}

/// Whether this process has every capability of `caps` in its effective
/// set.
fn has_caps(caps: &[u32]) -> bool {
    crate::probe::read_proc_text(Path::new("/proc/self/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|eff| caps.iter().all(|&c| eff & (1u64 << c) != 0))
}

/// Whether `first..=last` lies inside one extent of a `uid_map` or
/// `gid_map` (`inside outside count` per line); a missing file (no user
/// namespaces) maps everything.
fn mapped(file: &Path, first: u32, last: u32) -> bool {
    let Ok(text) = fs::read_to_string(file) else {
        return true;
    };
    text.lines().any(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        matches!(f[..], [inside, _, count] if inside <= u64::from(first) && u64::from(last) < inside + count)
    })
}

fn no_user(reason: String) -> SandboxError {
    SandboxError::NoBuildUser { reason }
}

/// `(name, id)` of every entry of a passwd- or group-format file.
fn taken_ids(file: &Path) -> impl Iterator<Item = (String, u32)> {
    let text = fs::read_to_string(file).unwrap_or_default();
    let entries: Vec<(String, u32)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id = f.nth(1)?.trim().parse().ok()?;
            Some((name.to_string(), id))
        })
        .collect();
    entries.into_iter()
}

/// The real, effective and saved uids of every process on the host.
fn running_uids() -> std::collections::BTreeSet<u32> {
    let mut uids = std::collections::BTreeSet::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return uids;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = crate::probe::read_proc_text(&e.path().join("status")) else {
            continue;
        };
        if let Some(l) = status.lines().find_map(|l| l.strip_prefix("Uid:")) {
            uids.extend(l.split_whitespace().filter_map(|u| u.parse::<u32>().ok()));
        }
    }
    uids
}

/// The lock directory: made 0755 if missing; it must be a directory
/// owned by root that nobody else can write, or a build user could be
/// taken from under its holder.
fn lock_dir(dir: &Path) -> Result<(), SandboxError> {
    if let Err(e) = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
    {
        return Err(no_user(format!(
            "creating {} (only root runs builds as build users): {e}",
            dir.display()
        )));
    }
    let md = fs::symlink_metadata(dir)
        .map_err(|e| no_user(format!("inspecting {}: {e}", dir.display())))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !md.is_dir() || md.uid() != me || md.mode() & 0o022 != 0 {
        return Err(no_user(format!(
            "{} is not a directory owned by uid {me} and writable only by it; remove it",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_are_refused() {
        let d = BuildUsers::new(DEFAULT_BUILD_UID_START, DEFAULT_BUILD_UID_COUNT).unwrap();
        assert_eq!(d.range(), (872_415_232, 65_536));
        assert!(d.contains(872_415_232) && d.contains(872_415_232 + 65_535));
        assert!(!d.contains(872_415_232 + 65_536) && !d.contains(0));
        assert_eq!(
            BuildUsers::parse("2000000:16").unwrap().range(),
            (2_000_000, 16)
        );
        for s in [
            "",
            "1",
            "x:1",
            "1:x",
            "0:5",
            "5:0",
            "4294967295:1",
            "4294967290:10",
            "60000:10000",
        ] {
            let e = BuildUsers::parse(s).unwrap_err();
            assert!(matches!(e, SandboxError::BadBuildUsers { .. }), "{s}: {e}");
            assert!(e.to_string().contains(BUILD_UIDS_ENV), "{s}: {e}");
        }
    }

    #[test]
    fn ranges_must_lie_inside_the_user_namespace_mapping() {
        let d = tempfile::tempdir().unwrap();
        let map = d.path().join("uid_map");
        fs::write(&map, "         0          0 4294967295\n").unwrap();
        assert!(mapped(&map, 872_415_232, 872_415_232 + 65_535));
        fs::write(&map, "0 1000 1\n1 100000 65536\n").unwrap();
        assert!(mapped(&map, 1, 65_536));
        assert!(!mapped(&map, 60_000, 70_000));
        assert!(!mapped(&map, 872_415_232, 872_415_232));
        assert!(mapped(&d.path().join("absent"), 5, 6));
    }

    #[test]
    fn two_holders_never_share_a_uid_and_a_dropped_one_is_free_again() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let users = BuildUsers::new(3_000_000_000, 3)
            .unwrap()
            .with_lock_dir(dir.path().join("locks"));
        let a = users.allocate().unwrap();
        let b = users.allocate().unwrap();
        let c = users.allocate().unwrap();
        assert_eq!(
            [a.uid(), b.uid(), c.uid()],
            [3_000_000_000, 3_000_000_001, 3_000_000_002]
        );
        assert_eq!(a.gid(), a.uid());
        let e = users.allocate().unwrap_err();
        assert!(e.to_string().contains("taken"), "{e}");
        drop(b);
        assert_eq!(users.allocate().unwrap().uid(), 3_000_000_001);
    }

    #[test]
    fn a_uid_not_released_idle_is_skipped_while_a_process_runs_as_it() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        let users = BuildUsers::new(3_000_000_100, 2)
            .unwrap()
            .with_lock_dir(&locks);
        let first = locks.join("3000000100");
        // Released without the proof: the file says held.
        drop(users.allocate().unwrap());
        assert_eq!(fs::read(&first).unwrap(), HELD);
        // A process of that uid (a holder's build still being torn down).
        let mut straggler = std::process::Command::new("sleep")
            .arg("30")
            .uid(3_000_000_100)
            .gid(3_000_000_100)
            .spawn()
            .unwrap();
        let taken = users.allocate().unwrap();
        assert_eq!(
            taken.uid(),
            3_000_000_101,
            "a uid with a process running as it was handed out"
        );
        drop(taken);
        straggler.kill().unwrap();
        straggler.wait().unwrap();
        // Once it is gone the uid is free; released idle, the file says so.
        let a = users.allocate().unwrap();
        assert_eq!(a.uid(), 3_000_000_100);
        assert_eq!(
            fs::read(&first).unwrap(),
            HELD,
            "a held uid's file says held"
        );
        a.run_ended(true);
        drop(a);
        assert_eq!(fs::read(&first).unwrap(), RELEASED_IDLE);
        // One run not seen to end is enough for the next holder to scan.
        let b = users.allocate().unwrap();
        assert_eq!(b.uid(), 3_000_000_100);
        b.run_ended(false);
        b.run_ended(true);
        drop(b);
        assert_eq!(fs::read(&first).unwrap(), HELD);
    }
}
