//! [`SandboxSpec`]: everything one sandboxed run is made of, and the one
//! deterministic bwrap argv it turns into.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use executor_core::SandboxError;

use crate::layers;
use crate::probe::{BwrapFeatures, FileKind, HostFs};

/// The uid the command runs as inside (never 0: no capabilities).
pub const SANDBOX_UID: u32 = 1000;
/// The gid the command runs as inside.
pub const SANDBOX_GID: u32 = 100;
/// The fixed hostname inside (the host's never shows).
pub const SANDBOX_HOSTNAME: &str = "fhsx";

/// What a command sees of who and where it runs, beyond its files: pinned
/// by default ([`Persona::default`]: uid 1000, gid 100, hostname `fhsx`,
/// umask 0022, every CPU, ASLR on), so the caller's state never reaches it;
/// varied on purpose to check that a build does not depend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persona {
    pub hostname: String,
    /// The uid and gid inside (never 0).
    pub uid: u32,
    pub gid: u32,
    pub umask: u32,
    /// Run on this many CPUs (the first ones) instead of all of them:
    /// affinity, and so `nproc`.
    pub cpus: Option<usize>,
    /// Address-space layout randomisation (`personality`'s
    /// `ADDR_NO_RANDOMIZE` when off).
    pub aslr: bool,
}

impl Default for Persona {
    fn default() -> Self {
        Persona {
            hostname: SANDBOX_HOSTNAME.into(),
            uid: SANDBOX_UID,
            gid: SANDBOX_GID,
            umask: 0o022,
            cpus: None,
            aslr: true,
        }
    }
}
/// Where the host root provider puts the workspace.
pub const WORKSPACE_DIR: &str = "/workspace";
/// Where the view root provider puts the scratch directory.
pub const SCRATCH_DIR: &str = "/build";
/// Where the RPC bridge socket appears inside (`WF_RPC_SOCK`).
pub const RPC_SOCKET_PATH: &str = "/run/wf.sock";
/// The environment variable naming the RPC bridge socket.
pub const RPC_SOCKET_ENV: &str = "WF_RPC_SOCK";
/// The fd the supervisor's executable is handed to bwrap on (an `O_PATH`
/// descriptor of the installed, execute-only file; the supervisor closes
/// it first thing).
pub const SUPERVISOR_FD: i32 = 6;
/// The path bwrap execs as PID 1: the supervisor through its descriptor,
/// so no mount of it is made (each bind costs bwrap a read of the mount
/// table); `/proc/1/cmdline` shows this.
pub const SUPERVISOR_EXEC: &str = "/proc/self/fd/6";
/// The fd the supervisor's control channel has inside.
pub const CONTROL_FD: i32 = 3;
/// The fd bwrap reads the seccomp filter from (`--seccomp 5`).
pub const SECCOMP_FD: i32 = 5;
/// The sandbox's own directory inside (proxy socket, extra files); not part of any view, so [`SandboxSpec::ro_bind_file`] may only
/// place files below it.
pub const FHSX_RUN_DIR: &str = "/run/fhsx";
/// Where the fetch proxy's host socket appears inside
/// ([`SandboxSpec::proxy`]); the supervisor connects to it.
pub const PROXY_SOCKET_PATH: &str = "/run/fhsx/proxy.sock";
/// Where a build's jobserver FIFO appears inside ([`SandboxSpec::jobserver`]).
pub const JOBSERVER_PATH: &str = "/run/fhsx/jobserver";
/// The descriptors the jobserver is inherited on inside, read end (the
/// FIFO at [`JOBSERVER_PATH`]) and write end (the pool's returns), for
/// makes that know only `R,W`.
pub const JOBSERVER_FDS: (i32, i32) = (7, 8);
/// `MAKEFLAGS` with a jobserver: `-j` without a number (the pool bounds
/// the jobs), the FIFO for make >= 4.4, ninja >= 1.13 and the `jobserver`
/// crate (they take the last `--jobserver-auth`), then the descriptors as
/// `--jobserver-fd`, getopt's abbreviation of `--jobserver-fds`, which
/// make <= 4.3 takes (the last wins there too, and it cannot parse a
/// FIFO) and ninja ignores (it would take them, and refuse them). The
/// same text in every build.
pub const JOBSERVER_MAKEFLAGS: &str =
    "-j --jobserver-auth=fifo:/run/fhsx/jobserver --jobserver-fd=7,8";
