//! The REAPI mapping: an REAPI `Action`/`Command` as an fhsx [`Action`],
//! and what the build left as an `ActionResult`. Pure: no store, no
//! network, no clock — every function here takes values and returns
//! values, so each rule has a unit test.
//!
//! Known gaps: on a toolchain, an input root's size is paid at every
//! action (exported, the working tree ingested); as `/`, only its places.
//! Over a toolchain, the record names the shadowed atoms, so its
//! `toolchain_digest` is the registered id only where nothing is
//! shadowed. No LogStream; limits are the worker's defaults, not
//! per-action.
//!
//! The mapping (DESIGN.md, "The REAPI worker"). Where the input root is
//! ([`Root`]) is chosen per action, by its platform:
//!
//! - **The input root is `/`** (`fhsx-root=input`, or no `fhsx-toolchain`:
//!   BuildStream, recc with a sysroot, Buildbarn's `chroot_into_input_root`
//!   clients). The input root is the action's closure, composed into the
//!   read-only view like any atom, its reads proven within it; over the
//!   toolchain the action names (or the worker's `--input-root-over`), each
//!   toolchain atom shadowed by the input root so the input root's entries
//!   take precedence. The scratch is placed only at the working directory
//!   and where the outputs are ([`paths::places`]): each place a directory
//!   of the scratch holding at first what the input root has there, bound
//!   at its path (`[outputs] at`), and output `dirN` afterwards; nothing
//!   else is writable but the private `/tmp`. An action asking for the
//!   whole root as output (BuildStream's integration commands) has every
//!   top-level directory as a place ([`Plan::widen`]). Where Buildbarn's
//!   runner and buildbox-run give the command a writable copy of the whole
//!   input root, fhsx keeps it read-only but there: it serves the root
//!   from its store, lazily, and proves what was read of it.
//! - **The toolchain is `/`** (`fhsx-toolchain=b3:…`, one the worker's
//!   operator registered: Bazel). The input root is the action's `source`,
//!   exported writable to `/build/out` (an in-place build, `[outputs]
//!   in_place = "out"`), so the working tree after the build is output
//!   `out`; the command runs in `/build/out/<working_directory>`. Nothing
//!   runs on the host's tools either way.
//!
//! In both: argv and env are the Command's, env on top of fhsx's base
//! environment (`HOME` is `/tmp` when the input root is `/`); the timeout
//! is `Action.timeout` (the worker's default when unset, refused above its
//! maximum); `do_not_cache` skips fhsx's action cache; the output paths
//! (`output_paths`, or the older `output_files` and `output_directories`)
//! are resolved against the working directory ([`super::paths`], which
//! says where fhsx differs from REAPI); their parent directories (and the
//! places) are created in the input root before the build, and afterwards
//! each is looked up in the output holding it ([`Plan::locate`]).
//!
//! The result: each requested path becomes an `OutputFile`, an
//! `OutputDirectory` (its `Tree` uploaded) or a symlink entry in the field
//! the client asked with (`output_symlinks` for `output_paths`, else
//! `output_file_symlinks` or `output_directory_symlinks`); a file asked as a
//! directory or the reverse is `FAILED_PRECONDITION`, a missing one left
//! out. stdout and stderr are the record's two logs (the executor keeps
//! them apart for the worker, `BuildRequest::split_streams`). An output
//! fhsx refuses (the ingest rules, anywhere in the working tree) or a usage
//! error is `FAILED_PRECONDITION`, a containment violation
//! `PERMISSION_DENIED`, anything else `INTERNAL` (retryable elsewhere); a
//! run fhsx refused still returns its `ActionResult` beside that status
//! (exit code, log, proof: they say why). A command that ran and failed
//! returns its outputs too (a failed test's logs): the worker asks the
//! executor to ingest them (`BuildRequest::failed_outputs`), and the
//! record, a failed build's, names them. `ExecutedActionMetadata` has the
//! worker and its start, input-fetch, execution, output-upload and
//! completion timestamps (the queued one is the engine's: a lease does not
//! say when its action was queued; BuildGrid sets it, and its own worker
//! start and completion over the worker's). The proof rides in
//! `auxiliary_metadata` as `OutputFile` entries (a type every client
//! decodes) `fhsx-record.json` and `fhsx-read-set`, with their SHA-256 in
//! the engine's CAS and node properties `fhsx-b3` (the store name) and
//! `fhsx-signer` (the record key).
//!
//! Paths must be relative, with no empty component, and stay within the
//! input root (else `INVALID_ARGUMENT`, naming the path); the directories
//! an output or the working directory need are made through the input root
//! in one walk down and one up (a trie held flat, no recursion), refused
//! through a file or symlink.
//!
//! The cost per action: an input tree's conversion is paid once (the
//! SHA-256 → atom map). With the input root as `/`, a sysroot costs its
//! places only: it is served lazily from the store, and only what the
//! places hold is copied into the scratch and ingested back. On the
//! working tree, the executor exports the whole input root into the
//! scratch and ingests it back as output `out`, so a large input root
//! there costs its size each time.

// The fields REAPI 2.1 deprecated (`output_files`, `output_directories`,
// `Command.platform`, the typed symlink lists) are what Bazel 2.x and
// BuildGrid's `bgd` still send and read.
#![allow(deprecated)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use castore::{Digest, Directory, Name, Node, SymlinkTarget};
use executor_core::action::{Inputs, Limits, Network, Outputs, Run};
use executor_core::{Action, ActionOf, OutputName};
use prost::Message;
use sha2::{Digest as _, Sha256};

use super::paths;
pub use super::paths::{OutputKind, OutputRequest};
use super::proto::{re, Code};

/// The platform property naming the toolchain an action runs on.
pub const TOOLCHAIN_PROPERTY: &str = "fhsx-toolchain";
/// The platform property saying where the input root is: `input` (the
/// input root is `/`) or `toolchain` (the toolchain is `/`, the input root
/// the working tree at [`WORKTREE`]). Unset: `toolchain` when the action
/// names one, else `input`.
pub const ROOT_PROPERTY: &str = "fhsx-root";
/// The output that is the working tree.
pub const WORKTREE_OUTPUT: &str = "out";
/// Where the input root appears in the sandbox.
pub const WORKTREE: &str = "/build/out";

/// Why an action is not run: a `google.rpc.Code` and a message that says
/// what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    fn precondition(message: impl Into<String>) -> Self {
        Self::new(Code::FailedPrecondition, message)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

