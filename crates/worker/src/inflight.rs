//! How many calls one connection may have in progress: past
//! [`CALLS_PER_CONNECTION`], the worker stops reading that connection until
//! one of them ends.
//!
//! A call in progress holds its message until it returns — a build queued
//! behind `--jobs`, a transfer waiting for its turn (`transfers`) — and
//! capnp-rpc reads and dispatches every call a peer sends, with no cap of
//! its own (HTTP/2 has one, `SETTINGS_MAX_CONCURRENT_STREAMS`). So a
//! client sending calls faster than they end would grow the worker without
//! bound. Not reading is the back-pressure TCP already has: the client's
//! sends block, nobody else's.
//!
//! The cap is far above what `fhsx build --remote` has in flight (eight
//! batches, eight upload streams with a chunk or two each, two claims, a
//! build): an honest client never waits on it. A connection that reaches
//! it reads nothing more — not even the answers to the worker's own calls
//! to it (a download's chunks, a build's log) — until one of its calls
//! ends, which a stalled transfer does at its stall timeout.

use std::cell::{Cell, RefCell};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Calls one connection may have in progress before the worker stops
/// reading it.
pub const CALLS_PER_CONNECTION: usize = 64;

/// One connection's count of calls in progress.
#[derive(Default)]
pub(crate) struct Calls {
    in_progress: Cell<usize>,
    /// The connection's reader, waiting for a call to end.
    reader: RefCell<Option<Waker>>,
}

impl Calls {
    /// Count a call until the returned guard drops.
    pub(crate) fn enter(self: &Rc<Self>) -> Call {
        self.in_progress.set(self.in_progress.get() + 1);
        Call(self.clone())
    }
}

/// A call in progress.
pub(crate) struct Call(Rc<Calls>);

impl Drop for Call {
    fn drop(&mut self) {
        let calls = &self.0;
        calls
            .in_progress
            .set(calls.in_progress.get().saturating_sub(1));
        if let Some(w) = calls.reader.borrow_mut().take() {
            w.wake();
        }
    }
}

/// A connection's reading side, read only while its calls in progress are
/// under the cap.
pub(crate) struct Gated<R> {
    inner: R,
    calls: Rc<Calls>,
}

impl<R> Gated<R> {
    pub(crate) fn new(inner: R, calls: Rc<Calls>) -> Self {
        Self { inner, calls }
    }
}

impl<R: futures::AsyncRead + Unpin> futures::AsyncRead for Gated<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.calls.in_progress.get() >= CALLS_PER_CONNECTION {
            *this.calls.reader.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}
