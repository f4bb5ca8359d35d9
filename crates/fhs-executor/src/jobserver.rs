//! The token pool: one CPU budget per process, shared by every build it
//! runs (a graph's actions, a worker's jobs), handed to each build as a
//! GNU make jobserver.
//!
//! The pool holds `size` tokens. A build holds one *implicit* token while
//! it runs ([`TokenPool::acquire`] waits for it, the highest priority
//! first), as make's first job does; every further job its build starts
//! takes a token from its jobserver and gives it back when done, so all
//! the builds together run at most `size` jobs.
//!
//! **Pipes of its own.** Each build's jobserver is its own: a FIFO of
//! *spares* it takes tokens from (shown at a fixed path, and inherited as
//! the read descriptor) and a FIFO of *returns* it gives them back to
//! (the write descriptor; see `executor_sandbox::JOBSERVER_MAKEFLAGS`).
//! Shared pipes cannot tell whose tokens are missing when a build is
//! killed mid-job; these can: the pool counts the tokens out with each
//! build (`out`: in its spares, or held by its jobs), reads how many
//! spares are left (`FIONREAD`), and when the build ends, however it ends,
//! takes back all that were out with it. A killed build cannot shrink the
//! pool. And a token given back comes to the pool, not to the pipe the
//! same make reads from next (where it would take it again before anyone
//! else could): the pool gives it to whoever needs it most, a build
//! waiting to start first. Clients that know only the FIFO (make >= 4.4,
//! ninja) give tokens back into their spares; those are taken back once
//! they sit unread.
//!
//! **Spares.** A token only helps a build while it sits in that build's
//! spares, so every free token is put in some build's spares while no
//! build waits to start: a build whose jobs just took its last spare
//! first, then all by priority. A spare that sits unread for [`IDLE`] is
//! taken back for a build that wants one (one waiting to start takes any
//! spare at once). A build whose spare was taken back wants no other until
//! its jobs take one, so two idle builds never pass one back and forth.
//!
//! **Forgeries.** The protocol is cooperative (a build can ignore it and
//! start as many processes as its limits allow), but the pool's own count
//! stays true: bytes written into the spares beyond what is out are
//! drained, and returns beyond what the build's jobs hold are not counted.
//!
//! The jobserver is no input of the action: its path, descriptors and
//! `MAKEFLAGS` are the same in every build and at every pool size, so only
//! how many jobs run at once changes, never what they make.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Error;

/// How often the pool looks at the spares while builds run (a token given
/// back wakes it at once).
pub const TICK: Duration = Duration::from_millis(10);
/// How long a spare must sit unread before it is taken back for another
/// running build.
pub const IDLE: Duration = Duration::from_millis(50);
/// How long a build waiting to start sleeps before it looks at its cancel
/// flag again (a token granted to it wakes it at once).
const RECHECK: Duration = Duration::from_millis(50);

/// The token the pool writes (make writes back what it read; any byte
/// counts).
const TOKEN: u8 = b'+';

/// One process's CPU budget. Dropping it stops its broker thread; leases
/// outlive it harmlessly.
pub struct TokenPool {
    shared: Arc<Shared>,
    broker: Option<JoinHandle<()>>,
}

/// How the pool is used right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The pool's size.
    pub size: usize,
    /// Tokens held: one per running build, plus those their jobs took.
    pub in_use: usize,
    /// Builds holding their implicit token.
    pub builds: usize,
    /// Builds waiting for it.
    pub waiting: usize,
}

struct Shared {
    size: usize,
    state: Mutex<State>,
    /// Wakes the broker out of its poll.
    wake: OwnedFd,
    /// The waiters': a token was granted.
    granted: Condvar,
    /// How long a waiter sleeps without being woken ([`RECHECK`]).
    recheck: Duration,
}

#[derive(Default)]
struct State {
    free: usize,
    next: u64,
    /// Waiting builds: the highest priority first, then the earliest.
    waiting: BTreeSet<(Reverse<u64>, u64)>,
    /// Waiters whose implicit token is theirs.
    granted: HashSet<u64>,
    leases: BTreeMap<u64, Held>,
    shutdown: bool,
}

/// What the pool knows of one running build.
struct Held {
    priority: u64,
    /// Its jobserver, once opened.
    pipes: Option<Pipes>,
    /// Tokens out with it beyond its implicit one: in its spares, or
    /// held by its jobs.
    out: usize,
    /// Spares at the last look.
    level: usize,
    /// When a job last took a spare.
    last_take: Instant,
    /// Its last spare was taken back: it wants none until a job takes one.
    stolen: bool,
}

