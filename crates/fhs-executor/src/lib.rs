//! fhs-executor: the primary FHS executor.
//!
//! It owns what happens around a sandboxed build: composing the declared
//! closure and toolchain into the view, ingesting declared outputs
//! ([`ingest`]), deriving the interface manifest ([`manifest`]), the build's
//! size-capped working area ([`scratch`]), and signing and checking
//! BuildRecords ([`sign`], [`keys`]).
//!
//! It does not own the store (`castore`), the FUSE view and read-set capture
//! (`castore-fuse`), the bubblewrap sandbox (`executor-sandbox`) or the fetch
//! proxy (`fetch-proxy`): it wires them together.

pub mod build;
mod error;
pub mod ingest;
pub mod keys;
pub mod manifest;
pub mod scratch;
pub mod sign;

pub use build::FhsExecutor;
pub use error::Error;
