//! `fhsx-supervisor`: PID 1 inside an fhsx sandbox.
//!
//! Built by `executor-sandbox`'s build.rs as a static executable that
//! links no libc at all: `no_std`, its own `_start`, raw system calls
//! (`sys.rs`), no allocator. The sandbox root may hold no libc of the
//! host, so it had been a static glibc binary with `std`; but it starts
//! once per action, and a static glibc's start (CPU features probed with
//! `cpuid`, which traps to the hypervisor on a VM, IRELATIVE relocations,
//! TLS) and `std`'s (its stack guard read from `/proc/self/maps`) cost
//! 0.8 ms of each action's path on these machines — bare bwrap with this
//! supervisor as PID 1 took 1.30 ms longer than with `/bin/true` as PID 1,
//! with a minimal raw-syscall PID 1, 0.52 ms.
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
//! every accepted connection to the UNIX socket PATH, both ways, in its
//! one event loop (`proxy.rs`).
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
//!
//! Its aarch64 system calls (`sys.rs`) are written, not built here. The
//! forwarder's connect to the proxy waits at most
//! `CONNECT_TIMEOUT_S` (2 s, `SO_SNDTIMEO`) when the proxy's accept backlog
//! (128) is full, since the whole loop waits with it.

#![no_std]
#![no_main]

mod landlock;
mod mem;
mod proxy;
mod spawn;
mod sys;

use sys::{CStr, PollFd, RLimit, SigSet, POLLERR, POLLHUP, POLLIN};

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym entry,
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "mov x0, sp",
    "bl {entry}",
    "brk #0",
    entry = sym entry,
);

/// The process's start: `sp` points at argc, then argv, NULL, envp, NULL.
unsafe extern "C" fn entry(sp: *const usize) -> ! {
    let argc = *sp;
    let argv = sp.add(1) as *const CStr;
    let envp = argv.add(argc + 1);
    main(argc, argv, envp)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    say(&[b"internal error"]);
    sys::exit(125)
}

/// A line to stderr, prefixed with the program's name.
pub(crate) fn say(parts: &[&[u8]]) {
    let mut line = Line::new();
    line.push(b"fhsx-supervisor: ");
    for p in parts {
        line.push(p);
    }
    // A cut line still ends.
    line.len = line.len.min(line.buf.len() - 1);
    line.push(b"\n");
    sys::write_all(2, line.bytes());
}

fn die(parts: &[&[u8]]) -> ! {
    say(parts);
    sys::exit(125)
}

/// The bytes of `b` up to its first NUL.
pub(crate) fn until_nul(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |n| &b[..n])
}

/// A line of text built without an allocator; what does not fit is cut.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    fn push(&mut self, b: &[u8]) -> &mut Line {
        let n = b.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
        self
    }

    fn num(&mut self, v: u64) -> &mut Line {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut v = v;
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..])
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// `errno N, its text` (the text where [`sys::strerror`] has one).
fn errno_text(e: sys::Errno) -> Line {
    let mut l = Line::new();
    l.push(b"errno ").num(e as u64);
    let text = sys::strerror(e);
    if !text.is_empty() {
        l.push(b", ").push(text.as_bytes());
    }
    l
}

/// Room for the paths of each `--landlock-*` flag.
const MAX_PATHS: usize = 64;
/// Room for `--rlimit-*` flags.
const MAX_RLIMITS: usize = 8;

struct Args {
    control_fd: Option<i32>,
    nproc: Option<u64>,
    /// (resource, value) pairs set on the command before it execs.
    rlimits: [(u32, u64); MAX_RLIMITS],
    n_rlimits: usize,
    proxy_port: Option<u16>,
    proxy_socket: Option<&'static [u8]>,
    landlock_rw: [CStr; MAX_PATHS],
    n_rw: usize,
    landlock_files: [CStr; MAX_PATHS],
    n_files: usize,
    /// The command's umask (0022 unless varied on purpose).
    umask: u32,
    /// Inherited descriptors the command keeps (the jobserver's ends).
    keep_fds: [i32; MAX_KEPT_FDS],
    n_keep: usize,
    /// The command's argv: NULL-terminated, within the process's own.
    command: *const CStr,
}