/// The port the supervisor's proxy forwarder listens on by default
/// (`127.0.0.1:3128` inside the sandbox's own network namespace).
pub const DEFAULT_PROXY_PORT: u16 = 3128;
/// Where a CA bundle for the proxy conventionally goes
/// ([`SandboxSpec::ro_bind_file`]).
pub const PROXY_CA_PATH: &str = "/run/fhsx/ca.pem";
/// The variables tools read a CA bundle path from (DESIGN.md, "The fetch
/// proxy"); the caller sets them to [`PROXY_CA_PATH`] when it binds one.
pub const CA_BUNDLE_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];
/// Names of state directories masked under the work directory by default.
pub const DEFAULT_MASK_NAMES: &[&str] = &[".dsh-run"];
/// The variable naming the tool's home: masked and never passed on.
pub const DSH_HOME_ENV: &str = "DSH_HOME";
/// Variables that never cross the boundary, whatever the policy says.
pub const DENIED_ENV: &[&str] = &[DSH_HOME_ENV];

/// Top-level names of a view that the sandbox provides itself.
pub(crate) const VIEW_RESERVED: &[&str] = &["proc", "dev", "tmp", "build", "run"];

/// `/etc` entries of the host worth seeing: no secrets, no identity.
pub(crate) const HOST_ETC: &[&str] = &[
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/protocols",
    "/etc/services",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
];

/// Top-level system directories (or merged-usr symlinks) of the host.
pub(crate) const HOST_SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// NixOS' system paths, bound when the host has them.
pub(crate) const HOST_NIX: &[&str] = &["/nix/store", "/run/current-system/sw"];

/// The host environment the argv may copy whitelisted values from.
pub type HostEnv = BTreeMap<OsString, OsString>;

/// The calling process' environment as a [`HostEnv`].
pub fn current_host_env() -> HostEnv {
    std::env::vars_os().collect()
}

/// Host paths a run needs: the runtime directory's shared files and the
/// run's own RPC socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimePaths {
    /// The static supervisor executable (mode 0111: execute-only, so the
    /// build can run it but not read it).
    pub supervisor: PathBuf,
    /// The RPC bridge socket the host listens on.
    pub rpc_socket: PathBuf,
    /// A synthetic `/etc/passwd` naming only the sandbox user.
    pub passwd: PathBuf,
    /// A synthetic `/etc/group`.
    pub group: PathBuf,
}

impl RuntimePaths {
    /// The standard layout under one directory.
    pub fn under(dir: &Path) -> RuntimePaths {
        RuntimePaths {
            supervisor: dir.join("supervisor"),
            rpc_socket: dir.join("wf.sock"),
            passwd: dir.join("passwd"),
            group: dir.join("group"),
        }
    }
}

/// One probed entry of the host's system directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    /// Bind `src` read-only at `dest`.
    RoBind { src: PathBuf, dest: PathBuf },
    /// Recreate a symlink (e.g. merged-usr `bin -> usr/bin`).
    Symlink { target: PathBuf, dest: PathBuf },
}

/// What the sandbox's `/` is made of.
#[derive(Debug, Clone)]
pub enum RootProvider {
    /// A tree mounted elsewhere (the FUSE view), its top-level entries bound
    /// read-only; the scratch directory read-write at `/build`, or its
    /// directories at the places given ([`SandboxSpec::place_scratch`]).
    View {
        tree: PathBuf,
        scratch: PathBuf,
        entries: Vec<(OsString, FileKind)>,
        /// `(directory of the scratch, where it appears inside)`, in
        /// mount order; `None`: the whole scratch at `/build`.
        places: Option<Vec<(PathBuf, PathBuf)>>,
    },
    /// The host's own system directories read-only, the workspace
    /// read-write at `/workspace` (`fhsx run`).
    Host {
        workspace: PathBuf,
        system: Vec<SystemEntry>,
    },
}

