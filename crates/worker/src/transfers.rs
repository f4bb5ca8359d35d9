//! What one connection may have in flight: blob transfers take turns, and
//! a transfer that stalls is ended.
//!
//! A download holds two chunks of its blob (the one on its way, the next
//! one read), and an upload stream holds a blocking thread (its store
//! writer) and a queue of chunks; each is bounded, but without turns a client could open any
//! number of them on one connection and stall them all, growing the worker
//! by that many queues and emptying its blocking pool. So each connection
//! has [`UPLOADS_PER_CONNECTION`] upload and [`DOWNLOADS_PER_CONNECTION`]
//! download turns; a call beyond them waits for one (a pending call holds
//! no thread and no chunk). And so that a client cannot keep its turns
//! forever without moving a byte, a transfer that makes no progress for
//! the stall timeout (`fhsx worker --stall-timeout`) is ended, its turn,
//! its thread and its claim given back.
//!
//! Turns are per connection, not per worker: a worker-wide budget would let
//! a few stalled clients hold every turn until their timeouts. The
//! worker's bound is so [`crate::server::MAX_CONNECTIONS`] times a
//! connection's.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Upload streams (`putBlob`) one connection may have open at once: as
/// many as a client sends at once (`client::IN_FLIGHT`).
pub const UPLOADS_PER_CONNECTION: usize = 8;
/// Downloads (`getBlob`) one connection may have in progress at once; a
/// client takes its blobs one at a time.
pub const DOWNLOADS_PER_CONNECTION: usize = 2;
/// How long a transfer may go without progress by default: no chunk
/// received on an upload stream, or none taken by a download's client.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One connection's turns.
pub(crate) struct Turns {
    uploads: Arc<Semaphore>,
    downloads: Arc<Semaphore>,
}

/// A transfer's turn; given back when dropped.
pub(crate) type Turn = OwnedSemaphorePermit;

impl Turns {
    pub(crate) fn new() -> Self {
        Self {
            uploads: Arc::new(Semaphore::new(UPLOADS_PER_CONNECTION)),
            downloads: Arc::new(Semaphore::new(DOWNLOADS_PER_CONNECTION)),
        }
    }

    /// Wait for an upload turn.
    pub(crate) async fn upload(&self) -> Turn {
        take(&self.uploads).await
    }

    /// Wait for a download turn.
    pub(crate) async fn download(&self) -> Turn {
        take(&self.downloads).await
    }
}

async fn take(turns: &Arc<Semaphore>) -> Turn {
    // Only a closed semaphore refuses, and these are never closed.
    turns
        .clone()
        .acquire_owned()
        .await
        .expect("a connection's turns are never closed")
}