/// The pool's own ends of a build's FIFOs (non-blocking).
struct Pipes {
    spares: File,
    returns: File,
}

impl Held {
    fn wants(&self) -> bool {
        self.pipes.is_some() && self.level == 0 && !self.stolen
    }

    fn holds(&self) -> usize {
        self.out.saturating_sub(self.level)
    }
}

/// Who a free token may go to.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Claimant {
    Running(u64),
    /// A build waiting to start (first among equal priorities).
    Waiter(u64),
}

impl TokenPool {
    /// A pool of `size` tokens (at least 1), with its broker thread.
    pub fn new(size: usize) -> Result<Arc<TokenPool>, Error> {
        let shared = Shared::new(size, RECHECK)?;
        let s = shared.clone();
        let broker = std::thread::Builder::new()
            .name("fhsx-tokens".into())
            .spawn(move || s.broker())
            .map_err(|e| Error::Other(format!("starting the token pool's thread: {e}")))?;
        Ok(Arc::new(TokenPool {
            shared,
            broker: Some(broker),
        }))
    }

    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Wait for a build's implicit token: the highest `priority` waiting
    /// gets the next free one. `cancel` set while waiting gives up
    /// ([`executor_core::SandboxError::Cancelled`]).
    pub fn acquire(&self, priority: u64, cancel: Option<&AtomicBool>) -> Result<Lease, Error> {
        let shared = &self.shared;
        let mut s = shared.lock();
        let seq = s.next;
        s.next += 1;
        s.waiting.insert((Reverse(priority), seq));
        loop {
            shared.tick(&mut s);
            if s.granted.remove(&seq) {
                s.leases.insert(
                    seq,
                    Held {
                        priority,
                        pipes: None,
                        out: 0,
                        level: 0,
                        last_take: Instant::now(),
                        stolen: false,
                    },
                );
                shared.wake_broker();
                return Ok(Lease {
                    shared: shared.clone(),
                    id: seq,
                    fifos: Vec::new(),
                });
            }
            if cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
                s.waiting.remove(&(Reverse(priority), seq));
                return Err(Error::Sandbox(executor_core::SandboxError::Cancelled {
                    killed: false,
                }));
            }
            shared.wake_broker();
            s = shared
                .granted
                .wait_timeout(s, shared.recheck)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// How the pool is used now.
    pub fn usage(&self) -> Usage {
        let s = self.shared.lock();
        Usage {
            size: self.shared.size,
            in_use: s.leases.values().map(|h| 1 + h.holds()).sum(),
            builds: s.leases.len(),
            waiting: s.waiting.len(),
        }
    }
}

impl Drop for TokenPool {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake_broker();
        if let Some(b) = self.broker.take() {
            let _ = b.join();
        }
    }
}

/// One build's share of the pool: its implicit token, and once opened its
/// jobserver. Dropped when the build's sandbox is gone: every token out
/// with it comes back, and its FIFOs are removed.
pub struct Lease {
    shared: Arc<Shared>,
    id: u64,
    fifos: Vec<PathBuf>,
}

/// A build's jobserver FIFOs on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jobserver {
    /// Where its jobs take tokens (shown inside at a fixed path).
    pub spares: PathBuf,
    /// Where its jobs give them back (a descriptor only).
    pub returns: PathBuf,
}

impl Lease {
    /// Make this build's jobserver in `dir` (its working area), owned by
    /// `owner` (uid, gid) where the build runs as a user of its own; the
    /// pool puts spare tokens in it from now on.
    pub fn open_jobserver(
        &mut self,
        dir: &Path,
        owner: Option<(u32, u32)>,
    ) -> Result<Jobserver, Error> {
        let js = Jobserver {
            spares: dir.join("jobserver"),
            returns: dir.join("jobserver.returns"),
        };
        let mut ends = Vec::new();
        for path in [&js.spares, &js.returns] {
            make_fifo(path, owner)?;
            self.fifos.push(path.clone());
            // Read and write, so opening never waits for a peer and the
            // build's writes never fail for want of a reader.
            let end = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| Error::io("open the jobserver", path, e))?;
            ends.push(end);
        }
        let (Some(returns), Some(spares)) = (ends.pop(), ends.pop()) else {
            return Err(Error::Other("the jobserver has two FIFOs".into()));
        };
        let mut s = self.shared.lock();
        if let Some(h) = s.leases.get_mut(&self.id) {
            h.pipes = Some(Pipes { spares, returns });
            h.last_take = Instant::now();
        }
        self.shared.tick(&mut s);
        self.shared.wake_broker();
        Ok(js)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        if let Some(h) = s.leases.remove(&self.id) {
            s.free += 1 + h.out;
        }
        self.shared.tick(&mut s);
        drop(s);
        self.shared.wake_broker();
        for f in &self.fifos {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn make_fifo(path: &Path, owner: Option<(u32, u32)>) -> Result<(), Error> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Other(format!("{}: a path with a NUL byte", path.display())))?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(Error::io(
            "make the jobserver",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(|e| Error::io("hand the jobserver to the build user", path, e))?;
    }
    Ok(())
}

/// Bytes waiting in a pipe.
fn waiting_bytes(pipe: &File) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut n) };
    (r == 0).then(|| usize::try_from(n).unwrap_or(0))
}

