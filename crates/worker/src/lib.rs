//! `worker`: fhsx as an executor worker over Cap'n Proto, and its client.
//!
//! It owns the wire protocol (`schema/worker.capnp`, compiled by `build.rs`
//! with the `capnp` schema compiler), the worker daemon behind
//! `fhsx worker` ([`server`]: a `Cas` capability over the worker's local
//! store, `Executor.build` running the local [`fhs_executor::FhsExecutor`]
//! at most `jobs` at a time, logs streamed to the caller's `LogSink`,
//! cancellation when the caller goes away, graceful shutdown) and the client
//! behind `fhsx build --remote` ([`client`]: upload what the worker lacks,
//! build, download the record and its trees, verify the signature).
//!
//! It does not own how a build is run or signed (`fhs-executor`), the store
//! and its validation (`castore`: every directory a peer sends is decoded
//! and checked by [`castore::Directory::decode`]), nor argument parsing or
//! printing (the `fhsx` binary).
//!
//! The Rust bindings are generated at build time: `build.rs` runs `capnpc`,
//! which needs the `capnp` schema compiler on PATH (Debian: `capnproto`,
//! listed in `.ci/apt-packages`). Debian's package lacks the standard
//! `capnp/stream.capnp` that `-> stream` methods import, so the schema
//! directory vendors it (upstream ids, unchanged). Nothing generated is
//! checked in: edit `schema/worker.capnp` and rebuild.
//!
//! Who may build: the bootstrap capability is a `Gate` that hands out the
//! executor only for the worker's access token (a file both sides read,
//! [`read_token_file`]). A worker without one may listen only on loopback
//! or a UNIX socket. TCP carries TLS with a per-start self-signed
//! certificate bound to the worker's record key (`tls`): the client checks
//! the binding — and `--trust`, when given — before the token leaves. A
//! client trusts a *result* because the record is signed by the worker's
//! key (`--trust` pins which keys), not because of the channel.
//!
//! Limits on what a peer may send are set on every message reader
//! ([`reader_options`]): a message above [`MAX_MESSAGE_BYTES`] or nested
//! deeper than [`NESTING_LIMIT`] ends that connection, never the worker.

pub mod client;
mod error;
pub mod inflight;
pub mod reapi;
pub mod runner;
pub mod server;
mod tls;
pub mod transfers;

#[allow(clippy::all, clippy::pedantic, dead_code, unused, unreachable_pub)]
pub mod worker_capnp {
    include!(concat!(env!("OUT_DIR"), "/worker_capnp.rs"));
}

pub use error::Error;

use std::path::PathBuf;

/// The protocol version this crate speaks (`protocolVersion` in the schema).
pub const PROTOCOL_VERSION: u32 = worker_capnp::PROTOCOL_VERSION;

/// The largest message either side accepts, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// The deepest pointer nesting either side accepts.
pub const NESTING_LIMIT: i32 = 16;
/// Upload and download chunk size: under 1 MiB with the message around
/// it, so that the side reading it takes the message from its heap. `fhsx`
/// maps every block of 1 MiB or more fresh (see its `main`), and each page
/// of a fresh mapping is faulted in on its first write: 2 µs per 4 KiB on
/// these VMs, ten times what copying the page costs. With 1 MiB chunks a
/// big blob's bytes were faulted in twice on the worker's event loop (the
/// message, then its copy for the writer).
pub const CHUNK: usize = 960 << 10;
/// The size every message carrying blob bytes (a batch, a chunk) stays
/// below, header included: `fhsx` sets glibc's mmap threshold to it (its
/// `main`), so below it the reader takes the message from its heap.
/// Lists of digests may be bigger (50,000 digests a call); there are a
/// few per upload, not one per megabyte.
pub const HEAP_MESSAGE_MAX: usize = 1 << 20;
/// Bytes of blobs per `putBlobs` batch and per `getBlobs` answer: small, so the first leaves after reading
/// 960 KiB rather than 32 MiB and the worker hashes and writes one while
/// the next arrives (with 32 MiB batches four were read, 128 MiB, before
/// anything was sent). And under 1 MiB with the message around it: glibc
/// serves that from its heap, where `fhsx` maps every block of 1 MiB or
/// more fresh, each page faulted in (see its `main`). A blob no batch
/// holds is streamed in [`CHUNK`]s, which stay under 1 MiB too: sent
/// alone in a `putBlobs` of its size, the hello toolchain's 43 blobs
/// between 960 KiB and 16 MiB (107 MB) were faulted in twice on the
/// worker's event loop.
pub const BATCH_BYTES: usize = 960 << 10;
/// What a call's message takes besides its one big payload: the segment
/// table, the RPC call or return around it, the pointer to it.
const MESSAGE_FRAME_BYTES: usize = 4 << 10;

