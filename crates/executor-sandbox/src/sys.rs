//! Thin syscall wrappers. Each turns a failure into a `SandboxError::Io`
//! that names what was being done and to which path.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use executor_core::SandboxError;

/// An I/O error with what was being done.
pub(crate) fn io_err(what: impl Into<String>, source: io::Error) -> SandboxError {
    SandboxError::Io {
        what: what.into(),
        source,
    }
}

/// An I/O error about a path.
pub(crate) fn path_err(verb: &str, path: &Path, source: io::Error) -> SandboxError {
    io_err(format!("{verb} {}", path.display()), source)
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The `sockaddr_un` of a filesystem socket at `path`.
fn unix_addr(path: &Path) -> io::Result<libc::sockaddr_un> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a UNIX socket path must be under {} bytes with no NUL; pick a shorter $TMPDIR",
                addr.sun_path.len()
            ),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(addr)
}

/// A listening UNIX socket at `path` that only its owner may connect to
/// from the moment it exists. The mode is set on the socket before `bind`
/// makes the file, which takes it from there (Linux), so neither the
/// umask nor a window between `bind` and `chmod` lets anyone else in; and
/// the socket can sit in a directory others may pass through.
pub(crate) fn listen_unix_owner_only(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    let addr = unix_addr(path)?;
    // SAFETY: plain syscalls on a descriptor we own; addr is a valid
    // sockaddr_un of the given length.
    unsafe {
        let fd = OwnedFd::from_raw_fd(cvt(libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?);
        cvt(libc::fchmod(fd.as_raw_fd(), 0o600))?;
        cvt(libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        ))?;
        cvt(libc::listen(fd.as_raw_fd(), 128))?;
        Ok(std::os::unix::net::UnixListener::from(fd))
    }
}

/// `pidfd_open(2)`: a handle on a process that cannot be confused with a
/// later process reusing its PID.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(2)`.
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall; a null siginfo is allowed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether the process behind a pidfd has ended (the pidfd is readable).
pub(crate) fn pidfd_exited(pidfd: &OwnedFd) -> bool {
    poll_in(&[pidfd.as_raw_fd()], 0)
        .map(|r| r[0])
        .unwrap_or(true)
}

/// `poll(2)` for readability; returns which fds are readable or hung up.
pub(crate) fn poll_in(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: p is a valid array of pollfd of the given length.
        let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(p
            .iter()
            .map(|x| x.fd >= 0 && x.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
            .collect());
    }
}

/// An anonymous in-memory file holding `data`, positioned at its start.
pub(crate) fn memfd_with(name: &str, data: &[u8]) -> Result<OwnedFd, SandboxError> {
    let cname = std::ffi::CString::new(name).map_err(|_| {
        io_err(
            "creating a memfd",
            io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"),
        )
    })?;
    // SAFETY: valid C string; flags are constants.
    let fd = cvt(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) })
        .map_err(|e| io_err(format!("creating memfd {name}"), e))?;
    // SAFETY: fd was just returned by the kernel.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(fd);
    use std::io::{Seek, Write};
    f.write_all(data)
        .and_then(|_| f.seek(io::SeekFrom::Start(0)).map(|_| ()))
        .map_err(|e| io_err(format!("writing memfd {name}"), e))?;
    Ok(OwnedFd::from(f))
}

/// A connected pair of close-on-exec UNIX stream sockets.
pub(crate) fn socketpair() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid 2-element out array.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })
    .map_err(|e| io_err("creating the supervisor control socketpair", e))?;
    // SAFETY: both fds were just returned by the kernel.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A close-on-exec pipe (read end, write end).
pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid 2-element out array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })
        .map_err(|e| io_err("creating an output pipe", e))?;
    // SAFETY: both fds were just returned by the kernel.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Duplicate `fd` to the lowest free number >= `min`, close-on-exec.
pub(crate) fn dup_at_least(fd: RawFd, min: RawFd) -> Result<OwnedFd, SandboxError> {
    // SAFETY: F_DUPFD_CLOEXEC on a valid fd.
    let r = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })
        .map_err(|e| io_err("duplicating a descriptor for bwrap", e))?;
    // SAFETY: the kernel just returned r.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Set or clear O_NONBLOCK.
pub(crate) fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a valid fd.
    let fl = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let fl = if on {
        fl | libc::O_NONBLOCK
    } else {
        fl & !libc::O_NONBLOCK
    };
    // SAFETY: fcntl on a valid fd.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, fl) }).map(|_| ())
}