/// Read and drop up to `n` bytes of a non-blocking pipe; how many there
/// were.
fn drain(pipe: &mut File, n: usize) -> usize {
    let mut buf = [0u8; 4096];
    let mut got = 0;
    while got < n {
        let want = (n - got).min(buf.len());
        match pipe.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(k) => got += k,
        }
    }
    got
}

impl Shared {
    fn new(size: usize, recheck: Duration) -> Result<Arc<Shared>, Error> {
        let size = size.max(1);
        // SAFETY: eventfd takes integer arguments and returns a new fd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::Other(format!(
                "making the token pool's wake-up descriptor: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Arc::new(Shared {
            size,
            state: Mutex::new(State {
                free: size,
                ..State::default()
            }),
            // SAFETY: a descriptor eventfd just returned, owned here only.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            granted: Condvar::new(),
            recheck,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`State::tick`], waking the waiters if it granted any a token:
    /// whoever ticks (the broker, a build starting, opening its jobserver
    /// or ending) may grant another build's.
    fn tick(&self, s: &mut State) {
        let granted_before = s.granted.len();
        s.tick(Instant::now());
        if s.granted.len() != granted_before {
            self.granted.notify_all();
        }
    }

    fn wake_broker(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Wake on a token given back, on a change, and every [`TICK`] while
    /// builds run; hand out tokens each time.
    fn broker(&self) {
        loop {
            let (mut fds, timeout) = {
                let mut s = self.lock();
                if s.shutdown {
                    return;
                }
                self.tick(&mut s);
                let mut fds: Vec<RawFd> = vec![self.wake.as_raw_fd()];
                fds.extend(
                    s.leases
                        .values()
                        .filter_map(|h| h.pipes.as_ref().map(|p| p.returns.as_raw_fd())),
                );
                let busy = fds.len() > 1 || !s.waiting.is_empty();
                let timeout = if busy { TICK.as_millis() as i32 } else { -1 };
                (
                    fds.into_iter()
                        .map(|fd| libc::pollfd {
                            fd,
                            events: libc::POLLIN,
                            revents: 0,
                        })
                        .collect::<Vec<_>>(),
                    timeout,
                )
            };
            // A descriptor closed meanwhile (a build ended) only wakes this
            // early: the tick reads every pipe under the lock again.
            // SAFETY: fds is a live array of pollfd of its length.
            unsafe {
                libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout);
            }
            let mut count = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a live buffer.
            unsafe {
                libc::read(self.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8);
            }
        }
    }
}

impl State {
    /// Read every build's pipes, then hand out free tokens (taking spares
    /// back where none are free): to whoever wants one, by priority, then
    /// the rest to every build's spares.
    fn tick(&mut self, now: Instant) {
        for h in self.leases.values_mut() {
            let Some(p) = h.pipes.as_mut() else {
                continue;
            };
            let Some(mut level) = waiting_bytes(&p.spares) else {
                continue;
            };
            if level > h.out {
                // Not tokens: drained, so none can be forged.
                level -= drain(&mut p.spares, level - h.out);
            }
            if level < h.level {
                h.last_take = now;
                h.stolen = false;
            }
            h.level = level;
            // Given back: at most what its jobs hold counts.
            let back = waiting_bytes(&p.returns).unwrap_or(0);
            if back > 0 {
                let back = drain(&mut p.returns, back).min(h.out.saturating_sub(h.level));
                h.out -= back;
                self.free += back;
            }
        }
        while let Some(claimant) = self.best_claimant() {
            if self.free == 0 && !self.take_back_spare(claimant, now) {
                break;
            }
            match claimant {
                Claimant::Waiter(seq) => {
                    if let Some(&key) = self.waiting.iter().find(|(_, s)| *s == seq) {
                        self.waiting.remove(&key);
                    }
                    self.granted.insert(seq);
                    self.free -= 1;
                }
                Claimant::Running(id) => {
                    if !self.give(id) {
                        break;
                    }
                }
            }
        }
        if !self.waiting.is_empty() {
            return;
        }
        // What is left sits in the spares, by priority, so a build's next
        // job starts without waiting for the pool.
        let mut order: Vec<(u64, u64)> = (self.leases.iter())
            .filter(|(_, h)| h.pipes.is_some())
            .map(|(id, h)| (h.priority, *id))
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        while self.free > 0 {
            let before = self.free;
            for &(_, id) in &order {
                if self.free == 0 {
                    break;
                }
                self.give(id);
            }
            if self.free == before {
                break;
            }
        }
    }

