//! `fhsx-supervisor`: PID 1 inside an fhsx sandbox.
//!
//! Built by `executor-sandbox`'s build.rs as a static executable (the sandbox
//! root may hold no libc of the host), so it uses only `std` plus a few
//! hand-declared libc functions: no crates.
//!
//! Usage: `fhsx-supervisor [--control-fd N] [--nproc N] -- CMD [ARGS...]`
//!
//! It closes every inherited fd but 0-2 and the control fd, blocks the
//! terminating signals and reads them from a signalfd, starts CMD, reaps
//! every orphan that is re-parented to it, and relays a termination request
//! (SIGTERM/SIGINT/SIGHUP, or `TERM` on the control fd) to every process of
//! the namespace. When CMD ends it does not wait for lingering daemons: it
//! SIGKILLs everything left, reaps it, reports and exits with CMD's status
//! (128+signal if CMD was killed by a signal).
//!
//! Control protocol (lines on the control fd, a stream socket):
//! host -> supervisor: `TERM`; supervisor -> host: `START` once running,
//! then `EXIT <code>` or `SIGNAL <n>` or `NOEXEC <errno>`, then
//! `LINGER <count>`.

use std::ffi::OsString;
use std::io::Write;
use std::os::raw::{c_int, c_uint, c_void};
use std::os::unix::process::CommandExt;
use std::process::Command;

#[repr(C)]
struct SigSet {
    val: [u64; 16],
}

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

#[repr(C)]
struct RLimit {
    cur: u64,
    max: u64,
}

extern "C" {
    fn sigprocmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
    fn sigemptyset(set: *mut SigSet) -> c_int;
    fn sigaddset(set: *mut SigSet, sig: c_int) -> c_int;
    fn signalfd(fd: c_int, mask: *const SigSet, flags: c_int) -> c_int;
    fn signal(sig: c_int, handler: usize) -> usize;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    fn close(fd: c_int) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn setrlimit(resource: c_int, rlim: *const RLimit) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int;
    fn getpid() -> c_int;
    fn __errno_location() -> *mut c_int;
    fn syscall(n: i64, ...) -> i64;
    fn prctl(option: c_int, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> c_int;
}

const PR_SET_DUMPABLE: c_int = 4;

/// x86_64 and aarch64 syscall numbers of keyctl(2).
#[cfg(target_arch = "x86_64")]
const SYS_KEYCTL: i64 = 250;
#[cfg(target_arch = "aarch64")]
const SYS_KEYCTL: i64 = 219;
const KEYCTL_JOIN_SESSION_KEYRING: i64 = 1;

const SIG_BLOCK: c_int = 0;
const SIG_SETMASK: c_int = 2;
const SIGHUP: c_int = 1;
const SIGINT: c_int = 2;
const SIGKILL: c_int = 9;
const SIGPIPE: c_int = 13;
const SIGTERM: c_int = 15;
const SIGCHLD: c_int = 17;
const SIG_DFL: usize = 0;
const SFD_CLOEXEC: c_int = 0o2000000;
const SFD_NONBLOCK: c_int = 0o4000;
const WNOHANG: c_int = 1;
const POLLIN: i16 = 1;
const POLLHUP: i16 = 0x10;
const POLLERR: i16 = 0x8;
const RLIMIT_NPROC: c_int = 6;
const F_SETFD: c_int = 2;
const FD_CLOEXEC: c_int = 1;
const EINTR: c_int = 4;
const ECHILD: c_int = 10;

fn errno() -> c_int {
    // SAFETY: glibc's errno location is always valid for the calling thread.
    unsafe { *__errno_location() }
}

fn die(msg: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "fhsx-supervisor: {msg}");
    std::process::exit(125);
}

struct Args {
    control_fd: Option<c_int>,
    nproc: Option<u64>,
    command: Vec<OsString>,
}

