//! How much one connection may have outstanding before the worker stops
//! reading it: [`CALLS_PER_CONNECTION`] calls in progress, [`CALL_BYTES`]
//! bytes carried by their messages, or answers not yet written to it that
//! cost more than [`ANSWER_BACKLOG`]. Reading resumes once a call ends or
//! the answers drain.
//!
//! A call in progress holds its message until it returns — a build queued
//! behind `--jobs`, a transfer waiting for its turn (`transfers`), a batch
//! waiting for a blob another upload has claimed — and capnp-rpc reads and
//! dispatches every call a peer sends, with no cap of its own (HTTP/2 has
//! one, `SETTINGS_MAX_CONCURRENT_STREAMS`). So a client sending calls
//! faster than they end would grow the worker without bound. Not reading
//! is the back-pressure TCP already has: the client's sends block, nobody
//! else's. The count of calls alone bounds small calls; a message may
//! carry up to `MAX_MESSAGE_BYTES` (64 MiB), so 64 waiting calls could hold
//! 4 GiB: 64 batches of 8 MiB waiting on a claimed blob grew the worker by
//! 703 MiB (the messages and the method's copies of them). So each call
//! also counts what its message carries (the payload its method reads:
//! blobs, directories, digests, an action), once it has read it; the same
//! 64 batches now grow the worker by 64 MiB.
//!
//! An answer, once its call ends, waits in capnp-rpc's write queue, which
//! has no bound either, until the connection takes it: a client asking
//! for a directory over and over and reading nothing grew the worker by
//! what every answer was worth (1,500 answers of ~290 KB: 408 MiB). The
//! worker cannot see that queue, so it keeps its own list of the answers
//! it made, each with where the connection's writer will be, at least,
//! once it is out (what the writer had taken or the answer before it
//! ends, plus the bytes the answer carries: a floor, never more, so that
//! an answer is never thought to be out later than it is, which would
//! close a connection whose client reads everything) and with what it
//! costs until then (those bytes, plus [`ANSWER_COST`]). An answer's bytes
//! are its struct's size, measured once it is set; its frame, the
//! `Return` around it, is counted on the wire as [`ANSWER_WIRE_FLOOR`].
//! Counted as out sooner than they are, answers a slow reader has not
//! taken are under-counted by what the frames' floor misses (~24 bytes of
//! an empty `Return`'s ~80; more where it carries a capability). A call
//! its client cancels is answered too: capnp-rpc sends a `canceled`
//! `Return`, the smallest answer and so the floor, for every call whose
//! results it drops after a `Finish`, so every call is counted as one
//! answer whatever becomes of it. One cancelled after it set its answer
//! (its client had pipelined on it) gets that `canceled` `Return` too, so
//! its struct's bytes run the count ahead of the writer: such a client
//! holds back only its own connection. Whatever
//! else the worker writes (its own calls: a download's chunks, a build's log)
//! is bounded where it is made. The gate stops new calls at the backlog,
//! not those in progress, so the calls whose answers carry what they read
//! wait for room before they read it ([`Calls::answer_room`]): a directory
//! one call at a time, a batch of blobs in its download turn. So the queue
//! of answers holds at most the backlog, one directory, two batches, and
//! lists of digests no longer than those the calls in progress were sent.
//!
//! The caps are far above what `fhsx build --remote` has outstanding
//! (eight batches, eight upload streams with a chunk or two each, two
//! claims, a build; eight directories asked for at once): an honest client
//! never waits on them. A connection that reaches one reads nothing more —
//! not even the answers to the worker's own calls to it — until a call
//! ends, which a stalled transfer does at its stall timeout, or the client
//! reads.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Calls one connection may have in progress before the worker stops
/// reading it.
pub const CALLS_PER_CONNECTION: usize = 64;
/// Bytes the messages of one connection's calls in progress may carry
/// before the worker stops reading it. A call is counted once it has read
/// its message, so a connection may hold this plus one message. Four times
/// what `fhsx build --remote` had in flight at most while it uploaded the
/// hello toolchain (7.4 MiB: eight batches and the upload streams' chunks,
/// under 1 MiB each).
pub const CALL_BYTES: u64 = 32 << 20;
/// Bytes of answers one connection may leave unwritten before the worker
/// stops reading it. Far above what a client usually has coming (eight
/// directories, a batch of blobs); one with more (directories of tens of
/// MB) waits only as long as it takes to read them.
pub const ANSWER_BACKLOG: u64 = 16 << 20;
/// What an answer costs the worker until written, besides the payload a
/// method names: capnp-rpc's `Return` in a message allocation of its own
/// and the answer's entry in its table. A `Stats` answer is ~145 bytes on
/// the wire and ~800 in memory; counted at 128 bytes, 100,000 unread ones
/// grew the worker by 77-79 MiB without reaching the backlog. Counted
/// for every call, so that a flood of small answers is bounded too; an
/// honest client has far fewer than the 16,384 this allows outstanding.
pub const ANSWER_COST: u64 = 1024;
/// The fewest bytes an answer takes on the wire: a `Return` of an empty
/// struct was ~80, a `canceled` one (no payload: the segment table, the
/// root pointer, a `Message` of one word and a pointer, a `Return` of two
/// and one) is 56. Where the writer will be once an answer is out is
/// counted with this, a floor (see the module's doc).
pub const ANSWER_WIRE_FLOOR: u64 = 56;