    /// The waiter or wanting build of the highest priority (a waiter first
    /// among equals: it cannot start at all without one).
    fn best_claimant(&self) -> Option<Claimant> {
        let waiter = (self.waiting.first()).map(|(Reverse(p), seq)| (*p, Claimant::Waiter(*seq)));
        let running = (self.leases.iter())
            .filter(|(_, h)| h.wants())
            .map(|(id, h)| (h.priority, Claimant::Running(*id)))
            .max_by_key(|(p, c)| (*p, Reverse(*c)));
        match (waiter, running) {
            (Some(w), Some(r)) => Some(if r.0 > w.0 { r.1 } else { w.1 }),
            (w, r) => w.or(r).map(|x| x.1),
        }
    }

    /// Put one free token in build `id`'s spares.
    fn give(&mut self, id: u64) -> bool {
        let Some(h) = self.leases.get_mut(&id) else {
            return false;
        };
        let Some(p) = h.pipes.as_mut() else {
            return false;
        };
        if self.free == 0 || !matches!(p.spares.write(&[TOKEN]), Ok(1)) {
            return false;
        }
        h.out += 1;
        h.level += 1;
        self.free -= 1;
        true
    }

    /// Take a spare back for `claimant`: from any build for a waiter, from
    /// one that left it unread for [`IDLE`] for a running build; the
    /// lowest priority first. False when there is none.
    fn take_back_spare(&mut self, claimant: Claimant, now: Instant) -> bool {
        let (exclude, idle_only) = match claimant {
            Claimant::Waiter(_) => (None, false),
            Claimant::Running(id) => (Some(id), true),
        };
        let mut victims: Vec<(u64, u64)> = (self.leases.iter())
            .filter(|(id, h)| {
                Some(**id) != exclude
                    && h.pipes.is_some()
                    && h.level > 0
                    && h.out > 0
                    && (!idle_only || now.duration_since(h.last_take) >= IDLE)
            })
            .map(|(id, h)| (h.priority, *id))
            .collect();
        victims.sort_unstable();
        for (_, id) in victims {
            let Some(h) = self.leases.get_mut(&id) else {
                continue;
            };
            let Some(p) = h.pipes.as_mut() else {
                continue;
            };
            if drain(&mut p.spares, 1) == 1 {
                h.out -= 1;
                h.level = h.level.saturating_sub(1);
                h.stolen = h.level == 0;
                self.free += 1;
                return true;
            }
            // A job took it first.
            h.level = 0;
            h.last_take = now;
            h.stolen = false;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build's jobserver as its make sees it: both FIFOs, non-blocking.
    struct Make {
        take: File,
        give: File,
        held: usize,
    }

    impl Make {
        /// Take every token offered within a few ticks.
        fn take_all(&mut self) -> usize {
            let mut got = 0;
            for _ in 0..20 {
                let mut b = [0u8; 64];
                if let Ok(n) = self.take.read(&mut b) {
                    got += n;
                }
                std::thread::sleep(TICK);
            }
            self.held += got;
            got
        }

        fn give_back(&mut self, n: usize) {
            self.give.write_all(&vec![TOKEN; n]).unwrap();
            self.held -= n.min(self.held);
        }
    }

    fn jobserver(pool: &TokenPool, dir: &Path, priority: u64) -> (Lease, Make) {
        let mut lease = pool.acquire(priority, None).unwrap();
        let dir = dir.join(format!("b{}", lease.id));
        std::fs::create_dir(&dir).unwrap();
        let js = lease.open_jobserver(&dir, None).unwrap();
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(p)
                .unwrap()
        };
        let make = Make {
            take: open(&js.spares),
            give: open(&js.returns),
            held: 0,
        };
        (lease, make)
    }

    #[test]
    fn builds_together_hold_at_most_the_pool_and_a_killed_one_gives_all_back() {
        let t = tempfile::tempdir().unwrap();
        let pool = TokenPool::new(4).unwrap();
        let (a, mut ma) = jobserver(&pool, t.path(), 1);
        let (b, mut mb) = jobserver(&pool, t.path(), 2);
        // Two implicit tokens; the other two are for their jobs.
        assert_eq!(ma.take_all() + mb.take_all(), 2);
        let u = pool.usage();
        assert_eq!((u.in_use, u.builds), (4, 2));
        // A third build waits until a token is free: b is killed holding
        // what it took, and everything it had comes back.
        let waiter = std::thread::spawn({
            let pool = pool.clone();
            move || pool.acquire(0, None).map(|_| ())
        });
        std::thread::sleep(IDLE * 2);
        assert!(!waiter.is_finished());
        drop((b, mb));
        waiter.join().unwrap().unwrap();
        let u = pool.usage();
        assert_eq!(u.builds, 1);
        assert!(u.in_use <= 4);
        drop((a, ma));
        assert_eq!(pool.usage().in_use, 0);
        // All four are back: four builds start at once.
        let leases: Vec<Lease> = (0..4).map(|p| pool.acquire(p, None).unwrap()).collect();
        assert_eq!(pool.usage().in_use, 4);
        drop(leases);
    }

    #[test]
    fn a_token_given_back_goes_to_a_waiting_build_before_the_make_that_gave_it() {
        let t = tempfile::tempdir().unwrap();
        let pool = TokenPool::new(2).unwrap();
        let (_a, mut ma) = jobserver(&pool, t.path(), 0);
        assert_eq!(ma.take_all(), 1);
        let waiter = std::thread::spawn({
            let pool = pool.clone();
            move || pool.acquire(0, None)
        });
        std::thread::sleep(IDLE * 2);
        assert!(!waiter.is_finished());
        // The job ends; its make at once wants another, but the waiting
        // build starts first.
        ma.give_back(1);
        let started = waiter.join().unwrap().unwrap();
        assert_eq!(ma.take_all(), 0);
        // Once it ends, the token is a's again.
        drop(started);
        assert_eq!(ma.take_all(), 1);
    }

    #[test]
    fn forged_tokens_are_neither_kept_nor_counted() {
        let t = tempfile::tempdir().unwrap();
        let pool = TokenPool::new(2).unwrap();
        let (lease, mut m) = jobserver(&pool, t.path(), 0);
        assert_eq!(m.take_all(), 1);
        // A hundred forged spares, and a hundred returns for one token.
        m.take.write_all(&[TOKEN; 100]).unwrap();
        m.give_back(100);
        std::thread::sleep(TICK * 5);
        let u = pool.usage();
        assert_eq!((u.in_use, u.size), (1, 2));
        assert!(waiting_bytes(&m.take).unwrap() <= 1);
        drop(lease);
        assert_eq!(pool.usage().in_use, 0);
    }

    #[test]
    fn a_token_granted_by_another_builds_tick_wakes_its_waiter() {
        let t = tempfile::tempdir().unwrap();
        // No broker, and a waiter that would sleep a minute unless woken:
        // only the ticks of acquire, open_jobserver and a lease's drop
        // grant anything here.
        let pool = Arc::new(TokenPool {
            shared: Shared::new(2, Duration::from_secs(60)).unwrap(),
            broker: None,
        });
        let (_a, mut ma) = jobserver(&pool, t.path(), 0);
        assert_eq!(ma.take_all(), 1);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn({
            let pool = pool.clone();
            move || {
                let _ = tx.send(pool.acquire(5, None).map(|_| ()));
            }
        });
        while pool.usage().waiting == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // a's job gives its token back; a build that then gives up waiting
        // ticks, which reads the return and grants it to the first waiter.
        ma.give_back(1);
        let cancel = AtomicBool::new(true);
        assert!(pool.acquire(0, Some(&cancel)).is_err());
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the waiter was woken when its token was granted")
            .unwrap();
    }

    #[test]
    fn a_waiting_build_gets_an_idle_spare_and_a_cancel_stops_the_wait() {
        let t = tempfile::tempdir().unwrap();
        let pool = TokenPool::new(2).unwrap();
        // One build, its spare in its pipe and never read.
        let (_a, _ma) = jobserver(&pool, t.path(), 0);
        std::thread::sleep(TICK * 3);
        let b = pool.acquire(0, None).unwrap();
        assert_eq!(pool.usage().builds, 2);
        let cancel = AtomicBool::new(true);
        assert!(matches!(
            pool.acquire(9, Some(&cancel)),
            Err(Error::Sandbox(
                executor_core::SandboxError::Cancelled { .. }
            ))
        ));
        drop(b);
        assert_eq!(pool.usage().waiting, 0);
    }
}