/// Which environment variables cross: `allow` names copied from the host
/// if set there, and `set` pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvPolicy {
    pub allow: BTreeSet<String>,
    pub set: BTreeMap<String, OsString>,
}

/// The fetch proxy forwarder: the supervisor listens on
/// `127.0.0.1:port` inside and forwards each connection to `socket`, the
/// proxy's host UNIX socket bound at [`PROXY_SOCKET_PATH`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyForward {
    pub socket: PathBuf,
    pub port: u16,
}

/// Resource limits of the command (an action's `[limits]`). `None` leaves
/// a resource as the caller has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory in bytes: a memory cgroup's limit (the run's cgroup v2
    /// `memory.max`, else a per-run cgroup v1 memory cgroup's
    /// `memory.limit_in_bytes`), else — only where neither can be had —
    /// `RLIMIT_AS` of the command, which limits address space (see
    /// [`MemoryEnforcement`](crate::MemoryEnforcement)).
    pub memory: Option<u64>,
    /// The largest file the command may write, in bytes (`RLIMIT_FSIZE`;
    /// a write past it fails with `EFBIG` or `SIGXFSZ`).
    pub file_size: Option<u64>,
    /// Open file descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
}

/// The host uid and gid a run's bwrap and everything inside run as
/// ([`SandboxSpec::build_user`]), instead of the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

/// One sandboxed run's full description. Build it with [`SandboxSpec::host`]
/// or [`SandboxSpec::view`], adjust it, then call
/// [`bwrap_argv`](SandboxSpec::bwrap_argv).
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub(crate) root: RootProvider,
    pub(crate) env: EnvPolicy,
    pub(crate) masks: Vec<PathBuf>,
    pub(crate) hostname: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) umask: u32,
    pub(crate) cpus: Option<usize>,
    pub(crate) aslr: bool,
    pub(crate) run_as: Option<RunAs>,
    pub(crate) chdir: Option<PathBuf>,
    pub(crate) nproc: Option<u64>,
    pub(crate) limits: Limits,
    pub(crate) proxy: Option<ProxyForward>,
    pub(crate) jobserver: Option<(PathBuf, PathBuf)>,
    pub(crate) files: Vec<(PathBuf, PathBuf)>,
    pub(crate) features: BwrapFeatures,
    pub(crate) seccomp: bool,
    pub(crate) runtime: RuntimePaths,
    pub(crate) fs: Arc<dyn HostFs>,
}

fn bad_path(path: &Path, role: &'static str, reason: impl Into<String>) -> SandboxError {
    SandboxError::BadPath {
        path: path.to_path_buf(),
        role,
        reason: reason.into(),
    }
}

impl SandboxSpec {
    fn new(root: RootProvider, runtime: RuntimePaths, fs: Arc<dyn HostFs>) -> Self {
        SandboxSpec {
            root,
            env: EnvPolicy::default(),
            masks: Vec::new(),
            hostname: SANDBOX_HOSTNAME.to_string(),
            uid: SANDBOX_UID,
            gid: SANDBOX_GID,
            umask: 0o022,
            cpus: None,
            aslr: true,
            run_as: None,
            chdir: None,
            nproc: None,
            limits: Limits::default(),
            proxy: None,
            jobserver: None,
            files: Vec::new(),
            features: BwrapFeatures::ALL,
            seccomp: crate::seccomp::filter_bytes().is_some(),
            runtime,
            fs,
        }
    }

