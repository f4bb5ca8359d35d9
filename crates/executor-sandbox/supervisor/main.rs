//! `fhsx-supervisor`: PID 1 inside an fhsx sandbox.
//!
//! Built by `executor-sandbox`'s build.rs as a static executable (the sandbox
//! root may hold no libc of the host), so it uses only `std` plus a few
//! hand-declared libc functions: no crates.
//!
//! Usage: `fhsx-supervisor [--control-fd N] [--umask OCTAL] [--nproc N] [--rlimit-fsize N]
//! [--rlimit-nofile N] [--rlimit-as N] [--proxy-port P --proxy-socket PATH]
//! [--landlock-rw PATH]... [--landlock-files PATH]... -- CMD [ARGS...]`
//!
//! With any `--landlock-*` path, CMD runs inside a Landlock domain (see
//! `landlock.rs`): writes only beneath those paths, and no signal or
//! abstract-socket connection out of the domain.
//!
//! The `--rlimit-*` limits (and `--nproc`) are set on CMD only, just before
//! it execs; a value above the current hard limit is clamped to it. CMD
//! also starts with every signal disposition at its default, an empty
//! signal mask, umask 0022 and `oom_score_adj` 500 (see
//! `pristine_for_command`; the host side pinned the rest of the process
//! state before bwrap).
//!
//! It is installed execute-only (mode 0111): the build may run it, but not
//! read it, and because its file is unreadable the kernel makes it
//! non-dumpable from its first instruction, so `/proc/1/exe`, `/proc/1/mem`
//! and `/proc/1/map_files` are closed to the command as well.
//!
//! With `--proxy-port`, before CMD starts it listens on `127.0.0.1:P` (the
//! sandbox's own network namespace, where only `lo` exists) and forwards
//! every accepted connection to the UNIX socket PATH, both ways, one thread
//! per connection and at most [`MAX_PROXY_CONNS`] at a time (more wait in
//! the listen backlog); an EOF from either side is passed on as a
//! half-close (`shutdown(Write)`), so HTTP clients see the response end.
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
//! `LANDLOCK <abi>` (0: none) when asked for Landlock, then `EXIT <code>` or `SIGNAL <n>` or `NOEXEC <errno>`, then
//! `LINGER <count>`.

mod landlock;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_uint, c_void};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};

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
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    fn close(fd: c_int) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn setrlimit(resource: c_int, rlim: *const RLimit) -> c_int;
    fn getrlimit(resource: c_int, rlim: *mut RLimit) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int;
    fn getpid() -> c_int;
    fn __errno_location() -> *mut c_int;
    fn syscall(n: i64, ...) -> i64;
    fn prctl(option: c_int, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> c_int;
    fn umask(mask: c_uint) -> c_uint;
    fn open(path: *const u8, flags: c_int, ...) -> c_int;
}

/// x86_64 and aarch64 syscall numbers of rt_sigaction(2).
#[cfg(target_arch = "x86_64")]
const SYS_RT_SIGACTION: i64 = 13;
#[cfg(target_arch = "aarch64")]
const SYS_RT_SIGACTION: i64 = 134;
const SIGSTOP: c_int = 19;
const O_WRONLY: c_int = 1;
const O_CLOEXEC: c_int = 0o2000000;

/// The command's `oom_score_adj` (executor-sandbox's
/// `COMMAND_OOM_SCORE_ADJ`): the first the OOM killer picks, in the run's
/// memory cgroup and on the host.
const COMMAND_OOM_SCORE_ADJ: &[u8] = b"500";

