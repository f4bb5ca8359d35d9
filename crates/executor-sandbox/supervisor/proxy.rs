//! The fetch proxy's forwarder: `127.0.0.1:P` inside the sandbox (its own
//! network namespace, where only `lo` exists) to the proxy's UNIX socket,
//! both ways, for at most [`MAX_CONNS`] connections at a time (more wait
//! in the listen backlog). An EOF from either side is passed on as a
//! half-close (`shutdown(SHUT_WR)`), so HTTP clients see the response
//! end; an error on either side closes both.
//!
//! It runs in the supervisor's one event loop: its descriptors are polled
//! with the signalfd and the control channel, so there are no threads
//! (the supervisor has no libc to make them with), and nothing here ever
//! blocks for long — but a connect to the proxy's socket, bounded by
//! [`CONNECT_TIMEOUT_S`].

use crate::sys::{self, Errno, PollFd, POLLIN, POLLOUT};

/// Proxy connections forwarded at once; further ones wait to be accepted.
pub const MAX_CONNS: usize = 64;
/// Each direction's buffer.
const BUF: usize = 32 * 1024;
/// A connect to the proxy's socket waits at most this long for the proxy
/// to accept (its backlog full): the whole loop waits with it.
const CONNECT_TIMEOUT_S: i64 = 2;

#[repr(C)]
struct SockaddrIn {
    family: u16,
    port_be: u16,
    addr_be: u32,
    zero: [u8; 8],
}

#[repr(C)]
struct SockaddrUn {
    family: u16,
    path: [u8; 108],
}

/// One direction of a connection: its buffer holds `start..end`.
#[derive(Clone, Copy, Default)]
struct Flow {
    start: usize,
    end: usize,
    /// The source said EOF.
    eof: bool,
    /// The EOF was passed on.
    done: bool,
}

impl Flow {
    fn wants_read(&self) -> bool {
        !self.eof && self.start == self.end
    }
    fn wants_write(&self) -> bool {
        self.start < self.end
    }
}

#[derive(Clone, Copy)]
struct Conn {
    tcp: i32,
    unix: i32,
    /// `2 * BUF` bytes: tcp → unix, then unix → tcp.
    buf: *mut u8,
    /// [0]: tcp → unix, [1]: unix → tcp.
    flows: [Flow; 2],
}

pub struct Proxy {
    listener: i32,
    socket: SockaddrUn,
    conns: [Option<Conn>; MAX_CONNS],
    /// Accepting failed for want of descriptors or memory: the listener
    /// rests for one short poll instead of spinning.
    resting: bool,
}

/// Why the forwarder could not start: the call and its errno.
pub struct ListenError {
    pub call: &'static str,
    pub errno: Errno,
}

impl Proxy {
    /// Listen on `127.0.0.1:port` now (the command must find it up).
    pub fn listen(port: u16, socket: &[u8]) -> Result<Proxy, ListenError> {
        let err = |call| move |errno| ListenError { call, errno };
        let mut un = SockaddrUn {
            family: sys::AF_UNIX as u16,
            path: [0; 108],
        };
        if socket.len() >= un.path.len() {
            return Err(ListenError {
                call: "the proxy socket's path (too long)",
                errno: sys::ENAMETOOLONG,
            });
        }
        un.path[..socket.len()].copy_from_slice(socket);
        let fd = sys::socket(
            sys::AF_INET,
            sys::SOCK_STREAM | sys::SOCK_CLOEXEC | sys::SOCK_NONBLOCK,
        )
        .map_err(err("socket"))?;
        let one: i32 = 1;
        sys::setsockopt(fd, sys::SOL_SOCKET, sys::SO_REUSEADDR, &one).map_err(err("setsockopt"))?;
        let addr = SockaddrIn {
            family: sys::AF_INET as u16,
            port_be: port.to_be(),
            addr_be: 0x7f00_0001u32.to_be(),
            zero: [0; 8],
        };
        sys::bind(fd, &addr).map_err(err("bind"))?;
        sys::listen(fd, 128).map_err(err("listen"))?;
        Ok(Proxy {
            listener: fd,
            socket: un,
            conns: [None; MAX_CONNS],
            resting: false,
        })
    }

    /// The poll timeout the forwarder needs (ms; -1: none).
    pub fn timeout(&self) -> i64 {
        if self.resting {
            50
        } else {
            -1
        }
    }

    /// Append what to poll: the listener while a slot is free, then each
    /// connection's two sockets (fd -1 where nothing is wanted, so the
    /// order stays fixed for [`handle`](Self::handle)).
    pub fn fill(&self, fds: &mut [PollFd], n: &mut usize) {
        let free = self.conns.iter().any(Option::is_none);
        fds[*n] = PollFd {
            fd: if free && !self.resting {
                self.listener
            } else {
                -1
            },
            events: POLLIN,
            revents: 0,
        };
        *n += 1;
        for c in self.conns.iter().flatten() {
            let [a, b] = &c.flows;
            let ev_tcp =
                if a.wants_read() { POLLIN } else { 0 } | if b.wants_write() { POLLOUT } else { 0 };
            let ev_unix =
                if b.wants_read() { POLLIN } else { 0 } | if a.wants_write() { POLLOUT } else { 0 };
            for (fd, events) in [(c.tcp, ev_tcp), (c.unix, ev_unix)] {
                fds[*n] = PollFd {
                    fd: if events != 0 { fd } else { -1 },
                    events,
                    revents: 0,
                };
                *n += 1;
            }
        }
    }