/// What `clone3_into` returned in this process.
pub(crate) enum Cloned {
    Child,
    Parent { pid: libc::pid_t, pidfd: OwnedFd },
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_VM: u64 = 0x100;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A fork-like `clone3(2)` that returns a pidfd and, given a cgroup
/// directory fd, starts the child inside that cgroup (Linux >= 5.7).
///
/// In the child, only async-signal-safe calls may follow (as after fork).
pub(crate) fn clone3_into(cgroup: Option<RawFd>) -> io::Result<Cloned> {
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: CLONE_PIDFD,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    if let Some(fd) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    // SAFETY: clone3 without CLONE_VM behaves like fork; args is valid for
    // its size and pidfd outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        0 => Ok(Cloned::Child),
        r if r > 0 => Ok(Cloned::Parent {
            pid: r as libc::pid_t,
            // SAFETY: CLONE_PIDFD stored a fresh fd for us.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The entry point of a [`clone3_vfork`] child: runs on its own stack in the
/// parent's memory (the parent is suspended until it execs or exits); may
/// only make raw, async-signal-safe calls and must never return.
pub(crate) type VforkEntry = extern "C" fn(*mut libc::c_void) -> !;

/// `clone3(CLONE_VM | CLONE_VFORK | CLONE_PIDFD [| CLONE_INTO_CGROUP])`:
/// what `posix_spawn` does, plus a pidfd and a cgroup. No page tables are
/// copied, so starting bwrap costs the same however large this process is.
///
/// The child runs `entry(arg)` on `stack`; every signal is blocked around
/// the call (the child unblocks them itself before exec).
///
/// # Safety
/// `entry` must follow [`VforkEntry`]'s rules, `arg` must be valid for it,
/// and `stack` must not be used by anything else until this returns.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn clone3_vfork(
    cgroup: Option<RawFd>,
    stack: &mut [u128],
    entry: VforkEntry,
    arg: *mut libc::c_void,
) -> io::Result<(libc::pid_t, OwnedFd)> {
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: CLONE_VM | CLONE_VFORK | CLONE_PIDFD,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        // u128 elements: the base, and so the top, is 16-byte aligned.
        stack: stack.as_mut_ptr() as u64,
        stack_size: std::mem::size_of_val(stack) as u64,
        ..CloneArgs::default()
    };
    if let Some(fd) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    // SAFETY: the caller upholds the contract; sets are valid out-pointers.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let ret: i64;
        // In the parent the syscall returns the pid (or -errno) and we jump
        // past the child branch. In the child (rax = 0) the kernel has put
        // the stack pointer at the top of `stack`: call entry(arg) there.
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &mut args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if ret < 0 {
            return Err(io::Error::from_raw_os_error((-ret) as i32));
        }
        Ok((ret as libc::pid_t, OwnedFd::from_raw_fd(pidfd)))
    }
}

/// Elsewhere: unsupported, callers fall back to a fork-like clone.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn clone3_vfork(
    _cgroup: Option<RawFd>,
    _stack: &mut [u128],
    _entry: VforkEntry,
    _arg: *mut libc::c_void,
) -> io::Result<(libc::pid_t, OwnedFd)> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// A pidfd on the only child of our own child `parent` (bwrap's child, the
/// supervisor), proven: it is listed as `parent`'s child both before and
/// after the pidfd is opened, and `parent` (unreaped, so its PID is ours)
/// is still running, so the list is current.
pub(crate) fn child_pidfd(parent: libc::pid_t) -> Option<OwnedFd> {
    let list = || -> Option<Vec<libc::pid_t>> {
        let path = format!("/proc/{parent}/task/{parent}/children");
        let text = std::fs::read_to_string(path).ok()?;
        Some(
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
        )
    };
    let before = list()?;
    let [child] = before.as_slice() else {
        return None;
    };
    let fd = pidfd_open(*child).ok()?;
    let after = list()?;
    (after.contains(child) && !pidfd_exited(&fd)).then_some(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's RPC socket sits in a directory build users may pass
    /// through: only its own mode keeps others out. Another uid tries to
    /// connect, and must be refused.
    #[test]
    fn a_run_socket_refuses_every_uid_but_its_owner() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // Without root there is no other uid to try it as.
        }
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let path = dir.path().join("run-1-0-0.sock");
        let _listener = listen_unix_owner_only(&path).unwrap();
        let md = std::fs::symlink_metadata(&path).unwrap();
        assert!(md.file_type().is_socket());
        assert_eq!(
            md.permissions().mode() & 0o777,
            0o600,
            "not the mode set before bind"
        );
        std::os::unix::net::UnixStream::connect(&path).expect("the owner connects");

        // Everything the child needs is made before the fork: it only
        // makes raw system calls.
        let addr = unix_addr(&path).unwrap();

        // SAFETY: the child calls only async-signal-safe functions and
        // _exits; the parent reaps it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: raw system calls in the freshly forked child.
            unsafe {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    libc::_exit(100);
                }
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let r = libc::connect(
                    fd,
                    (&addr as *const libc::sockaddr_un).cast(),
                    std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                );
                libc::_exit(if r == 0 { 0 } else { *libc::__errno_location() });
            }
        }
        let mut status = 0;
        // SAFETY: our own child; a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            libc::EACCES,
            "uid 65534 connected to (0) or failed otherwise than EACCES on another uid's run socket"
        );
    }
}