/// Why directory `d` (of `entries` entries, `encoded` bytes encoded)
/// cannot travel in one message either way, or `None` if it can. The
/// client asks before it uploads one, the worker before it sends one
/// back: a build may make a directory no message can carry, and the
/// reader's own refusal ("Message has N words, which is too large")
/// names neither the directory nor the fix.
pub(crate) fn too_big_for_a_message(
    d: &castore::Digest,
    entries: usize,
    encoded: usize,
) -> Option<String> {
    (encoded + MESSAGE_FRAME_BYTES > MAX_MESSAGE_BYTES).then(|| {
        format!(
            "directory {d} has {entries} entries and encodes to {encoded} bytes, more than the {} bytes \
             one message between a client and a worker may carry: split it into subdirectories",
            MAX_MESSAGE_BYTES - MESSAGE_FRAME_BYTES
        )
    })
}

/// Message reader limits for every connection.
pub fn reader_options() -> capnp::message::ReaderOptions {
    let mut o = capnp::message::ReaderOptions::new();
    o.traversal_limit_in_words(Some(MAX_MESSAGE_BYTES / 8));
    o.nesting_limit(NESTING_LIMIT);
    o
}

/// Where a worker listens / a client connects: `HOST:PORT` or `unix:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

impl Endpoint {
    pub fn parse(s: &str) -> Endpoint {
        match s.strip_prefix("unix:") {
            Some(p) => Endpoint::Unix(PathBuf::from(p)),
            None => Endpoint::Tcp(s.to_owned()),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => f.write_str(a),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

fn digest_from(b: &[u8]) -> Result<castore::Digest, capnp::Error> {
    castore::Digest::from_slice(b).ok_or_else(|| {
        capnp::Error::failed(format!(
            "a digest must be 32 bytes (BLAKE3-256), got {}",
            b.len()
        ))
    })
}

/// Every digest of a list a peer sent, each checked as [`digest_from`].
fn digest_list(l: capnp::data_list::Reader) -> Result<Vec<castore::Digest>, capnp::Error> {
    l.iter().map(|d| digest_from(d?)).collect()
}

/// Fill `l`, made for as many, with `ds`: the list [`digest_list`] reads.
fn set_digest_list<'a>(
    mut l: capnp::data_list::Builder<'_>,
    ds: impl IntoIterator<Item = &'a castore::Digest>,
) {
    for (i, d) in ds.into_iter().enumerate() {
        l.set(i as u32, d.as_bytes());
    }
}

/// Read an access token from `path`: its bytes without surrounding
/// whitespace, at least [`server::MIN_TOKEN_BYTES`] of them.
pub fn read_token_file(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    let bytes = std::fs::read(path).map_err(|e| {
        Error::Usage(format!(
            "cannot read the access token {}: {e}",
            path.display()
        ))
    })?;
    let token = bytes.trim_ascii().to_vec();
    if token.len() < server::MIN_TOKEN_BYTES {
        return Err(Error::Usage(format!(
            "the access token in {} is {} bytes; use at least {} random ones (e.g. `head -c 32 /dev/urandom | base64 > {}`)",
            path.display(),
            token.len(),
            server::MIN_TOKEN_BYTES,
            path.display()
        )));
    }
    Ok(token)
}

/// The next [`CHUNK`] of `blob` (less only at its end; empty there), with
/// the reader handed back for the chunk after: a blocking read that holds
/// no thread between chunks.
pub(crate) fn next_chunk(
    mut blob: Box<dyn std::io::Read + Send>,
) -> std::io::Result<(Box<dyn std::io::Read + Send>, Vec<u8>)> {
    use std::io::Read;
    let mut chunk = Vec::with_capacity(CHUNK);
    blob.by_ref().take(CHUNK as u64).read_to_end(&mut chunk)?;
    Ok((blob, chunk))
}

/// Send the blob `digest` of `store` down `tx` in [`CHUNK`]-sized pieces
/// (from a blocking thread: the REAPI front door's upload of a stored blob
/// to the engine's ByteStream).
/// Stops quietly when the receiver goes away; a read error is the last
/// message.
pub(crate) fn send_blob(
    store: &castore::LocalStore,
    digest: &castore::Digest,
    tx: &tokio::sync::mpsc::Sender<Result<Vec<u8>, String>>,
) {
    use castore::BlobStore;
    use std::io::Read;
    let mut f = match store.open_blob(digest) {
        Ok(f) => f,
        Err(e) => {
            let _ = tx.blocking_send(Err(castore::Chain(&e).to_string()));
            return;
        }
    };
    loop {
        let mut buf = vec![0u8; CHUNK];
        match f.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                buf.truncate(n);
                if tx.blocking_send(Ok(buf)).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.blocking_send(Err(format!("reading blob {digest}: {e}")));
                return;
            }
        }
    }
}

