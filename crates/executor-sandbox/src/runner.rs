//! Running a [`SandboxSpec`]: start bwrap with the argv on an fd, the
//! supervisor as PID 1, the RPC bridge listening; enforce the timeout with
//! the reaper; report how the command ended.

use std::ffi::{CString, OsString};
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use executor_core::SandboxError;

use crate::pristine::Pristine;
use crate::probe::{find_bwrap, BwrapFeatures, RealFs};
use crate::reaper::{MemoryCgroup, Reaper, ReaperMode, ReaperPreference, GRACE_PERIOD};
use crate::rpc::{BasicHandler, RpcHandler, RpcLimits, RpcServer};
use crate::spec::{HostEnv, RootProvider, RunAs, RuntimePaths, SandboxSpec};
use crate::supervisor::{SUPERVISOR_BYTES, SUPERVISOR_TAG};
use crate::sys::{self, io_err, path_err};

/// The fd bwrap reads its NUL-separated argv from (`--args 4`).
const ARGS_FD: RawFd = 4;

/// Where the command's stdin comes from.
#[derive(Debug, Default)]
pub enum Stdin {
    /// The caller's own stdin.
    #[default]
    Inherit,
    /// `/dev/null`.
    Null,
    /// This descriptor.
    Fd(OwnedFd),
}

/// Where the command's stdout and stderr go.
#[derive(Debug, Default)]
pub enum Output {
    /// The caller's own stdout and stderr — or, if
    /// [`RunOptions::capture_output`] is set, captured into the report.
    #[default]
    Inherit,
    /// Captured into [`RunReport::stdout`] and [`RunReport::stderr`] (the
    /// same as `capture_output: true`; the two streams' relative order is
    /// lost).
    Capture,
    /// Both streams into this one descriptor (a pipe, a file, a terminal),
    /// in the order they were written: for teeing a log live. bwrap's and
    /// the supervisor's own messages go there too. The report's
    /// `stdout`/`stderr` stay empty. A pipe must be read while the run
    /// goes on, or the command blocks once it is full.
    Fd(OwnedFd),
    /// stdout into the first descriptor, stderr into the second, as
    /// [`Output::Fd`] does both: what REAPI clients read apart. bwrap's
    /// and the supervisor's own messages go with stderr.
    Split(OwnedFd, OwnedFd),
}

/// How to run one spec.
pub struct RunOptions {
    /// Wall-clock limit; `None` runs until the command ends.
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL at a timeout ([`GRACE_PERIOD`]).
    pub grace: Duration,
    pub stdin: Stdin,
    /// Collect stdout and stderr into the report instead of inheriting
    /// (ignored when [`output`](RunOptions::output) is [`Output::Fd`]).
    pub capture_output: bool,
    /// Where stdout and stderr go (see [`Output`]).
    pub output: Output,
    /// Set to `true` (from anywhere, e.g. a SIGINT handler or a worker
    /// noticing its client left) to stop the run: it ends like a timeout
    /// (SIGTERM to proven processes, [`grace`](RunOptions::grace), then
    /// SIGKILL) and [`Runtime::run`] returns
    /// [`SandboxError::Cancelled`]. Checked at least every 50 ms; already
    /// `true` at the start means nothing is started.
    ///
    /// With a flag, bwrap runs in a process group of its own, so a
    /// terminal's Ctrl-C reaches only the caller (which sets the flag, for
    /// a graceful stop) instead of killing bwrap, and with it the sandbox,
    /// at once. Should the caller die instead, bwrap follows it
    /// (`--die-with-parent`) and takes the sandbox along.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Set to `true` to stop the run for a limit the caller enforces (the
    /// size of its output, say): it ends like a timeout, and the report's
    /// outcome is [`Outcome::Stopped`] — a result, not an error, so the
    /// caller can say which limit it was. Checked like `cancel`.
    pub stop: Option<Arc<AtomicBool>>,
    pub reaper: ReaperPreference,
    /// Answers the sandbox's RPC requests (default: [`BasicHandler`]).
    pub handler: Option<Arc<dyn RpcHandler>>,
    pub rpc_limits: RpcLimits,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            timeout: None,
            grace: GRACE_PERIOD,
            stdin: Stdin::Inherit,
            capture_output: false,
            output: Output::Inherit,
            cancel: None,
            stop: None,
            reaper: ReaperPreference::Auto,
            handler: None,
            rpc_limits: RpcLimits::default(),
        }
    }
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It exited by itself with this code.
    Exited(i32),
    /// A signal ended it (from inside the sandbox: the host sends none
    /// before a timeout).
    Signaled(i32),
    /// It ran past the timeout. `killed`: it outlived the grace period
    /// after SIGTERM and was SIGKILLed.
    TimedOut { killed: bool },
    /// The caller stopped it ([`RunOptions::stop`]); `killed` as above.
    Stopped { killed: bool },
}

impl Outcome {
    /// The command's own exit code, or the [`SandboxError`] that says why
    /// there is none (`timeout` is what the run was given, for the message).
    pub fn into_result(self, timeout: Option<Duration>) -> Result<i32, SandboxError> {
        match self {
            Outcome::Exited(c) => Ok(c),
            Outcome::Signaled(s) => Err(SandboxError::KilledBySignal(s)),
            Outcome::TimedOut { .. } => Err(SandboxError::Timeout(timeout.unwrap_or_default())),
            Outcome::Stopped { killed } => Err(SandboxError::Cancelled { killed }),
        }
    }

    /// A shell-style exit code: the code, 128+signal, or 124 for a timeout.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Exited(c) => *c,
            Outcome::Signaled(s) => 128 + s,
            Outcome::TimedOut { .. } => 124,
            Outcome::Stopped { .. } => 125,
        }
    }
}

