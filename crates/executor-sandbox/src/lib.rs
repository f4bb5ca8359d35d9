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
//! # The network path, extra files, limits, cancellation, output
//!
//! - **Fetch proxy forwarder** ([`SandboxSpec::proxy`]): the sandbox has its
//!   own network namespace with only `lo`. The fetch proxy runs outside on
//!   a host UNIX socket; that socket is bound (read-only: `connect` still
//!   works) at [`PROXY_SOCKET_PATH`], and the supervisor, told by its argv
//!   (`--proxy-port`, `--proxy-socket`; never the build's environment),
//!   listens on `127.0.0.1:<port>` ([`DEFAULT_PROXY_PORT`] 3128) *before*
//!   the command starts and forwards each connection to the socket, both
//!   ways, passing half-closes on, at most 64 at a time (more wait in the
//!   backlog). Its threads run as the sandbox uid and so count toward
//!   [`SandboxSpec::nproc`] (at most 65). Setting `http_proxy` and friends
//!   is the caller's policy ([`SandboxSpec::set_env`]).
//! - **Extra read-only files** ([`SandboxSpec::ro_bind_file`]), e.g. the
//!   proxy's CA bundle at [`PROXY_CA_PATH`] (variables: [`CA_BUNDLE_ENV`]):
//!   only below [`FHSX_RUN_DIR`], which no view provides.
//! - **Limits** ([`SandboxSpec::limits`], [`Limits`]): `file_size` and
//!   `open_files` are `RLIMIT_FSIZE`/`RLIMIT_NOFILE` set by the supervisor on
//!   the command; the process count is [`SandboxSpec::nproc`]
//!   (`RLIMIT_NPROC`, and a cgroup's `pids.max`). A value above the caller's
//!   own hard limit is clamped to it.
//! - **Memory** ([`Limits::memory`]) is limited by a memory controller
//!   wherever one can be had, so that it bounds memory and not address
//!   space: the run's cgroup v2 `memory.max` (`memory.swap.max` 0; the
//!   controller is enabled in the parent's `cgroup.subtree_control` when
//!   the parent has it and may hand it down), else a per-run cgroup in the
//!   host's cgroup v1 `memory` hierarchy (`memory.limit_in_bytes`, and
//!   `memory.memsw.limit_in_bytes` the same where swap accounting exists),
//!   made, joined before bwrap execs and removed like the v1 pids cgroup.
//!   Past the limit the kernel's OOM killer ends a process of the run
//!   inside its cgroup (the host is not touched); the run counts those
//!   ([`RunReport::oom_kills`]) and says so in its output (`fhsx: the run
//!   reached its [limits] memory (…): the kernel's OOM killer ended …`).
//!   Only where no controller can be had (without root, unless a cgroup v2
//!   with the memory controller is delegated to the caller) is it
//!   `RLIMIT_AS`, which also refuses address space that is only reserved
//!   (`PROT_NONE`/`MAP_NORESERVE` mappings: ASan, Go, the JVM,
//!   `WebAssembly.Memory`); then [`RunReport::memory`] is
//!   [`MemoryEnforcement::AddressSpace`] and the run's output starts with
//!   a line saying so (`fhsx: [limits] memory (…) is enforced as an
//!   address-space limit (RLIMIT_AS) here: …`). The sandbox writes these
//!   lines itself, where the command's stderr goes, so a caller's log has
//!   them without its help.
//! - **Cancellation** ([`RunOptions::cancel`]): a flag the caller sets (a
//!   SIGINT handler, a worker whose client left); the run ends like a
//!   timeout (SIGTERM to proven processes, grace, SIGKILL) and
//!   [`Runtime::run`] returns [`SandboxError::Cancelled`]. With a flag,
//!   bwrap leads its own process group, so a terminal's Ctrl-C reaches only
//!   the caller.
//! - **Output** ([`RunOptions::output`], [`Output`]): inherited, captured
//!   (stdout and stderr apart), or both into one caller-provided descriptor
//!   in write order ([`Output::Fd`]), for teeing a log live.
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
//! modes, since a file made in the workspace is root's on the host, and
//! what namespaces leave open (`TIOCSTI`/`TIOCLINUX`, keyrings,
//! `perf_event_open`, `ptrace`, the new mount API, `personality`); a
//! process limit that binds host root too (cgroup v2 `pids.max`, else a
//! cgroup v1 pids cgroup: `RLIMIT_NPROC` exempts uid 0); a memory limit
//! that is the memory controller's (cgroup v2, else a cgroup v1 memory
//! cgroup), not an address-space limit. The
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
pub use runner::{MemoryEnforcement, Outcome, Output, RunOptions, RunReport, Runtime, Stdin};
pub use spec::*;