/// One connection's calls in progress and answers not yet written.
#[derive(Default)]
pub(crate) struct Calls {
    in_progress: Cell<usize>,
    /// Bytes the messages of the calls in progress carry.
    held: Cell<u64>,
    /// Where the writer's count will be, at least, once every answer made
    /// so far is written.
    answered_to: Cell<u64>,
    /// The answers not yet written, oldest first: where the writer's count
    /// will be, at least, once each is out, and what each costs until
    /// then.
    unwritten: RefCell<VecDeque<(u64, u64)>>,
    /// What they cost together.
    unwritten_cost: Cell<u64>,
    /// Bytes the connection's writer has taken.
    written: Cell<u64>,
    /// The connection's reader, waiting for a call to end or answers to
    /// drain.
    reader: RefCell<Option<Waker>>,
    /// Calls waiting for answers to drain before they make theirs.
    drained: tokio::sync::Notify,
    /// Held by the call reading a big answer (`big_answer_turn`).
    big_answers: futures::lock::Mutex<()>,
}

impl Calls {
    /// Serve one call: its method's `body`, given the [`Call`] that counts
    /// it and its answer (see the module's doc), from its first poll until
    /// it ends, returned or cancelled.
    pub(crate) async fn serve<T>(self: &Rc<Self>, body: impl AsyncFnOnce(&Call) -> T) -> T {
        let call = self.enter();
        body(&call).await
    }

    /// Count a call until the returned guard drops.
    fn enter(self: &Rc<Self>) -> Call {
        self.in_progress.set(self.in_progress.get() + 1);
        Call {
            calls: self.clone(),
            held: Cell::new(0),
            answer_bytes: Cell::new(0),
        }
    }

    fn full(&self) -> bool {
        self.in_progress.get() >= CALLS_PER_CONNECTION
            || self.held.get() > CALL_BYTES
            || self.backlogged()
    }

    fn backlogged(&self) -> bool {
        self.unwritten_cost.get() > ANSWER_BACKLOG
    }

    /// Wait until the answers not yet written are under [`ANSWER_BACKLOG`],
    /// before reading what an answer will carry. The gate stops new calls
    /// at the backlog, but not the calls already in progress: 64 of them
    /// each reading a directory of ~8 MB off the event loop made every
    /// answer at once (1.5 GiB). A caller's answer is counted as its call
    /// ends, in the turn it is set ([`Call::answers`]), before the next
    /// one looks.
    pub(crate) async fn answer_room(&self) {
        loop {
            let drained = self.drained.notified();
            if !self.backlogged() {
                return;
            }
            drained.await;
        }
    }

    /// [`Calls::answer_room`] for an answer that may be big (a directory of
    /// up to `MAX_MESSAGE_BYTES`), taken one call at a time: hold the turn
    /// until the answer is counted.
    pub(crate) async fn big_answer_turn(&self) -> futures::lock::MutexGuard<'_, ()> {
        let turn = self.big_answers.lock().await;
        self.answer_room().await;
        turn
    }

    /// Count an answer made now, of at least `wire` bytes on the wire and
    /// costing `cost` until then: out no sooner than the writer has taken
    /// what it had and these.
    fn answer(&self, wire: u64, cost: u64) {
        let out_by = self.answered_to.get().max(self.written.get()) + wire;
        self.answered_to.set(out_by);
        if out_by > self.written.get() {
            self.unwritten.borrow_mut().push_back((out_by, cost));
            self.unwritten_cost.set(self.unwritten_cost.get() + cost);
        }
    }

    fn wrote(&self, n: usize) {
        self.written.set(self.written.get() + n as u64);
        let was_backlogged = self.backlogged();
        let mut unwritten = self.unwritten.borrow_mut();
        while let Some(&(out_by, cost)) = unwritten.front() {
            if out_by > self.written.get() {
                break;
            }
            unwritten.pop_front();
            self.unwritten_cost.set(self.unwritten_cost.get() - cost);
        }
        drop(unwritten);
        // Calls wait for room only while backlogged: wake them as it ends,
        // not on every write.
        if was_backlogged && !self.backlogged() {
            self.drained.notify_waiters();
        }
        if !self.full() {
            self.wake_reader();
        }
    }

    fn wake_reader(&self) {
        if let Some(w) = self.reader.borrow_mut().take() {
            w.wake();
        }
    }
}

