//! The six layers, each emitting its part of the argv. `SandboxSpec::bwrap_argv`
//! calls them in this order, always: namespaces, isolation, mounts, masks,
//! RPC bridge, environment.

pub(crate) mod bridge;
pub(crate) mod env;
pub(crate) mod isolation;
pub(crate) mod masks;
pub(crate) mod mounts;
pub(crate) mod namespaces;