    /// Act on what the poll found, `fds` starting where [`fill`](Self::fill)
    /// began.
    pub fn handle(&mut self, fds: &[PollFd]) {
        self.resting = false;
        let mut i = 1;
        for slot in self.conns.iter_mut() {
            let Some(c) = slot else { continue };
            let ready = fds[i].revents != 0 || fds[i + 1].revents != 0;
            i += 2;
            if ready && !c.step() {
                c.close();
                *slot = None;
            }
        }
        if fds[0].revents != 0 {
            self.accept();
        }
    }

    fn accept(&mut self) {
        let Some(slot) = self.conns.iter_mut().find(|c| c.is_none()) else {
            return;
        };
        let tcp = match sys::accept(self.listener, sys::SOCK_NONBLOCK | sys::SOCK_CLOEXEC) {
            Ok(fd) => fd,
            Err(sys::EAGAIN) | Err(sys::EINTR) => return,
            Err(_) => {
                // EMFILE and the like: rest, do not spin.
                self.resting = true;
                return;
            }
        };
        let Some(unix) = connect_unix(&self.socket) else {
            crate::say(&[
                b"cannot reach the fetch proxy at ",
                crate::until_nul(&self.socket.path),
            ]);
            sys::close(tcp);
            return;
        };
        let Ok(buf) = sys::map(2 * BUF) else {
            sys::close(tcp);
            sys::close(unix);
            self.resting = true;
            return;
        };
        *slot = Some(Conn {
            tcp,
            unix,
            buf,
            flows: [Flow::default(); 2],
        });
    }
}

/// A connection to the proxy's socket, non-blocking once made.
fn connect_unix(addr: &SockaddrUn) -> Option<i32> {
    let fd = sys::socket(sys::AF_UNIX, sys::SOCK_STREAM | sys::SOCK_CLOEXEC).ok()?;
    match connect_then_unblock(fd, addr) {
        Ok(()) => Some(fd),
        Err(_) => {
            sys::close(fd);
            None
        }
    }
}

/// Connect `fd` to `addr`, waiting at most [`CONNECT_TIMEOUT_S`], then
/// make it non-blocking.
fn connect_then_unblock(fd: i32, addr: &SockaddrUn) -> Result<(), Errno> {
    let timeout: [i64; 2] = [CONNECT_TIMEOUT_S, 0];
    sys::setsockopt(fd, sys::SOL_SOCKET, sys::SO_SNDTIMEO, &timeout)?;
    while let Err(e) = sys::connect(fd, addr) {
        if e != sys::EINTR {
            return Err(e);
        }
    }
    let flags = sys::fcntl(fd, sys::F_GETFL, 0)?;
    sys::fcntl(fd, sys::F_SETFL, flags | sys::O_NONBLOCK)?;
    Ok(())
}

impl Conn {
    /// Move what can move without blocking, both ways; false once the
    /// connection is over (both directions ended, or an error).
    fn step(&mut self) -> bool {
        let (tcp, unix, buf) = (self.tcp, self.unix, self.buf);
        // SAFETY: buf is a live mapping of 2 * BUF bytes owned by this
        // connection, split in two disjoint halves.
        let (up, down) = unsafe {
            (
                core::slice::from_raw_parts_mut(buf, BUF),
                core::slice::from_raw_parts_mut(buf.add(BUF), BUF),
            )
        };
        let [a, b] = &mut self.flows;
        if flow(a, up, tcp, unix).is_err() || flow(b, down, unix, tcp).is_err() {
            return false;
        }
        !(a.done && b.done)
    }

    fn close(&self) {
        sys::close(self.tcp);
        sys::close(self.unix);
        // SAFETY: the mapping is this connection's, and it is over.
        unsafe { sys::unmap(self.buf, 2 * BUF) };
    }
}

/// One direction: write what is buffered, pass an EOF on, read more;
/// until the sockets would block.
fn flow(f: &mut Flow, buf: &mut [u8], from: i32, to: i32) -> Result<(), ()> {
    loop {
        if f.wants_write() {
            match sys::send(to, &buf[f.start..f.end]) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    f.start += n;
                    if f.start == f.end {
                        f.start = 0;
                        f.end = 0;
                    }
                    continue;
                }
                Err(sys::EAGAIN) => return Ok(()),
                Err(sys::EINTR) => continue,
                Err(_) => return Err(()),
            }
        }
        if f.eof {
            if !f.done {
                f.done = true;
                // The peer may already be gone: nothing left to tell it.
                sys::shutdown_write(to);
            }
            return Ok(());
        }
        match sys::recv(from, buf) {
            Ok(0) => f.eof = true,
            Ok(n) => {
                f.start = 0;
                f.end = n;
            }
            Err(sys::EAGAIN) => return Ok(()),
            Err(sys::EINTR) => {}
            Err(_) => return Err(()),
        }
    }
}