/// What the worker's operator decided.
#[derive(Debug, Clone)]
pub struct Policy {
    /// For an action without `timeout`.
    pub default_timeout: Duration,
    /// An action asking for more is refused.
    pub max_timeout: Duration,
    /// Registered toolchains: `fhsx-toolchain` value → atoms, in order.
    pub toolchains: BTreeMap<Digest, Vec<Digest>>,
    /// The toolchain (one of `toolchains`) an action whose input root is
    /// its `/` sits over when it names none: `None`, such an action has
    /// only its input root.
    pub input_root_over: Option<Digest>,
    /// Limits every action runs under.
    pub limits: Limits,
}

/// An REAPI action, checked and ready to become an fhsx action.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Relative to the input root, `""` for the root itself.
    pub working_directory: String,
    pub outputs: Vec<OutputRequest>,
    /// Directories (relative to the input root) that must exist before
    /// the build ([`paths::Resolved::dirs`], and the places).
    pub dirs: Vec<String>,
    /// The toolchain: its `fhsx-toolchain` value and its atoms.
    pub toolchain: Option<(Digest, Vec<Digest>)>,
    /// Where the input root is.
    pub root: Root,
    pub timeout: Duration,
    pub do_not_cache: bool,
}

/// Where an action's input root is in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// At [`WORKTREE`], writable, the toolchain as `/`; the whole tree
    /// after the build is output [`WORKTREE_OUTPUT`].
    Worktree,
    /// The input root is `/`, read-only, over the toolchain if there is
    /// one (the input root's entries shadow the toolchain's); the scratch
    /// is placed at these directories (relative to the input root,
    /// [`paths::places`]), each holding at first what the input root has
    /// there and afterwards output `dirN`. When an output is the whole
    /// input root ([`Plan::whole_root`]), every top-level directory of it
    /// is a place ([`Plan::widen`]) and that output is the input root with
    /// them replaced by what they hold afterwards.
    Slash { places: Vec<String> },
}

impl Plan {
    /// The working directory as the build sees it.
    pub fn workdir(&self) -> String {
        let top = match self.root {
            Root::Worktree => WORKTREE,
            Root::Slash { .. } => "",
        };
        match (top, self.working_directory.as_str()) {
            ("", "") => "/".to_owned(),
            (top, "") => top.to_owned(),
            (top, wd) => format!("{top}/{wd}"),
        }
    }

    /// Whether the input root is `/` and an output is all of it (what
    /// BuildStream asks for when it runs commands with the root writable).
    pub fn whole_root(&self) -> bool {
        matches!(self.root, Root::Slash { .. }) && self.outputs.iter().any(|o| o.in_root.is_empty())
    }

    /// For an action that writes its whole root: every top-level directory
    /// `top` of its input root (with the places made) is a place too.
    pub fn widen(&mut self, top: impl IntoIterator<Item = String>) {
        if !self.whole_root() {
            return;
        }
        if let Root::Slash { places } = &mut self.root {
            *places = paths::with_top_level(std::mem::take(places), top);
        }
    }

    /// The places that are top-level directories, each with its output:
    /// what replaces the input root's entries in a whole-root output.
    pub fn top_level_places(&self) -> Vec<(String, OutputName)> {
        let Root::Slash { places, .. } = &self.root else {
            return Vec::new();
        };
        places
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.contains('/'))
            .filter_map(|(i, p)| Some((p.clone(), place_output(i).ok()?)))
            .collect()
    }

    /// The output holding `in_root` (a path relative to the input root)
    /// after the build, and the path within it. The whole input root is
    /// in none (see [`Plan::top_level_places`]).
    pub fn locate<'p>(&self, in_root: &'p str) -> Option<(OutputName, &'p str)> {
        match &self.root {
            Root::Worktree => Some((worktree_output().ok()?, in_root)),
            Root::Slash { places, .. } => places.iter().enumerate().find_map(|(i, p)| {
                let rest = in_root.strip_prefix(p.as_str())?;
                let rest = match rest.strip_prefix('/') {
                    Some(r) => r,
                    None if rest.is_empty() => rest,
                    None => return None,
                };
                Some((place_output(i).ok()?, rest))
            }),
        }
    }
}

fn worktree_output() -> Result<OutputName, Refusal> {
    WORKTREE_OUTPUT
        .parse()
        .map_err(|e: String| Refusal::new(Code::Internal, e))
}

/// The output a place becomes: `dir0`, `dir1`, … in the places' order.
fn place_output(i: usize) -> Result<OutputName, Refusal> {
    format!("dir{i}")
        .parse()
        .map_err(|e: String| Refusal::new(Code::Internal, e))
}

/// The action's platform properties: `Action.platform` (REAPI ≥ 2.2), else
/// the Command's.
fn properties<'a>(
    action: &'a re::Action,
    command: &'a re::Command,
) -> &'a [re::platform::Property] {
    match &action.platform {
        Some(p) if !p.properties.is_empty() => &p.properties,
        _ => command
            .platform
            .as_ref()
            .map(|p| p.properties.as_slice())
            .unwrap_or(&[]),
    }
}