    /// The host root for `fhsx run`: probes the host's mount table and
    /// system directories; `workspace` appears read-write at `/workspace`.
    pub fn host(
        workspace: &Path,
        runtime: RuntimePaths,
        fs: Arc<dyn HostFs>,
    ) -> Result<Self, SandboxError> {
        let ws = fs
            .canonicalize(workspace)
            .ok_or_else(|| bad_path(workspace, "the workspace", "it does not exist"))?;
        if fs.kind(&ws) != Some(FileKind::Dir) {
            return Err(bad_path(
                workspace,
                "the workspace",
                "it is not a directory",
            ));
        }
        if ws == Path::new("/") {
            return Err(bad_path(workspace, "the workspace", "binding the host's / read-write would defeat the sandbox; pick a project directory"));
        }
        let mounts = fs.mount_points()?;
        let mut system = Vec::new();
        let push = |p: &str, system: &mut Vec<SystemEntry>| {
            let path = PathBuf::from(p);
            match fs.kind(&path) {
                Some(FileKind::Dir) | Some(FileKind::File) => system.push(SystemEntry::RoBind {
                    src: path.clone(),
                    dest: path,
                }),
                Some(FileKind::Symlink(target)) => {
                    system.push(SystemEntry::Symlink { target, dest: path })
                }
                _ => {}
            }
        };
        for p in HOST_SYSTEM {
            push(p, &mut system);
        }
        for p in HOST_NIX {
            let path = Path::new(p);
            // NixOS: a mount point of the host, or a path that resolves
            // (`/run/current-system` is a symlink into the store).
            if mounts.iter().any(|m| m == path) || fs.canonicalize(path).is_some() {
                system.push(SystemEntry::RoBind {
                    src: path.to_path_buf(),
                    dest: path.to_path_buf(),
                });
            }
        }
        for p in HOST_ETC {
            push(p, &mut system);
        }
        Ok(Self::new(
            RootProvider::Host {
                workspace: ws,
                system,
            },
            runtime,
            fs,
        ))
    }

    /// The view root for the executor: `tree` (a mounted, composed view)
    /// provides `/`; `scratch` appears read-write at `/build`.
    pub fn view(
        tree: &Path,
        scratch: &Path,
        runtime: RuntimePaths,
        fs: Arc<dyn HostFs>,
    ) -> Result<Self, SandboxError> {
        if fs.kind(tree) != Some(FileKind::Dir) {
            return Err(bad_path(tree, "the view root", "it is not a directory"));
        }
        let mut entries = Vec::new();
        for name in fs.read_dir(tree)? {
            if let Some(k) = fs.kind(&tree.join(&name)) {
                entries.push((name, k));
            }
        }
        Self::view_of(tree, entries, scratch, runtime, fs)
    }

