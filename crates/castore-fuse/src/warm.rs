//! Warming a fresh mount for the build about to run on it: the root's
//! listing and the build's first opens, done while the sandbox is being
//! set up instead of in series with it.
//!
//! A view is a new superblock per build, so its page cache starts empty,
//! and the build's first act, the `execve` of its command, then waits on
//! the daemon: the lookup, the blob's hash at its first `READ`, and page
//! faults that each come back as a `READ` until the prefill thread has
//! stored the file (a 2 MB static busybox: ~2 ms from `execve` to its
//! first system call). So a child of this process
//!
//! 1. lists the root — the listing the sandbox's layout depends on (one
//!    bind per root entry), which tells the kernel every root entry, so
//!    the set-up's own lookups never reach the daemon — and says so on a
//!    pipe ([`Warming::root_listed`]);
//! 2. then opens the paths it is sent, inside the view (`openat2` with
//!    `RESOLVE_IN_ROOT`, so no link leads out of it), and reads their
//!    first byte: what the build's `execve` is about to do. That `READ`
//!    records and verifies the file as the exec's would, and hands it to
//!    the prefill thread, which stores all of it in the page cache before
//!    the exec comes.
//!
//! and a thread finds those paths (the caller's guess: the command and its
//! ELF interpreter) and sends them to the child. The child's `READ` has the
//! file hashed by the serving thread, after the listing: hashing it ahead,
//! on a thread of its own, took a core from the listing, which the sandbox
//! waits for.
//!
//! What it changes in the read set: nothing that the exec would not
//! record itself, given the guess is right; a wrong guess (a path the
//! build never opens) adds that path's lookups and read — entries of the
//! declared view, so `reads ⊆ declared` still holds, and every use of a
//! read set (pruning, the validated cache) only grows more conservative.
//!
//! A child, never this process: the process serving a mount must not wait
//! on it itself (killed during the wait, its serving threads die first and
//! the wait never ends). The child holds no descriptor of the connection,
//! so if this process dies the connection is aborted and the child fails.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One of the build's first opens: its path in the view (absolute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstOpen {
    pub path: Vec<u8>,
}

/// The most bytes of paths the child takes (its stack holds them).
const PATHS_MAX: usize = 4096;

/// The warming child and thread of one mount.
#[derive(Debug)]
pub(crate) struct Warming {
    pid: libc::pid_t,
    /// Read end of the child's "root listed" pipe; `None` once read.
    listed: Option<std::fs::File>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The child's stack and arguments, alive until it is reaped.
    _stack: Vec<u8>,
    _args: Box<ChildArgs>,
}

#[derive(Debug)]
struct ChildArgs {
    mountpoint: CString,
    listed_w: RawFd,
    paths_r: RawFd,
}

impl Warming {
    /// Start the child on `mountpoint` and the thread that runs `find` and
    /// sends the child the paths.
    pub(crate) fn start(
        mountpoint: &Path,
        find: Box<dyn FnOnce() -> Vec<FirstOpen> + Send>,
    ) -> std::io::Result<Warming> {
        let (listed_r, listed_w) = pipe()?;
        // A socket, not a pipe: a send to a child that is gone must fail
        // with EPIPE (MSG_NOSIGNAL), not kill this process with SIGPIPE.
        let (paths_r, paths_w) = socketpair()?;
        let args = Box::new(ChildArgs {
            mountpoint: CString::new(mountpoint.as_os_str().as_bytes())?,
            listed_w: listed_w.as_raw_fd(),
            paths_r: paths_r.as_raw_fd(),
        });
        // CLONE_VM: no copy of this process's page tables; its own stack,
        // held (with its arguments) until the child is reaped. No
        // CLONE_FILES: closing descriptors in the child closes its copies.
        let mut stack = vec![0u8; 64 << 10];
        // The stack grows down from its 16-byte aligned end.
        let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
        // SAFETY: the child runs `warm_and_exit` on `stack`, makes raw
        // system calls only (no allocation, no lock) and `_exit`s; `stack`
        // and `args` are kept in the returned value until it is reaped.
        let pid = unsafe {
            libc::clone(
                warm_and_exit,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::SIGCHLD,
                &*args as *const ChildArgs as *mut libc::c_void,
            )
        };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        drop((listed_w, paths_r));
        let thread = std::thread::Builder::new()
            .name("fhsx-warm".into())
            .spawn(move || {
                let first = find();
                let mut bytes = Vec::new();
                for f in &first {
                    if bytes.len() + f.path.len() < PATHS_MAX && !f.path.contains(&0) {
                        bytes.extend_from_slice(&f.path);
                        bytes.push(0);
                    }
                }
                // The child may be gone (the mount ended): nothing to warm.
                // Its read of each file has the file hashed (by the thread
                // that serves it): not here, where the hash would take a
                // core from the root's listing, which the sandbox waits for.
                send_all(&paths_w, &bytes);
                drop(paths_w);
            });
        // Without the thread the child gets no paths (its socket's sending
        // end is gone with the closure): it lists the root and ends.
        let thread = thread.ok();
        Ok(Warming {
            pid,
            listed: Some(std::fs::File::from(listed_r)),
            thread,
            _stack: stack,
            _args: args,
        })
    }