fn parse_args() -> Args {
    let mut it = std::env::args_os().skip(1);
    let mut a = Args {
        control_fd: None,
        nproc: None,
        command: Vec::new(),
    };
    while let Some(arg) = it.next() {
        match arg.to_str() {
            Some("--control-fd") => {
                let v = it.next().and_then(|v| v.to_str().and_then(|s| s.parse().ok()));
                a.control_fd = Some(v.unwrap_or_else(|| die("--control-fd needs a number")));
            }
            Some("--nproc") => {
                let v = it.next().and_then(|v| v.to_str().and_then(|s| s.parse().ok()));
                a.nproc = Some(v.unwrap_or_else(|| die("--nproc needs a number")));
            }
            Some("--") => {
                a.command = it.collect();
                break;
            }
            _ => die("usage: fhsx-supervisor [--control-fd N] [--nproc N] -- CMD [ARGS...]"),
        }
    }
    if a.command.is_empty() {
        die("no command given after --");
    }
    a
}

struct Control(Option<c_int>);

impl Control {
    fn send(&self, line: &str) {
        if let Some(fd) = self.0 {
            let msg = format!("{line}\n");
            let mut off = 0;
            while off < msg.len() {
                // SAFETY: the buffer is valid for the given length.
                let n = unsafe { write(fd, msg[off..].as_ptr().cast(), msg.len() - off) };
                if n < 0 && errno() == EINTR {
                    continue;
                }
                if n <= 0 {
                    return;
                }
                off += n as usize;
            }
        }
    }
}

fn sigset(signals: &[c_int]) -> SigSet {
    let mut set = SigSet { val: [0; 16] };
    // SAFETY: set is a valid, writable sigset_t-sized buffer.
    unsafe {
        sigemptyset(&mut set);
        for &s in signals {
            sigaddset(&mut set, s);
        }
    }
    set
}

/// Number of processes in this PID namespace other than ourselves.
fn count_others() -> u32 {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    // SAFETY: getpid has no preconditions.
    let me = unsafe { getpid() };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<c_int>().ok()))
        .filter(|&p| p != me)
        .count() as u32
}

/// Reap every child that has already ended; return the main child's raw
/// wait status if it was among them.
fn reap_ready(main: c_int, main_status: &mut Option<c_int>) {
    loop {
        let mut st: c_int = 0;
        // SAFETY: st is a valid out-pointer.
        let pid = unsafe { waitpid(-1, &mut st, WNOHANG) };
        if pid > 0 {
            if pid == main {
                *main_status = Some(st);
            }
            continue;
        }
        if pid < 0 && errno() == EINTR {
            continue;
        }
        return;
    }
}

/// SIGKILL everything else in the namespace and reap it until nothing is left.
fn kill_and_reap_all() {
    loop {
        // SAFETY: kill(-1) from PID 1 reaches every process of this PID
        // namespace except ourselves, and nothing outside it.
        unsafe { kill(-1, SIGKILL) };
        let mut st: c_int = 0;
        // SAFETY: st is a valid out-pointer.
        let pid = unsafe { waitpid(-1, &mut st, 0) };
        if pid < 0 {
            match errno() {
                EINTR => continue,
                ECHILD => return,
                _ => return,
            }
        }
    }
}