/// In the command's child, before exec: every signal disposition to
/// default (an ignored one would survive execve; std ignores SIGPIPE in
/// this process), an empty mask, umask 0022, and the command's
/// `oom_score_adj`. The host side imposed the rest of the pristine state
/// on bwrap already (see executor-sandbox's `pristine.rs`). Raw calls
/// only: async-signal-safe.
fn pristine_for_command(mask: u32) {
    // The kernel's struct sigaction, zeroed: SIG_DFL, no flags, no mask.
    let dfl = [0u64; 4];
    for sig in 1..=64 {
        if sig != SIGKILL && sig != SIGSTOP {
            // SAFETY: a valid struct sigaction; no old action wanted.
            unsafe {
                syscall(
                    SYS_RT_SIGACTION,
                    sig as i64,
                    dfl.as_ptr(),
                    std::ptr::null::<u64>(),
                    8i64,
                )
            };
        }
    }
    let empty = SigSet { val: [0; 16] };
    // SAFETY: valid sigset pointer; umask has no preconditions.
    unsafe {
        sigprocmask(SIG_SETMASK, &empty, std::ptr::null_mut());
        umask(mask);
    }
    // Raising is always allowed. Only where the caller is host root are
    // this child's /proc files its own (it is not dumpable, so they belong
    // to host uid 0); elsewhere the host side set the value for the whole
    // sandbox already, and this open fails.
    // SAFETY: a NUL-terminated path; our own descriptor.
    unsafe {
        let fd = open(b"/proc/self/oom_score_adj\0".as_ptr(), O_WRONLY | O_CLOEXEC);
        if fd >= 0 {
            write(
                fd,
                COMMAND_OOM_SCORE_ADJ.as_ptr().cast(),
                COMMAND_OOM_SCORE_ADJ.len(),
            );
            close(fd);
        }
    }
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
const SIGTERM: c_int = 15;
const SIGCHLD: c_int = 17;
const SFD_CLOEXEC: c_int = 0o2000000;
const SFD_NONBLOCK: c_int = 0o4000;
const WNOHANG: c_int = 1;
const POLLIN: i16 = 1;
const POLLHUP: i16 = 0x10;
const POLLERR: i16 = 0x8;
const RLIMIT_NPROC: c_int = 6;
const RLIMIT_FSIZE: c_int = 1;
const RLIMIT_NOFILE: c_int = 7;
const RLIMIT_AS: c_int = 9;
const POLLOUT: i16 = 4;

/// Proxy connections forwarded at once; further ones wait to be accepted.
const MAX_PROXY_CONNS: usize = 64;
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
    /// (resource, value) pairs set on the command before it execs.
    rlimits: Vec<(c_int, u64)>,
    proxy_port: Option<u16>,
    proxy_socket: Option<OsString>,
    landlock_rw: Vec<OsString>,
    landlock_files: Vec<OsString>,
    /// The command's umask (0022 unless varied on purpose).
    umask: u32,
    command: Vec<OsString>,
}

const USAGE: &str = "usage: fhsx-supervisor [--control-fd N] [--umask OCTAL] [--nproc N] [--rlimit-fsize N] [--rlimit-nofile N] [--rlimit-as N] [--proxy-port P --proxy-socket PATH] [--landlock-rw PATH]... [--landlock-files PATH]... -- CMD [ARGS...]";