/// Check an REAPI action against the worker's policy.
pub fn plan(action: &re::Action, command: &re::Command, policy: &Policy) -> Result<Plan, Refusal> {
    let known = || {
        if policy.toolchains.is_empty() {
            "this worker has none registered (its operator starts it with --toolchain FILE.toolchain)".to_owned()
        } else {
            let names: Vec<String> = policy
                .toolchains
                .keys()
                .map(|d| format!("{TOOLCHAIN_PROPERTY}={d}"))
                .collect();
            format!("this worker has {}", names.join(", "))
        }
    };
    let mut toolchain = None;
    let mut root = None;
    for p in properties(action, command) {
        if p.name == ROOT_PROPERTY {
            if root.is_some() {
                return Err(Refusal::invalid(format!(
                    "the platform names {ROOT_PROPERTY} more than once"
                )));
            }
            root = Some(match p.value.as_str() {
                "input" => true,
                "toolchain" => false,
                other => {
                    return Err(Refusal::invalid(format!(
                        "platform property {ROOT_PROPERTY}={other:?} is neither `input` (the input root is /) nor `toolchain` (the toolchain is /, the input root {WORKTREE})"
                    )))
                }
            });
        } else if p.name == TOOLCHAIN_PROPERTY {
            if toolchain.is_some() {
                return Err(Refusal::invalid(format!(
                    "the platform names {TOOLCHAIN_PROPERTY} more than once: an action runs on one toolchain"
                )));
            }
            let d: Digest = p.value.parse().map_err(|e| {
                Refusal::invalid(format!(
                    "platform property {TOOLCHAIN_PROPERTY}={:?} is not a toolchain digest ({e}); {}",
                    p.value,
                    known()
                ))
            })?;
            toolchain = Some(d);
        } else if p.name.starts_with("fhsx-") {
            return Err(Refusal::invalid(format!(
                "unknown platform property {:?}: fhsx knows {TOOLCHAIN_PROPERTY} and {ROOT_PROPERTY}",
                p.name
            )));
        }
    }
    // Without a toolchain the input root holds the tools: it is `/`.
    let slash = root.unwrap_or(toolchain.is_none());
    let toolchain = match toolchain {
        None if !slash => {
            return Err(Refusal::precondition(format!(
                "the action runs on a toolchain ({ROOT_PROPERTY}=toolchain) but names none: set the platform property {TOOLCHAIN_PROPERTY}=b3:… (fhsx runs nothing on the host's tools), or {ROOT_PROPERTY}=input to run in the input root; {}",
                known()
            )))
        }
        None => policy.input_root_over,
        Some(t) => Some(t),
    };
    let toolchain = match toolchain {
        None => None,
        Some(t) => match policy.toolchains.get(&t) {
            Some(atoms) => Some((t, atoms.clone())),
            None => {
                return Err(Refusal::precondition(format!(
                    "the action asks for toolchain {TOOLCHAIN_PROPERTY}={t}, which this worker does not hold; {}",
                    known()
                )))
            }
        },
    };

    if command.arguments.is_empty() || command.arguments[0].is_empty() {
        return Err(Refusal::invalid("the Command has no arguments"));
    }
    if let Some(a) = command.arguments.iter().find(|a| a.contains('\0')) {
        return Err(Refusal::invalid(format!(
            "argument {a:?} contains a NUL byte"
        )));
    }
    let mut env = BTreeMap::new();
    for v in &command.environment_variables {
        if v.name.is_empty()
            || v.name.contains('=')
            || v.name.contains('\0')
            || v.value.contains('\0')
        {
            return Err(Refusal::invalid(format!(
                "environment variable {:?} is not a valid name or value",
                v.name
            )));
        }
        if env.insert(v.name.clone(), v.value.clone()).is_some() {
            return Err(Refusal::invalid(format!(
                "environment variable {:?} is set twice",
                v.name
            )));
        }
    }
    let resolved = paths::resolve_command(command)?;

    let timeout = match &action.timeout {
        None => policy.default_timeout,
        Some(t) if t.seconds == 0 && t.nanos == 0 => policy.default_timeout,
        Some(t) if t.seconds < 0 || t.nanos < 0 => {
            return Err(Refusal::invalid("Action.timeout is negative"))
        }
        Some(t) => {
            // fhsx times builds in whole seconds: round up.
            Duration::from_secs(t.seconds as u64 + u64::from(t.nanos > 0))
        }
    };
    if timeout > policy.max_timeout {
        return Err(Refusal::invalid(format!(
            "Action.timeout {}s is above this worker's maximum of {}s",
            timeout.as_secs(),
            policy.max_timeout.as_secs()
        )));
    }
    let (root, dirs) = if slash {
        let places = paths::places(&resolved)?;
        // A place is a mount point: the input root has a directory there.
        let dirs: BTreeSet<String> = resolved.dirs.iter().chain(&places).cloned().collect();
        (Root::Slash { places }, dirs.into_iter().collect())
    } else {
        (Root::Worktree, resolved.dirs)
    };
    Ok(Plan {
        argv: command.arguments.clone(),
        env,
        working_directory: resolved.working_directory,
        outputs: resolved.outputs,
        dirs,
        toolchain,
        root,
        timeout,
        do_not_cache: action.do_not_cache,
    })
}

/// The fhsx action for a plan whose input root (with [`Plan::dirs`]
/// made) is the castore tree `source`. `toolchain`: the plan's toolchain
/// atoms as the build composes them — as registered for the working
/// tree; for the input root as `/`, without what the input root shadows
/// (`castore::compose::shadowed`), so the two compose without a clash.
pub fn fhsx_action(
    plan: &Plan,
    source: Digest,
    toolchain: Vec<Digest>,
    limits: &Limits,
) -> Result<Action, Refusal> {
    let (closure, source, outputs) = match &plan.root {
        Root::Worktree => {
            let out = worktree_output()?;
            let outputs = Outputs {
                names: vec![out.clone()],
                in_place: Some(out),
                at: BTreeMap::new(),
            };
            (Vec::new(), Some(source), outputs)
        }
        Root::Slash { places, .. } => {
            let mut at = BTreeMap::new();
            for (i, p) in places.iter().enumerate() {
                at.insert(place_output(i)?, format!("/{p}"));
            }
            // No place (no output, the root as working directory): an
            // action that makes nothing, with nothing of the scratch shown.
            let outputs = Outputs {
                names: at.keys().cloned().collect(),
                in_place: None,
                at,
            };
            (vec![source], None, outputs)
        }
    };
    let action: Action = ActionOf {
        inputs: Inputs {
            closure,
            toolchain,
            source,
        },
        run: Run {
            command: plan.argv.clone(),
            env: plan.env.clone(),
            workdir: plan.workdir(),
            timeout: plan.timeout,
        },
        network: Network::default(),
        outputs,
        limits: limits.clone(),
    };
    // Through the parser: an action built here obeys every rule a file does.
    Action::parse(&action.to_toml(), std::path::Path::new("reapi-action"))
        .map_err(|e| Refusal::invalid(format!("the action cannot run on fhsx: {e}")))
}