/// At most this many `--keep-fd`s: the jobserver's two ends.
const MAX_KEPT_FDS: usize = 2;

const USAGE: &[u8] = b"usage: fhsx-supervisor [--control-fd N] [--keep-fd N]... [--umask OCTAL] [--nproc N] [--rlimit-fsize N] [--rlimit-nofile N] [--rlimit-as N] [--proxy-port P --proxy-socket PATH] [--landlock-rw PATH]... [--landlock-files PATH]... -- CMD [ARGS...]";

fn number(flag: &[u8], v: Option<&[u8]>, radix: u64) -> u64 {
    let parsed = v.filter(|v| !v.is_empty() && v.len() <= 20).and_then(|v| {
        v.iter().try_fold(0u64, |n, &c| {
            let d = (c as u64).wrapping_sub(b'0' as u64);
            if d >= radix {
                return None;
            }
            n.checked_mul(radix)?.checked_add(d)
        })
    });
    parsed.unwrap_or_else(|| {
        die(&[
            flag,
            if radix == 8 {
                b" needs an octal mask"
            } else {
                b" needs a number"
            },
        ])
    })
}

/// # Safety
/// `argv` must be the process's argv, `argc` entries and a NULL.
unsafe fn parse_args(argc: usize, argv: *const CStr) -> Args {
    let mut a = Args {
        control_fd: None,
        nproc: None,
        rlimits: [(0, 0); MAX_RLIMITS],
        n_rlimits: 0,
        proxy_port: None,
        proxy_socket: None,
        landlock_rw: [core::ptr::null(); MAX_PATHS],
        n_rw: 0,
        landlock_files: [core::ptr::null(); MAX_PATHS],
        n_files: 0,
        umask: 0o022,
        keep_fds: [-1; MAX_KEPT_FDS],
        n_keep: 0,
        command: core::ptr::null(),
    };
    let arg = |i: usize| (i < argc).then(|| sys::bytes_of(*argv.add(i)));
    let mut i = 1;
    while let Some(flag) = arg(i) {
        let value = arg(i + 1);
        match flag {
            b"--control-fd" => {
                a.control_fd = Some(number(flag, value, 10).min(i32::MAX as u64) as i32)
            }
            b"--umask" => a.umask = number(flag, value, 8) as u32 & 0o777,
            b"--keep-fd" => {
                if a.n_keep == MAX_KEPT_FDS {
                    die(&[b"too many --keep-fd flags"]);
                }
                let fd = number(flag, value, 10);
                if !(3..=i32::MAX as u64).contains(&fd) {
                    die(&[b"--keep-fd needs a descriptor above 2"]);
                }
                a.keep_fds[a.n_keep] = fd as i32;
                a.n_keep += 1;
            }
            b"--nproc" => a.nproc = Some(number(flag, value, 10)),
            b"--rlimit-fsize" | b"--rlimit-nofile" | b"--rlimit-as" => {
                let res = match flag {
                    b"--rlimit-fsize" => sys::RLIMIT_FSIZE,
                    b"--rlimit-nofile" => sys::RLIMIT_NOFILE,
                    _ => sys::RLIMIT_AS,
                };
                if a.n_rlimits == MAX_RLIMITS {
                    die(&[b"too many --rlimit-* flags"]);
                }
                a.rlimits[a.n_rlimits] = (res, number(flag, value, 10));
                a.n_rlimits += 1;
            }
            b"--proxy-port" => {
                let p = number(flag, value, 10);
                if p > u16::MAX as u64 {
                    die(&[b"--proxy-port needs a port number"]);
                }
                a.proxy_port = Some(p as u16);
            }
            b"--proxy-socket" => {
                a.proxy_socket =
                    Some(value.unwrap_or_else(|| die(&[b"--proxy-socket needs a path"])));
            }
            b"--landlock-rw" | b"--landlock-files" => {
                if value.is_none() {
                    die(&[flag, b" needs a path"]);
                }
                let (list, n) = if flag == b"--landlock-rw" {
                    (&mut a.landlock_rw, &mut a.n_rw)
                } else {
                    (&mut a.landlock_files, &mut a.n_files)
                };
                if *n == MAX_PATHS {
                    die(&[b"too many ", flag, b" paths"]);
                }
                list[*n] = *argv.add(i + 1);
                *n += 1;
            }
            b"--" => {
                a.command = argv.add(i + 1);
                break;
            }
            _ => die(&[USAGE]),
        }
        i += 2;
    }
    if a.command.is_null() || (*a.command).is_null() {
        die(&[b"no command given after --"]);
    }
    if a.proxy_port.is_some() != a.proxy_socket.is_some() {
        die(&[b"--proxy-port and --proxy-socket go together"]);
    }
    a
}