fn parse_args() -> Args {
    let mut it = std::env::args_os().skip(1);
    let mut a = Args {
        control_fd: None,
        nproc: None,
        rlimits: Vec::new(),
        proxy_port: None,
        proxy_socket: None,
        landlock_rw: Vec::new(),
        landlock_files: Vec::new(),
        umask: 0o022,
        command: Vec::new(),
    };
    while let Some(arg) = it.next() {
        match arg.to_str() {
            Some("--control-fd") => {
                let v = it
                    .next()
                    .and_then(|v| v.to_str().and_then(|s| s.parse().ok()));
                a.control_fd = Some(v.unwrap_or_else(|| die("--control-fd needs a number")));
            }
            Some("--umask") => {
                let v = it
                    .next()
                    .and_then(|v| v.to_str().and_then(|s| u32::from_str_radix(s, 8).ok()));
                a.umask = v.unwrap_or_else(|| die("--umask needs an octal mask")) & 0o777;
            }
            Some("--nproc") => {
                let v = it
                    .next()
                    .and_then(|v| v.to_str().and_then(|s| s.parse().ok()));
                a.nproc = Some(v.unwrap_or_else(|| die("--nproc needs a number")));
            }
            Some(flag @ ("--rlimit-fsize" | "--rlimit-nofile" | "--rlimit-as")) => {
                let res = match flag {
                    "--rlimit-fsize" => RLIMIT_FSIZE,
                    "--rlimit-nofile" => RLIMIT_NOFILE,
                    _ => RLIMIT_AS,
                };
                let v = it
                    .next()
                    .and_then(|v| v.to_str().and_then(|s| s.parse().ok()));
                let v = v.unwrap_or_else(|| die(&format!("{flag} needs a number")));
                a.rlimits.push((res, v));
            }
            Some("--proxy-port") => {
                let v = it
                    .next()
                    .and_then(|v| v.to_str().and_then(|s| s.parse().ok()));
                a.proxy_port = Some(v.unwrap_or_else(|| die("--proxy-port needs a port number")));
            }
            Some("--proxy-socket") => {
                a.proxy_socket = Some(
                    it.next()
                        .unwrap_or_else(|| die("--proxy-socket needs a path")),
                );
            }
            Some(flag @ ("--landlock-rw" | "--landlock-files")) => {
                let p = it
                    .next()
                    .unwrap_or_else(|| die(&format!("{flag} needs a path")));
                if flag == "--landlock-rw" {
                    a.landlock_rw.push(p);
                } else {
                    a.landlock_files.push(p);
                }
            }
            Some("--") => {
                a.command = it.collect();
                break;
            }
            _ => die(USAGE),
        }
    }
    if a.command.is_empty() {
        die("no command given after --");
    }
    if a.proxy_port.is_some() != a.proxy_socket.is_some() {
        die("--proxy-port and --proxy-socket go together");
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

    // The forwarder's threads start after the signals are blocked, so they
    // inherit the mask and every signal goes to the signalfd.
    if let (Some(port), Some(socket)) = (args.proxy_port, args.proxy_socket.clone()) {
        start_proxy(port, socket);
    }

    // Limits are computed here (no allocation after fork): a value above
    // the hard limit cannot be set without privilege, so it is clamped.
    let limits: Vec<(c_int, RLimit)> = args
        .rlimits
        .iter()
        .map(|&(res, v)| {
            let mut cur = RLimit { cur: 0, max: 0 };
            // SAFETY: cur is a valid out-pointer.
            let v = if unsafe { getrlimit(res, &mut cur) } == 0 {
                v.min(cur.max)
            } else {
                v
            };
            (res, RLimit { cur: v, max: v })
        })
        .collect();

    let ruleset = if args.landlock_rw.is_empty() && args.landlock_files.is_empty() {
        None
    } else {
        match landlock::build(&args.landlock_rw, &args.landlock_files) {
            Ok(r) => {
                control.send(&format!("LANDLOCK {}", r.as_ref().map_or(0, |r| r.abi)));
                r
            }
            Err(e) => die(&e),
        }
    };

    let nproc = args.nproc;
    let mask = args.umask;
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    // The pre_exec hook is required: it unblocks the signals we read from
    // the signalfd (std's posix_spawn path would leave them blocked, and
    // the command could not be terminated).
    // SAFETY: the closure only calls async-signal-safe functions.
    unsafe {
        cmd.pre_exec(move || {
            pristine_for_command(mask);
            if let Some(n) = nproc {
                let lim = RLimit { cur: n, max: n };
                setrlimit(RLIMIT_NPROC, &lim);
            }
            for (res, lim) in &limits {
                if setrlimit(*res, lim) != 0 {
                    return Err(std::io::Error::from_raw_os_error(errno()));
                }
            }
            // Last, so nothing above runs restricted; the supervisor itself
            // stays outside the domain (and so out of the command's reach).
            if let Some(r) = &ruleset {
                r.restrict_self().map_err(std::io::Error::from_raw_os_error)?;
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
                fd: if control_open {
                    control.0.unwrap_or(-1)
                } else {
                    -1
                },
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

/// Listen on `127.0.0.1:port` now (the command must find it up) and
/// forward each connection to the UNIX socket `socket` from a thread.
fn start_proxy(port: u16, socket: OsString) {
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| {
        die(&format!(
            "cannot listen on 127.0.0.1:{port} for the fetch proxy: {e}"
        ))
    });
    let slots = Arc::new((Mutex::new(0usize), Condvar::new()));
    let spawned = std::thread::Builder::new()
        .name("proxy-accept".into())
        .stack_size(256 * 1024)
        .spawn(move || accept_loop(listener, socket, slots));
    if let Err(e) = spawned {
        die(&format!("cannot start the fetch proxy forwarder: {e}"));
    }
}

/// Frees a connection slot when the connection's thread ends.
struct Slot(Arc<(Mutex<usize>, Condvar)>);

impl Drop for Slot {
    fn drop(&mut self) {
        let (m, cv) = &*self.0;
        if let Ok(mut n) = m.lock() {
            *n -= 1;
        }
        cv.notify_one();
    }
}

fn accept_loop(listener: TcpListener, socket: OsString, slots: Arc<(Mutex<usize>, Condvar)>) {
    loop {
        {
            let (m, cv) = &*slots;
            let Ok(mut n) = m.lock() else { return };
            while *n >= MAX_PROXY_CONNS {
                n = match cv.wait(n) {
                    Ok(n) => n,
                    Err(_) => return,
                };
            }
            *n += 1;
        }
        let slot = Slot(slots.clone());
        let tcp = match listener.accept() {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // EMFILE and the like: back off, do not spin.
                drop(slot);
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let socket = socket.clone();
        let started = std::thread::Builder::new()
            .name("proxy-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let _slot = slot;
                if let Ok(unix) = UnixStream::connect(&socket) {
                    forward(tcp, unix);
                } else {
                    let _ = writeln!(
                        std::io::stderr(),
                        "fhsx-supervisor: cannot reach the fetch proxy at {}",
                        std::path::Path::new(&socket).display()
                    );
                }
            });
        // On failure the closure (tcp and slot with it) is dropped.
        drop(started);
    }
}

/// One direction of a forwarded connection.
struct Pipe {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The source said EOF.
    eof: bool,
    /// The EOF was passed on (shutdown(Write) of the destination).
    done: bool,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe {
            buf: vec![0; 32 * 1024],
            start: 0,
            end: 0,
            eof: false,
            done: false,
        }
    }
    fn wants_read(&self) -> bool {
        !self.eof && self.start == self.end
    }
    fn wants_write(&self) -> bool {
        self.start < self.end
    }
}

/// Copy both ways between `tcp` and `unix` (non-blocking, one thread,
/// poll) until both directions have ended; an error on either side ends
/// the connection (both closed).
fn forward(tcp: TcpStream, unix: UnixStream) {
    if tcp.set_nonblocking(true).is_err() || unix.set_nonblocking(true).is_err() {
        return;
    }
    let mut tcp = tcp;
    let mut unix = unix;
    // [0]: tcp -> unix, [1]: unix -> tcp
    let mut p = [Pipe::new(), Pipe::new()];
    loop {
        if p[0].done && p[1].done {
            return;
        }
        let ev_tcp = if p[0].wants_read() { POLLIN } else { 0 }
            | if p[1].wants_write() { POLLOUT } else { 0 };
        let ev_unix = if p[1].wants_read() { POLLIN } else { 0 }
            | if p[0].wants_write() { POLLOUT } else { 0 };
        let mut fds = [
            PollFd {
                fd: if ev_tcp != 0 { tcp.as_raw_fd() } else { -1 },
                events: ev_tcp,
                revents: 0,
            },
            PollFd {
                fd: if ev_unix != 0 { unix.as_raw_fd() } else { -1 },
                events: ev_unix,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfd structs.
        let n = unsafe { poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if errno() == EINTR {
                continue;
            }
            return;
        }
        let [a, b] = &mut p;
        if step(a, &mut tcp, &mut unix, |s| s.shutdown(Shutdown::Write)).is_err()
            || step(b, &mut unix, &mut tcp, |s| s.shutdown(Shutdown::Write)).is_err()
        {
            return;
        }
    }
}

/// Move what can move without blocking in one direction.
fn step<R: Read, W: Write>(
    p: &mut Pipe,
    from: &mut R,
    to: &mut W,
    half_close: impl Fn(&mut W) -> std::io::Result<()>,
) -> Result<(), ()> {
    use std::io::ErrorKind::{Interrupted, WouldBlock};
    loop {
        if p.wants_write() {
            match to.write(&p.buf[p.start..p.end]) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    p.start += n;
                    if p.start == p.end {
                        p.start = 0;
                        p.end = 0;
                    }
                    continue;
                }
                Err(e) if e.kind() == WouldBlock => return Ok(()),
                Err(e) if e.kind() == Interrupted => continue,
                Err(_) => return Err(()),
            }
        }
        if p.eof {
            if !p.done {
                p.done = true;
                // The peer may already be gone: nothing left to tell it.
                let _ = half_close(to);
            }
            return Ok(());
        }
        match from.read(&mut p.buf) {
            Ok(0) => p.eof = true,
            Ok(n) => {
                p.start = 0;
                p.end = n;
            }
            Err(e) if e.kind() == WouldBlock => return Ok(()),
            Err(e) if e.kind() == Interrupted => {}
            Err(_) => return Err(()),
        }
    }
}
