//! The system calls the supervisor makes, each wrapped once: raw
//! `syscall` instructions, since it links no libc (see `main.rs` for
//! why). A call returns `Ok(value)` or `Err(errno)`.

use core::arch::asm;

pub type Errno = i32;
pub type SysResult = Result<usize, Errno>;

#[cfg(target_arch = "x86_64")]
mod nr {
    pub const READ: usize = 0;
    pub const WRITE: usize = 1;
    pub const CLOSE: usize = 3;
    pub const MMAP: usize = 9;
    pub const MUNMAP: usize = 11;
    pub const RT_SIGACTION: usize = 13;
    pub const RT_SIGPROCMASK: usize = 14;
    pub const GETPID: usize = 39;
    pub const SOCKET: usize = 41;
    pub const CONNECT: usize = 42;
    pub const SENDTO: usize = 44;
    pub const RECVFROM: usize = 45;
    pub const SHUTDOWN: usize = 48;
    pub const BIND: usize = 49;
    pub const LISTEN: usize = 50;
    pub const SETSOCKOPT: usize = 54;
    pub const CLONE: usize = 56;
    pub const EXECVE: usize = 59;
    pub const WAIT4: usize = 61;
    pub const KILL: usize = 62;
    pub const FCNTL: usize = 72;
    pub const UMASK: usize = 95;
    pub const PRCTL: usize = 157;
    pub const GETDENTS64: usize = 217;
    pub const EXIT_GROUP: usize = 231;
    pub const KEYCTL: usize = 250;
    pub const OPENAT: usize = 257;
    pub const PPOLL: usize = 271;
    pub const ACCEPT4: usize = 288;
    pub const SIGNALFD4: usize = 289;
    pub const PIPE2: usize = 293;
    pub const PRLIMIT64: usize = 302;
}

#[cfg(target_arch = "aarch64")]
mod nr {
    pub const READ: usize = 63;
    pub const WRITE: usize = 64;
    pub const CLOSE: usize = 57;
    pub const MMAP: usize = 222;
    pub const MUNMAP: usize = 215;
    pub const RT_SIGACTION: usize = 134;
    pub const RT_SIGPROCMASK: usize = 135;
    pub const GETPID: usize = 172;
    pub const SOCKET: usize = 198;
    pub const CONNECT: usize = 203;
    pub const SENDTO: usize = 206;
    pub const RECVFROM: usize = 207;
    pub const SHUTDOWN: usize = 210;
    pub const BIND: usize = 200;
    pub const LISTEN: usize = 201;
    pub const SETSOCKOPT: usize = 208;
    pub const CLONE: usize = 220;
    pub const EXECVE: usize = 221;
    pub const WAIT4: usize = 260;
    pub const KILL: usize = 129;
    pub const FCNTL: usize = 25;
    pub const UMASK: usize = 166;
    pub const PRCTL: usize = 167;
    pub const GETDENTS64: usize = 61;
    pub const EXIT_GROUP: usize = 94;
    pub const KEYCTL: usize = 219;
    pub const OPENAT: usize = 56;
    pub const PPOLL: usize = 73;
    pub const ACCEPT4: usize = 242;
    pub const SIGNALFD4: usize = 74;
    pub const PIPE2: usize = 59;
    pub const PRLIMIT64: usize = 261;
}

// The same numbers on every architecture (allocated after the unification).
pub const SYS_CLOSE_RANGE: usize = 436;
pub const SYS_LANDLOCK_CREATE_RULESET: usize = 444;
pub const SYS_LANDLOCK_ADD_RULE: usize = 445;
pub const SYS_LANDLOCK_RESTRICT_SELF: usize = 446;

/// One system call with up to six arguments.
///
/// # Safety
/// The arguments must be what call `n` expects (valid pointers for the
/// lengths given).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn syscall(n: usize, a: [usize; 6]) -> SysResult {
    let r: isize;
    asm!(
        "syscall",
        inlateout("rax") n as isize => r,
        in("rdi") a[0],
        in("rsi") a[1],
        in("rdx") a[2],
        in("r10") a[3],
        in("r8") a[4],
        in("r9") a[5],
        lateout("rcx") _,
        lateout("r11") _,
        options(nostack)
    );
    result(r)
}