    /// As [`view`](Self::view), with the entries of the view's root given
    /// instead of listed through `tree`. The executor serves its view from
    /// its own FUSE daemon and must never wait on it from its own process:
    /// killed during such a wait, its serving threads die first and the
    /// wait never ends (an unkillable process holding a mount).
    pub fn view_of(
        tree: &Path,
        entries: Vec<(OsString, FileKind)>,
        scratch: &Path,
        runtime: RuntimePaths,
        fs: Arc<dyn HostFs>,
    ) -> Result<Self, SandboxError> {
        let scratch_c = fs
            .canonicalize(scratch)
            .ok_or_else(|| bad_path(scratch, "the scratch directory", "it does not exist"))?;
        if fs.kind(&scratch_c) != Some(FileKind::Dir) {
            return Err(bad_path(
                scratch,
                "the scratch directory",
                "it is not a directory",
            ));
        }
        let mut entries = entries;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self::new(
            RootProvider::View {
                tree: tree.to_path_buf(),
                scratch: scratch_c,
                entries,
                places: None,
            },
            runtime,
            fs,
        ))
    }

    /// Show the scratch's directories at places in the view instead of the
    /// whole scratch at `/build`: each `(dir, inside)` binds `dir`, a
    /// directory below the scratch, read-write at `inside`, an absolute
    /// path whose mount point the view provides (or, at the top level,
    /// that nothing in the view takes). Mounted shallowest first; `/build`
    /// is then the view's own, if it has one. No places: nothing of the
    /// scratch is shown.
    pub fn place_scratch(
        &mut self,
        places: Vec<(PathBuf, PathBuf)>,
    ) -> Result<&mut Self, SandboxError> {
        let RootProvider::View {
            scratch,
            places: placed,
            ..
        } = &mut self.root
        else {
            return Err(bad_path(
                Path::new(WORKSPACE_DIR),
                "the workspace",
                "only a view root places its scratch",
            ));
        };
        let mut checked = Vec::with_capacity(places.len());
        for (dir, inside) in places {
            // The directory itself may not be made yet (the scratch is
            // filled while the sandbox is composed): its parent is checked.
            let below = |d: &Path| d.starts_with(&*scratch);
            let dir_c = match (dir.parent(), dir.file_name()) {
                (Some(parent), Some(name)) => self
                    .fs
                    .canonicalize(parent)
                    .filter(|p| below(p))
                    .map(|p| p.join(name)),
                _ => None,
            }
            .ok_or_else(|| {
                bad_path(
                    &dir,
                    "a placed scratch directory",
                    "it is not a directory below the scratch",
                )
            })?;
            let normal = inside.is_absolute()
                && inside.parent().is_some()
                && inside
                    .components()
                    .skip(1)
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !normal {
                return Err(bad_path(
                    &inside,
                    "where a scratch directory is placed",
                    "it is not a normal absolute path below /",
                ));
            }
            checked.push((dir_c, inside));
        }
        checked.sort_by_key(|(_, inside)| inside.components().count());
        *placed = Some(checked);
        Ok(self)
    }

    /// The directory the command starts in and the defaults are masked under.
    pub fn work_dir(&self) -> &'static str {
        match self.root {
            RootProvider::View { .. } => SCRATCH_DIR,
            RootProvider::Host { .. } => WORKSPACE_DIR,
        }
    }

    /// Let a host variable through (copied only if the host has it).
    pub fn allow_env(&mut self, name: &str) -> Result<&mut Self, SandboxError> {
        check_env_name(name)?;
        self.env.allow.insert(name.to_string());
        Ok(self)
    }

    /// Set a variable inside.
    pub fn set_env(
        &mut self,
        name: &str,
        value: impl Into<OsString>,
    ) -> Result<&mut Self, SandboxError> {
        check_env_name(name)?;
        let value = value.into();
        if std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str()).contains(&0) {
            return Err(SandboxError::BadEnv {
                name: name.to_string(),
                reason: "its value contains a NUL byte".into(),
            });
        }
        self.env.set.insert(name.to_string(), value);
        Ok(self)
    }

    /// Mask one more in-sandbox path (empty read-only tmpfs over a
    /// directory, `/dev/null` over a file; absent paths are left alone).
    pub fn mask(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.masks.push(path.into());
        self
    }

    /// The directory the command starts in (default: the work directory).
    /// Run the command as `p` (see [`Persona`]); a uid or gid of 0 is
    /// refused (no one is root inside).
    pub fn persona(&mut self, p: &Persona) -> Result<&mut Self, SandboxError> {
        if p.uid == 0 || p.gid == 0 {
            return Err(SandboxError::Protocol(
                "a persona's uid and gid inside must not be 0".into(),
            ));
        }
        if p.hostname.is_empty() || p.hostname.len() > 64 || p.hostname.contains(['\0', '/']) {
            return Err(SandboxError::Protocol(format!(
                "hostname {:?} is not a valid hostname",
                p.hostname
            )));
        }
        self.hostname = p.hostname.clone();
        self.uid = p.uid;
        self.gid = p.gid;
        self.umask = p.umask & 0o777;
        self.cpus = p.cpus.filter(|n| *n > 0);
        self.aslr = p.aslr;
        Ok(self)
    }

    /// The umask, CPU count and ASLR the command gets (the runner imposes
    /// them before bwrap; the supervisor sets the umask again).
    pub(crate) fn process_persona(&self) -> (u32, Option<usize>, bool) {
        (self.umask, self.cpus, self.aslr)
    }

    pub fn chdir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.chdir = Some(dir.into());
        self
    }

    /// Run as this build user (root only): bwrap, the supervisor and the
    /// command run as its host uid and gid, with no supplementary groups,
    /// instead of the caller's, and the sandbox uid inside maps to it.
    /// The caller keeps `user` (its lock) until the run and whatever it
    /// left are done with. Every directory above what the sandbox binds
    /// (the root tree, the work directory, the supervisor, the sockets,
    /// the extra files) must then be searchable by it; the run's own
    /// directories and sockets are made so ([`Runtime::run`](crate::Runtime::run)),
    /// the work directory is the caller's to hand over.
    pub fn build_user(&mut self, user: &crate::BuildUser) -> &mut Self {
        self.run_as = Some(RunAs {
            uid: user.uid(),
            gid: user.gid(),
        });
        self
    }

    /// The build user set, if any.
    pub fn run_as(&self) -> Option<RunAs> {
        self.run_as
    }

    /// Cap the number of processes the sandbox user may have (fork bombs):
    /// `RLIMIT_NPROC` of the command, and the run cgroup's `pids.max` when
    /// it has one with the pids controller (`RLIMIT_NPROC` does not bind a
    /// caller that is host root).
    pub fn nproc(&mut self, n: Option<u64>) -> &mut Self {
        self.nproc = n;
        self
    }

    /// Resource limits of the command (see [`Limits`]); the process count
    /// is [`nproc`](SandboxSpec::nproc).
    pub fn limits(&mut self, limits: Limits) -> &mut Self {
        self.limits = limits;
        self
    }

    /// The resource limits set.
    pub fn resource_limits(&self) -> Limits {
        self.limits
    }

    /// Give the sandbox its one network path: bind the fetch proxy's host
    /// UNIX socket at [`PROXY_SOCKET_PATH`] and have the supervisor listen
    /// on `127.0.0.1:port` ([`DEFAULT_PROXY_PORT`]) inside the sandbox's
    /// network namespace, forwarding every connection to it. The listener
    /// is up before the command starts. The environment (`http_proxy`, ...)
    /// is the caller's to set.
    pub fn proxy(&mut self, host_socket: &Path, port: u16) -> Result<&mut Self, SandboxError> {
        if port < 1024 {
            return Err(SandboxError::Protocol(format!(
                "proxy port {port} is privileged (the sandbox has no capabilities); use a port of 1024 or more, e.g. {DEFAULT_PROXY_PORT}"
            )));
        }
        let c = self.fs.canonicalize(host_socket).ok_or_else(|| {
            bad_path(
                host_socket,
                "the fetch proxy socket",
                "it does not exist; start the proxy first",
            )
        })?;
        if self.fs.kind(&c) != Some(FileKind::Other) {
            return Err(bad_path(
                host_socket,
                "the fetch proxy socket",
                "it is not a UNIX socket",
            ));
        }
        self.proxy = Some(ProxyForward { socket: c, port });
        Ok(self)
    }

    /// The proxy forwarder, if set.
    pub fn proxy_forward(&self) -> Option<&ProxyForward> {
        self.proxy.as_ref()
    }

    /// Bind one host file read-only at `dest` inside (e.g. the proxy's CA
    /// bundle at [`PROXY_CA_PATH`]). `dest` must be a plain absolute path
    /// below [`FHSX_RUN_DIR`], which no view provides, and not one the
    /// sandbox uses itself (the supervisor, the proxy socket).
    ///
    /// The command can read every byte of it, and it is not part of the
    /// view (no read set records it): bind only data that is public, and
    /// record it if a record says what the build could read
    /// ([`readable_host_files`](Self::readable_host_files)).
    pub fn ro_bind_file(
        &mut self,
        host: &Path,
        dest: impl AsRef<Path>,
    ) -> Result<&mut Self, SandboxError> {
        let dest = dest.as_ref();
        let src = self
            .fs
            .canonicalize(host)
            .ok_or_else(|| bad_path(host, "a file to bind", "it does not exist"))?;
        if self.fs.kind(&src) != Some(FileKind::File) {
            return Err(bad_path(host, "a file to bind", "it is not a regular file"));
        }
        let plain = dest.is_absolute()
            && dest
                .components()
                .skip(1)
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain || !dest.starts_with(FHSX_RUN_DIR) || dest == Path::new(FHSX_RUN_DIR) {
            return Err(bad_path(
                dest,
                "a file's place inside",
                format!("it must be a plain absolute path below {FHSX_RUN_DIR} (no `.`/`..`), e.g. {PROXY_CA_PATH}"),
            ));
        }
        let taken = [Path::new(PROXY_SOCKET_PATH)];
        if taken
            .iter()
            .any(|t| t.starts_with(dest) || dest.starts_with(t))
            || self
                .files
                .iter()
                .any(|(_, d)| d.starts_with(dest) || dest.starts_with(d))
        {
            return Err(bad_path(
                dest,
                "a file's place inside",
                "that place is already taken (the proxy socket or another file); pick another name",
            ));
        }
        // `a/./b` names `a/b`: store it as bwrap will see it.
        self.files.push((src, dest.components().collect()));
        Ok(self)
    }

    /// The host files bound into the sandbox that the command can read,
    /// besides its root and its work directory: `(host path, path
    /// inside)`, each from [`ro_bind_file`](Self::ro_bind_file). The
    /// supervisor is not bound: bwrap execs it from a descriptor
    /// ([`SUPERVISOR_FD`]) that PID 1 closes at once. An executor recording what a build could read
    /// records these (their digests) with its read set.
    pub fn readable_host_files(&self) -> Vec<(PathBuf, PathBuf)> {
        self.files.clone()
    }

    /// Give the command a GNU make jobserver: two FIFOs on the host, one
    /// its jobs take tokens from (`spares`, shown at [`JOBSERVER_PATH`] and
    /// inherited as the read end of [`JOBSERVER_FDS`]) and one they give
    /// them back to (`returns`, the write end only); `MAKEFLAGS` is
    /// [`JOBSERVER_MAKEFLAGS`] unless the caller sets one. The FIFO inside
    /// is writable (it is a pipe, not a file): a client that knows only
    /// the path gives tokens back into it.
    pub fn jobserver(&mut self, spares: &Path, returns: &Path) -> Result<&mut Self, SandboxError> {
        for (p, role) in [
            (spares, "the jobserver"),
            (returns, "the jobserver's returns"),
        ] {
            if self.fs.kind(p) != Some(FileKind::Other) {
                return Err(bad_path(p, role, "it is not a FIFO"));
            }
        }
        self.jobserver = Some((spares.to_path_buf(), returns.to_path_buf()));
        Ok(self)
    }

    /// The jobserver's FIFOs on the host (spares, returns), if the command
    /// has one.
    pub fn jobserver_fifos(&self) -> Option<(&Path, &Path)> {
        self.jobserver
            .as_ref()
            .map(|(s, r)| (s.as_path(), r.as_path()))
    }

    /// Install the no-setuid-bits seccomp filter (see [`crate::seccomp`]);
    /// on by default where this crate has a filter for the architecture.
    pub fn seccomp(&mut self, on: bool) -> &mut Self {
        self.seccomp = on;
        self
    }

    /// Which optional bwrap flags to use (see [`BwrapFeatures::probe`]).
    pub fn features(&mut self, f: BwrapFeatures) -> &mut Self {
        self.features = f;
        self
    }

    /// The host paths this run uses.
    pub fn runtime(&self) -> &RuntimePaths {
        &self.runtime
    }

    /// The root provider as probed.
    pub fn root(&self) -> &RootProvider {
        &self.root
    }

    /// The whole bwrap argv (without `bwrap` itself), layers in their fixed
    /// order: namespace flags, isolation flags, mounts, masks, RPC bridge,
    /// environment, then `--`, the supervisor and `command`. Same spec,
    /// environment and host state: byte-identical output.
    pub fn bwrap_argv(&self, host_env: &HostEnv, command: &[OsString]) -> Vec<OsString> {
        self.argv_parts(host_env, command).0
    }

    /// The argv and the index of the `--` that ends bwrap's options (bwrap
    /// reads the options from `--args FD`; the command follows on its real
    /// command line).
    pub(crate) fn argv_parts(
        &self,
        host_env: &HostEnv,
        command: &[OsString],
    ) -> (Vec<OsString>, usize) {
        self.argv_parts_with(host_env, command, false)
    }

    /// [`argv_parts`](Self::argv_parts); `memory_in_cgroup`: the run's
    /// cgroup enforces the memory limit, so the supervisor sets no
    /// `RLIMIT_AS`.
    pub(crate) fn argv_parts_with(
        &self,
        host_env: &HostEnv,
        command: &[OsString],
        memory_in_cgroup: bool,
    ) -> (Vec<OsString>, usize) {
        let mut a = Argv::default();
        layers::namespaces::emit(self, &mut a);
        layers::isolation::emit(self, &mut a);
        let binds = layers::mounts::emit(self, &mut a);
        layers::masks::emit(self, host_env, &binds, &mut a);
        layers::bridge::emit(self, &mut a);
        layers::env::emit(self, host_env, &mut a);
        let split = a.0.len();
        a.push("--");
        a.push(SUPERVISOR_EXEC);
        a.push("--control-fd");
        a.push(CONTROL_FD.to_string());
        if let Some(n) = self.nproc {
            a.push("--nproc");
            a.push(n.to_string());
        }
        let l = &self.limits;
        let rlimits = [
            ("--rlimit-fsize", l.file_size),
            ("--rlimit-nofile", l.open_files),
            ("--rlimit-as", l.memory.filter(|_| !memory_in_cgroup)),
        ];
        for (flag, v) in rlimits {
            if let Some(v) = v {
                a.push(flag);
                a.push(v.to_string());
            }
        }
        for p in layers::mounts::writable_inside(self) {
            a.push("--landlock-rw");
            a.push(p);
        }
        for p in layers::mounts::WRITE_EXISTING_INSIDE {
            a.push("--landlock-files");
            a.push(p);
        }
        if self.jobserver.is_some() {
            a.push("--landlock-files");
            a.push(JOBSERVER_PATH);
            for fd in [JOBSERVER_FDS.0, JOBSERVER_FDS.1] {
                a.push("--keep-fd");
                a.push(fd.to_string());
            }
        }
        if self.umask != 0o022 {
            a.push("--umask");
            a.push(format!("{:o}", self.umask));
        }
        if let Some(p) = &self.proxy {
            a.push("--proxy-port");
            a.push(p.port.to_string());
            a.push("--proxy-socket");
            a.push(PROXY_SOCKET_PATH);
        }
        a.push("--");
        for c in command {
            a.push(c);
        }
        (a.0, split)
    }
}

/// An environment variable name that may be passed with `--setenv`.
pub(crate) fn check_env_name(name: &str) -> Result<(), SandboxError> {
    let bad = |reason: &str| SandboxError::BadEnv {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(bad("a name must be non-empty and contain no '=' or NUL"));
    }
    if DENIED_ENV.contains(&name) {
        return Err(bad("it names the tool's own home, which never crosses"));
    }
    if name == RPC_SOCKET_ENV {
        return Err(bad("the sandbox sets it itself"));
    }
    Ok(())
}

/// The growing argv.
#[derive(Debug, Default)]
pub(crate) struct Argv(pub(crate) Vec<OsString>);

impl Argv {
    pub(crate) fn push(&mut self, s: impl AsRef<OsStr>) {
        self.0.push(s.as_ref().to_os_string());
    }
    pub(crate) fn flag2(&mut self, flag: &str, a: impl AsRef<OsStr>) {
        self.push(flag);
        self.push(a);
    }
    pub(crate) fn flag3(&mut self, flag: &str, a: impl AsRef<OsStr>, b: impl AsRef<OsStr>) {
        self.push(flag);
        self.push(a);
        self.push(b);
    }
}
