//! Waiting for SIGINT/SIGTERM without a handler: block them before any
//! serving thread starts (threads inherit the mask), then `sigwait`.

/// The blocked termination signals; [`TerminationSignals::wait`] returns the
/// one that arrived.
pub struct TerminationSignals {
    set: libc::sigset_t,
}

impl TerminationSignals {
    /// Block SIGINT, SIGTERM and SIGHUP in the calling thread (and so in every
    /// thread it starts afterwards). Call before [`crate::mount`].
    pub fn block() -> std::io::Result<Self> {
        // SAFETY: sigset_t is plain data initialised by sigemptyset before use;
        // all pointers are to live locals.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if r != 0 {
                return Err(std::io::Error::from_raw_os_error(r));
            }
            Ok(TerminationSignals { set })
        }
    }

    /// Wait for one of the blocked signals; returns its number.
    pub fn wait(&self) -> std::io::Result<i32> {
        let mut sig = 0;
        // SAFETY: `self.set` was initialised in `block`; `sig` is a live local.
        let r = unsafe { libc::sigwait(&self.set, &mut sig) };
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r));
        }
        Ok(sig)
    }

    /// Like [`TerminationSignals::wait`], but gives up after `limit`
    /// (`Ok(None)`), so a caller can also watch something else.
    pub fn wait_timeout(&self, limit: std::time::Duration) -> std::io::Result<Option<i32>> {
        let ts = libc::timespec {
            tv_sec: limit.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: limit.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `self.set` was initialised in `block`; `ts` is a live local;
        // a null siginfo pointer is allowed.
        let r = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        if r >= 0 {
            return Ok(Some(r));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(e),
        }
    }
}
