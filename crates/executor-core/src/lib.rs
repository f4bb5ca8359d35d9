//! The shared vocabulary of fhsx: the types every other crate speaks.
//!
//! This crate owns the names — [`SandboxError`], [`ExitClass`], and (as the
//! executor lands) `Action`, `BuildRecord` and `ReadSet` — and nothing that
//! touches the outside world. It does no I/O: a type here can be built and
//! inspected in a unit test without a store, a mount or a sandbox.
//!
//! It does not own digests or trees (that is `castore`) nor how a sandbox is
//! assembled (that is `executor-sandbox`).

mod error;

pub use error::{ExitClass, SandboxError};