/// A call in progress.
pub(crate) struct Call {
    calls: Rc<Calls>,
    /// Bytes its message carries.
    held: Cell<u64>,
    /// Bytes its answer's struct takes on the wire (see [`Call::answers`]).
    answer_bytes: Cell<u64>,
}

impl Call {
    /// This call's message carries `bytes` (blobs, directories, digests,
    /// an action): counted against [`CALL_BYTES`] until the call ends.
    pub(crate) fn holds(&self, bytes: usize) {
        self.held.set(self.held.get() + bytes as u64);
        let calls = &self.calls;
        calls.held.set(calls.held.get() + bytes as u64);
    }

    /// This call's answer, once set, is a struct of `size` (its
    /// `total_size`: a directory, a list, the counters), which it takes on
    /// the wire besides its frame. Counted with the frame as one answer
    /// when the call ends, which is in the same turn of the event loop: a
    /// method sets its answer last, awaiting nothing after, so the answer
    /// is counted before any other call looks (`big_answer_turn`). A size
    /// that could not be taken counts nothing, a floor.
    pub(crate) fn answers(&self, size: capnp::Result<capnp::MessageSize>) {
        self.answer_bytes.set(size.map_or(0, |s| s.word_count * 8));
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let calls = &self.calls;
        calls
            .in_progress
            .set(calls.in_progress.get().saturating_sub(1));
        calls
            .held
            .set(calls.held.get().saturating_sub(self.held.get()));
        let bytes = self.answer_bytes.get();
        calls.answer(bytes + ANSWER_WIRE_FLOOR, bytes + ANSWER_COST);
        calls.wake_reader();
    }
}

/// A connection's reading side, read only while its calls in progress and
/// answers not yet written are under their caps.
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
        if this.calls.full() {
            *this.calls.reader.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

/// A connection's writing side, counting what it takes for [`Gated`].
pub(crate) struct Counted<W> {
    inner: W,
    calls: Rc<Calls>,
}

impl<W> Counted<W> {
    pub(crate) fn new(inner: W, calls: Rc<Calls>) -> Self {
        Self { inner, calls }
    }

    /// A write's result, its bytes counted as taken.
    fn count(&self, r: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = r {
            self.calls.wrote(n);
        }
        r
    }
}

impl<W: futures::AsyncWrite + Unpin> futures::AsyncWrite for Counted<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.count(r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.count(r)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers whose writes go out in full, each at least its floor, are
    /// all counted out again, however many: a count running ahead of the
    /// writer would close the connection of a client that reads all. The
    /// smallest is the `canceled` `Return` capnp-rpc sends for a call its
    /// client cancelled (56 bytes): at a floor of 64 each ran 8 bytes
    /// ahead, ~1 in 8 stayed counted, 200,000 of them reached the backlog,
    /// and 48,000 `getBlob`s cancelled while they waited for a turn left
    /// their connection unread until the stall timeout.
    #[test]
    fn answers_written_in_full_are_never_a_backlog() {
        // A cancelled call's `Return`, and an empty struct's (~80).
        for written in [56, 80] {
            let calls = Rc::new(Calls::default());
            for _ in 0..200_000 {
                drop(calls.enter());
                calls.wrote(written);
                assert!(!calls.full(), "answers of {written} bytes");
            }
            assert!(calls.unwritten.borrow().is_empty());
        }
    }

    /// Answers nobody writes close the gate at the backlog, by what they
    /// cost, and open it again once written.
    #[test]
    fn unwritten_answers_close_the_gate_at_their_cost() {
        let calls = Rc::new(Calls::default());
        let allowed = ANSWER_BACKLOG / ANSWER_COST;
        for _ in 0..allowed {
            drop(calls.enter());
        }
        assert!(!calls.full());
        drop(calls.enter());
        assert!(calls.full());
        calls.wrote(((allowed + 1) * ANSWER_WIRE_FLOOR) as usize);
        assert!(!calls.full());
        let big = calls.enter();
        big.answers(Ok(capnp::MessageSize {
            word_count: ANSWER_BACKLOG / 8 + 1,
            cap_count: 0,
        }));
        drop(big);
        assert!(calls.full());
        calls.wrote(ANSWER_BACKLOG as usize);
        assert!(calls.full(), "counted out before its last bytes");
        calls.wrote(8 + ANSWER_WIRE_FLOOR as usize);
        assert!(!calls.full());
    }
}