/// See the x86_64 version.
///
/// # Safety
/// As there.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub unsafe fn syscall(n: usize, a: [usize; 6]) -> SysResult {
    let r: isize;
    asm!(
        "svc 0",
        in("x8") n,
        inlateout("x0") a[0] as isize => r,
        in("x1") a[1],
        in("x2") a[2],
        in("x3") a[3],
        in("x4") a[4],
        in("x5") a[5],
        options(nostack)
    );
    result(r)
}

fn result(r: isize) -> SysResult {
    if (-4095..0).contains(&r) {
        Err(-r as Errno)
    } else {
        Ok(r as usize)
    }
}

pub const EINTR: Errno = 4;
pub const EAGAIN: Errno = 11;
pub const EACCES: Errno = 13;
pub const ENOENT: Errno = 2;
pub const ENOTDIR: Errno = 20;
pub const ENODEV: Errno = 19;
pub const ENOEXEC: Errno = 8;
pub const ESTALE: Errno = 116;
pub const ETIMEDOUT: Errno = 110;
pub const ENAMETOOLONG: Errno = 36;
pub const ENOMEM: Errno = 12;

pub const O_RDONLY: usize = 0;
pub const O_WRONLY: usize = 1;
pub const O_RDWR: usize = 2;
pub const O_NONBLOCK: usize = 0o4000;
pub const O_DIRECTORY: usize = 0o200000;
pub const O_CLOEXEC: usize = 0o2000000;
pub const O_PATH: usize = 0o10000000;
const AT_FDCWD: isize = -100;

pub const SIGHUP: i32 = 1;
pub const SIGINT: i32 = 2;
pub const SIGKILL: i32 = 9;
pub const SIGPIPE: i32 = 13;
pub const SIGTERM: i32 = 15;
pub const SIGCHLD: i32 = 17;
pub const SIGSTOP: i32 = 19;

/// A NUL-terminated string: what every path argument must be.
pub type CStr = *const u8;

/// The bytes of a NUL-terminated string, without the NUL.
///
/// # Safety
/// `p` must point to a NUL-terminated string that outlives the process
/// (argv and envp do).
pub unsafe fn bytes_of(p: CStr) -> &'static [u8] {
    let mut n = 0;
    while *p.add(n) != 0 {
        n += 1;
    }
    core::slice::from_raw_parts(p, n)
}