/// The SHA-256 digest of some bytes, as REAPI names them.
pub fn sha256_digest(bytes: &[u8]) -> re::Digest {
    re::Digest {
        hash: hex(&Sha256::digest(bytes)),
        size_bytes: bytes.len() as i64,
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Check a digest as the wire carries it: 64 lower-case hex digits and a
/// size that is not negative.
pub fn check_digest(what: &str, d: &re::Digest) -> Result<(), Refusal> {
    let ok = d.hash.len() == 64
        && d.hash
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        && d.size_bytes >= 0;
    if ok {
        Ok(())
    } else {
        Err(Refusal::invalid(format!(
            "{what} {}/{} is not a SHA-256 digest (64 lower-case hex digits and a size): this worker speaks SHA-256 only",
            d.hash.escape_debug(),
            d.size_bytes
        )))
    }
}

/// An REAPI `Directory` as a castore one. `dirs` maps each child
/// directory's REAPI digest to its castore digest and entry count, `blobs`
/// each file's REAPI digest to its BLAKE3 digest. Node properties (mtimes,
/// modes) are dropped: castore keeps content, the executable bit and
/// symlink targets.
pub fn castore_directory(
    d: &re::Directory,
    dirs: &HashMap<re::Digest, (Digest, u64)>,
    blobs: &HashMap<re::Digest, Digest>,
) -> Result<Directory, Refusal> {
    let bad = |e: castore::Error| Refusal::invalid(format!("an input directory is invalid: {e}"));
    let mut out = Directory::new();
    for f in &d.files {
        let rd = f
            .digest
            .as_ref()
            .ok_or_else(|| Refusal::invalid(format!("file {:?} has no digest", f.name)))?;
        check_digest("file", rd)?;
        let b3 = blobs.get(rd).ok_or_else(|| {
            Refusal::invalid(format!("file {:?}: blob {} unknown", f.name, rd.hash))
        })?;
        out.insert(
            Name::new(f.name.as_bytes()).map_err(bad)?,
            Node::File {
                digest: *b3,
                size: rd.size_bytes as u64,
                executable: f.is_executable,
            },
        )
        .map_err(bad)?;
    }
    for c in &d.directories {
        let rd = c
            .digest
            .as_ref()
            .ok_or_else(|| Refusal::invalid(format!("directory {:?} has no digest", c.name)))?;
        check_digest("directory", rd)?;
        let (b3, size) = dirs.get(rd).ok_or_else(|| {
            Refusal::invalid(format!("directory {:?}: {} unknown", c.name, rd.hash))
        })?;
        out.insert(
            Name::new(c.name.as_bytes()).map_err(bad)?,
            Node::Directory {
                digest: *b3,
                size: *size,
            },
        )
        .map_err(bad)?;
    }
    for s in &d.symlinks {
        out.insert(
            Name::new(s.name.as_bytes()).map_err(bad)?,
            Node::Symlink {
                target: SymlinkTarget::new(s.target.as_bytes()).map_err(bad)?,
            },
        )
        .map_err(bad)?;
    }
    Ok(out)
}

/// A castore directory as an REAPI one (entries in name order, as both
/// require). `dirs` maps child castore digests to REAPI digests, `blobs`
/// blob BLAKE3 digests to SHA-256 ones.
pub fn reapi_directory(
    d: &Directory,
    dirs: &HashMap<Digest, re::Digest>,
    blobs: &HashMap<Digest, re::Digest>,
) -> Result<re::Directory, Refusal> {
    let mut out = re::Directory::default();
    let text = |n: &Name| {
        String::from_utf8(n.as_bytes().to_vec()).map_err(|_| {
            Refusal::precondition(format!(
                "output name {n:?} is not UTF-8, which REAPI cannot carry"
            ))
        })
    };
    for (name, node) in d.entries() {
        match node {
            Node::File {
                digest, executable, ..
            } => out.files.push(re::FileNode {
                name: text(name)?,
                digest: Some(blobs.get(digest).cloned().ok_or_else(|| {
                    Refusal::new(
                        Code::Internal,
                        format!("no SHA-256 digest for blob {digest}"),
                    )
                })?),
                is_executable: *executable,
                node_properties: None,
            }),
            Node::Directory { digest, .. } => out.directories.push(re::DirectoryNode {
                name: text(name)?,
                digest: Some(dirs.get(digest).cloned().ok_or_else(|| {
                    Refusal::new(
                        Code::Internal,
                        format!("no REAPI digest for directory {digest}"),
                    )
                })?),
            }),
            Node::Symlink { target } => out.symlinks.push(re::SymlinkNode {
                name: text(name)?,
                target: String::from_utf8(target.as_bytes().to_vec()).map_err(|_| {
                    Refusal::precondition(format!("symlink {name:?} has a non-UTF-8 target"))
                })?,
                node_properties: None,
            }),
        }
    }
    Ok(out)
}

/// The REAPI `Tree` of the castore directory `root`, given every directory
/// below it (`dirs`, by castore digest) and the SHA-256 digest of every
/// blob. Returns the tree, its encoding and digest, and each directory's
/// REAPI encoding (what a client may also fetch by digest).
pub fn tree(
    root: &Digest,
    dirs: &HashMap<Digest, Directory>,
    blobs: &HashMap<Digest, re::Digest>,
) -> Result<EncodedTree, Refusal> {
    // Depth-first, children before parents.
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![(*root, false)];
    while let Some((d, expanded)) = stack.pop() {
        if expanded {
            order.push(d);
            continue;
        }
        if !seen.insert(d) {
            continue;
        }
        let dir = dirs
            .get(&d)
            .ok_or_else(|| Refusal::new(Code::Internal, format!("directory {d} not loaded")))?;
        stack.push((d, true));
        for (_, n) in dir.entries() {
            if let Node::Directory { digest, .. } = n {
                stack.push((*digest, false));
            }
        }
    }
    let mut reapi: HashMap<Digest, re::Digest> = HashMap::new();
    let mut encoded: HashMap<Digest, re::Directory> = HashMap::new();
    for d in &order {
        if encoded.contains_key(d) {
            continue;
        }
        let dir = &dirs[d];
        let r = reapi_directory(dir, &reapi, blobs)?;
        reapi.insert(*d, sha256_digest(&r.encode_to_vec()));
        encoded.insert(*d, r);
    }
    let mut children = Vec::new();
    let mut listed = BTreeSet::new();
    for d in &order {
        if d != root && listed.insert(*d) {
            children.push(encoded[d].clone());
        }
    }
    let t = re::Tree {
        root: Some(encoded[root].clone()),
        children,
    };
    let bytes = t.encode_to_vec();
    let mut directories: Vec<(re::Digest, Vec<u8>)> = order
        .iter()
        .filter_map(|d| {
            encoded
                .get(d)
                .map(|r| (reapi[d].clone(), r.encode_to_vec()))
        })
        .collect();
    directories.sort_by(|a, b| a.0.hash.cmp(&b.0.hash));
    directories.dedup_by(|a, b| a.0 == b.0);
    Ok(EncodedTree {
        digest: sha256_digest(&bytes),
        root_directory: reapi[root].clone(),
        bytes,
        directories,
    })
}

/// A `Tree` ready to upload.
#[derive(Debug, Clone)]
pub struct EncodedTree {
    pub digest: re::Digest,
    pub root_directory: re::Digest,
    pub bytes: Vec<u8>,
    /// Every directory of the tree on its own, under its digest: what a
    /// client fetching `root_directory_digest` walks.
    pub directories: Vec<(re::Digest, Vec<u8>)>,
}

/// What a path in the working tree turned out to be after the build.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    File {
        digest: re::Digest,
        executable: bool,
    },
    Directory {
        tree: re::Digest,
        root: re::Digest,
    },
    Symlink {
        target: String,
    },
    Missing,
}