/// How a run's memory limit ([`Limits::memory`](crate::Limits)) was
/// enforced ([`RunReport::memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryEnforcement {
    /// The run had no memory limit.
    None,
    /// The run's own cgroup v2: `memory.max`, `memory.swap.max` 0.
    CgroupV2,
    /// A per-run cgroup in the host's cgroup v1 memory hierarchy:
    /// `memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` the same
    /// where swap accounting exists.
    CgroupV1,
    /// No memory controller could be had (without root, unless a cgroup v2
    /// with the memory controller is delegated to the caller): the
    /// command's `RLIMIT_AS`, which limits *address space*, so a program
    /// that only reserves more (a `PROT_NONE` mapping, a JIT's or a
    /// sanitizer's reservation, Go, the JVM, `WebAssembly.Memory`) fails
    /// too. The run writes a line saying so to its output.
    AddressSpace,
}

impl MemoryEnforcement {
    /// A memory controller (v2 or v1) enforces the limit.
    pub fn is_cgroup(self) -> bool {
        matches!(
            self,
            MemoryEnforcement::CgroupV2 | MemoryEnforcement::CgroupV1
        )
    }
}

/// `n` bytes for a log line: exact, with the binary unit when it is round.
fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n => format!("{n} bytes"),
    }
}

/// The line a run writes to its output when its memory limit is only an
/// address-space limit.
fn address_space_note(limit: u64) -> String {
    format!(
        "fhsx: [limits] memory ({}) is enforced as an address-space limit (RLIMIT_AS) here: no memory cgroup could be made for the run (that takes root, or a delegated cgroup v2 with the memory controller), so reserving more address space than that fails too\n",
        bytes(limit)
    )
}

/// The line a run writes to its output when the OOM killer ended some of
/// it.
fn oom_note(kills: u64, limit: Option<u64>) -> String {
    let what = if kills == 1 {
        "1 process".to_string()
    } else {
        format!("{kills} processes")
    };
    match limit {
        Some(l) => format!(
            "fhsx: the run reached its [limits] memory ({}): the kernel's OOM killer ended {what} of it\n",
            bytes(l)
        ),
        None => format!("fhsx: the kernel's OOM killer ended {what} of the run\n"),
    }
}

/// What a run did.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: Outcome,
    /// Processes still running when the command ended, killed by the
    /// supervisor (daemons, background jobs).
    pub lingering_killed: u32,
    /// Whether the reaper found anything left in the run's cgroup at the end.
    pub cgroup_leftovers: bool,
    /// Whether the run's PID namespace was seen to end: its PID 1 exited,
    /// which the kernel lets happen only once every other process in it is
    /// gone. Then no process of the run is left anywhere, and its build
    /// user may be released as idle ([`crate::users::BuildUser::run_ended`]).
    pub sandbox_emptied: bool,
    pub reaper: ReaperMode,
    /// The Landlock ABI the command ran under (0: the kernel has none, so
    /// the mount layout and namespaces alone held).
    pub landlock_abi: u32,
    /// How the memory limit was enforced. [`MemoryEnforcement::AddressSpace`]
    /// is also said in the run's output (a line starting `fhsx: [limits]
    /// memory`), so a log shows it without the caller's help.
    pub memory: MemoryEnforcement,
    /// Processes of the run the kernel's OOM killer ended inside the run's
    /// memory cgroup (its limit was reached; 0 without a memory cgroup).
    /// Also said in the run's output (`fhsx: the run reached its [limits]
    /// memory …`).
    pub oom_kills: u64,
    pub elapsed: Duration,
    /// Captured output (empty unless `capture_output` or
    /// [`Output::Capture`]).
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The host side of sandboxed runs: bwrap, its features, the supervisor
/// executable and a private RPC socket per run.
#[derive(Debug)]
pub struct Runtime {
    paths: RuntimePaths,
    bwrap: PathBuf,
    features: BwrapFeatures,
    /// The installed supervisor, held by an `O_PATH` descriptor: each run
    /// hands it to bwrap, which execs it as PID 1 through
    /// [`SUPERVISOR_EXEC`](crate::spec::SUPERVISOR_EXEC) — no bind mount
    /// of it, and a file swept or replaced meanwhile is still this one.
    supervisor: OwnedFd,
}

static RUN_SEQ: AtomicU64 = AtomicU64::new(0);

/// The installed supervisor's mode: execute-only, for everyone (the
/// sandbox uid is its owner inside).
pub(crate) const SUPERVISOR_MODE: u32 = 0o111;

const PASSWD: &str = "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nbuild:x:1000:100:fhsx build user:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nusers:x:100:\nnogroup:x:65534:\n";

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// A directory only we can write: created with `mode`, or checked to be
/// ours and given `mode`.
fn private_dir(path: &Path, mode: u32) -> Result<(), SandboxError> {
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(path_err("creating", path, e)),
    }
    let md = fs::symlink_metadata(path).map_err(|e| path_err("inspecting", path, e))?;
    if !md.is_dir() || md.uid() != uid() || md.mode() & 0o022 != 0 {
        return Err(SandboxError::BadPath {
            path: path.to_path_buf(),
            role: "the sandbox runtime directory",
            reason:
                "it exists but is not a directory owned by you and writable only by you; remove it"
                    .into(),
        });
    }
    if md.mode() & 0o777 != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| path_err("setting the mode of", path, e))?;
    }
    Ok(())
}

