//! The reaper: proves which processes are a run's own before any signal.
//!
//! `record` registers a process we forked ourselves (held by a pidfd, so a
//! recycled PID can never be hit). `proven` gates every delivery: it yields
//! a [`Proof`] only for a recorded child, or — when the host lets us create
//! a cgroup v2 per run — for a live member of that cgroup, checked through
//! a pidfd opened *before* the membership is read. A signal can only be sent
//! with a `Proof`; there is no way to signal a bare PID.
//!
//! It also holds the run's limits that live in cgroups: `pids.max` and
//! `memory.max` in the run's cgroup v2 where the controllers are there,
//! else per-run cgroups in the host's cgroup v1 `pids` and `memory`
//! hierarchies, which the child joins (by their `tasks` files) before it
//! execs bwrap and which are removed when the run is over.
//!
//! With a cgroup, `kill_all` is one write to `cgroup.kill` (kernel >= 5.14),
//! which catches `setsid` double-forks and fork bombs alike. Without one, it
//! SIGKILLs the recorded children (bwrap); `--die-with-parent` then takes the
//! supervisor, and with it (PID 1 of the namespace) every process inside.

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::probe::{parse_mountinfo, read_proc_text, take_last_mountinfo};
use crate::sys;

/// The grace period between SIGTERM and SIGKILL at a timeout.
pub const GRACE_PERIOD: Duration = Duration::from_secs(5);

/// Which ownership mechanism to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReaperPreference {
    /// A per-run cgroup v2 if the host allows it, pidfds otherwise.
    #[default]
    Auto,
    /// Only pidfds of our own children (what an unprivileged host gets).
    PidfdOnly,
}

/// The mechanism actually in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReaperMode {
    Cgroup(PathBuf),
    Pidfd,
}

/// A per-run cgroup v2 directory.
#[derive(Debug)]
struct Cgroup {
    dir: PathBuf,
    /// The path as `/proc/<pid>/cgroup` shows it (`0::<rel>`).
    rel: String,
    procs: fs::File,
    /// The directory itself, for `clone3(CLONE_INTO_CGROUP)`.
    dir_fd: fs::File,
}

/// Evidence that a PID is this run's: a pidfd on exactly that process.
#[derive(Debug)]
pub struct Proof {
    pid: i32,
    pidfd: OwnedFd,
}

impl Proof {
    pub fn pid(&self) -> i32 {
        self.pid
    }
}

/// Per-run ownership records and signal delivery.
#[derive(Debug)]
pub struct Reaper {
    cgroup: Option<Cgroup>,
    /// Where the run has no cgroup v2 with the pids controller but the host
    /// mounts the cgroup v1 pids hierarchy: a per-run v1 pids cgroup, only
    /// for `pids.max` (a fork bomb run as host root is otherwise bounded by
    /// nothing: RLIMIT_NPROC exempts uid 0).
    pids_v1: Option<V1Cgroup>,
    /// Where the run has no cgroup v2 with the memory controller but the
    /// host mounts the cgroup v1 memory hierarchy (and lets us write it): a
    /// per-run v1 memory cgroup for `memory.limit_in_bytes` (and
    /// `memory.memsw.limit_in_bytes`, so swap is no way around it).
    memory_v1: Option<V1Cgroup>,
    owned: Vec<(i32, OwnedFd)>,
}

/// Where a run's memory limit is enforced (see [`Reaper::set_memory_max`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemoryCgroup {
    V2,
    V1,
}

/// A per-run directory in one cgroup v1 hierarchy (pids or memory).
#[derive(Debug)]
struct V1Cgroup {
    dir: PathBuf,
    tasks: fs::File,
}

