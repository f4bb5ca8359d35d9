//! A pristine process state for every run: nothing of the caller's
//! process state crosses into the sandbox (see the crate doc, "Process
//! state").
//!
//! Signal dispositions, the signal mask, the umask, personality, the
//! scheduling knobs, the resource limits and `oom_score_adj` survive
//! `fork` and `execve` (an ignored signal stays ignored across `execve`:
//! `cmd &` in a script ignores SIGINT and SIGQUIT, `nohup` SIGHUP). So the
//! child that execs bwrap sets every one of them to a documented value
//! first, while it still has the caller's privileges (as root: lowering
//! `nice`, raising hard limits, leaving `SCHED_IDLE`, flooring
//! `oom_score_adj`, which nothing inside the sandbox may do), and the
//! supervisor resets the dispositions, the mask, the umask and
//! `oom_score_adj` once more for the command, after bwrap and its own
//! start-up.
//!
//! [`Pristine::new`] computes everything before the fork;
//! [`Pristine::apply`] makes only raw system calls, for the vfork-style
//! child.

use std::ffi::CString;

/// `RLIM_INFINITY`.
const INF: u64 = u64::MAX;

/// The `oom_score_adj` of the command (the supervisor sets it; the host
/// side does where the supervisor cannot): a build is the first candidate
/// of the kernel's OOM killer, before the executor, its FUSE daemon and
/// the rest of the host.
pub(crate) const COMMAND_OOM_SCORE_ADJ: i32 = 500;

/// The kernel's default timer slack (50 µs).
const TIMER_SLACK_NS: u64 = 50_000;

/// One resource limit as the run starts: `(resource, soft, hard)`.
type Rlimit = (libc::c_int, u64, u64);

/// `personality`'s flag that turns address-space randomisation off.
const ADDR_NO_RANDOMIZE: libc::c_ulong = 0x0040000;

/// The process state to impose, computed before the fork.
#[derive(Debug)]
pub(crate) struct Pristine {
    rlimits: Vec<Rlimit>,
    /// Every CPU there may be: the kernel keeps those the caller's cpuset
    /// allows and that are online.
    cpus: Vec<u64>,
    umask: libc::mode_t,
    personality: libc::c_ulong,
    oom_path: CString,
    /// `oom_score_adj` for bwrap and the supervisor (and so the floor of
    /// the command's, as root).
    oom_value: Vec<u8>,
}