struct Control(Option<i32>);

impl Control {
    fn send(&self, line: &mut Line) {
        if let Some(fd) = self.0 {
            sys::write_all(fd, line.push(b"\n").bytes());
        }
    }
}

/// Number of processes in this PID namespace other than ourselves.
fn count_others() -> u32 {
    // SAFETY: a NUL-terminated path.
    let Ok(fd) = (unsafe {
        sys::open(
            c"/proc".as_ptr().cast(),
            sys::O_RDONLY | sys::O_DIRECTORY | sys::O_CLOEXEC,
        )
    }) else {
        return 0;
    };
    let me = sys::getpid() as u64;
    let mut buf = [0u8; 4096];
    let mut n = 0;
    while let Ok(len) = sys::getdents(fd, &mut buf) {
        if len == 0 {
            break;
        }
        // struct linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
        let mut at = 0;
        while at + 19 < len {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let name = until_nul(&buf[at + 19..(at + reclen).min(len)]);
            let pid = name.iter().try_fold(0u64, |v, &c| {
                c.is_ascii_digit()
                    .then(|| v.saturating_mul(10).saturating_add((c - b'0') as u64))
            });
            if matches!(pid, Some(p) if !name.is_empty() && p != me) {
                n += 1;
            }
            at += reclen;
        }
    }
    sys::close(fd);
    n
}

/// Reap every child that has already ended; return the main child's raw
/// wait status if it was among them.
fn reap_ready(main: i32, main_status: &mut Option<i32>) {
    loop {
        match sys::wait(-1, sys::WNOHANG) {
            Ok((pid, st)) if pid > 0 => {
                if pid == main {
                    *main_status = Some(st);
                }
            }
            Err(sys::EINTR) => {}
            _ => return,
        }
    }
}