/// The first directory at or above `dir` (canonical) that `who` may not
/// search, with its mode and owner.
fn unsearchable(dir: &Path, who: RunAs) -> Option<(PathBuf, u32, u32)> {
    let mut dirs: Vec<&Path> = dir.ancestors().collect();
    dirs.reverse();
    for d in dirs {
        let Ok(md) = fs::metadata(d) else {
            // Missing: bwrap will say so, naming it.
            return None;
        };
        let bit = if md.uid() == who.uid {
            0o100
        } else if md.gid() == who.gid {
            0o010
        } else {
            0o001
        };
        if md.mode() & bit == 0 {
            return Some((d.to_path_buf(), md.mode() & 0o7777, md.uid()));
        }
    }
    None
}

/// Hand a socket we bind into the sandbox to the build user's group: it
/// may connect (write), nothing more; the owner stays ours.
fn share_socket(path: &Path, who: RunAs) -> Result<(), SandboxError> {
    use std::os::unix::fs::FileTypeExt;
    let md = fs::symlink_metadata(path).map_err(|e| path_err("inspecting", path, e))?;
    if !md.file_type().is_socket() {
        return Err(SandboxError::BadPath {
            path: path.to_path_buf(),
            role: "a socket bound into the sandbox",
            reason: "it is not a UNIX socket".into(),
        });
    }
    std::os::unix::fs::lchown(path, None, Some(who.gid))
        .map_err(|e| path_err("handing to the build user's group", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660))
        .map_err(|e| path_err("setting the mode of", path, e))
}

