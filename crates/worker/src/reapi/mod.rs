//! The REAPI front door: fhsx as a Remote Execution API worker. It attaches
//! to an engine's `Bots` service (Remote Workers API v1test2), takes
//! leases, fetches each action's input root from the engine's CAS, runs it
//! through the shared [`crate::runner::Runner`] — the same `FhsExecutor`,
//! view, sandbox, read-set proof, limits and signed record as `fhsx
//! build` — and returns an `ActionResult` with the outputs uploaded and
//! the record attached.
//!
//! - [`mapping`]: REAPI Action/Command ↔ fhsx action, outputs ↔
//!   ActionResult; pure and unit-tested.
//! - [`paths`]: output paths resolved against the working directory.
//! - [`platform`]: the properties the worker advertises for matching.
//! - [`cache`]: an REAPI ActionCache and CAS as `fhsx build --cache`'s
//!   remote cache.
//! - `cas`: the engine's CAS as the store sees it: SHA-256 on the wire,
//!   BLAKE3 in the store, a persistent index between them.
//! - `bot`: the bot session loop, one per slot.
//! - `proto`: the Remote Workers API types and client.

#[allow(deprecated)]
mod bot;
pub mod cache;
mod cas;
pub mod mapping;
pub mod paths;
pub mod platform;
pub mod proto;

pub use bot::{run, BotConfig};
