//! The shared vocabulary of fhsx: the types every other crate speaks.
//!
//! This crate owns the names — [`Action`] (what a build may depend on,
//! parsed strictly), [`BuildRecord`] (what it did, in the canonical form that
//! is signed), [`SandboxError`] and [`ExitClass`] — and nothing that touches
//! the outside world beyond reading an action file. A type here can be built
//! and inspected in a unit test without a store, a mount or a sandbox.
//!
//! It does not own digests or trees (that is `castore`), how a sandbox is
//! assembled (`executor-sandbox`), nor how a record is signed
//! (`fhs-executor`).

pub mod action;
mod error;
pub mod record;

pub use action::{Action, ActionError, NetworkMode};
pub use error::{ExitClass, SandboxError};
pub use record::{BuildRecord, ExitStatus, ResourceUse, SignedRecord};