/// Write `data` at `path` with `mode` unless an identical-size file is
/// there; atomically (temp file + rename), so no reader sees a partial file.
/// Returns whether it had to write the file.
fn install_file(path: &Path, data: &[u8], mode: u32) -> Result<bool, SandboxError> {
    if let Ok(md) = fs::metadata(path) {
        if md.len() == data.len() as u64 && md.permissions().mode() & 0o777 == mode {
            return Ok(false);
        }
    }
    let tmp = path.with_extension(format!(
        "tmp{}-{}",
        std::process::id(),
        RUN_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| path_err("creating", &tmp, e))?;
    f.write_all(data)
        .map_err(|e| path_err("writing", &tmp, e))?;
    // Exactly `mode`, whatever the caller's umask took away.
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| path_err("setting the mode of", &tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| path_err("installing", path, e))?;
    Ok(true)
}

/// After installing a new supervisor: remove other versions not touched
/// for a day (an older fhsx still running may be using a recent one).
fn sweep_old_supervisors(base: &Path, current: &Path) {
    let Ok(rd) = fs::read_dir(base) else {
        return;
    };
    let day = Duration::from_secs(24 * 3600);
    for e in rd.flatten() {
        let p = e.path();
        let is_sup = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("supervisor-"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > day);
        if is_sup && p != current && old {
            let _ = fs::remove_file(p);
        }
    }
}

impl Runtime {
    /// Find bwrap (error if missing), probe its features, install the
    /// supervisor in the per-user cache and name the run's private RPC socket.
    pub fn new() -> Result<Runtime, SandboxError> {
        let bwrap = find_bwrap()?;
        let features = BwrapFeatures::probe(&bwrap)?;
        let base = std::env::temp_dir().join(format!("fhsx-{}", uid()));
        // As root, build users must pass through it (to the execute-only
        // supervisor and their run's RPC socket), without listing it.
        private_dir(&base, if uid() == 0 { 0o711 } else { 0o700 })?;
        let supervisor = base.join(format!("supervisor-{SUPERVISOR_TAG}"));
        // Execute-only: the build may run it but read no byte of it (nor,
        // since the kernel makes a process of an unreadable file
        // non-dumpable, of PID 1's memory or /proc/1/exe).
        if install_file(&supervisor, SUPERVISOR_BYTES, SUPERVISOR_MODE)? {
            sweep_old_supervisors(&base, &supervisor);
        }
        // O_PATH needs no read permission: the file stays execute-only.
        let supervisor_fd: OwnedFd = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(&supervisor)
            .map_err(|e| path_err("opening", &supervisor, e))?
            .into();
        let passwd = base.join("passwd");
        install_file(&passwd, PASSWD.as_bytes(), 0o444)?;
        let group = base.join("group");
        install_file(&group, GROUP.as_bytes(), 0o444)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        sweep_stale_runs(&base);
        // The socket straight in the runtime directory, not in a directory
        // of its own: it is private by its own mode (see
        // `listen_unix_owner_only`), and a directory made and removed per
        // run costs a block allocated and freed — 0.14–0.5 ms where the
        // host discards freed blocks synchronously.
        let rpc_socket = base.join(format!(
            "run-{}-{}-{nanos:x}.sock",
            std::process::id(),
            RUN_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        Ok(Runtime {
            paths: RuntimePaths {
                supervisor,
                rpc_socket,
                passwd,
                group,
            },
            bwrap,
            features,
            supervisor: supervisor_fd,
        })
    }

    /// A host-root spec (`fhsx run`) for this runtime: its paths and
    /// bwrap's probed features filled in.
    pub fn host_spec(&self, workspace: &Path) -> Result<SandboxSpec, SandboxError> {
        let mut s = SandboxSpec::host(workspace, self.paths.clone(), Arc::new(RealFs))?;
        s.features(self.features);
        Ok(s)
    }

    /// A view-root spec (the executor) for this runtime: `tree` is the
    /// mounted view, `scratch` appears read-write at `/build`.
    pub fn view_spec(&self, tree: &Path, scratch: &Path) -> Result<SandboxSpec, SandboxError> {
        let mut s = SandboxSpec::view(tree, scratch, self.paths.clone(), Arc::new(RealFs))?;
        s.features(self.features);
        Ok(s)
    }

    /// The host paths a spec for this runtime must carry.
    pub fn paths(&self) -> &RuntimePaths {
        &self.paths
    }

    /// The optional bwrap flags this host's bwrap has.
    pub fn features(&self) -> BwrapFeatures {
        self.features
    }

    /// The bwrap executable in use.
    pub fn bwrap(&self) -> &Path {
        &self.bwrap
    }

    /// Before a run as a build user: root only; the proxy socket
    /// connectable by it (the RPC socket is shared once bound); every
    /// directory above what the sandbox
    /// binds searchable by it (bwrap, running as it, resolves each path),
    /// or an error naming the first that is not.
    fn prepare_build_user(&self, spec: &SandboxSpec, who: RunAs) -> Result<(), SandboxError> {
        if uid() != 0 {
            return Err(SandboxError::NoBuildUser {
                reason: "only root can run a sandbox as a build user".into(),
            });
        }
        if let Some(p) = &spec.proxy {
            share_socket(&p.socket, who)?;
        }
        // Not the supervisor: bwrap execs it through its descriptor, which
        // walks no directory.
        let mut sources: Vec<PathBuf> = vec![self.paths.rpc_socket.clone()];
        match &spec.root {
            RootProvider::View { tree, scratch, .. } => {
                sources.push(tree.join("x"));
                sources.push(scratch.clone());
            }
            RootProvider::Host { workspace, .. } => sources.push(workspace.clone()),
        }
        sources.extend(spec.proxy.iter().map(|p| p.socket.clone()));
        sources.extend(spec.files.iter().map(|(src, _)| src.clone()));
        for src in sources {
            let Some(dir) = src.parent() else { continue };
            let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            if let Some((d, mode, owner)) = unsearchable(&dir, who) {
                return Err(SandboxError::BadPath {
                    path: d,
                    role: "a directory above what the sandbox binds",
                    reason: format!(
                        "build user {} may not pass through it (mode {mode:04o}, owner uid {owner}): as root each build runs as a build user of its own, which must be able to search every directory above its working area, so put $TMPDIR where every user may pass (o+x), e.g. /tmp, or `chmod o+x` it",
                        who.uid
                    ),
                });
            }
        }
        Ok(())
    }

    /// Run `command` in the sandbox `spec` describes. One run at a time
    /// per `Runtime` (its RPC socket path is per runtime).
    pub fn run(
        &self,
        spec: &SandboxSpec,
        host_env: &HostEnv,
        command: &[OsString],
        opts: RunOptions,
    ) -> Result<RunReport, SandboxError> {
        self.run_when(spec, host_env, command, opts, || true)
    }

    /// [`run`](Self::run), with everything the run needs of its own made
    /// first (its cgroups, the argv and filter, the RPC socket) and bwrap
    /// started only once `ready` says what it binds is ready — so a caller
    /// can mount that meanwhile. `ready` returning false abandons the run
    /// before anything is started ([`SandboxError::NotReady`]); the caller
    /// knows why.
    pub fn run_when(
        &self,
        spec: &SandboxSpec,
        host_env: &HostEnv,
        command: &[OsString],
        opts: RunOptions,
        ready: impl FnOnce() -> bool,
    ) -> Result<RunReport, SandboxError> {
        if command.is_empty() {
            return Err(SandboxError::Protocol("no command given to run".into()));
        }
        if spec.runtime() != &self.paths {
            return Err(SandboxError::Protocol(
                "the spec was built for another Runtime's paths; build it with this Runtime's paths()".into(),
            ));
        }
        let cancelled =
            |c: &Option<Arc<AtomicBool>>| c.as_ref().is_some_and(|c| c.load(Ordering::SeqCst));
        if cancelled(&opts.cancel) {
            return Err(SandboxError::Cancelled { killed: false });
        }
        let started = Instant::now();
        let mut reaper = Reaper::new(opts.reaper);
        // Memory: a memory cgroup (v2 memory.max, else a v1 memory
        // cgroup), else RLIMIT_AS set by the supervisor — which also
        // refuses address space that is only reserved, and says so.
        let memory = match spec.limits.memory {
            None => MemoryEnforcement::None,
            Some(m) => match reaper.set_memory_max(m) {
                Some(MemoryCgroup::V2) => MemoryEnforcement::CgroupV2,
                Some(MemoryCgroup::V1) => MemoryEnforcement::CgroupV1,
                None => MemoryEnforcement::AddressSpace,
            },
        };
        let memory_in_cgroup = memory.is_cgroup();
        // Processes: RLIMIT_NPROC (set by the supervisor) does not bind
        // host root (the kernel exempts it); a cgroup's pids.max does, so
        // it is set as well where the run has one with that controller.
        // The cgroup also holds bwrap and the supervisor (whose proxy
        // forwarder is no thread: it runs in the supervisor's poll loop):
        // room is left for those.
        if let Some(n) = spec.nproc {
            reaper.set_pids_max(n.saturating_add(RUNTIME_TASKS));
        }
        let (argv, split) = spec.argv_parts_with(host_env, command, memory_in_cgroup);
        // bwrap reads NUL-separated options: a NUL inside one (a path built
        // in Rust can hold one) would smuggle in options of its own.
        if let Some(bad) = argv[..split].iter().find(|a| a.as_bytes().contains(&0)) {
            return Err(SandboxError::Protocol(format!(
                "sandbox option {bad:?} contains a NUL byte; remove it"
            )));
        }
        let mut data = Vec::new();
        for a in &argv[..split] {
            data.extend_from_slice(a.as_bytes());
            data.push(0);
        }
        let args_fd = sys::memfd_with("fhsx-bwrap-args", &data)?;
        let seccomp_fd = if spec.seccomp {
            let bytes = crate::seccomp::filter_bytes().ok_or_else(|| {
                SandboxError::Protocol(
                    "no seccomp filter for this architecture; turn it off with SandboxSpec::seccomp(false)".into(),
                )
            })?;
            Some(sys::memfd_with("fhsx-seccomp", &bytes)?)
        } else {
            None
        };
        if let Some(who) = spec.run_as {
            self.prepare_build_user(spec, who)?;
        }
        let (ctl_host, ctl_child) = sys::socketpair()?;

        let stdin_fd: Option<OwnedFd> = match opts.stdin {
            Stdin::Inherit => None,
            Stdin::Null => Some(
                fs::File::open("/dev/null")
                    .map_err(|e| path_err("opening", Path::new("/dev/null"), e))?
                    .into(),
            ),
            Stdin::Fd(fd) => Some(fd),
        };
        // `given`: the caller's descriptors for stdout and stderr.
        let (capture, given) = match opts.output {
            Output::Fd(fd) => {
                let err = fd
                    .try_clone()
                    .map_err(|e| io_err("duplicating the output descriptor", e))?;
                (false, Some((fd, err)))
            }
            Output::Split(out, err) => (false, Some((out, err))),
            Output::Capture => (true, None),
            Output::Inherit => (opts.capture_output, None),
        };
        let (out_pipe, err_pipe) = if capture {
            (Some(sys::pipe()?), Some(sys::pipe()?))
        } else {
            (None, None)
        };
        // The sandbox's own notes go where the command's stderr goes (our
        // own stderr when inherited).
        let mut note_out: Option<fs::File> = match (&err_pipe, &given) {
            (Some((_, w)), _) => w.try_clone().ok().map(fs::File::from),
            (None, Some((_, fd))) => fd.try_clone().ok().map(fs::File::from),
            (None, None) => None,
        };
        if let (MemoryEnforcement::AddressSpace, Some(m)) = (memory, spec.limits.memory) {
            note(&mut note_out, &address_space_note(m));
        }
        // The bridge's log lines go with the sandbox's notes: into the run's
        // output, counted as the build's (see `rpc`).
        let handler = opts.handler.clone().unwrap_or_else(|| {
            let out = note_out.as_ref().and_then(|f| f.try_clone().ok());
            Arc::new(BasicHandler::new(format!("run-{}", std::process::id())).with_output(out))
        });
        let server = RpcServer::bind_polled(&self.paths.rpc_socket, handler, opts.rpc_limits)?;
        if let Some(who) = spec.run_as {
            share_socket(&self.paths.rpc_socket, who)?;
        }

        // Everything the child needs, prepared before fork (the child may
        // only make async-signal-safe calls).
        let ctl_hi = sys::dup_at_least(ctl_child.as_raw_fd(), 10)?;
        let supervisor_hi = sys::dup_at_least(self.supervisor.as_raw_fd(), 10)?;
        let args_hi = sys::dup_at_least(args_fd.as_raw_fd(), 10)?;
        let seccomp_hi = seccomp_fd
            .as_ref()
            .map(|f| sys::dup_at_least(f.as_raw_fd(), 10))
            .transpose()?;
        // The jobserver, opened here: its read end on the spares, its write
        // end on the returns, both blocking, as make expects.
        let jobserver_hi = match spec.jobserver_fifos() {
            Some((spares, returns)) => {
                let read = open_jobserver_end(spares, libc::O_RDONLY)?;
                let write = open_jobserver_end(returns, libc::O_WRONLY)?;
                Some((
                    sys::dup_at_least(read.as_raw_fd(), 10)?,
                    sys::dup_at_least(write.as_raw_fd(), 10)?,
                ))
            }
            None => None,
        };
        let in_hi = stdin_fd
            .as_ref()
            .map(|f| sys::dup_at_least(f.as_raw_fd(), 10))
            .transpose()?;
        let out_hi = match (&out_pipe, &given) {
            (Some(p), _) => Some(sys::dup_at_least(p.1.as_raw_fd(), 10)?),
            (None, Some((fd, _))) => Some(sys::dup_at_least(fd.as_raw_fd(), 10)?),
            (None, None) => None,
        };
        let err_hi = match (&err_pipe, &given) {
            (Some(p), _) => Some(sys::dup_at_least(p.1.as_raw_fd(), 10)?),
            (None, Some((_, fd))) => Some(sys::dup_at_least(fd.as_raw_fd(), 10)?),
            (None, None) => None,
        };
        let bad = |_| {
            io_err(
                "preparing bwrap's path",
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            )
        };
        let bwrap_c = CString::new(self.bwrap.as_os_str().as_bytes()).map_err(bad)?;
        let mut c_argv = vec![
            CString::new("bwrap").map_err(bad)?,
            CString::new("--args").map_err(bad)?,
            CString::new(ARGS_FD.to_string()).map_err(bad)?,
        ];
        for a in &argv[split..] {
            c_argv.push(CString::new(a.as_bytes()).map_err(|_| {
                SandboxError::Protocol(format!("command argument {a:?} contains a NUL byte"))
            })?);
        }
        let argv_ptrs: Vec<*const libc::c_char> = c_argv
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        // As root without a build user, bwrap and the supervisor keep host
        // root's privileged defaults (see pristine.rs).
        let (umask, cpus, aslr) = spec.process_persona();
        let pristine = Pristine::new(uid() == 0 && spec.run_as.is_none(), umask, cpus, aslr);
        let child_fds = ChildFds {
            join_cgroup: reaper.join_fd(),
            join_v1: reaper.join_v1_fds(),
            stdin: in_hi.as_ref().map(|f| f.as_raw_fd()),
            stdout: out_hi.as_ref().map(|f| f.as_raw_fd()),
            stderr: err_hi.as_ref().map(|f| f.as_raw_fd()),
            control: ctl_hi.as_raw_fd(),
            args: args_hi.as_raw_fd(),
            supervisor: supervisor_hi.as_raw_fd(),
            seccomp: seccomp_hi.as_ref().map(|f| f.as_raw_fd()),
            jobserver: jobserver_hi
                .as_ref()
                .map(|(r, w)| (r.as_raw_fd(), w.as_raw_fd())),
            new_pgrp: opts.cancel.is_some(),
            run_as: spec.run_as,
        };

        if !ready() {
            return Err(SandboxError::NotReady);
        }
        // Start the child straight inside the run's cgroup (migrating a
        // running process costs tens of milliseconds, spawning into the
        // cgroup does not) with a pidfd from the start. First choice: a
        // vfork-style clone3 (no page tables copied); then a fork-like
        // clone3; then fork + joining by `cgroup.procs` + pidfd_open.
        let mut child_fds = child_fds;
        let cgroup_fd = reaper.cgroup_dir_fd();
        let mut stack = vec![0u128; 4096];
        let mut job = ChildJob {
            fds: &ChildFds {
                join_cgroup: None,
                ..child_fds
            },
            pristine: &pristine,
            bwrap: &bwrap_c,
            argv: &argv_ptrs,
            envp: &envp,
        };
        // SAFETY: child_entry only makes raw calls and never returns; job
        // and stack outlive the call (the parent waits for the exec).
        let vforked = unsafe {
            sys::clone3_vfork(
                cgroup_fd,
                &mut stack,
                child_entry,
                &mut job as *mut ChildJob as *mut libc::c_void,
            )
        };
        let (pid, early_pidfd) = match vforked {
            Ok((pid, pidfd)) => (pid, Some(pidfd)),
            Err(_) => match sys::clone3_into(cgroup_fd) {
                Ok(sys::Cloned::Child) => {
                    child_fds.join_cgroup = None;
                    // SAFETY: we are the freshly cloned child.
                    unsafe { exec_child(&child_fds, &pristine, &bwrap_c, &argv_ptrs, &envp) };
                }
                Ok(sys::Cloned::Parent { pid, pidfd }) => (pid, Some(pidfd)),
                Err(_) => {
                    // SAFETY: fork in a possibly multi-threaded process; the
                    // child only calls async-signal-safe functions.
                    let pid = unsafe { libc::fork() };
                    if pid < 0 {
                        return Err(io_err(
                            "forking to start bwrap",
                            std::io::Error::last_os_error(),
                        ));
                    }
                    if pid == 0 {
                        // SAFETY: we are the freshly forked child.
                        unsafe { exec_child(&child_fds, &pristine, &bwrap_c, &argv_ptrs, &envp) };
                    }
                    (pid, None)
                }
            },
        };
        drop(stack);
        drop((
            ctl_child,
            ctl_hi,
            args_hi,
            args_fd,
            in_hi,
            out_hi,
            err_hi,
            stdin_fd,
            supervisor_hi,
        ));
        drop(given);
        drop((seccomp_fd, seccomp_hi));
        let pidfd = match early_pidfd.map(Ok).unwrap_or_else(|| sys::pidfd_open(pid)) {
            Ok(fd) => fd,
            Err(e) => {
                // Without a pidfd we cannot prove anything: end it, reap it.
                // SAFETY: pid is our own unreaped child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
                return Err(io_err("opening a pidfd for bwrap (Linux >= 5.3 needed)", e));
            }
        };
        let pidfd_raw = pidfd.as_raw_fd();
        reaper.record(pid, pidfd);

        let readers = [out_pipe, err_pipe].map(|p| {
            p.map(|(r, w)| {
                drop(w);
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let _ = fs::File::from(r).read_to_end(&mut buf);
                    buf
                })
            })
        });

        let mut ctl = fs::File::from(ctl_host);
        let _ = sys::set_nonblocking(ctl.as_raw_fd(), true);
        let mut ctl_buf = Vec::new();
        let mut ctl_open = true;
        let mut phase = Phase::Running;
        let mut cause = Stop::Timeout;
        let mut deadline = opts.timeout.map(|t| started + t);
        let mut wait_failure = None;
        // The supervisor (bwrap's child, PID 1 inside), held by a pidfd:
        // its end means the whole PID namespace is gone.
        let mut supervisor: Option<OwnedFd> = None;
        loop {
            let mut wait_ms = match deadline {
                None => -1,
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .as_millis()
                    .min(i32::MAX as u128) as i32,
            };
            if phase == Phase::Running && (opts.cancel.is_some() || opts.stop.is_some()) {
                wait_ms = if wait_ms < 0 {
                    CANCEL_POLL_MS
                } else {
                    wait_ms.min(CANCEL_POLL_MS)
                };
            }
            let fds = [
                pidfd_raw,
                if ctl_open { ctl.as_raw_fd() } else { -1 },
                server.listener_fd(),
            ];
            let ready = match sys::poll_in(&fds, wait_ms) {
                Ok(r) => r,
                Err(e) => {
                    // Cannot watch it any more: end it rather than leave it.
                    reaper.kill_all();
                    wait_failure = Some(e);
                    break;
                }
            };
            if ready[2] {
                server.accept_ready();
            }
            if ready[1] {
                ctl_open = drain(&mut ctl, &mut ctl_buf);
                if supervisor.is_none() && ctl_buf.starts_with(b"START\n") {
                    supervisor = sys::child_pidfd(pid);
                }
            }
            if ready[0] {
                break;
            }
            if phase == Phase::Running && cancelled(&opts.cancel) {
                // Ends like a timeout, now.
                cause = Stop::Cancel;
                deadline = Some(Instant::now());
            } else if phase == Phase::Running && cancelled(&opts.stop) {
                cause = Stop::Limit;
                deadline = Some(Instant::now());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                match phase {
                    Phase::Running => {
                        phase = Phase::Terminating;
                        let _ = ctl.write_all(b"TERM\n");
                        reaper.terminate();
                        deadline = Some(Instant::now() + opts.grace);
                    }
                    Phase::Terminating | Phase::Killed => {
                        phase = Phase::Killed;
                        reaper.kill_all();
                        deadline = None;
                    }
                }
            }
        }
        let mut status: libc::c_int = 0;
        loop {
            // SAFETY: pid is our own child; status is a valid out-pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
        // PID 1 of a namespace finishes exiting only once every other
        // process in it is gone: wait for that, so nothing of the run is
        // left when we return (cgroup mode also checks its cgroup).
        let sandbox_emptied = supervisor.as_ref().is_some_and(|sup| {
            sys::poll_in(&[sup.as_raw_fd()], 10_000).is_ok_and(|ready| ready[0])
        });
        // bwrap is gone, so is everything inside: read what is left.
        let _ = sys::set_nonblocking(ctl.as_raw_fd(), false);
        let until = Instant::now() + Duration::from_secs(2);
        while ctl_open && Instant::now() < until {
            match sys::poll_in(&[ctl.as_raw_fd()], 100) {
                Ok(r) if r[0] => ctl_open = drain(&mut ctl, &mut ctl_buf),
                _ => {}
            }
        }
        drop(server);
        let reaper_mode = reaper.mode();
        let oom_kills = reaper.oom_kills();
        if oom_kills > 0 {
            note(&mut note_out, &oom_note(oom_kills, spec.limits.memory));
        }
        drop(note_out);
        let cgroup_leftovers = reaper.finish();
        let [out_t, err_t] = readers;
        let stdout = out_t.and_then(|t| t.join().ok()).unwrap_or_default();
        let stderr = err_t.and_then(|t| t.join().ok()).unwrap_or_default();

        if let Some(e) = wait_failure {
            return Err(io_err("waiting for bwrap (the sandbox was killed)", e));
        }
        let report = parse_control(&ctl_buf);
        if cause == Stop::Cancel && phase != Phase::Running {
            return Err(SandboxError::Cancelled {
                killed: phase == Phase::Killed,
            });
        }
        let outcome = match (phase, report.end) {
            (Phase::Terminating | Phase::Killed, _) if cause == Stop::Limit => Outcome::Stopped {
                killed: phase == Phase::Killed,
            },
            (Phase::Terminating, _) => Outcome::TimedOut { killed: false },
            (Phase::Killed, _) => Outcome::TimedOut { killed: true },
            (Phase::Running, Some(End::Exit(c))) => Outcome::Exited(c),
            (Phase::Running, Some(End::Signal(s))) => Outcome::Signaled(s),
            (Phase::Running, Some(End::NoExec)) => Outcome::Exited(127),
            (Phase::Running, None) => {
                return Err(if libc::WIFEXITED(status) {
                    SandboxError::BwrapFailed {
                        status: libc::WEXITSTATUS(status),
                        message: if capture {
                            String::from_utf8_lossy(&stderr).trim().to_string()
                        } else {
                            "see its message above".to_string()
                        },
                    }
                } else {
                    SandboxError::SupervisorLost {
                        detail: format!("bwrap ended by signal {}", libc::WTERMSIG(status)),
                    }
                });
            }
        };
        Ok(RunReport {
            outcome,
            lingering_killed: report.lingering,
            landlock_abi: report.landlock,
            memory,
            oom_kills,
            cgroup_leftovers,
            sandbox_emptied,
            reaper: reaper_mode,
            elapsed: started.elapsed(),
            stdout,
            stderr,
        })
    }
}

/// Remove run sockets (and the run directories of older versions) left by
/// processes that no longer exist (killed before their `Runtime` was
/// dropped). A live process's runs are left alone: its PID is the second
/// field of the name.
fn sweep_stale_runs(base: &Path) {
    let Ok(rd) = fs::read_dir(base) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("run-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            match e.file_type() {
                Ok(t) if t.is_dir() => drop(fs::remove_dir_all(e.path())),
                _ => drop(fs::remove_file(e.path())),
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // A run removes it when it ends; this covers a Runtime never run
        // and a run that failed half-way.
        let _ = fs::remove_file(&self.paths.rpc_socket);
    }
}

/// Tasks of a run besides the command's: bwrap and the supervisor, with
/// slack.
const RUNTIME_TASKS: u64 = 8;

/// How often a run with a cancel flag looks at it.
const CANCEL_POLL_MS: i32 = 50;

/// Why a run is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Timeout,
    Cancel,
    Limit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Terminating,
    Killed,
}

enum End {
    Exit(i32),
    Signal(i32),
    NoExec,
}

struct ControlReport {
    end: Option<End>,
    lingering: u32,
    landlock: u32,
}

fn parse_control(buf: &[u8]) -> ControlReport {
    let mut r = ControlReport {
        end: None,
        lingering: 0,
        landlock: 0,
    };
    for line in String::from_utf8_lossy(buf).lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<i64>().ok())) else {
            continue;
        };
        match k {
            "EXIT" => r.end = Some(End::Exit(v as i32)),
            "SIGNAL" => r.end = Some(End::Signal(v as i32)),
            "NOEXEC" => r.end = Some(End::NoExec),
            "LINGER" => r.lingering = v as u32,
            "LANDLOCK" => r.landlock = v as u32,
            _ => {}
        }
    }
    r
}

