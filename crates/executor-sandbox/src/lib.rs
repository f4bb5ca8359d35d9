//! `executor-sandbox`: contains one command so that nothing inside can reach
//! what it was not given.
//!
//! It owns:
//! - [`SandboxSpec`] and its six layers (namespaces, isolation, mounts,
//!   masks, RPC bridge, environment), composed in that fixed order into one
//!   deterministic bubblewrap argv by [`SandboxSpec::bwrap_argv`];
//! - the two root providers: the *view* root (a mounted tree bound
//!   read-only, scratch read-write at `/build`) and the *host* root
//!   (`fhsx run`: the host's probed system directories read-only, the
//!   workspace read-write at `/workspace`);
//! - the static `fhsx-supervisor` (embedded, see build.rs) that runs as PID 1
//!   inside, reaps orphans and kills lingering processes when the command
//!   ends;
//! - the RPC bridge ([`rpc`]) at `/run/wf.sock`, length-framed, 1 MiB frames;
//! - the [`reaper`]: wall-clock timeout, SIGTERM to proven PIDs only, a
//!   grace period, then SIGKILL, by a per-run cgroup v2 or pidfds;
//! - [`Runtime::run`], which puts these together and reports an [`Outcome`].
//!
//! # Running as root
//!
//! bwrap maps the sandbox uid (1000) to the caller's uid; for root that is
//! host uid 0, with every capability dropped (`--cap-drop ALL`, uid != 0
//! inside, `--disable-userns`). Ownership alone must then give nothing
//! away, so the sandbox only ever shows what is safe for an owner to see:
//! read-only, `nosuid`/`nodev` binds of `/usr` and a whitelist of `/etc`
//! entries (no `shadow`, no `ssl/private`), a synthetic `passwd`/`group`,
//! no `/sys`; `/proc/sys` re-bound read-only and `/proc/sysrq-trigger`
//! covered (bwrap leaves both writable to host uid 0); PID 1 non-dumpable
//! (the command can neither ptrace it nor read its fds); a fresh session
//! keyring; a seccomp filter ([`seccomp`]) that refuses setuid/setgid
//! modes, since a file made in the workspace is root's on the host. The
//! writable places are the work directory, a private `/tmp`
//! and a private `/dev/shm` (a tmpfs like `/tmp`: POSIX shared memory needs
//! it).
//!
//! It does not own: the FUSE view or read-set capture (`castore-fuse`), the
//! fetch proxy (`fetch-proxy`), what an action is or how outputs are
//! ingested (`fhs-executor`), nor the error vocabulary
//! ([`executor_core::SandboxError`], shared by the stack). It holds no
//! opinion on the command it runs.

mod layers;
pub mod probe;
pub mod reaper;
pub mod rpc;
mod runner;
pub mod seccomp;
mod spec;
pub mod supervisor;
mod sys;

pub use executor_core::SandboxError;
pub use probe::{BwrapFeatures, FileKind, HostFs, MemFs, RealFs};
pub use reaper::{ReaperMode, ReaperPreference, GRACE_PERIOD};
pub use rpc::{Request, Response, RpcHandler, MAX_FRAME};
pub use runner::{Outcome, Output, RunOptions, RunReport, Runtime, Stdin};
pub use spec::*;