    /// Wait until the child has listed the root.
    pub(crate) fn root_listed(&mut self, mountpoint: &Path) -> std::io::Result<()> {
        let Some(mut r) = self.listed.take() else {
            return Ok(());
        };
        let mut b = [0u8; 1];
        if r.read(&mut b)? == 1 {
            return Ok(());
        }
        // It ended without listing: say how.
        Err(std::io::Error::other(format!(
            "listing the view at {} failed (child status {})",
            mountpoint.display(),
            self.reap()?
        )))
    }

    /// End: the thread joined, the child reaped (after the connection has
    /// ended, it fails fast if it is still at work).
    pub(crate) fn finish(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = self.reap();
    }

    /// Wait for the child to end; its wait status.
    fn reap(&mut self) -> std::io::Result<libc::c_int> {
        if self.pid <= 0 {
            return Ok(0);
        }
        let mut status = 0;
        loop {
            // SAFETY: pid is our own child; status is a valid out-pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                self.pid = 0;
                return Ok(status);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

fn socketpair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two ints.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just returned to us and are owned by no one else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Send all of `bytes` on the socket `fd`, stopping at the first error.
fn send_all(fd: &OwnedFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: bytes is valid for its length; fd is an open socket.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just returned to us and are owned by no one else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// The warming child's whole life: keep only its two pipe ends (so it
/// holds none of the FUSE connection), list the root, say so, then read
/// the first byte of each path it is sent, inside the view; exit 0, or 1
/// if the root could not be listed.
extern "C" fn warm_and_exit(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: arg points to the ChildArgs the parent keeps alive until it
    // reaps this child; raw system calls on the child's own descriptors;
    // every buffer is valid for its length; _exit never returns.
    unsafe {
        let args = &*(arg as *const ChildArgs);
        // Its two pipe ends at 0 and 1, everything else closed.
        let (listed, paths) = (0, 1);
        let paths_tmp = libc::fcntl(args.paths_r, libc::F_DUPFD, 3);
        if paths_tmp < 0
            || libc::dup2(args.listed_w, listed) < 0
            || libc::dup2(paths_tmp, paths) < 0
        {
            libc::_exit(1);
        }
        libc::syscall(libc::SYS_close_range, 2u32, u32::MAX, 0u32);
        let root = libc::open(
            args.mountpoint.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if root < 0 {
            libc::_exit(1);
        }
        let mut buf = [0u8; 8192];
        loop {
            let n = libc::syscall(libc::SYS_getdents64, root, buf.as_mut_ptr(), buf.len());
            if n == 0 {
                break;
            }
            if n < 0 {
                libc::_exit(1);
            }
        }
        libc::write(listed, b"1".as_ptr().cast(), 1);
        libc::close(listed);
        // The paths, NUL-terminated, until the sender closes its end.
        let mut got = 0usize;
        while got < PATHS_MAX {
            let n = libc::read(paths, buf.as_mut_ptr().add(got).cast(), PATHS_MAX - got);
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        let mut start = 0usize;
        for i in 0..got {
            if buf[i] != 0 {
                continue;
            }
            let how = OpenHow {
                flags: (libc::O_RDONLY | libc::O_CLOEXEC) as u64,
                mode: 0,
                resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
            };
            let fd = libc::syscall(
                libc::SYS_openat2,
                root,
                buf.as_ptr().add(start),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            );
            if fd >= 0 {
                let mut one = [0u8; 1];
                libc::read(fd as libc::c_int, one.as_mut_ptr().cast(), 1);
                libc::close(fd as libc::c_int);
            }
            start = i + 1;
        }
        libc::_exit(0);
    }
}