pub fn read(fd: i32, buf: &mut [u8]) -> SysResult {
    // SAFETY: buf is writable for its length.
    unsafe {
        syscall(
            nr::READ,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub fn write(fd: i32, buf: &[u8]) -> SysResult {
    // SAFETY: buf is readable for its length.
    unsafe {
        syscall(
            nr::WRITE,
            [fd as usize, buf.as_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

/// Write all of `buf`, retrying on EINTR; gives up quietly on an error
/// (a reader that is gone).
pub fn write_all(fd: i32, mut buf: &[u8]) {
    while !buf.is_empty() {
        match write(fd, buf) {
            Ok(0) => return,
            Ok(n) => buf = &buf[n..],
            Err(EINTR) => {}
            Err(_) => return,
        }
    }
}

pub fn close(fd: i32) {
    // SAFETY: closing a descriptor touches no memory of ours.
    let _ = unsafe { syscall(nr::CLOSE, [fd as usize, 0, 0, 0, 0, 0]) };
}

pub fn close_range(first: u32, last: u32) {
    // SAFETY: as close.
    let _ = unsafe { syscall(SYS_CLOSE_RANGE, [first as usize, last as usize, 0, 0, 0, 0]) };
}

/// # Safety
/// `path` must be NUL-terminated.
pub unsafe fn open(path: CStr, flags: usize) -> Result<i32, Errno> {
    syscall(
        nr::OPENAT,
        [AT_FDCWD as usize, path as usize, flags, 0, 0, 0],
    )
    .map(|fd| fd as i32)
}

pub fn fcntl(fd: i32, cmd: usize, arg: usize) -> SysResult {
    // SAFETY: the commands used take integer arguments.
    unsafe { syscall(nr::FCNTL, [fd as usize, cmd, arg, 0, 0, 0]) }
}
pub const F_SETFD: usize = 2;
pub const F_GETFL: usize = 3;
pub const F_SETFL: usize = 4;
pub const FD_CLOEXEC: usize = 1;

pub fn getpid() -> i32 {
    // SAFETY: no arguments.
    unsafe { syscall(nr::GETPID, [0; 6]) }.unwrap_or(0) as i32
}

pub fn prctl(option: usize, arg2: usize) -> SysResult {
    // SAFETY: the options used take integer arguments.
    unsafe { syscall(nr::PRCTL, [option, arg2, 0, 0, 0, 0]) }
}
pub const PR_SET_DUMPABLE: usize = 4;
pub const PR_SET_NO_NEW_PRIVS: usize = 38;

/// Join a fresh anonymous session keyring.
pub fn join_anonymous_session_keyring() {
    const KEYCTL_JOIN_SESSION_KEYRING: usize = 1;
    // SAFETY: a null name asks for an anonymous keyring.
    let _ = unsafe { syscall(nr::KEYCTL, [KEYCTL_JOIN_SESSION_KEYRING, 0, 0, 0, 0, 0]) };
}

pub fn umask(mask: u32) {
    // SAFETY: integer argument.
    let _ = unsafe { syscall(nr::UMASK, [mask as usize, 0, 0, 0, 0, 0]) };
}

/// The kernel's signal set (`sizeof` 8 on the architectures here).
#[derive(Clone, Copy)]
#[repr(transparent)]
// Read by the kernel, through a pointer.
#[allow(dead_code)]
pub struct SigSet(pub u64);

impl SigSet {
    pub fn of(signals: &[i32]) -> SigSet {
        SigSet(signals.iter().fold(0, |m, s| m | 1 << (s - 1)))
    }
}

pub const SIG_BLOCK: usize = 0;
pub const SIG_SETMASK: usize = 2;

pub fn sigprocmask(how: usize, set: &SigSet) {
    // SAFETY: set is a valid 8-byte signal set; no old set wanted.
    let _ = unsafe {
        syscall(
            nr::RT_SIGPROCMASK,
            [how, set as *const SigSet as usize, 0, 8, 0, 0],
        )
    };
}

/// Set `sig`'s disposition to `SIG_DFL` (0) or `SIG_IGN` (1), no flags,
/// no mask.
pub fn set_disposition(sig: i32, handler: usize) {
    // The kernel's struct sigaction: handler, flags, restorer, mask.
    let act: [usize; 4] = [handler, 0, 0, 0];
    // SAFETY: a valid struct sigaction; no old action wanted.
    let _ = unsafe {
        syscall(
            nr::RT_SIGACTION,
            [sig as usize, act.as_ptr() as usize, 0, 8, 0, 0],
        )
    };
}
pub const SIG_DFL: usize = 0;
pub const SIG_IGN: usize = 1;

pub const SFD_CLOEXEC: usize = 0o2000000;
pub const SFD_NONBLOCK: usize = 0o4000;

pub fn signalfd(set: &SigSet, flags: usize) -> Result<i32, Errno> {
    // SAFETY: set is a valid 8-byte signal set.
    unsafe {
        syscall(
            nr::SIGNALFD4,
            [usize::MAX, set as *const SigSet as usize, 8, flags, 0, 0],
        )
    }
    .map(|fd| fd as i32)
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PollFd {
    pub fd: i32,
    pub events: i16,
    pub revents: i16,
}
pub const POLLIN: i16 = 1;
pub const POLLOUT: i16 = 4;
pub const POLLERR: i16 = 8;
pub const POLLHUP: i16 = 0x10;
pub const POLLNVAL: i16 = 0x20;

/// `poll`, by way of `ppoll` (aarch64 has no `poll`): `timeout_ms` < 0
/// waits for ever.
pub fn poll(fds: &mut [PollFd], timeout_ms: i64) -> SysResult {
    let ts: [i64; 2] = [timeout_ms / 1000, (timeout_ms % 1000) * 1_000_000];
    let tsp = if timeout_ms < 0 {
        0
    } else {
        ts.as_ptr() as usize
    };
    // SAFETY: fds is a valid array of pollfd for its length; ts a timespec.
    unsafe {
        syscall(
            nr::PPOLL,
            [fds.as_mut_ptr() as usize, fds.len(), tsp, 0, 8, 0],
        )
    }
}

pub const WNOHANG: usize = 1;

/// `wait4(pid, &status, options)`: the pid reaped and its raw status.
pub fn wait(pid: i32, options: usize) -> Result<(i32, i32), Errno> {
    let mut st: i32 = 0;
    // SAFETY: st is a valid out-pointer; no rusage wanted.
    let r = unsafe {
        syscall(
            nr::WAIT4,
            [pid as usize, &mut st as *mut i32 as usize, options, 0, 0, 0],
        )
    }?;
    Ok((r as i32, st))
}

pub fn kill(pid: i32, sig: i32) -> SysResult {
    // SAFETY: integer arguments.
    unsafe { syscall(nr::KILL, [pid as usize, sig as usize, 0, 0, 0, 0]) }
}

/// `fork()` as `clone(SIGCHLD)`: 0 in the child.
pub fn fork() -> Result<i32, Errno> {
    // SAFETY: no memory shared with the child; a null stack means our own,
    // copied.
    unsafe { syscall(nr::CLONE, [SIGCHLD as usize, 0, 0, 0, 0, 0]) }.map(|p| p as i32)
}

/// Returns only on failure.
///
/// # Safety
/// `path` NUL-terminated; `argv` and `envp` NULL-terminated arrays of them.
pub unsafe fn execve(path: CStr, argv: *const CStr, envp: *const CStr) -> Errno {
    match syscall(
        nr::EXECVE,
        [path as usize, argv as usize, envp as usize, 0, 0, 0],
    ) {
        Err(e) => e,
        Ok(_) => 0,
    }
}

pub fn exit(code: i32) -> ! {
    loop {
        // SAFETY: ends the process.
        let _ = unsafe { syscall(nr::EXIT_GROUP, [code as usize, 0, 0, 0, 0, 0]) };
    }
}

pub fn pipe() -> Result<(i32, i32), Errno> {
    let mut fds = [0i32; 2];
    // SAFETY: fds holds two ints.
    unsafe {
        syscall(
            nr::PIPE2,
            [fds.as_mut_ptr() as usize, O_CLOEXEC, 0, 0, 0, 0],
        )
    }?;
    Ok((fds[0], fds[1]))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct RLimit {
    pub cur: u64,
    pub max: u64,
}
pub const RLIMIT_FSIZE: u32 = 1;
pub const RLIMIT_NPROC: u32 = 6;
pub const RLIMIT_NOFILE: u32 = 7;
pub const RLIMIT_AS: u32 = 9;

pub fn getrlimit(res: u32) -> Result<RLimit, Errno> {
    let mut old = RLimit { cur: 0, max: 0 };
    // SAFETY: old is a valid out-pointer.
    unsafe {
        syscall(
            nr::PRLIMIT64,
            [0, res as usize, 0, &mut old as *mut RLimit as usize, 0, 0],
        )
    }?;
    Ok(old)
}

pub fn setrlimit(res: u32, lim: &RLimit) -> SysResult {
    // SAFETY: lim is a valid struct rlimit.
    unsafe {
        syscall(
            nr::PRLIMIT64,
            [0, res as usize, lim as *const RLimit as usize, 0, 0, 0],
        )
    }
}

pub fn getdents(fd: i32, buf: &mut [u8]) -> SysResult {
    // SAFETY: buf is writable for its length.
    unsafe {
        syscall(
            nr::GETDENTS64,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

/// A private anonymous mapping of `len` bytes.
pub fn map(len: usize) -> Result<*mut u8, Errno> {
    const PROT_READ_WRITE: usize = 3;
    const MAP_PRIVATE_ANONYMOUS: usize = 0x02 | 0x20;
    // SAFETY: a fresh mapping aliases nothing.
    unsafe {
        syscall(
            nr::MMAP,
            [
                0,
                len,
                PROT_READ_WRITE,
                MAP_PRIVATE_ANONYMOUS,
                usize::MAX,
                0,
            ],
        )
    }
    .map(|p| p as *mut u8)
}

/// # Safety
/// `p` and `len` must be a mapping from [`map`] no longer used.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    let _ = syscall(nr::MUNMAP, [p as usize, len, 0, 0, 0, 0]);
}

pub const AF_UNIX: usize = 1;
pub const AF_INET: usize = 2;
pub const SOCK_STREAM: usize = 1;
pub const SOCK_NONBLOCK: usize = 0o4000;
pub const SOCK_CLOEXEC: usize = 0o2000000;
pub const SOL_SOCKET: usize = 1;
pub const SO_REUSEADDR: usize = 2;
pub const SO_SNDTIMEO: usize = 21;
pub const MSG_NOSIGNAL: usize = 0x4000;
pub const SHUT_WR: usize = 1;

pub fn socket(domain: usize, ty: usize) -> Result<i32, Errno> {
    // SAFETY: integer arguments.
    unsafe { syscall(nr::SOCKET, [domain, ty, 0, 0, 0, 0]) }.map(|fd| fd as i32)
}

pub fn setsockopt<T>(fd: i32, level: usize, name: usize, value: &T) -> SysResult {
    // SAFETY: value is readable for its size.
    unsafe {
        syscall(
            nr::SETSOCKOPT,
            [
                fd as usize,
                level,
                name,
                value as *const T as usize,
                core::mem::size_of::<T>(),
                0,
            ],
        )
    }
}

pub fn bind<T>(fd: i32, addr: &T) -> SysResult {
    with_address(nr::BIND, fd, addr)
}

pub fn connect<T>(fd: i32, addr: &T) -> SysResult {
    with_address(nr::CONNECT, fd, addr)
}

/// `bind` or `connect` (`call`) of `fd` to the socket address `addr`.
fn with_address<T>(call: usize, fd: i32, addr: &T) -> SysResult {
    let len = core::mem::size_of::<T>();
    // SAFETY: addr is readable for its size.
    unsafe { syscall(call, [fd as usize, addr as *const T as usize, len, 0, 0, 0]) }
}

pub fn listen(fd: i32, backlog: usize) -> SysResult {
    // SAFETY: integer arguments.
    unsafe { syscall(nr::LISTEN, [fd as usize, backlog, 0, 0, 0, 0]) }
}

pub fn accept(fd: i32, flags: usize) -> Result<i32, Errno> {
    // SAFETY: no peer address wanted.
    unsafe { syscall(nr::ACCEPT4, [fd as usize, 0, 0, flags, 0, 0]) }.map(|fd| fd as i32)
}

pub fn send(fd: i32, buf: &[u8]) -> SysResult {
    // SAFETY: buf is readable for its length; no address.
    unsafe {
        syscall(
            nr::SENDTO,
            [
                fd as usize,
                buf.as_ptr() as usize,
                buf.len(),
                MSG_NOSIGNAL,
                0,
                0,
            ],
        )
    }
}

pub fn recv(fd: i32, buf: &mut [u8]) -> SysResult {
    // SAFETY: buf is writable for its length; no address.
    unsafe {
        syscall(
            nr::RECVFROM,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub fn shutdown_write(fd: i32) {
    // SAFETY: integer arguments.
    let _ = unsafe { syscall(nr::SHUTDOWN, [fd as usize, SHUT_WR, 0, 0, 0, 0]) };
}

/// The text of the error numbers a command's start can fail with, for
/// the message that names it; others are given by number.
pub fn strerror(e: Errno) -> &'static str {
    match e {
        1 => "Operation not permitted",
        ENOENT => "No such file or directory",
        7 => "Argument list too long",
        ENOEXEC => "Exec format error",
        ENOMEM => "Cannot allocate memory",
        EACCES => "Permission denied",
        ENOTDIR => "Not a directory",
        21 => "Is a directory",
        22 => "Invalid argument",
        26 => "Text file busy",
        ENAMETOOLONG => "File name too long",
        40 => "Too many levels of symbolic links",
        _ => "",
    }
}