/// SIGKILL everything else in the namespace and reap it until nothing is left.
fn kill_and_reap_all() {
    loop {
        // kill(-1) from PID 1 reaches every process of this PID namespace
        // except ourselves, and nothing outside it.
        let _ = sys::kill(-1, sys::SIGKILL);
        match sys::wait(-1, 0) {
            Ok(_) | Err(sys::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// Descriptors 0-2 open, as a process expects (on `/dev/null` if not).
fn standard_fds_open() {
    let mut fds = [0, 1, 2].map(|fd| PollFd {
        fd,
        events: 0,
        revents: 0,
    });
    if sys::poll(&mut fds, 0).is_err() {
        return;
    }
    for f in fds {
        if f.revents & sys::POLLNVAL != 0 {
            // SAFETY: a NUL-terminated path. Opened on the lowest free
            // descriptor, which is this one.
            let _ = unsafe { sys::open(c"/dev/null".as_ptr().cast(), sys::O_RDWR) };
        }
    }
}

/// Close every descriptor above 2 but the control channel and the kept
/// ones (which stay inheritable, as they came).
fn close_all_but(args: &Args) {
    let mut keep = [0i32; MAX_KEPT_FDS + 1];
    let mut n = 0;
    for fd in args
        .control_fd
        .iter()
        .chain(&args.keep_fds[..args.n_keep])
    {
        if *fd >= 3 {
            keep[n] = *fd;
            n += 1;
        }
    }
    let keep = &mut keep[..n];
    keep.sort_unstable();
    let mut next = 3u32;
    for &fd in keep.iter() {
        let fd = fd as u32;
        if fd > next {
            sys::close_range(next, fd - 1);
        }
        next = next.max(fd + 1);
    }
    sys::close_range(next, u32::MAX);
}

unsafe fn main(argc: usize, argv: *const CStr, envp: *const CStr) -> ! {
    standard_fds_open();
    // Writes to a control channel or a proxy connection whose peer is gone
    // fail with EPIPE instead.
    sys::set_disposition(sys::SIGPIPE, sys::SIG_IGN);
    let args = parse_args(argc, argv);

    // It signals "every process it can see" (kill -1): only ever sane as
    // PID 1 of a PID namespace of its own. Anywhere else it would hit the
    // host's processes, so it refuses to start.
    if sys::getpid() != 1 {
        die(&[b"must run as PID 1 of its own PID namespace (bwrap --unshare-pid --as-pid-1); refusing to start, since it signals every process it can see"]);
    }

    // Close every inherited descriptor but stdio, the control channel and
    // those the command keeps.
    close_all_but(&args);
    if let Some(fd) = args.control_fd.filter(|&fd| fd >= 3) {
        let _ = sys::fcntl(fd, sys::F_SETFD, sys::FD_CLOEXEC);
    }
    let control = Control(args.control_fd.filter(|&fd| fd >= 3));

    // Not dumpable: the command (same uid) can neither ptrace PID 1 nor
    // open its /proc entries, so it cannot forge the status it reports.
    let _ = sys::prctl(sys::PR_SET_DUMPABLE, 0);

    // A fresh, anonymous session keyring: the caller's session keys (which,
    // when the caller is root, the sandbox uid would own) stay out of reach.
    sys::join_anonymous_session_keyring();

    // Tell the host we exist: while bwrap lives, it can find and hold us by
    // a pidfd, and later wait for this namespace to be empty.
    control.send(Line::new().push(b"START"));

    // Blocked before the signalfd exists, so no signal is lost.
    let handled = SigSet::of(&[sys::SIGTERM, sys::SIGINT, sys::SIGHUP, sys::SIGCHLD]);
    sys::sigprocmask(sys::SIG_BLOCK, &handled);
    let sfd = match sys::signalfd(&handled, sys::SFD_CLOEXEC | sys::SFD_NONBLOCK) {
        Ok(fd) => fd,
        Err(e) => die(&[b"signalfd failed (", errno_text(e).bytes(), b")"]),
    };

    let mut proxy = match (args.proxy_port, args.proxy_socket) {
        (Some(port), Some(socket)) => match proxy::Proxy::listen(port, socket) {
            Ok(p) => Some(p),
            Err(e) => die(&[
                b"cannot listen on 127.0.0.1:",
                Line::new().num(port as u64).bytes(),
                b" for the fetch proxy: ",
                e.call.as_bytes(),
                b" failed (",
                errno_text(e.errno).bytes(),
                b")",
            ]),
        },
        _ => None,
    };

    // A value above the hard limit cannot be set without privilege, so it
    // is clamped.
    let mut limits = [(0u32, RLimit { cur: 0, max: 0 }); MAX_RLIMITS];
    for (i, &(res, v)) in args.rlimits[..args.n_rlimits].iter().enumerate() {
        let v = sys::getrlimit(res).map_or(v, |cur| v.min(cur.max));
        limits[i] = (res, RLimit { cur: v, max: v });
    }

    let ruleset = if args.n_rw == 0 && args.n_files == 0 {
        None
    } else {
        match landlock::build(
            &args.landlock_rw[..args.n_rw],
            &args.landlock_files[..args.n_files],
        ) {
            Ok(r) => {
                control.send(
                    Line::new()
                        .push(b"LANDLOCK ")
                        .num(r.as_ref().map_or(0, |r| r.abi as u64)),
                );
                r
            }
            Err(f) => {
                let path = f.path.map_or(&b""[..], |p| sys::bytes_of(p));
                die(&[
                    f.call.as_bytes(),
                    if path.is_empty() { b"" } else { b"(" },
                    path,
                    if path.is_empty() { b"" } else { b")" },
                    b" failed (",
                    errno_text(f.errno).bytes(),
                    b")",
                ])
            }
        }
    };

    let setup = spawn::Setup {
        umask: args.umask,
        nproc: args.nproc,
        rlimits: &limits[..args.n_rlimits],
        ruleset: ruleset.as_ref(),
    };
    let main_pid = match spawn::spawn(args.command, envp, &setup) {
        Ok(pid) => pid,
        Err(e) => {
            say(&[
                b"cannot run \"",
                sys::bytes_of(*args.command),
                b"\": ",
                errno_text(e).bytes(),
            ]);
            control.send(Line::new().push(b"NOEXEC ").num(e as u64));
            control.send(Line::new().push(b"LINGER 0"));
            sys::exit(127);
        }
    };

    let main_status = supervise(main_pid, sfd, &control, proxy.as_mut());

    // The main process has ended: do not wait for anything it left behind.
    let mut other = None;
    reap_ready(-2, &mut other);
    let lingering = count_others();
    kill_and_reap_all();

    let code = if main_status & 0x7f == 0 {
        let code = (main_status >> 8) & 0xff;
        control.send(Line::new().push(b"EXIT ").num(code as u64));
        code
    } else {
        let sig = main_status & 0x7f;
        control.send(Line::new().push(b"SIGNAL ").num(sig as u64));
        128 + sig
    };
    control.send(Line::new().push(b"LINGER ").num(lingering as u64));
    if let Some(fd) = control.0 {
        sys::close(fd);
    }
    sys::exit(code)
}

/// Poll sizes: the signalfd, the control channel, the proxy's listener
/// and two per proxy connection.
const MAX_POLL: usize = 3 + 2 * proxy::MAX_CONNS;

/// Until the command ends: reap orphans, relay a termination request
/// (SIGTERM/SIGINT/SIGHUP, or `TERM` on the control channel) to the whole
/// namespace, forward proxy connections. The command's raw wait status.
fn supervise(
    main_pid: i32,
    sfd: i32,
    control: &Control,
    mut proxy: Option<&mut proxy::Proxy>,
) -> i32 {
    let mut main_status: Option<i32> = None;
    let mut control_open = control.0.is_some();
    let mut buf = [0u8; 128];
    let mut fds = [PollFd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX_POLL];
    loop {
        if let Some(st) = main_status {
            return st;
        }
        fds[0] = PollFd {
            fd: sfd,
            events: POLLIN,
            revents: 0,
        };
        fds[1] = PollFd {
            fd: if control_open {
                control.0.unwrap_or(-1)
            } else {
                -1
            },
            events: POLLIN,
            revents: 0,
        };
        let mut n = 2;
        if let Some(p) = proxy.as_deref() {
            p.fill(&mut fds, &mut n);
        }
        let timeout = proxy.as_deref().map_or(-1, proxy::Proxy::timeout);
        match sys::poll(&mut fds[..n], timeout) {
            Ok(_) => {}
            Err(sys::EINTR) => continue,
            Err(e) => die(&[b"poll failed (", errno_text(e).bytes(), b")"]),
        }
        let mut terminate = false;
        if fds[0].revents & POLLIN != 0 {
            // signalfd_siginfo records of 128 bytes; the signal number first.
            while let Ok(128) = sys::read(sfd, &mut buf) {
                let signo = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
                if signo != sys::SIGCHLD {
                    terminate = true;
                }
            }
            reap_ready(main_pid, &mut main_status);
        }
        if control_open && fds[1].revents & (POLLIN | POLLHUP | POLLERR) != 0 {
            if let Some(fd) = control.0 {
                match sys::read(fd, &mut buf) {
                    // The host end is gone; bwrap's --die-with-parent covers us.
                    Ok(0) | Err(_) => control_open = false,
                    Ok(r) => {
                        if buf[..r].windows(4).any(|w| w == b"TERM") {
                            terminate = true;
                        }
                    }
                }
            }
        }
        if let Some(p) = proxy.as_deref_mut() {
            p.handle(&fds[2..n]);
        }
        if terminate && main_status.is_none() {
            // kill(-1) from PID 1 only reaches this namespace.
            let _ = sys::kill(-1, sys::SIGTERM);
        }
    }
}