/// The verified bytes of `digests` for one `getBlobs` answer, in order;
/// refused, naming the blob, when one is missing or they come to more than
/// [`BATCH_BYTES`]. Sizes are looked at before anything is read, so a
/// client naming big blobs costs the worker no memory.
pub(crate) fn read_blobs(
    store: &castore::LocalStore,
    digests: &[castore::Digest],
) -> Result<Vec<Vec<u8>>, String> {
    use castore::store::ObjectKind;
    let mut total = 0u64;
    for d in digests {
        let Some(size) = store.object_len(ObjectKind::Blob, d) else {
            return Err(format!("blob {d} is not in the worker's store"));
        };
        total += size;
        if total > BATCH_BYTES as u64 {
            return Err(format!(
                "getBlobs asks for more than {BATCH_BYTES} bytes of blobs (blob {d} and those \
                 before it): ask for the bigger ones with getBlob"
            ));
        }
    }
    digests
        .iter()
        .map(|d| {
            store
                .read_blob(d)
                .map_err(|e| castore::Chain(&e).to_string())
        })
        .collect()
}

/// A blocking `Read` over the chunks an async front door receives (an
/// upload or a ByteStream download), for the blocking thread writing them
/// into the store. Ends when the sender goes away.
pub(crate) struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    pub(crate) fn new(rx: tokio::sync::mpsc::Receiver<Vec<u8>>) -> ChannelReader {
        ChannelReader {
            rx,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        castore::store::read_from_buffer(self, out)
    }
}

/// The chunk at hand is the buffer: a store writer takes it as it is
/// (`Txn::put_blob_buffered`), with no copy and no buffer of its own.
impl std::io::BufRead for ChannelReader {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.pos >= self.buf.len() {
            match self.rx.blocking_recv() {
                Some(b) => {
                    self.buf = b;
                    self.pos = 0;
                }
                None => return Ok(&[]),
            }
        }
        Ok(&self.buf[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.buf.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message of one segment: a chain of `depth` struct pointers, each
    /// to a struct of no data and one pointer (the next link).
    fn chain(depth: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&0u32.to_le_bytes());
        m.extend_from_slice(&(depth + 1).to_le_bytes());
        for _ in 0..depth {
            m.extend_from_slice(&[0, 0, 0, 0, 0, 0, 1, 0]);
        }
        m.extend_from_slice(&[0; 8]);
        m
    }

    fn total(bytes: &[u8]) -> capnp::Result<u64> {
        let r = capnp::serialize::read_message(bytes, reader_options())?;
        let root: capnp::any_pointer::Reader = r.get_root()?;
        Ok(root.target_size()?.word_count)
    }

    #[test]
    fn readers_refuse_deep_nesting() {
        assert!(total(&chain(NESTING_LIMIT as u32 - 2)).is_ok());
        let e = total(&chain(200)).unwrap_err();
        assert!(e.to_string().contains("nest"), "{e}");
    }

    #[test]
    fn readers_refuse_oversized_messages() {
        let mut m = Vec::new();
        m.extend_from_slice(&0u32.to_le_bytes());
        m.extend_from_slice(&((MAX_MESSAGE_BYTES / 8) as u32 + 1).to_le_bytes());
        let Err(e) = capnp::serialize::read_message(&m[..], reader_options()) else {
            panic!("an oversized message was accepted");
        };
        assert!(e.to_string().contains("too large"), "{e}");
    }

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("unix:/run/w.sock"),
            Endpoint::Unix("/run/w.sock".into())
        );
        assert_eq!(
            Endpoint::parse("127.0.0.1:7070"),
            Endpoint::Tcp("127.0.0.1:7070".into())
        );
    }
}
