//! fhs-executor: the primary FHS executor.
//!
//! It owns the build pipeline ([`build`]: resolve → cache → compose →
//! prepare → run → prove → ingest → sign, each a function that owns what it
//! creates) and its stages' pieces: composing the declared closure and
//! toolchain into the view and proving the read set inside it ([`view`]),
//! the fetch proxy session (`fetch`), the build's size-capped working area
//! ([`scratch`]) and the pool a worker keeps such areas in between builds
//! ([`pool`]), ingesting each declared output as an atom ([`ingest`]),
//! the token pool every build of a process shares as its make jobserver
//! ([`jobserver`]), the interface manifest ([`manifest`]), signing and checking BuildRecords
//! ([`sign`], [`keys`]), the action cache ([`cache`]: exact hits, and hits
//! of the same command whose read set holds in the new view, [`validate`]),
//! `--check` comparison ([`check`]), pruning an action to its read set
//! ([`prune`]), moving records with what they name between stores or
//! through a bundle file ([`copy`]), and the narrow interface through
//! which a remote cache is consulted and fed ([`remote`]; the REAPI one
//! is the `worker` crate's).
//!
//! It does not own the store (`castore`), the FUSE view and read-set capture
//! (`castore-fuse`), the bubblewrap sandbox (`executor-sandbox`) or the fetch
//! proxy (`fetch-proxy`): it wires them together.

mod ahead;
mod background;
pub mod build;
pub mod cache;
pub mod check;
pub mod copy;
mod error;
mod fetch;
pub mod history;
pub mod ingest;
pub mod jobserver;
pub mod keys;
mod log;
pub mod manifest;
pub mod pool;
pub mod prune;
pub mod remote;
pub mod scratch;
pub mod sign;
pub mod validate;
pub mod view;
pub mod world;

pub use build::FhsExecutor;
pub use error::Error;
pub use scratch::ScratchMedium;
pub use view::check_read_set;