/// Where each found output goes in the `ActionResult` (output files,
/// directories and symlinks, sorted by path). An `output_files` entry that
/// is a directory, or an `output_directories` entry that is a file, is
/// the client's mistake: `FAILED_PRECONDITION`, as REAPI says.
pub fn outputs(plan: &Plan, found: &[Found], result: &mut re::ActionResult) -> Result<(), Refusal> {
    for (req, f) in plan.outputs.iter().zip(found) {
        let path = req.path.clone();
        match (req.kind, f) {
            (_, Found::Missing) => {}
            (OutputKind::File | OutputKind::Path, Found::File { digest, executable }) => {
                result.output_files.push(re::OutputFile {
                    path,
                    digest: Some(digest.clone()),
                    is_executable: *executable,
                    contents: Vec::new(),
                    node_properties: None,
                })
            }
            (OutputKind::Directory | OutputKind::Path, Found::Directory { tree, root }) => {
                result.output_directories.push(re::OutputDirectory {
                    path,
                    tree_digest: Some(tree.clone()),
                    is_topologically_sorted: false,
                    root_directory_digest: Some(root.clone()),
                })
            }
            (kind, Found::Symlink { target }) => {
                let s = re::OutputSymlink {
                    path,
                    target: target.clone(),
                    node_properties: None,
                };
                match kind {
                    OutputKind::Path => result.output_symlinks.push(s),
                    OutputKind::File => result.output_file_symlinks.push(s),
                    OutputKind::Directory => result.output_directory_symlinks.push(s),
                }
            }
            (OutputKind::File, Found::Directory { .. }) => {
                return Err(Refusal::precondition(format!(
                    "output file {:?} is a directory: list it in output_directories",
                    req.path
                )))
            }
            (OutputKind::Directory, Found::File { .. }) => {
                return Err(Refusal::precondition(format!(
                    "output directory {:?} is a file: list it in output_files",
                    req.path
                )))
            }
        }
    }
    result.output_files.sort_by(|a, b| a.path.cmp(&b.path));
    result
        .output_directories
        .sort_by(|a, b| a.path.cmp(&b.path));
    for l in [
        &mut result.output_symlinks,
        &mut result.output_file_symlinks,
        &mut result.output_directory_symlinks,
    ] {
        l.sort_by(|a, b| a.path.cmp(&b.path));
    }
    Ok(())
}

/// The exit code REAPI reports for how the build ended (a signal as
/// 128 + its number, as a shell says it), and the status: a timeout is
/// `DEADLINE_EXCEEDED`, a build fhsx stopped at one of its limits
/// `RESOURCE_EXHAUSTED`.
pub fn exit(status: &executor_core::ExitStatus) -> (i32, Code) {
    match status {
        executor_core::ExitStatus::Exited { code } => (*code, Code::Ok),
        executor_core::ExitStatus::Signaled { signal } => (128 + signal, Code::Ok),
        executor_core::ExitStatus::TimedOut => (128 + 9, Code::DeadlineExceeded),
        // Stopped past one of fhsx's own limits ([limits] log): the
        // client's action asked for more than it may.
        executor_core::ExitStatus::LimitExceeded { .. } => (128 + 9, Code::ResourceExhausted),
    }
}

/// The status of an action that ran, beside its `ActionResult` (which a
/// client gets either way: the exit code, the log and the proof of a run
/// fhsx refused are what says why). `OK` for a command that ran to its end,
/// whatever its exit code; the timeout is `DEADLINE_EXCEEDED`; outputs fhsx
/// refused (`failure`: its ingest rules, a limit) `FAILED_PRECONDITION`; a
/// containment violation `PERMISSION_DENIED` — each naming the record.
pub fn verdict(
    status: &executor_core::ExitStatus,
    failure: Option<&str>,
    violations: &[String],
    record: &Digest,
    timeout: Duration,
) -> (Code, String) {
    if !violations.is_empty() {
        return (
            Code::PermissionDenied,
            format!("{} (record {record})", violations.join("; ")),
        );
    }
    if let Some(f) = failure {
        return (Code::FailedPrecondition, format!("{f} (record {record})"));
    }
    let code = exit(status).1;
    let why = match status {
        executor_core::ExitStatus::TimedOut => {
            format!("the action ran out of its {}s timeout", timeout.as_secs())
        }
        executor_core::ExitStatus::LimitExceeded { limit } => {
            format!("the action went past its {limit}")
        }
        _ => return (code, String::new()),
    };
    (code, format!("{why} (record {record})"))
}

/// What fhsx's own errors are on the wire. A refused or invalid action is
/// the client's to fix; a containment violation is not retried
/// elsewhere; anything else may be this worker's trouble, so the engine
/// may retry it (`INTERNAL`).
pub fn error_code(class: executor_core::ExitClass) -> Code {
    match class {
        executor_core::ExitClass::Usage => Code::FailedPrecondition,
        executor_core::ExitClass::Integrity => Code::PermissionDenied,
        executor_core::ExitClass::BuildFailed | executor_core::ExitClass::CheckMismatch => {
            Code::Internal
        }
    }
}

/// The name the signed record goes by in `auxiliary_metadata`.
pub const PROOF_RECORD: &str = "fhsx-record.json";
/// The name the read set goes by there.
pub const PROOF_READ_SET: &str = "fhsx-read-set";