fn main() {
    let args = parse_args();

    // It signals "every process it can see" (kill -1): only ever sane as
    // PID 1 of a PID namespace of its own. Anywhere else it would hit the
    // host's processes, so it refuses to start.
    // SAFETY: getpid has no preconditions.
    if unsafe { getpid() } != 1 {
        die("must run as PID 1 of its own PID namespace (bwrap --unshare-pid --as-pid-1); refusing to start, since it signals every process it can see");
    }

    // Close every inherited descriptor but stdio and the control channel.
    // SAFETY: closing descriptors we do not use has no memory-safety effect.
    unsafe {
        match args.control_fd {
            Some(fd) if fd >= 3 => {
                if fd > 3 {
                    close_range(3, (fd - 1) as c_uint, 0);
                }
                close_range((fd + 1) as c_uint, c_uint::MAX, 0);
                fcntl(fd, F_SETFD, FD_CLOEXEC);
            }
            _ => {
                close_range(3, c_uint::MAX, 0);
            }
        }
    }
    let control = Control(args.control_fd.filter(|&fd| fd >= 3));

    // Not dumpable: the command (same uid) can neither ptrace PID 1 nor
    // open its /proc entries, so it cannot forge the status it reports.
    // SAFETY: plain prctl.
    unsafe { prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) };

    // A fresh, anonymous session keyring: the caller's session keys (which,
    // when the caller is root, the sandbox uid would own) stay out of reach.
    // SAFETY: keyctl with a null name creates and joins an anonymous keyring.
    unsafe { syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, 0i64) };

    // Tell the host we exist: while bwrap lives, it can find and hold us by
    // a pidfd, and later wait for this namespace to be empty.
    control.send("START");

    let handled = sigset(&[SIGTERM, SIGINT, SIGHUP, SIGCHLD]);
    // SAFETY: valid sigset pointers; blocking before the signalfd exists
    // means no signal is lost.
    let sfd = unsafe {
        sigprocmask(SIG_BLOCK, &handled, std::ptr::null_mut());
        signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK)
    };
    if sfd < 0 {
        die(&format!("signalfd failed (errno {})", errno()));
    }

    let nproc = args.nproc;
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    // The pre_exec hook is required: it unblocks the signals we read from
    // the signalfd (std's posix_spawn path would leave them blocked, and
    // the command could not be terminated).
    // SAFETY: the closure only calls async-signal-safe functions.
    unsafe {
        cmd.pre_exec(move || {
            let empty = SigSet { val: [0; 16] };
            sigprocmask(SIG_SETMASK, &empty, std::ptr::null_mut());
            signal(SIGPIPE, SIG_DFL);
            if let Some(n) = nproc {
                let lim = RLimit { cur: n, max: n };
                setrlimit(RLIMIT_NPROC, &lim);
            }
            Ok(())
        });
    }
    let main_pid = match cmd.spawn() {
        Ok(child) => child.id() as c_int,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "fhsx-supervisor: cannot run {:?}: {e}",
                args.command[0]
            );
            control.send(&format!("NOEXEC {}", e.raw_os_error().unwrap_or(0)));
            control.send("LINGER 0");
            std::process::exit(127);
        }
    };

    let mut main_status: Option<c_int> = None;
    let mut control_open = control.0.is_some();
    let mut buf = [0u8; 128];
    while main_status.is_none() {
        let mut fds = [
            PollFd {
                fd: sfd,
                events: POLLIN,
                revents: 0,
            },
            PollFd {
                fd: if control_open { control.0.unwrap_or(-1) } else { -1 },
                events: POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfd structs.
        let n = unsafe { poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if errno() == EINTR {
                continue;
            }
            die(&format!("poll failed (errno {})", errno()));
        }
        let mut terminate = false;
        if fds[0].revents & POLLIN != 0 {
            loop {
                // SAFETY: buf holds one signalfd_siginfo (128 bytes).
                let r = unsafe { read(sfd, buf.as_mut_ptr().cast(), buf.len()) };
                if r != buf.len() as isize {
                    break;
                }
                let signo = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as c_int;
                if signo != SIGCHLD {
                    terminate = true;
                }
            }
            reap_ready(main_pid, &mut main_status);
        }
        if control_open && fds[1].revents & (POLLIN | POLLHUP | POLLERR) != 0 {
            if let Some(fd) = control.0 {
                // SAFETY: buf is valid for its length.
                let r = unsafe { read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if r <= 0 {
                    // The host end is gone; bwrap's --die-with-parent covers us.
                    control_open = false;
                } else if buf[..r as usize].windows(4).any(|w| w == b"TERM") {
                    terminate = true;
                }
            }
        }
        if terminate && main_status.is_none() {
            // SAFETY: kill(-1) from PID 1 only reaches this namespace.
            unsafe { kill(-1, SIGTERM) };
        }
    }

    // The main process has ended: do not wait for anything it left behind.
    let mut other = None;
    reap_ready(-2, &mut other);
    let lingering = count_others();
    kill_and_reap_all();

    let st = main_status.unwrap_or(0);
    let (line, code) = if st & 0x7f == 0 {
        let code = (st >> 8) & 0xff;
        (format!("EXIT {code}"), code)
    } else {
        let sig = st & 0x7f;
        (format!("SIGNAL {sig}"), 128 + sig)
    };
    control.send(&line);
    control.send(&format!("LINGER {lingering}"));
    if let Some(fd) = control.0 {
        // SAFETY: closing our own descriptor.
        unsafe { close(fd) };
    }
    std::process::exit(code);
}