impl V1Cgroup {
    /// The v1 hierarchy of `controller`: its mount point and our cgroup in
    /// it.
    fn base(controller: &str) -> Option<PathBuf> {
        let hierarchy = cgroup_mounts()
            .v1
            .iter()
            .find(|m| m.super_options.split(',').any(|o| o == controller))?;
        let cg = read_proc_text(Path::new("/proc/self/cgroup")).ok()?;
        let own = cg.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctl, path) = (it.next()?, it.next()?, it.next()?);
            ctl.split(',')
                .any(|c| c == controller)
                .then(|| path.to_owned())
        })?;
        let rel = Path::new(&own)
            .strip_prefix(&hierarchy.root)
            .unwrap_or(Path::new(&own));
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        Some(hierarchy.mount_point.join(rel))
    }

    /// A fresh per-run cgroup in the `controller` hierarchy with `settings`
    /// written in order (a setting whose file is absent is skipped when
    /// marked optional); `None` if any required one cannot be made.
    fn create(controller: &str, settings: &[(&str, String, bool)]) -> Option<V1Cgroup> {
        let base = Self::base(controller)?;
        remove_stale(&base);
        let dir = base.join(format!(
            "fhsx-run-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir).ok()?;
        let set = settings.iter().all(|(name, value, optional)| {
            let file = dir.join(name);
            if *optional && !file.exists() {
                return true;
            }
            fs::OpenOptions::new()
                .write(true)
                .open(file)
                .and_then(|mut f| f.write_all(value.as_bytes()))
                .is_ok()
        });
        // `tasks`, not `cgroup.procs`: the joining child is single-threaded,
        // and moving one thread (`0`: itself) skips the global threadgroup
        // lock whose RCU grace period made each join cost ~14 ms.
        let tasks = fs::OpenOptions::new().write(true).open(dir.join("tasks"));
        match (set, tasks) {
            (true, Ok(tasks)) => Some(V1Cgroup { dir, tasks }),
            _ => {
                let _ = fs::remove_dir(&dir);
                None
            }
        }
    }

    /// Empty once the namespace is gone (rmdir fails until then).
    fn remove(self) {
        drop(self.tasks);
        remove_cgroup(&self.dir);
    }
}

/// The `oom_kill N` count of a memory cgroup's event file (v2
/// `memory.events`, v1 `memory.oom_control`).
fn oom_kill_count(file: &Path) -> u64 {
    fs::read_to_string(file)
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Where the host mounts its cgroup hierarchies.
struct CgroupMounts {
    /// The cgroup v2 mount point.
    v2: Option<PathBuf>,
    /// Each v1 hierarchy (its super options name its controllers).
    v1: Vec<crate::probe::MountInfo>,
}

/// Read from mountinfo once per process, not once for each of a run's
/// (up to three) cgroups: hierarchies are mounted at boot and do not
/// move. Which cgroup this process is in can change, and is read each
/// time.
fn cgroup_mounts() -> &'static CgroupMounts {
    static MOUNTS: std::sync::OnceLock<CgroupMounts> = std::sync::OnceLock::new();
    MOUNTS.get_or_init(|| {
        let table = take_last_mountinfo().unwrap_or_else(|| {
            parse_mountinfo(&read_proc_text(Path::new("/proc/self/mountinfo")).unwrap_or_default())
        });
        let (v1, rest): (Vec<_>, Vec<_>) = table.into_iter().partition(|m| m.fs_type == "cgroup");
        let v2 = rest
            .into_iter()
            .find(|m| m.fs_type == "cgroup2")
            .map(|m| m.mount_point);
        CgroupMounts { v2, v1 }
    })
}

fn cgroup2_mount() -> Option<PathBuf> {
    cgroup_mounts().v2.clone()
}

fn own_cgroup_rel() -> Option<String> {
    let text = read_proc_text(Path::new("/proc/self/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|s| s.to_string())
}

impl Cgroup {
    fn create() -> Option<Cgroup> {
        let mount = cgroup2_mount()?;
        let own = own_cgroup_rel()?;
        let base = mount.join(own.trim_start_matches('/'));
        remove_stale(&base);
        let name = format!(
            "fhsx-run-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = base.join(&name);
        fs::create_dir(&dir).ok()?;
        let usable = dir.join("cgroup.kill").exists();
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"));
        let dir_fd = fs::File::open(&dir);
        match (usable, procs, dir_fd) {
            (true, Ok(procs), Ok(dir_fd)) => Some(Cgroup {
                rel: format!("{}/{}", own.trim_end_matches('/'), name),
                dir,
                procs,
                dir_fd,
            }),
            _ => {
                let _ = fs::remove_dir(&dir);
                None
            }
        }
    }

    fn members(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn populated(&self) -> bool {
        match fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(t) => t.lines().any(|l| l.trim() == "populated 1"),
            Err(_) => false,
        }
    }

    fn write(&self, name: &str, value: &str) -> bool {
        fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join(name))
            .and_then(|mut f| f.write_all(value.as_bytes()))
            .is_ok()
    }

    /// Make `controller`'s files appear in the run's cgroup: if the parent
    /// has the controller but does not hand it down, enable it in the
    /// parent's `cgroup.subtree_control` (which the kernel refuses when the
    /// parent is a non-root cgroup holding processes: then there is none).
    fn ensure_controller(&self, controller: &str, probe: &str) -> bool {
        if self.dir.join(probe).exists() {
            return true;
        }
        let Some(parent) = self.dir.parent() else {
            return false;
        };
        let offered = fs::read_to_string(parent.join("cgroup.controllers"))
            .is_ok_and(|t| t.split_whitespace().any(|c| c == controller));
        if !offered {
            return false;
        }
        let _ = fs::OpenOptions::new()
            .write(true)
            .open(parent.join("cgroup.subtree_control"))
            .and_then(|mut f| f.write_all(format!("+{controller}").as_bytes()));
        self.dir.join(probe).exists()
    }

    fn set_memory_max(&self, bytes: u64) -> bool {
        if !self.ensure_controller("memory", "memory.max")
            || !self.write("memory.max", &bytes.to_string())
        {
            return false;
        }
        if self.dir.join("memory.swap.max").exists() {
            let _ = self.write("memory.swap.max", "0");
        }
        true
    }

    fn set_pids_max(&self, n: u64) -> bool {
        self.ensure_controller("pids", "pids.max") && self.write("pids.max", &n.to_string())
    }

    fn kill(&self) {
        if let Ok(mut f) = fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
        {
            let _ = f.write_all(b"1");
        }
    }

    fn contains(&self, pid: i32) -> bool {
        fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map(|t| {
                t.lines()
                    .any(|l| l.strip_prefix("0::") == Some(self.rel.as_str()))
            })
            .unwrap_or(false)
    }
}

impl Reaper {
    /// Set up ownership tracking for one run.
    pub fn new(pref: ReaperPreference) -> Reaper {
        let cgroup = match pref {
            ReaperPreference::Auto => Cgroup::create(),
            ReaperPreference::PidfdOnly => None,
        };
        Reaper {
            cgroup,
            pids_v1: None,
            memory_v1: None,
            owned: Vec::new(),
        }
    }

    /// Which mechanism this run uses.
    pub fn mode(&self) -> ReaperMode {
        match &self.cgroup {
            Some(c) => ReaperMode::Cgroup(c.dir.clone()),
            None => ReaperMode::Pidfd,
        }
    }

    /// The `cgroup.procs` fd a freshly forked child writes `0` to, joining
    /// the run's cgroup before it execs.
    pub(crate) fn join_fd(&self) -> Option<RawFd> {
        self.cgroup.as_ref().map(|c| c.procs.as_raw_fd())
    }

    /// The run's cgroup directory, for starting a child inside it.
    pub(crate) fn cgroup_dir_fd(&self) -> Option<RawFd> {
        self.cgroup.as_ref().map(|c| c.dir_fd.as_raw_fd())
    }

    /// Limit the run's memory by a memory cgroup: the run's cgroup v2
    /// (`memory.max`, and `memory.swap.max` 0 where swap accounting
    /// exists; the controller is enabled in the parent's
    /// `cgroup.subtree_control` first if the parent has it but does not
    /// hand it down), else a per-run cgroup v1 memory directory
    /// (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` the same
    /// where swap accounting exists; the child joins it by
    /// [`Self::join_v1_fds`]). `None`: no memory controller can be had
    /// here, and the caller falls back to `RLIMIT_AS`.
    pub(crate) fn set_memory_max(&mut self, bytes: u64) -> Option<MemoryCgroup> {
        if let Some(cg) = &self.cgroup {
            if cg.set_memory_max(bytes) {
                return Some(MemoryCgroup::V2);
            }
        }
        let v = bytes.to_string();
        self.memory_v1 = V1Cgroup::create(
            "memory",
            &[
                // The plain limit first: memsw may never be below it.
                ("memory.limit_in_bytes", v.clone(), false),
                ("memory.memsw.limit_in_bytes", v, true),
            ],
        );
        self.memory_v1.as_ref().map(|_| MemoryCgroup::V1)
    }

    /// How many processes the kernel's OOM killer ended in the run's
    /// memory cgroup so far (0 without one). Read before [`Self::finish`].
    pub(crate) fn oom_kills(&self) -> u64 {
        if let Some(v1) = &self.memory_v1 {
            return oom_kill_count(&v1.dir.join("memory.oom_control"));
        }
        self.cgroup
            .as_ref()
            .map_or(0, |cg| oom_kill_count(&cg.dir.join("memory.events")))
    }

    /// Cap the run's process count by its cgroup (`pids.max`). False when
    /// the run has no cgroup or the pids controller is not enabled for it.
    /// Without that, a per-run cgroup v1 pids directory where the host
    /// mounts that hierarchy (the child joins it by [`Self::join_v1_fds`]).
    pub(crate) fn set_pids_max(&mut self, n: u64) -> bool {
        if self.cgroup.as_ref().is_some_and(|cg| cg.set_pids_max(n)) {
            return true;
        }
        self.pids_v1 = V1Cgroup::create("pids", &[("pids.max", n.to_string(), false)]);
        self.pids_v1.is_some()
    }

    /// The v1 `tasks` fds (pids, memory) a freshly forked (single-threaded)
    /// child writes `0` to.
    pub(crate) fn join_v1_fds(&self) -> [Option<RawFd>; 2] {
        [&self.pids_v1, &self.memory_v1].map(|c| c.as_ref().map(|c| c.tasks.as_raw_fd()))
    }

    /// Register a child we forked ourselves, by its pidfd.
    pub fn record(&mut self, pid: i32, pidfd: OwnedFd) {
        self.owned.push((pid, pidfd));
    }

    /// A proof that `pid` is this run's, or `None`. Never guesses.
    pub fn proven(&self, pid: i32) -> Option<Proof> {
        if pid <= 0 {
            return None;
        }
        if let Some((_, fd)) = self.owned.iter().find(|(p, _)| *p == pid) {
            if sys::pidfd_exited(fd) {
                return None;
            }
            return fd.try_clone().ok().map(|pidfd| Proof { pid, pidfd });
        }
        let cg = self.cgroup.as_ref()?;
        // Open the handle first, then check membership, then check the
        // handle's process is still alive: the membership we read was its.
        let pidfd = sys::pidfd_open(pid).ok()?;
        if !cg.contains(pid) || sys::pidfd_exited(&pidfd) {
            return None;
        }
        Some(Proof { pid, pidfd })
    }

    /// Deliver `sig` to a proven process.
    pub fn signal(&self, proof: &Proof, sig: i32) -> std::io::Result<()> {
        sys::pidfd_send_signal(&proof.pidfd, sig)
    }

    /// SIGTERM every proven member of the run except the recorded children
    /// (bwrap dies at once on SIGTERM; its sandbox gets the grace period
    /// through the supervisor instead). Returns how many were signalled.
    pub fn terminate(&self) -> usize {
        let Some(cg) = &self.cgroup else {
            return 0;
        };
        cg.members()
            .into_iter()
            .filter(|p| !self.owned.iter().any(|(o, _)| o == p))
            .filter_map(|p| self.proven(p))
            .filter(|proof| self.signal(proof, libc::SIGTERM).is_ok())
            .count()
    }

    /// SIGKILL everything the run owns.
    pub fn kill_all(&self) {
        if let Some(cg) = &self.cgroup {
            cg.kill();
        }
        for (pid, _) in &self.owned {
            if let Some(p) = self.proven(*pid) {
                let _ = self.signal(&p, libc::SIGKILL);
            }
        }
    }

    /// After the run: kill what is left in the cgroup, wait until it is
    /// empty (bounded), remove it. Returns whether anything was left.
    pub fn finish(&mut self) -> bool {
        for v1 in [self.pids_v1.take(), self.memory_v1.take()]
            .into_iter()
            .flatten()
        {
            v1.remove();
        }
        let Some(cg) = self.cgroup.take() else {
            return false;
        };
        let left = cg.populated();
        if left {
            cg.kill();
            let until = Instant::now() + Duration::from_secs(10);
            while cg.populated() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        remove_cgroup(&cg.dir);
        left
    }
}

/// Remove empty run cgroups left by fhsx processes that no longer exist
/// (killed before they could clean up). Live runs are never touched: their
/// creator's PID is alive, and a populated cgroup cannot be removed anyway.
fn remove_stale(base: &Path) {
    let Ok(rd) = fs::read_dir(base) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("fhsx-run-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = fs::remove_dir(e.path());
        }
    }
}

fn remove_cgroup(dir: &Path) {
    for _ in 0..200 {
        if fs::remove_dir(dir).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unrecorded_pids_are_never_proven() {
        let r = Reaper::new(ReaperPreference::Auto);
        // PID 1, our own process and our parent are not this run's.
        assert!(r.proven(1).is_none());
        assert!(r.proven(std::process::id() as i32).is_none());
        assert!(r.proven(0).is_none());
        assert!(r.proven(-1).is_none());
    }

    #[test]
    fn a_recorded_child_is_proven_until_it_ends() {
        let mut r = Reaper::new(ReaperPreference::PidfdOnly);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep(1) must exist: install coreutils");
        let pid = child.id() as i32;
        r.record(
            pid,
            sys::pidfd_open(pid).expect("pidfd_open needs Linux >= 5.3"),
        );
        let proof = r.proven(pid).expect("own child is proven");
        r.signal(&proof, libc::SIGKILL).expect("signal own child");
        let _ = child.wait();
        assert!(
            r.proven(pid).is_none(),
            "an ended child is no longer proven"
        );
    }
}
