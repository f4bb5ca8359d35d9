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
//! - [`users`]: build users, the host uids (and gids) builds run as when
//!   the caller is root, one per running build ([`BuildUsers`],
//!   [`BuildUser`], [`SandboxSpec::build_user`]);
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
//!   backlog), in the supervisor's own poll loop: no thread of its own
//!   counts toward [`SandboxSpec::nproc`]. Setting `http_proxy` and friends
//!   is the caller's policy ([`SandboxSpec::set_env`]).
//! - **Extra read-only files** ([`SandboxSpec::ro_bind_file`]), e.g. the
//!   proxy's CA bundle at [`PROXY_CA_PATH`] (variables: [`CA_BUNDLE_ENV`]):
//!   only below [`FHSX_RUN_DIR`], which no view provides. The command can
//!   read them, and they are not part of the view: bind only public data,
//!   and record them ([`SandboxSpec::readable_host_files`]).
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
//! # No byte from outside the view
//!
//! Every byte a command can read is part of its root (the view, whose
//! reads the FUSE daemon records; for [`SandboxSpec::host`], the host's
//! system directories by design) or its own work directory, or it is
//! unreadable, or it is one of these, each from the host and each named:
//!
//! - **the supervisor** (26 KB of this crate's build): installed
//!   execute-only (mode 0111) in the runtime directory and handed to bwrap
//!   as an `O_PATH` descriptor ([`SUPERVISOR_FD`]), which bwrap execs as
//!   PID 1 through [`SUPERVISOR_EXEC`]; PID 1 closes it before anything
//!   else runs, so no path inside leads to the file and no mount of it is
//!   made. Reading it fails anyway — it is the caller's file: with a build
//!   user the command is in the "others" class, and as host root without
//!   one the sandbox uid is its owner, with no capability to override the
//!   missing read bit. A process of an unreadable file is
//!   made non-dumpable by the kernel at `execve`, so PID 1's `/proc/1/exe`,
//!   `mem`, `maps`, `environ`, `fd/` and `map_files/` (and those of PID
//!   1's child before it execs the command) are closed, and
//!   `process_vm_readv` and `ptrace` are
//!   refused. The command's own `/proc/self/exe` is the command.
//! - **files bound by [`SandboxSpec::ro_bind_file`]**: readable; the
//!   caller vouches for them. fhsx's executor binds only the fetch proxy's
//!   CA certificate (`STORE/ca/ca.crt`: public, the one every build of that
//!   store trusts; its key never leaves the store), which a build must
//!   read to trust the proxy. [`SandboxSpec::readable_host_files`] lists
//!   them, for a record of what the build could read.
//! - **sockets**: the RPC bridge ([`RPC_SOCKET_PATH`]: its answers are
//!   `Pong`, the run id, which names the host process, and the elapsed
//!   time) and the fetch proxy's socket ([`PROXY_SOCKET_PATH`]: what the
//!   proxy serves is recorded by the proxy); `open` of a socket reads
//!   nothing.
//! - **synthetic files**: for [`SandboxSpec::host`] only, `/etc/passwd` and
//!   `/etc/group`, constants of this crate; `/dev/null` over
//!   `/proc/sysrq-trigger` and masked files.
//! - **the kernel's own files**: bwrap's `/dev` (null, zero, full, random,
//!   urandom, tty), the sandbox's `/proc` (its own processes; `/proc/sys`
//!   read-only) — kernel state, not host files; `/proc/self/mountinfo`
//!   names the host paths the binds come from (names, not contents), and
//!   `/proc/1/cmdline` is the supervisor's argv (derived from the spec:
//!   limits, writable paths, the command).
//!
//! # Process state
//!
//! Nothing of the caller's process state crosses. Signal dispositions (an
//! ignored signal stays ignored across `execve`: `cmd &` in a script
//! ignores SIGINT and SIGQUIT, `nohup` SIGHUP), the signal mask, the umask,
//! nice and the scheduling policy, CPU affinity, personality, every
//! resource limit and `oom_score_adj` survive `fork` and `execve`; so the
//! child that execs bwrap sets all of them to the values below first,
//! while it still has the caller's privileges, and the supervisor resets
//! the dispositions, the mask, the umask and `oom_score_adj` once more for
//! the command (after bwrap and its own start-up). The command starts
//! with:
//!
//! | state | value |
//! |---|---|
//! | signal dispositions, mask | every signal `SIG_DFL` (none ignored); mask empty |
//! | umask | `0022` |
//! | nice, scheduling | nice 0, `SCHED_OTHER`; I/O priority none (it follows nice) |
//! | CPU affinity | every CPU (the kernel keeps those online that the caller's cpuset allows) |
//! | NUMA policy, THP, timer slack | `MPOL_DEFAULT`, THP not disabled, 50 µs |
//! | personality | `PER_LINUX`: no `ADDR_NO_RANDOMIZE`, `READ_IMPLIES_EXEC`, … |
//! | `oom_score_adj` | 500 (see below) |
//! | `RLIMIT_STACK` | 8 MiB soft, unlimited hard |
//! | `RLIMIT_CORE` | 0 soft, unlimited hard (no core files unless the build asks) |
//! | `RLIMIT_NOFILE` | 1024 soft, 524288 hard (systemd's default; at most `fs.nr_open`) |
//! | `RLIMIT_NPROC`, `RLIMIT_SIGPENDING` | `kernel.threads-max / 2`, soft and hard (what the kernel gives init at boot) |
//! | `RLIMIT_MEMLOCK` | 8 MiB, soft and hard (the kernel's default since 5.16) |
//! | `RLIMIT_MSGQUEUE` | 819200 bytes, soft and hard (the kernel's default) |
//! | `RLIMIT_NICE`, `RLIMIT_RTPRIO` | 0, soft and hard |
//! | `RLIMIT_CPU`, `FSIZE`, `DATA`, `RSS`, `AS`, `LOCKS`, `RTTIME` | unlimited |
//!
//! [`Limits`] and [`SandboxSpec::nproc`] then set `RLIMIT_FSIZE`,
//! `RLIMIT_NOFILE`, `RLIMIT_NPROC` (and `RLIMIT_AS` where it is the memory
//! limit) on top, soft and hard.
//!
//! `oom_score_adj` 500 makes a build the kernel OOM killer's first choice,
//! before the executor (whose FUSE daemon serves the build's view) and the
//! host's services, and inside the run's memory cgroup before bwrap and the
//! supervisor. As host root without a build user (`fhsx run`) those two
//! get 0, which with CAP_SYS_RESOURCE is also the floor nothing inside may
//! go below, and the supervisor raises the command's to 500. Without root,
//! and as a build user, the supervisor cannot (its not-dumpable child's
//! `/proc` files are not the sandbox uid's), so the host side sets 500 for
//! the whole sandbox (as root, before it becomes the build user), and a
//! build may lower its own down to the caller's floor only.
//!
//! Some of it takes privilege to undo: a caller's raised nice value or
//! `SCHED_IDLE` needs CAP_SYS_NICE, a hard limit the caller lowered
//! (`ulimit -s 1024` lowers both) needs CAP_SYS_RESOURCE. Without them
//! (unprivileged, or root in a container that dropped them) those stay as
//! the caller had them (a hard limit below the table's value clamps it);
//! everything else is always reset. What the caller cannot lift itself
//! either — its seccomp filter, `no_new_privs`, its cpuset and cgroups, an
//! LSM profile — is the host's policy and stays.
//!
//! # Running as root
//!
//! bwrap maps the sandbox uid (1000) and gid (100) to the uid and gid it
//! runs as. A caller that is root gives a build a **build user**
//! ([`SandboxSpec::build_user`], taken from [`BuildUsers`]: Nix's
//! `auto-allocate-uids` model, one uid per build): the child that execs
//! bwrap joins the run's cgroups and pins the process state while it is
//! still root, then drops every supplementary group and sets its real,
//! effective and saved gid and uid to the build user's, last, right
//! before `execve`, so bwrap, the supervisor and the command run as that
//! unprivileged host uid, on user namespaces, exactly as for an
//! unprivileged caller. The build user is nobody else (no account in
//! `/etc/passwd` or `/etc/group` may hold an id of the range) and no two
//! running builds share one (a `flock` per uid in the host-global
//! [`users::BUILD_UID_LOCK_DIR`]), so what one build leaves is its own,
//! and one build's processes cannot signal or ptrace another's even
//! outside the namespaces: the kernel's uid checks refuse it. Its
//! `RLIMIT_NPROC` binds too (it exempts only uid 0).
//!
//! bwrap, as the build user, resolves every path it binds itself, so
//! every directory above them must let the build user pass (search): the
//! runner gives the run's own directory (the RPC socket's) to the build
//! user's group (0710, socket 0660), shares the proxy socket the same way
//! (its group, 0660), makes the runtime directory (the supervisor's)
//! `0711`, and refuses a run whose bind sources lie below a directory the
//! build user may not pass, naming it ([`SandboxError::BadPath`]). The
//! work directory (the scratch) is the caller's to hand to the build user;
//! the view it binds must be mounted so that other users may use it (FUSE
//! `allow_other`, which castore-fuse sets for root).
//!
//! Without a build user (`fhsx run`, whose workspace is the caller's own)
//! root's sandbox user maps to host uid 0, with every capability dropped
//! (`--cap-drop ALL`, uid != 0 inside, `--disable-userns`). Ownership alone
//! must then give nothing away, so the sandbox only ever shows what is
//! safe for an owner to see: read-only, `nosuid`/`nodev` binds of `/usr`
//! and a whitelist of `/etc` entries (no `shadow`, no `ssl/private`), a
//! synthetic `passwd`/`group`, no `/sys`; `/proc/sys` re-bound read-only
//! and `/proc/sysrq-trigger` covered (bwrap leaves both writable to host
//! uid 0); PID 1 non-dumpable (the command can neither ptrace it nor read
//! its fds) and its file execute-only (the owner class, which host uid 0
//! without CAP_DAC_OVERRIDE falls in, has no read bit); a fresh session
//! keyring; a seccomp filter ([`seccomp`]) that refuses setuid/setgid
//! modes, since a file made in the workspace is root's on the host, and
//! what namespaces leave open (`TIOCSTI`/`TIOCLINUX`, keyrings,
//! `perf_event_open`, `ptrace`, the new mount API, `personality`); a
//! process limit that binds host root too (cgroup v2 `pids.max`, else a
//! cgroup v1 pids cgroup: `RLIMIT_NPROC` exempts uid 0); a memory limit
//! that is the memory controller's (cgroup v2, else a cgroup v1 memory
//! cgroup), not an address-space limit; a pristine process state (see
//! "Process state": as root the host side also undoes a caller's nice
//! value and lowered hard limits, and floors `oom_score_adj` at 0). All of
//! it holds with a build user as well. The writable places are the work
//! directory, a private `/tmp` and a private `/dev/shm` (a tmpfs like
//! `/tmp`: POSIX shared memory needs it).
//!
//! It does not own: the FUSE view or read-set capture (`castore-fuse`), the
//! fetch proxy (`fetch-proxy`), what an action is or how outputs are
//! ingested (`fhs-executor`), nor the error vocabulary
//! ([`executor_core::SandboxError`], shared by the stack). It holds no
//! opinion on the command it runs.

mod layers;
mod pristine;
pub mod probe;
pub mod reaper;
pub mod rpc;
mod runner;
pub mod seccomp;
mod spec;
pub mod supervisor;
mod sys;
pub mod users;

pub use executor_core::SandboxError;
pub use probe::{BwrapFeatures, FileKind, HostFs, MemFs, RealFs};
pub use reaper::{ReaperMode, ReaperPreference, GRACE_PERIOD};
pub use rpc::{Request, Response, RpcHandler, MAX_FRAME};
pub use runner::{MemoryEnforcement, Outcome, Output, RunOptions, RunReport, Runtime, Stdin};
pub use spec::*;
pub use users::{BuildUser, BuildUsers};