/// A number from a `/proc/sys` file.
fn sysctl(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The resource limits every run starts with (the command's own
/// `[limits]` are set on top by the supervisor). Values the kernel derives
/// from the machine at boot (`RLIMIT_NPROC`, `RLIMIT_SIGPENDING`:
/// `kernel.threads-max / 2`) are computed the same way.
pub(crate) fn default_rlimits() -> Vec<Rlimit> {
    let per_user = sysctl("/proc/sys/kernel/threads-max").map_or(INF, |t| (t / 2).max(1));
    let nofile_max = sysctl("/proc/sys/fs/nr_open").map_or(524_288, |n| n.min(524_288));
    vec![
        (libc::RLIMIT_CPU as libc::c_int, INF, INF),
        (libc::RLIMIT_FSIZE as libc::c_int, INF, INF),
        (libc::RLIMIT_DATA as libc::c_int, INF, INF),
        (libc::RLIMIT_STACK as libc::c_int, 8 << 20, INF),
        (libc::RLIMIT_CORE as libc::c_int, 0, INF),
        (libc::RLIMIT_RSS as libc::c_int, INF, INF),
        (libc::RLIMIT_NPROC as libc::c_int, per_user, per_user),
        (libc::RLIMIT_NOFILE as libc::c_int, 1024, nofile_max),
        (libc::RLIMIT_MEMLOCK as libc::c_int, 8 << 20, 8 << 20),
        (libc::RLIMIT_AS as libc::c_int, INF, INF),
        (libc::RLIMIT_LOCKS as libc::c_int, INF, INF),
        (libc::RLIMIT_SIGPENDING as libc::c_int, per_user, per_user),
        (libc::RLIMIT_MSGQUEUE as libc::c_int, 819_200, 819_200),
        (libc::RLIMIT_NICE as libc::c_int, 0, 0),
        (libc::RLIMIT_RTPRIO as libc::c_int, 0, 0),
        (libc::RLIMIT_RTTIME as libc::c_int, INF, INF),
    ]
}

impl Pristine {
    /// `host_root`: bwrap and the supervisor run as host root (root
    /// without a build user), which may floor `oom_score_adj` and lets
    /// the supervisor raise the command's.
    /// With the umask, CPU count (the first `cpus` CPUs; all when `None`)
    /// and ASLR the run's persona asks for (0022, all, on by default).
    pub(crate) fn new(host_root: bool, umask: u32, cpus: Option<usize>, aslr: bool) -> Pristine {
        // Room for every CPU a kernel may have (CONFIG_NR_CPUS is at most
        // 8192): the kernel reads as much of the mask as it has CPUs and
        // ignores the rest, so nothing need be read from /sys first.
        let words = 8192 / 64;
        // As host root: 0 for bwrap and the supervisor, which also floors
        // the command's (a privileged write sets the floor), and the
        // supervisor raises the command's. Without root, or as a build
        // user, the supervisor cannot (its non-dumpable children's /proc
        // files are not the sandbox uid's), so the value is set here, for
        // all of the sandbox (as root, before becoming the build user).
        let oom = if host_root { 0 } else { COMMAND_OOM_SCORE_ADJ };
        let mut mask = vec![u64::MAX; words];
        if let Some(n) = cpus {
            mask = vec![0; words];
            for c in 0..n.min(words * 64) {
                mask[c / 64] |= 1 << (c % 64);
            }
        }
        Pristine {
            rlimits: default_rlimits(),
            cpus: mask,
            umask: umask as libc::mode_t,
            personality: if aslr { 0 } else { ADDR_NO_RANDOMIZE },
            oom_path: c"/proc/self/oom_score_adj".to_owned(),
            oom_value: oom.to_string().into_bytes(),
        }
    }

    /// Impose the state on the calling process. Best effort item by item:
    /// what the caller may not change (without root: lowering `nice`,
    /// raising a hard limit) stays as the caller had it.
    ///
    /// # Safety
    /// Only raw system calls: safe in a vfork-style child, between fork
    /// and exec.
    pub(crate) unsafe fn apply(&self) {
        unsafe {
            // Every disposition to default (ignored ones survive execve) —
            // by the raw call, so glibc's own signals (32, 33) are reset
            // too. The kernel's struct sigaction, zeroed: SIG_DFL, no
            // flags, empty mask.
            let dfl = [0u64; 4];
            for sig in 1..=64 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::syscall(
                        libc::SYS_rt_sigaction,
                        sig,
                        dfl.as_ptr(),
                        std::ptr::null::<u64>(),
                        8usize,
                    );
                }
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::umask(self.umask);
            // PER_LINUX (clears ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, …),
            // or PER_LINUX with ASLR off for a persona that asks: it is
            // inherited through bwrap and the supervisor to the command.
            libc::personality(self.personality);
            libc::setpriority(libc::PRIO_PROCESS, 0, 0);
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_OTHER, &param);
            // IOPRIO_WHO_PROCESS, self, IOPRIO_CLASS_NONE: follow nice.
            libc::syscall(libc::SYS_ioprio_set, 1, 0, 0);
            libc::sched_setaffinity(
                0,
                std::mem::size_of_val(self.cpus.as_slice()),
                self.cpus.as_ptr().cast(),
            );
            // MPOL_DEFAULT.
            libc::syscall(libc::SYS_set_mempolicy, 0, std::ptr::null::<u64>(), 0usize);
            libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
            libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0);
            let fd = libc::open(self.oom_path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, self.oom_value.as_ptr().cast(), self.oom_value.len());
                libc::close(fd);
            }
            for &(res, cur, max) in &self.rlimits {
                let want = [cur, max];
                if libc::syscall(
                    libc::SYS_prlimit64,
                    0,
                    res,
                    want.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                ) == 0
                {
                    continue;
                }
                // Not allowed to raise the hard limit: as close as it may.
                let mut old = [0u64; 2];
                if libc::syscall(
                    libc::SYS_prlimit64,
                    0,
                    res,
                    std::ptr::null::<u64>(),
                    old.as_mut_ptr(),
                ) == 0
                {
                    let clamped = [cur.min(old[1]), max.min(old[1])];
                    libc::syscall(
                        libc::SYS_prlimit64,
                        0,
                        res,
                        clamped.as_ptr(),
                        std::ptr::null_mut::<u64>(),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_is_pinned_once() {
        let l = default_rlimits();
        let mut r: Vec<_> = l.iter().map(|x| x.0).collect();
        r.sort();
        r.dedup();
        assert_eq!(r.len(), l.len());
        // RLIM_NLIMITS: every resource Linux has.
        assert_eq!(r.len(), 16);
        assert!(l.iter().all(|&(_, cur, max)| cur <= max));
    }
}
