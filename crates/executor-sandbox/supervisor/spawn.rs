//! Starting the command: fork, put the child in the command's pristine
//! state and limits, enter the Landlock domain, and exec it as `execvp`
//! would (a name without `/` searched on `PATH`, a file the kernel cannot
//! exec run by `/bin/sh`). A failure before or at the exec comes back to
//! the parent as an errno over a close-on-exec pipe, and the child is
//! reaped then, so the caller sees either a running command or why not.

use crate::landlock::Ruleset;
use crate::sys::{self, CStr, Errno, RLimit, SigSet};

/// What the child sets up before it execs.
pub struct Setup<'a> {
    pub umask: u32,
    pub nproc: Option<u64>,
    /// Already clamped to the hard limits.
    pub rlimits: &'a [(u32, RLimit)],
    pub ruleset: Option<&'a Ruleset>,
}

/// The command's `oom_score_adj` (executor-sandbox's
/// `COMMAND_OOM_SCORE_ADJ`): the first the OOM killer picks, in the run's
/// memory cgroup and on the host.
const COMMAND_OOM_SCORE_ADJ: &[u8] = b"500";

/// Start `argv` (NULL-terminated, `argv[0]` the program) with `envp`: its
/// pid, or the errno of what failed.
///
/// # Safety
/// `argv` and `envp` must be NULL-terminated arrays of NUL-terminated
/// strings (the process's own).
pub unsafe fn spawn(argv: *const CStr, envp: *const CStr, setup: &Setup) -> Result<i32, Errno> {
    let (report_r, report_w) = sys::pipe()?;
    let pid = match sys::fork() {
        Ok(pid) => pid,
        Err(e) => {
            sys::close(report_r);
            sys::close(report_w);
            return Err(e);
        }
    };
    if pid == 0 {
        sys::close(report_r);
        let e = prepare(setup).err().unwrap_or_else(|| execvp(argv, envp));
        sys::write_all(report_w, &e.to_ne_bytes());
        sys::exit(127);
    }
    sys::close(report_w);
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < b.len() {
        match sys::read(report_r, &mut b[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(sys::EINTR) => {}
            Err(_) => break,
        }
    }
    sys::close(report_r);
    if got < b.len() {
        // The pipe closed at the exec: the command runs.
        return Ok(pid);
    }
    while let Err(sys::EINTR) = sys::wait(pid, 0) {}
    Err(i32::from_ne_bytes(b))
}

/// In the child: every signal disposition to default (an ignored one
/// would survive execve, and the supervisor ignores SIGPIPE), an empty
/// mask, the umask, the command's `oom_score_adj`, its limits, and last
/// the Landlock domain, so nothing above runs restricted and the
/// supervisor itself stays outside it.
fn prepare(setup: &Setup) -> Result<(), Errno> {
    for sig in 1..=64 {
        if sig != sys::SIGKILL && sig != sys::SIGSTOP {
            sys::set_disposition(sig, sys::SIG_DFL);
        }
    }
    sys::sigprocmask(sys::SIG_SETMASK, &SigSet(0));
    sys::umask(setup.umask);
    // Raising is always allowed. Only where the caller is host root are
    // this child's /proc files its own (it is not dumpable, so they belong
    // to host uid 0); elsewhere the host side set the value for the whole
    // sandbox already, and this open fails.
    // SAFETY: a NUL-terminated path.
    if let Ok(fd) = unsafe {
        sys::open(
            c"/proc/self/oom_score_adj".as_ptr().cast(),
            sys::O_WRONLY | sys::O_CLOEXEC,
        )
    } {
        let _ = sys::write(fd, COMMAND_OOM_SCORE_ADJ);
        sys::close(fd);
    }
    if let Some(n) = setup.nproc {
        let _ = sys::setrlimit(sys::RLIMIT_NPROC, &RLimit { cur: n, max: n });
    }
    for (res, lim) in setup.rlimits {
        sys::setrlimit(*res, lim)?;
    }
    if let Some(r) = setup.ruleset {
        r.restrict_self()?;
    }
    Ok(())
}

/// The default search path of glibc's `execvp` when `PATH` is unset.
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// Exec `argv[0]` as glibc's `execvp` does; returns only on failure.
unsafe fn execvp(argv: *const CStr, envp: *const CStr) -> Errno {
    let file = sys::bytes_of(*argv);
    if file.is_empty() {
        return sys::ENOENT;
    }
    if file.contains(&b'/') {
        return exec_or_sh(*argv, argv, envp);
    }
    let path = env(envp, b"PATH").unwrap_or(DEFAULT_PATH);
    let mut buf = [0u8; 4096];
    let mut last = sys::ENOENT;
    let mut denied = false;
    for dir in path.split(|&c| c == b':') {
        // An empty element is the current directory.
        let n = if dir.is_empty() {
            file.len()
        } else {
            dir.len() + 1 + file.len()
        };
        if n + 1 > buf.len() {
            last = sys::ENAMETOOLONG;
            continue;
        }
        let mut at = 0;
        if !dir.is_empty() {
            buf[..dir.len()].copy_from_slice(dir);
            buf[dir.len()] = b'/';
            at = dir.len() + 1;
        }
        buf[at..at + file.len()].copy_from_slice(file);
        buf[n] = 0;
        last = exec_or_sh(buf.as_ptr(), argv, envp);
        match last {
            sys::EACCES => denied = true,
            sys::ENOENT | sys::ESTALE | sys::ENOTDIR | sys::ENODEV | sys::ETIMEDOUT => {}
            e => return e,
        }
    }
    if denied {
        sys::EACCES
    } else {
        last
    }
}

/// `execve`, and for a file the kernel has no format for, `/bin/sh file
/// args…` (as `execvp` does); returns only on failure.
unsafe fn exec_or_sh(path: CStr, argv: *const CStr, envp: *const CStr) -> Errno {
    let e = sys::execve(path, argv, envp);
    if e != sys::ENOEXEC {
        return e;
    }
    let mut argc = 0;
    while !(*argv.add(argc)).is_null() {
        argc += 1;
    }
    // sh, the file, argv[1..], NULL.
    let len = (argc + 2) * core::mem::size_of::<CStr>();
    let Ok(mem) = sys::map(len) else {
        return sys::ENOMEM;
    };
    let sh_argv = mem as *mut CStr;
    *sh_argv = c"/bin/sh".as_ptr().cast();
    *sh_argv.add(1) = path;
    for i in 1..argc {
        *sh_argv.add(i + 1) = *argv.add(i);
    }
    *sh_argv.add(argc + 1) = core::ptr::null();
    // As glibc's: what stopped the shell is what is reported.
    let sh = sys::execve(c"/bin/sh".as_ptr().cast(), sh_argv, envp);
    sys::unmap(mem, len);
    sh
}

/// `NAME`'s value in `envp`.
unsafe fn env(envp: *const CStr, name: &[u8]) -> Option<&'static [u8]> {
    let mut i = 0;
    loop {
        let p = *envp.add(i);
        if p.is_null() {
            return None;
        }
        let kv = sys::bytes_of(p);
        if kv.len() > name.len() && kv.starts_with(name) && kv[name.len()] == b'=' {
            return Some(&kv[name.len() + 1..]);
        }
        i += 1;
    }
}