/// The `auxiliary_metadata` entries: where a client finds the proof. Each
/// is an `OutputFile` (a type every REAPI client can decode): the record,
/// then its read set, each with its SHA-256 digest in the engine's CAS and,
/// as node properties, its BLAKE3 name in fhsx's store and the signer.
pub fn proof(
    record: &re::Digest,
    record_b3: &Digest,
    read_set: &re::Digest,
    read_set_b3: &Digest,
    public_key: &str,
) -> [re::OutputFile; 2] {
    let entry = |path: &str, d: &re::Digest, b3: &Digest| re::OutputFile {
        path: path.to_owned(),
        digest: Some(d.clone()),
        is_executable: false,
        contents: Vec::new(),
        node_properties: Some(re::NodeProperties {
            properties: vec![
                re::NodeProperty {
                    name: "fhsx-b3".into(),
                    value: b3.to_string(),
                },
                re::NodeProperty {
                    name: "fhsx-signer".into(),
                    value: public_key.to_owned(),
                },
            ],
            mtime: None,
            unix_mode: None,
        }),
    };
    [
        entry(PROOF_RECORD, record, record_b3),
        entry(PROOF_READ_SET, read_set, read_set_b3),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tc() -> Digest {
        Digest::of(b"toolchain")
    }

    fn policy() -> Policy {
        let mut toolchains = BTreeMap::new();
        toolchains.insert(tc(), vec![Digest::of(b"atom1"), Digest::of(b"atom2")]);
        Policy {
            default_timeout: Duration::from_secs(600),
            max_timeout: Duration::from_secs(3600),
            toolchains,
            input_root_over: None,
            limits: Limits::default(),
        }
    }

    fn prop(name: &str, value: &str) -> re::platform::Property {
        re::platform::Property {
            name: name.into(),
            value: value.into(),
        }
    }

    fn command(args: &[&str]) -> re::Command {
        re::Command {
            arguments: args.iter().map(|s| s.to_string()).collect(),
            platform: Some(re::Platform {
                properties: vec![prop(TOOLCHAIN_PROPERTY, &tc().to_string())],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_worktree_output_name_is_valid() {
        assert!(WORKTREE_OUTPUT.parse::<OutputName>().is_ok());
    }

    #[test]
    fn a_command_maps_to_an_in_place_action() {
        let mut c = command(&["/bin/sh", "-c", "echo hi > out/a.txt"]);
        c.environment_variables
            .push(re::command::EnvironmentVariable {
                name: "CC".into(),
                value: "gcc".into(),
            });
        c.working_directory = "w/sub".into();
        c.output_files = vec!["out/a.txt".into()];
        c.output_directories = vec!["gen".into()];
        let a = re::Action {
            timeout: Some(super::super::proto::Duration {
                seconds: 30,
                nanos: 5,
            }),
            do_not_cache: true,
            ..Default::default()
        };
        let p = plan(&a, &c, &policy()).unwrap();
        assert_eq!(p.workdir(), "/build/out/w/sub");
        assert_eq!(p.timeout, Duration::from_secs(31));
        assert!(p.do_not_cache);
        assert_eq!(p.dirs, ["w/sub", "w/sub/out"]);
        assert_eq!(
            p.outputs,
            [
                OutputRequest {
                    path: "out/a.txt".into(),
                    in_root: "w/sub/out/a.txt".into(),
                    kind: OutputKind::File
                },
                OutputRequest {
                    path: "gen".into(),
                    in_root: "w/sub/gen".into(),
                    kind: OutputKind::Directory
                }
            ]
        );
        let src = Digest::of(b"src");
        let atoms = policy().toolchains[&tc()].clone();
        let fa = fhsx_action(&p, src, atoms.clone(), &Limits::default()).unwrap();
        assert_eq!(fa.inputs.toolchain, atoms);
        assert!(fa.inputs.closure.is_empty());
        assert_eq!(fa.inputs.source, Some(src));
        assert_eq!(fa.outputs.source_dir(), "out");
        assert_eq!(fa.run.env["CC"], "gcc");
        assert_eq!(fa.run.command, c.arguments);
        // The same REAPI action is the same fhsx action.
        let again = fhsx_action(
            &plan(&a, &c, &policy()).unwrap(),
            src,
            atoms,
            &Limits::default(),
        );
        assert_eq!(again.unwrap().digest(None), fa.digest(None));
    }

    #[test]
    fn output_paths_win_over_the_older_fields_and_action_platform_over_command() {
        let mut c = command(&["true"]);
        c.output_paths = vec!["x/y".into()];
        c.output_files = vec!["ignored".into()];
        c.platform = None;
        let a = re::Action {
            platform: Some(re::Platform {
                properties: vec![prop(TOOLCHAIN_PROPERTY, &tc().to_string())],
            }),
            ..Default::default()
        };
        let p = plan(&a, &c, &policy()).unwrap();
        assert_eq!(p.outputs.len(), 1);
        assert_eq!(p.outputs[0].kind, OutputKind::Path);
        assert_eq!(p.dirs, ["x"]);
        assert_eq!(p.timeout, Duration::from_secs(600));
        assert_eq!(p.workdir(), "/build/out");
    }

    /// BuildStream's action: no fhsx property, a working directory deep in
    /// the input root and an install root beside it.
    #[test]
    fn an_action_naming_no_toolchain_runs_in_its_input_root_as_slash() {
        let mut c = command(&["sh", "-c", "-e", "make install"]);
        c.platform = Some(re::Platform {
            properties: vec![prop("ISA", "x86-64"), prop("OSFamily", "linux")],
        });
        c.working_directory = "buildstream/p/e".into();
        c.output_paths = vec![".".into(), "../../../buildstream-install".into()];
        let a = re::Action::default();
        let p = plan(&a, &c, &policy()).unwrap();
        assert_eq!(p.workdir(), "/buildstream/p/e");
        assert_eq!(p.toolchain, None);
        assert_eq!(
            p.root,
            Root::Slash {
                places: vec!["buildstream/p/e".into(), "buildstream-install".into()]
            }
        );
        // The mount points are made in the input root (with the outputs'
        // parents, as for every action).
        assert_eq!(
            p.dirs,
            ["buildstream-install", "buildstream/p", "buildstream/p/e"]
        );
        let src = Digest::of(b"sysroot");
        let fa = fhsx_action(&p, src, Vec::new(), &Limits::default()).unwrap();
        assert_eq!(fa.inputs.closure, [src]);
        assert!(fa.inputs.toolchain.is_empty());
        assert_eq!(fa.inputs.source, None);
        let at: Vec<(String, String)> = fa
            .outputs
            .at
            .iter()
            .map(|(n, p)| (n.to_string(), p.clone()))
            .collect();
        assert_eq!(
            at,
            [
                ("dir0".into(), "/buildstream/p/e".into()),
                ("dir1".into(), "/buildstream-install".into())
            ]
        );
        // Each requested path, in the output holding it.
        let located: Vec<(String, &str)> = p
            .outputs
            .iter()
            .map(|o| {
                let (n, rel) = p.locate(&o.in_root).unwrap();
                (n.to_string(), rel)
            })
            .collect();
        assert_eq!(located, [("dir0".into(), ""), ("dir1".into(), "")]);

        // Over a toolchain: the action's, or the worker's default.
        let mut over = c.clone();
        over.platform = Some(re::Platform {
            properties: vec![
                prop(ROOT_PROPERTY, "input"),
                prop(TOOLCHAIN_PROPERTY, &tc().to_string()),
            ],
        });
        let p = plan(&a, &over, &policy()).unwrap();
        assert!(matches!(p.root, Root::Slash { .. }));
        assert_eq!(p.toolchain.map(|t| t.0), Some(tc()));
        let mut pol = policy();
        pol.input_root_over = Some(tc());
        assert_eq!(
            plan(&a, &c, &pol).unwrap().toolchain.map(|t| t.0),
            Some(tc())
        );
        // No output and the root as working directory: nothing is writable
        // but the private /tmp, and the action makes nothing.
        let mut bare = c.clone();
        bare.working_directory = String::new();
        bare.output_paths.clear();
        let p = plan(&a, &bare, &policy()).unwrap();
        assert_eq!(p.root, Root::Slash { places: vec![] });
        assert_eq!(p.workdir(), "/");
        let fa = fhsx_action(&p, src, Vec::new(), &Limits::default()).unwrap();
        assert!(fa.outputs.names.is_empty() && fa.outputs.placed());

        // The whole root (BuildStream's integration commands): every
        // top-level directory of the input root becomes a place, and the
        // root itself lies in none.
        let mut whole = c.clone();
        whole.output_paths = vec!["../../..".into()];
        let mut p = plan(&a, &whole, &policy()).unwrap();
        p.widen(["usr", "buildstream", "proc", "etc"].map(String::from));
        assert_eq!(
            p.root,
            Root::Slash {
                places: vec!["buildstream".into(), "etc".into(), "usr".into()]
            }
        );
        assert!(p.whole_root());
        assert_eq!(p.locate(""), None);
        let top: Vec<(String, String)> = p
            .top_level_places()
            .into_iter()
            .map(|(n, o)| (n, o.to_string()))
            .collect();
        assert_eq!(
            top,
            [
                ("buildstream".into(), "dir0".into()),
                ("etc".into(), "dir1".into()),
                ("usr".into(), "dir2".into())
            ]
        );
        // Widening changes nothing for an action that does not ask for it.
        let mut q = plan(&a, &c, &policy()).unwrap();
        let before = q.root.clone();
        q.widen(["usr".to_owned()]);
        assert_eq!(q.root, before);

        // `fhsx-root=toolchain` with a toolchain is the working tree.
        over.platform = Some(re::Platform {
            properties: vec![
                prop(ROOT_PROPERTY, "toolchain"),
                prop(TOOLCHAIN_PROPERTY, &tc().to_string()),
            ],
        });
        assert_eq!(plan(&a, &over, &policy()).unwrap().root, Root::Worktree);
    }

    #[test]
    fn refusals_say_what_to_change() {
        let a = re::Action::default();
        let mut c = command(&["true"]);
        c.platform = Some(re::Platform {
            properties: vec![prop(ROOT_PROPERTY, "toolchain")],
        });
        let e = plan(&a, &c, &policy()).unwrap_err();
        assert_eq!(e.code, Code::FailedPrecondition);
        assert!(
            e.message.contains("names none") && e.message.contains(&tc().to_string()),
            "{e}"
        );
        c.platform = Some(re::Platform {
            properties: vec![prop(ROOT_PROPERTY, "chroot")],
        });
        let e = plan(&a, &c, &policy()).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("neither `input`"), "{e}");
        // The input root as `/` stays read-only.
        let mut c = command(&["true"]);
        c.platform = None;
        c.output_files = vec!["a.o".into()];
        let e = plan(&a, &c, &policy()).unwrap_err();
        assert!(e.message.contains("directly in the input root"), "{e}");

        let mut c = command(&["true"]);
        c.platform = Some(re::Platform {
            properties: vec![prop(TOOLCHAIN_PROPERTY, &Digest::of(b"other").to_string())],
        });
        let e = plan(&a, &c, &policy()).unwrap_err();
        assert_eq!(e.code, Code::FailedPrecondition);
        assert!(e.message.contains("does not hold"), "{e}");

        c.platform = Some(re::Platform {
            properties: vec![prop(TOOLCHAIN_PROPERTY, "gcc")],
        });
        assert_eq!(
            plan(&a, &c, &policy()).unwrap_err().code,
            Code::InvalidArgument
        );
        c.platform = Some(re::Platform {
            properties: vec![
                prop(TOOLCHAIN_PROPERTY, &tc().to_string()),
                prop("fhsx-toolchian", "x"),
            ],
        });
        assert!(plan(&a, &c, &policy())
            .unwrap_err()
            .message
            .contains("fhsx-toolchian"));

        for (wd, out) in [
            ("../x", "a"),
            ("", "/etc/passwd"),
            ("", "a/../../b"),
            ("", "a/"),
            ("/abs", "a"),
        ] {
            let mut c = command(&["true"]);
            c.working_directory = wd.into();
            c.output_files = vec![out.into()];
            let e = plan(&a, &c, &policy()).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{wd} {out}: {e}");
        }
        let mut c = command(&["true"]);
        c.output_files = vec!["a".into(), "a".into()];
        assert!(plan(&a, &c, &policy())
            .unwrap_err()
            .message
            .contains("twice"));

        let c = command(&[]);
        assert!(plan(&a, &c, &policy())
            .unwrap_err()
            .message
            .contains("no arguments"));

        let long = re::Action {
            timeout: Some(super::super::proto::Duration {
                seconds: 7200,
                nanos: 0,
            }),
            ..Default::default()
        };
        let e = plan(&long, &command(&["true"]), &policy()).unwrap_err();
        assert!(e.message.contains("maximum"), "{e}");

        let mut c = command(&["true"]);
        c.environment_variables
            .push(re::command::EnvironmentVariable {
                name: "A=B".into(),
                value: "x".into(),
            });
        assert_eq!(
            plan(&a, &c, &policy()).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn digests_on_the_wire_are_sha256() {
        let d = sha256_digest(b"abc");
        assert_eq!(
            d.hash,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(check_digest("x", &d).is_ok());
        // A BLAKE3-only client's digests are the same length but not ours to
        // accept blindly: their size is checked, their content hashed on arrival.
        let b3 = re::Digest {
            hash: "b3:00".into(),
            size_bytes: 1,
        };
        assert!(check_digest("input root", &b3)
            .unwrap_err()
            .message
            .contains("SHA-256"));
    }

    #[test]
    fn directories_convert_both_ways_and_trees_list_each_child_once() {
        let blob = Digest::of(b"hello");
        let rblob = sha256_digest(b"hello");
        let mut leaf = Directory::new();
        leaf.insert(
            Name::new("f").unwrap(),
            Node::File {
                digest: blob,
                size: 5,
                executable: true,
            },
        )
        .unwrap();
        leaf.insert(
            Name::new("l").unwrap(),
            Node::Symlink {
                target: SymlinkTarget::new("f").unwrap(),
            },
        )
        .unwrap();
        let leaf_d = leaf.digest();
        let mut root = Directory::new();
        for n in ["a", "b"] {
            root.insert(
                Name::new(n).unwrap(),
                Node::Directory {
                    digest: leaf_d,
                    size: leaf.size(),
                },
            )
            .unwrap();
        }
        let root_d = root.digest();
        let dirs: HashMap<_, _> = [(leaf_d, leaf.clone()), (root_d, root.clone())].into();
        let blobs: HashMap<_, _> = [(blob, rblob.clone())].into();
        let t = tree(&root_d, &dirs, &blobs).unwrap();
        let decoded = re::Tree::decode(&t.bytes[..]).unwrap();
        assert_eq!(decoded.children.len(), 1, "the shared leaf is listed once");
        let rleaf = &decoded.children[0];
        assert_eq!(rleaf.files[0].name, "f");
        assert!(rleaf.files[0].is_executable);
        assert_eq!(rleaf.symlinks[0].target, "f");
        let rleaf_d = sha256_digest(&rleaf.encode_to_vec());
        assert_eq!(
            decoded.root.as_ref().unwrap().directories[0]
                .digest
                .as_ref(),
            Some(&rleaf_d)
        );
        assert_eq!(
            t.root_directory,
            sha256_digest(&decoded.root.as_ref().unwrap().encode_to_vec())
        );
        let listed: Vec<&re::Digest> = t.directories.iter().map(|(d, _)| d).collect();
        assert_eq!(listed.len(), 2);
        assert!(listed.contains(&&t.root_directory) && listed.contains(&&rleaf_d));
        // And back: the same castore tree.
        let back_leaf = castore_directory(rleaf, &HashMap::new(), &[(rblob, blob)].into()).unwrap();
        assert_eq!(back_leaf, leaf);
        let back_root = castore_directory(
            decoded.root.as_ref().unwrap(),
            &[(rleaf_d, (leaf_d, leaf.size()))].into(),
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(back_root.digest(), root_d);
        // Names castore refuses are refused.
        let mut evil = re::Directory::default();
        evil.symlinks.push(re::SymlinkNode {
            name: "..".into(),
            target: "x".into(),
            node_properties: None,
        });
        assert!(castore_directory(&evil, &HashMap::new(), &HashMap::new()).is_err());
    }

    #[test]
    fn found_outputs_land_in_the_fields_the_client_asked_with() {
        let mut c = command(&["true"]);
        c.output_files = vec!["f".into(), "fl".into(), "gone".into()];
        c.output_directories = vec!["d".into(), "dl".into()];
        let p = plan(&re::Action::default(), &c, &policy()).unwrap();
        let fd = sha256_digest(b"f");
        let found = vec![
            Found::File {
                digest: fd.clone(),
                executable: false,
            },
            Found::Symlink { target: "f".into() },
            Found::Missing,
            Found::Directory {
                tree: sha256_digest(b"t"),
                root: sha256_digest(b"r"),
            },
            Found::Symlink { target: "d".into() },
        ];
        let mut r = re::ActionResult::default();
        outputs(&p, &found, &mut r).unwrap();
        assert_eq!(r.output_files.len(), 1);
        assert_eq!(r.output_files[0].digest.as_ref(), Some(&fd));
        assert_eq!(r.output_file_symlinks[0].path, "fl");
        assert_eq!(r.output_directories[0].path, "d");
        assert_eq!(r.output_directory_symlinks[0].target, "d");
        assert!(r.output_symlinks.is_empty());

        let mut c = command(&["true"]);
        c.output_paths = vec!["s".into()];
        let p = plan(&re::Action::default(), &c, &policy()).unwrap();
        let mut r = re::ActionResult::default();
        outputs(&p, &[Found::Symlink { target: "x".into() }], &mut r).unwrap();
        assert_eq!(r.output_symlinks[0].path, "s");

        // BuildStream's shape: the working directory itself and a path
        // beside it, named in the result as the client wrote them.
        let mut c = command(&["true"]);
        c.working_directory = "buildstream/p/e".into();
        c.output_paths = vec![".".into(), "../../../install".into()];
        let p = plan(&re::Action::default(), &c, &policy()).unwrap();
        assert_eq!(p.outputs[0].in_root, "buildstream/p/e");
        assert_eq!(p.outputs[1].in_root, "install");
        let mut r = re::ActionResult::default();
        let tree = Found::Directory {
            tree: sha256_digest(b"t"),
            root: sha256_digest(b"r"),
        };
        outputs(&p, &[tree.clone(), tree], &mut r).unwrap();
        let got: Vec<&str> = r
            .output_directories
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        assert_eq!(got, [".", "../../../install"]);

        let mut c = command(&["true"]);
        c.output_files = vec!["d".into()];
        let p = plan(&re::Action::default(), &c, &policy()).unwrap();
        let e = outputs(
            &p,
            &[Found::Directory {
                tree: fd.clone(),
                root: fd,
            }],
            &mut re::ActionResult::default(),
        )
        .unwrap_err();
        assert_eq!(e.code, Code::FailedPrecondition);
    }

    #[test]
    fn exits_and_errors_map_to_codes() {
        use executor_core::{ExitClass, ExitStatus};
        assert_eq!(exit(&ExitStatus::Exited { code: 3 }), (3, Code::Ok));
        assert_eq!(exit(&ExitStatus::Signaled { signal: 15 }), (143, Code::Ok));
        assert_eq!(exit(&ExitStatus::TimedOut).1, Code::DeadlineExceeded);
        assert_eq!(error_code(ExitClass::Usage), Code::FailedPrecondition);
        assert_eq!(error_code(ExitClass::Integrity), Code::PermissionDenied);
        assert_eq!(error_code(ExitClass::BuildFailed), Code::Internal);
    }

    #[test]
    fn a_run_s_status_says_why_and_names_the_record() {
        use executor_core::ExitStatus;
        let rec = Digest::of(b"record");
        let t = Duration::from_secs(7);
        let none: &[String] = &[];
        let escaped = ["wrote outside /build".to_owned()];
        for (exit, failure, violations, code, says) in [
            // A command that failed ran to its end: OK, its exit code apart.
            (ExitStatus::Exited { code: 0 }, None, none, Code::Ok, ""),
            (ExitStatus::Exited { code: 2 }, None, none, Code::Ok, ""),
            (ExitStatus::Signaled { signal: 9 }, None, none, Code::Ok, ""),
            (
                ExitStatus::TimedOut,
                None,
                none,
                Code::DeadlineExceeded,
                "7s timeout",
            ),
            (
                ExitStatus::LimitExceeded {
                    limit: "[limits] log".into(),
                },
                None,
                none,
                Code::ResourceExhausted,
                "past its [limits] log",
            ),
            (
                ExitStatus::Exited { code: 0 },
                Some("fhsx: output out holds a device node"),
                none,
                Code::FailedPrecondition,
                "device node",
            ),
            (
                ExitStatus::Exited { code: 0 },
                Some("refused"),
                &escaped[..],
                Code::PermissionDenied,
                "outside /build",
            ),
        ] {
            let (c, m) = verdict(&exit, failure, violations, &rec, t);
            assert_eq!(c, code, "{exit:?}");
            assert!(m.contains(says), "{m}");
            assert_eq!(m.is_empty(), code == Code::Ok, "{m}");
            if code != Code::Ok {
                assert!(m.contains(&rec.to_string()), "{m}");
            }
        }
    }
}