/// One line of the sandbox's own into the run's output.
fn note(out: &mut Option<fs::File>, line: &str) {
    let _ = match out {
        Some(f) => f.write_all(line.as_bytes()),
        None => std::io::stderr().write_all(line.as_bytes()),
    };
}

/// Read what is available; false once the peer has closed.
fn drain(f: &mut fs::File, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 512];
    loop {
        match f.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > 64 * 1024 {
                    return false;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// What a vfork-style child needs, behind one pointer.
struct ChildJob<'a> {
    fds: &'a ChildFds,
    pristine: &'a Pristine,
    bwrap: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
}

/// The vfork-style child: exec bwrap (see `sys::clone3_vfork`).
extern "C" fn child_entry(arg: *mut libc::c_void) -> ! {
    // SAFETY: arg is the ChildJob the parent passed; the parent is
    // suspended (CLONE_VFORK) so it stays valid until we exec.
    unsafe {
        let job = &*(arg as *const ChildJob);
        exec_child(job.fds, job.pristine, job.bwrap, job.argv, job.envp)
    }
}

#[derive(Clone, Copy)]
struct ChildFds {
    join_cgroup: Option<RawFd>,
    /// Cgroup v1 `tasks` files (pids, memory) to join as well (see the
    /// reaper).
    join_v1: [Option<RawFd>; 2],
    stdin: Option<RawFd>,
    stdout: Option<RawFd>,
    stderr: Option<RawFd>,
    control: RawFd,
    args: RawFd,
    /// The supervisor's executable (`O_PATH`), for bwrap to exec.
    supervisor: RawFd,
    seccomp: Option<RawFd>,
    /// The jobserver's read and write ends, for [`crate::spec::JOBSERVER_FDS`].
    jobserver: Option<(RawFd, RawFd)>,
    /// Start bwrap in a process group of its own (see `RunOptions::cancel`).
    new_pgrp: bool,
    /// Become this build user last, right before exec.
    run_as: Option<RunAs>,
}

/// In the forked child: join the cgroup, arrange fds 0-8, close every
/// other inherited descriptor, impose the pristine process state (see
/// `pristine`), exec bwrap. Never returns.
///
/// # Safety
/// Must only be called in a freshly forked child; uses only
/// async-signal-safe calls.
unsafe fn exec_child(
    fds: &ChildFds,
    pristine: &Pristine,
    bwrap: &CString,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> ! {
    unsafe {
        let [pids_v1, memory_v1] = fds.join_v1;
        for j in [fds.join_cgroup, pids_v1, memory_v1].into_iter().flatten() {
            if libc::write(j, b"0".as_ptr().cast(), 1) != 1 {
                libc::_exit(126);
            }
        }
        if fds.new_pgrp && libc::setpgid(0, 0) != 0 {
            libc::_exit(126);
        }
        let moves = [
            (fds.stdin, 0),
            (fds.stdout, 1),
            (fds.stderr, 2),
            (Some(fds.control), crate::spec::CONTROL_FD),
            (Some(fds.args), ARGS_FD),
            (fds.seccomp, crate::spec::SECCOMP_FD),
            (Some(fds.supervisor), crate::spec::SUPERVISOR_FD),
            (fds.jobserver.map(|j| j.0), crate::spec::JOBSERVER_FDS.0),
            (fds.jobserver.map(|j| j.1), crate::spec::JOBSERVER_FDS.1),
        ];
        for (from, to) in moves {
            if let Some(f) = from {
                if libc::dup2(f, to) < 0 {
                    libc::_exit(126);
                }
            }
        }
        // Nothing else crosses: bwrap hands every open fd to the sandbox.
        let first = (crate::spec::JOBSERVER_FDS.1 + 1) as libc::c_uint;
        if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) != 0 {
            for fd in first as RawFd..65536 {
                libc::close(fd);
            }
        }
        // Nothing of the caller's process state crosses either: signal
        // dispositions and mask, umask, nice, affinity, limits, ...
        pristine.apply();
        // The build user, last (joining cgroups, lowering nice and raising
        // limits took root): no supplementary groups, then gid, then uid,
        // each real, effective and saved. Raw calls: glibc's wrappers
        // would signal every thread of the (vfork-shared) process.
        if let Some(who) = fds.run_as {
            if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, who.gid, who.gid, who.gid) != 0
                || libc::syscall(libc::SYS_setresuid, who.uid, who.uid, who.uid) != 0
            {
                let msg = b"fhsx: the sandbox could not become its build user (setgroups/setresgid/setresuid failed)\n";
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(126);
            }
        }
        libc::execve(bwrap.as_ptr(), argv.as_ptr(), envp.as_ptr());
        libc::_exit(127);
    }
}

/// One end of a jobserver FIFO, blocking (opened without waiting: the pool
/// holds the FIFO open for reading and writing).
fn open_jobserver_end(fifo: &Path, mode: libc::c_int) -> Result<fs::File, SandboxError> {
    let f = fs::OpenOptions::new()
        .read(mode == libc::O_RDONLY)
        .write(mode == libc::O_WRONLY)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(fifo)
        .map_err(|e| io_err("opening the jobserver", e))?;
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    let ok = unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if !ok {
        return Err(io_err(
            "making the jobserver blocking",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(f)
}
