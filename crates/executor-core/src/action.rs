//! The action: everything a build may depend on, parsed strictly from
//! `action.toml` (see DESIGN.md, "The action").
//!
//! Parsing is the type boundary: unknown keys, malformed digests, relative
//! or escaping paths, an empty command and out-of-range limits are rejected
//! with the line they are on, so an [`Action`] value is always runnable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use castore::Digest;
use serde::{Deserialize, Serialize};

/// Why an action file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{file}: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("{file}: {message}; fix the action file")]
    Invalid { file: PathBuf, message: String },
    #[error("cannot read action file {file}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the inputs of an action name: in a resolved [`Action`] a digest; in
/// an [`ActionFile`] an [`InputRef`], which may also name another action's
/// output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inputs<I = Digest> {
    /// Atom roots the build depends on, in composition order.
    #[serde(default = "Vec::new")]
    pub closure: Vec<I>,
    /// The toolchain composition, composed after the closure.
    #[serde(default = "Vec::new")]
    pub toolchain: Vec<I>,
    /// Optional source tree, copied writable to `/build/src`.
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub source: Option<I>,
}

impl<I> Inputs<I> {
    /// Every input with the list it is in, in order: closure, toolchain, source.
    pub fn iter(&self) -> impl Iterator<Item = (InputList, &I)> {
        self.closure
            .iter()
            .map(|i| (InputList::Closure, i))
            .chain(self.toolchain.iter().map(|i| (InputList::Toolchain, i)))
            .chain(self.source.iter().map(|i| (InputList::Source, i)))
    }
}

/// Which list of `[inputs]` an input is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputList {
    Closure,
    Toolchain,
    Source,
}

impl InputList {
    pub fn name(self) -> &'static str {
        match self {
            InputList::Closure => "closure",
            InputList::Toolchain => "toolchain",
            InputList::Source => "source",
        }
    }
}

/// An input as an action file may write it: a tree's digest (`b3:…`), or
/// an output of another action (`fetch.toml#out`: a path relative to the
/// referring file, `#`, an output name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InputRef {
    Digest(Digest),
    Output {
        file: PathBuf,
        output: OutputName,
    },
    /// A directory, tarball or `.deb` on disk (relative to the referring
    /// file), imported into the store when the action is resolved — as a
    /// Nix path literal is — so the action digest covers its content, not
    /// its name.
    Path(PathBuf),
}

impl std::fmt::Display for InputRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputRef::Digest(d) => write!(f, "{d}"),
            InputRef::Output { file, output } => write!(f, "{}#{output}", file.display()),
            InputRef::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

impl std::str::FromStr for InputRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with("b3:") {
            return s.parse().map(InputRef::Digest).map_err(|e| format!("{e}"));
        }
        match s.rsplit_once('#') {
            Some((file, output)) if !file.is_empty() => Ok(InputRef::Output {
                file: PathBuf::from(file),
                output: output.parse()?,
            }),
            Some(_) => Err(format!(
                "input {s:?} names no action file before `#`: write `other.toml#out`"
            )),
            // `sha256:…`, `b3…`: meant as a digest, not a file name.
            None if s.contains(':') && !s.contains('/') || s.is_empty() => {
                Err(match s.parse::<Digest>() {
                    Err(e) => format!(
                        "input {s:?} is neither a digest ({e}), another action's output (`other.toml#out`) nor a path (write `./{s}` for a file of that name)"
                    ),
                    Ok(_) => format!("input {s:?} is not an input"),
                })
            }
            None => Ok(InputRef::Path(PathBuf::from(s))),
        }
    }
}

impl Serialize for InputRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for InputRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The name of one of an action's outputs (`out`, `dev`, `doc`, …): the
/// build finds it as `$name`, the directory `/build/name`. Lower-case
/// letters, digits and `_`, starting with a letter, at most 64 bytes — so
/// it is a shell variable name that no base variable (`PATH`, `HOME`, …)
/// can be.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OutputName(String);

impl OutputName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The output's directory as the build sees it.
    pub fn build_path(&self) -> String {
        format!("/build/{}", self.0)
    }
}

impl std::fmt::Display for OutputName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for OutputName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut chars = s.chars();
        let ok = matches!(chars.next(), Some('a'..='z'))
            && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
            && s.len() <= 64
            && !RESERVED_OUTPUT_NAMES.contains(&s);
        if ok {
            Ok(OutputName(s.to_owned()))
        } else {
            Err(format!(
                "output name {s:?} is not allowed: use lower-case letters, digits and `_`, starting with a letter (`out`, `dev`, `doc`), at most 64 bytes, and not one of {RESERVED_OUTPUT_NAMES:?}"
            ))
        }
    }
}

/// Names under `/build` that fhsx itself uses.
const RESERVED_OUTPUT_NAMES: &[&str] = &["src", "home"];

impl Serialize for OutputName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for OutputName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "default_workdir")]
    pub workdir: String,
    /// `"20m"`, `"90s"`, `"2h"` or plain seconds.
    #[serde(default = "default_timeout", with = "duration_str")]
    pub timeout: Duration,
}

fn default_workdir() -> String {
    "/build".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(3600)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// No network at all: no proxy, no loopback beyond the sandbox's own.
    #[default]
    None,
    /// Only what the lock holds is served.
    Replay,
    /// The one impure mode: fetch upstream, write the lock.
    Record,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub mode: NetworkMode,
    /// The fetch lock, relative to the action file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<PathBuf>,
}

/// The outputs a build makes: each a directory `/build/NAME` (`$NAME` in
/// its environment) that becomes an atom of its own, whose root is that
/// directory's content — so `$out/usr/bin/hello` composes at
/// `/usr/bin/hello`. fhsx does not create them: a declared output the
/// build did not make is an error naming it, as in Nix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outputs {
    #[serde(default = "default_outputs")]
    pub names: Vec<OutputName>,
    /// An in-place build: the output that starts as the source tree. The
    /// source is exported writable to `/build/NAME` instead of
    /// `/build/src`, the build works in it, and what it holds afterwards
    /// is output `NAME` (how the REAPI worker runs an action in its input
    /// root). Needs `[inputs] source`; names one of `names`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place: Option<OutputName>,
    /// Outputs placed in the root: output `NAME`'s directory appears at
    /// this absolute path instead of `/build/NAME`, holding beforehand a
    /// writable copy of what the closure has there (its own tree, not the
    /// toolchain's), and a relative link in it may climb as far as `/`.
    /// Set, it places every output and `/build` is not mounted: these
    /// paths (with the private `/tmp` and `/dev/shm`) are all the build
    /// may write, each a directory of its scratch. How an REAPI action
    /// whose input root is its `/` gets its working directory and output
    /// paths writable.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub at: BTreeMap<OutputName, String>,
}

impl Outputs {
    /// Where the source tree is exported in the scratch: `src`, or the
    /// in-place output's name.
    pub fn source_dir(&self) -> &str {
        self.in_place.as_ref().map_or("src", |o| o.as_str())
    }

    /// Where output `name`'s directory appears in the sandbox.
    pub fn path_of(&self, name: &OutputName) -> String {
        self.at
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.build_path())
    }

    /// Whether the outputs are placed in the root (`at`) rather than
    /// under `/build`. An action that makes no output (`names = []`, a
    /// test whose exit code and log are its result) has no `/build`
    /// either: its scratch is placed nowhere.
    pub fn placed(&self) -> bool {
        !self.at.is_empty() || self.names.is_empty()
    }
}

/// The top-level directories the sandbox mounts itself, where an output
/// may not be placed (nothing written there is kept).
pub const SANDBOX_OWN: &[&str] = &["proc", "dev", "tmp", "run", "sys"];

/// Check an `[outputs] at` path: absolute, normal (no empty, `.` or `..`
/// component, no trailing `/`), not `/` and not at or under what the
/// sandbox mounts itself.
fn check_placement(name: &OutputName, path: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("[outputs] at.{name} = {path:?} {why}"));
    let Some(rest) = path.strip_prefix('/') else {
        return bad("is not an absolute path");
    };
    if rest.is_empty() {
        return bad("is the root, which stays read-only: place the output in a directory below it");
    }
    if rest
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
        || path.contains('\0')
    {
        return bad("is not a normal path (no empty, `.` or `..` component, no trailing `/`)");
    }
    let top = rest.split('/').next().unwrap_or_default();
    if SANDBOX_OWN.contains(&top) {
        return bad(&format!("lies in /{top}, which the sandbox mounts itself"));
    }
    Ok(())
}

fn default_outputs() -> Vec<OutputName> {
    vec![OutputName("out".into())]
}

impl Default for Outputs {
    fn default() -> Self {
        Outputs {
            names: default_outputs(),
            in_place: None,
            at: BTreeMap::new(),
        }
    }
}

/// Resource limits for the build. Defaults are generous but finite. A size
/// is a number of bytes or a string with a unit (`"64 MiB"`, `"1.5 GiB"`,
/// `"100 MB"`); either way the digest sees the bytes, so `disk = "64 MiB"`
/// and `disk = 67108864` are one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "Limits::default_pids")]
    pub pids: u64,
    /// Bytes of memory.
    #[serde(default = "Limits::default_memory", deserialize_with = "size::bytes")]
    pub memory: u64,
    /// Largest file the build may write, bytes.
    #[serde(
        default = "Limits::default_file_size",
        deserialize_with = "size::bytes"
    )]
    pub file_size: u64,
    #[serde(default = "Limits::default_open_files")]
    pub open_files: u64,
    /// Bytes the build may keep in its scratch directory at once (all
    /// files together), enforced by a file system of that size where the
    /// host allows it.
    #[serde(default = "Limits::default_disk", deserialize_with = "size::bytes")]
    pub disk: u64,
    /// Distinct paths the build may observe (its read set's entries): past
    /// it, new paths fail with `ENOMEM` inside and the build fails as a
    /// limit failure, its read set marked incomplete.
    #[serde(default = "Limits::default_reads")]
    pub reads: u64,
    /// Bytes of output (stdout and stderr together) kept in the log: past
    /// it fhsx stops the build as a limit failure, as Nix's
    /// `max-build-log-size` does.
    #[serde(default = "Limits::default_log", deserialize_with = "size::bytes")]
    pub log: u64,
    /// Bytes a recording (`--record`) may store, all bodies together (and
    /// so any one body): past it the recording aborts as a violation.
    #[serde(default = "Limits::default_fetch", deserialize_with = "size::bytes")]
    pub fetch: u64,
    /// Bytes the outputs may hold, all files together at their apparent
    /// size (a sparse file counts as long as it reads): past it ingest
    /// refuses them, and nothing of them reaches the store. Unset, `disk`.
    /// (Unset is left out of the action digest, so actions written before
    /// it keep theirs.)
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "size::some_bytes"
    )]
    pub output: Option<u64>,
    /// Entries (files, directories, symlinks) the outputs may hold, all
    /// together. Unset, [`Limits::DEFAULT_OUTPUT_ENTRIES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_entries: Option<u64>,
}

impl Limits {
    fn default_pids() -> u64 {
        4096
    }
    fn default_memory() -> u64 {
        8 << 30
    }
    fn default_file_size() -> u64 {
        16 << 30
    }
    fn default_open_files() -> u64 {
        4096
    }
    fn default_disk() -> u64 {
        32 << 30
    }
    /// Large real builds observe hundreds of thousands of paths; this is
    /// ten times that, about 180 MB of the FUSE daemon's memory at the cap.
    pub fn default_reads() -> u64 {
        4_000_000
    }
    pub fn default_log() -> u64 {
        64 << 20
    }
    /// Room for multi-GB SDK and toolchain archives, not for an endless body.
    pub fn default_fetch() -> u64 {
        16 << 30
    }

    /// A million entries: twice what a full LLVM or a TeX Live install
    /// holds, and what ingest can check and import within its memory
    /// bound (a directory's entries are held while it is hashed).
    pub const DEFAULT_OUTPUT_ENTRIES: u64 = 1 << 20;

    /// Bytes the outputs may hold (`output`, else `disk`).
    pub fn output_bytes(&self) -> u64 {
        self.output.unwrap_or(self.disk)
    }

    /// Entries the outputs may hold.
    pub fn output_entries(&self) -> u64 {
        self.output_entries.unwrap_or(Self::DEFAULT_OUTPUT_ENTRIES)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            pids: Self::default_pids(),
            memory: Self::default_memory(),
            file_size: Self::default_file_size(),
            open_files: Self::default_open_files(),
            disk: Self::default_disk(),
            reads: Self::default_reads(),
            log: Self::default_log(),
            fetch: Self::default_fetch(),
            output: None,
            output_entries: None,
        }
    }
}

/// A parsed, validated action whose inputs are `I`: a resolved [`Action`]
/// (every input a digest: what an executor runs and what the action digest
/// is computed over), or an [`ActionFile`] as written, whose inputs may
/// name other actions' outputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionOf<I> {
    pub inputs: Inputs<I>,
    pub run: Run,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub outputs: Outputs,
    #[serde(default)]
    pub limits: Limits,
}

/// A resolved action: every input a digest.
pub type Action = ActionOf<Digest>;

/// An action as its file says it: inputs may be references to other
/// actions' outputs, resolved by [`crate::graph`].
pub type ActionFile = ActionOf<InputRef>;

impl ActionFile {
    /// Read and validate an action file. Relative lock paths stay relative;
    /// resolve them with [`Action::lock_path`].
    pub fn read(file: &Path) -> Result<ActionFile, ActionError> {
        let text = std::fs::read_to_string(file).map_err(|source| ActionError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        ActionFile::from_text(&text, file)
    }

    /// Parse and validate action text; `file` names it in errors.
    pub fn from_text(text: &str, file: &Path) -> Result<ActionFile, ActionError> {
        let action: ActionFile = toml::from_str(text).map_err(|e| ActionError::Parse {
            file: file.to_path_buf(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        action.validate().map_err(|message| ActionError::Invalid {
            file: file.to_path_buf(),
            message,
        })?;
        Ok(action)
    }

    /// Replace every input by what `resolve` makes of it: a reference by
    /// the digest of the output it names, a path by the atom(s) it imports
    /// as. `source` must come to exactly one tree.
    pub fn resolve<E>(
        self,
        mut resolve: impl FnMut(InputList, &InputRef) -> Result<Vec<Digest>, E>,
        one_source: impl FnOnce(&InputRef, usize) -> E,
    ) -> Result<Action, E> {
        let mut each = |list, items: Vec<InputRef>| -> Result<Vec<Digest>, E> {
            let mut out = Vec::with_capacity(items.len());
            for i in items {
                match i {
                    InputRef::Digest(d) => out.push(d),
                    other => out.extend(resolve(list, &other)?),
                }
            }
            Ok(out)
        };
        let closure = each(InputList::Closure, self.inputs.closure)?;
        let toolchain = each(InputList::Toolchain, self.inputs.toolchain)?;
        let source = match self.inputs.source {
            None => None,
            Some(i) => {
                let got = each(InputList::Source, vec![i.clone()])?;
                match got.as_slice() {
                    [d] => Some(*d),
                    _ => return Err(one_source(&i, got.len())),
                }
            }
        };
        Ok(ActionOf {
            inputs: Inputs {
                closure,
                toolchain,
                source,
            },
            run: self.run,
            network: self.network,
            outputs: self.outputs,
            limits: self.limits,
        })
    }

    /// The references to other actions' outputs, in input order.
    pub fn references(&self) -> impl Iterator<Item = (InputList, &Path, &OutputName)> {
        self.inputs.iter().filter_map(|(list, i)| match i {
            InputRef::Output { file, output } => Some((list, file.as_path(), output)),
            _ => None,
        })
    }

    /// The paths to import, in input order.
    pub fn paths(&self) -> impl Iterator<Item = (InputList, &Path)> {
        self.inputs.iter().filter_map(|(list, i)| match i {
            InputRef::Path(p) => Some((list, p.as_path())),
            _ => None,
        })
    }
}

impl Action {
    /// Read a file that must hold a resolved action (digests only), as a
    /// worker receives one.
    pub fn load(file: &Path) -> Result<Action, ActionError> {
        let text = std::fs::read_to_string(file).map_err(|source| ActionError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        Action::parse(&text, file)
    }

    /// Parse action text that must name every input by digest.
    pub fn parse(text: &str, file: &Path) -> Result<Action, ActionError> {
        let invalid = |message| ActionError::Invalid {
            file: file.to_path_buf(),
            message,
        };
        ActionFile::from_text(text, file)?.resolve(
            |list, r| {
                Err(invalid(format!(
                    "[inputs] {} names {r}, not a digest: here every input must be a digest (`fhsx build` resolves references and paths)",
                    list.name()
                )))
            },
            |_, _| invalid("[inputs] source must be one tree".into()),
        )
    }

    /// The action as TOML an [`Action::parse`] reads back unchanged.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// The action digest: BLAKE3 of the canonical JSON encoding (keys sorted,
    /// no whitespace) with the lock replaced by its content digest, so equal
    /// digests mean equal inputs wherever the files live.
    pub fn digest(&self, lock_digest: Option<&Digest>) -> Digest {
        Digest::of(&self.canonical(lock_digest))
    }

    /// The command digest: the action digest of everything but the closure
    /// and toolchain lists (command, env, workdir, source, outputs, limits,
    /// network and lock). Records of one command are candidates for each
    /// other's read-set-validated cache.
    pub fn command_digest(&self, lock_digest: Option<&Digest>) -> Digest {
        let mut bare = self.clone();
        bare.inputs.closure.clear();
        bare.inputs.toolchain.clear();
        let mut bytes = b"fhsx-command\0".to_vec();
        bytes.extend(bare.canonical(lock_digest));
        Digest::of(&bytes)
    }

    pub fn canonical(&self, lock_digest: Option<&Digest>) -> Vec<u8> {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(net) = v.get_mut("network").and_then(|n| n.as_object_mut()) {
            net.remove("lock");
            if let Some(d) = lock_digest {
                net.insert(
                    "lock_digest".into(),
                    serde_json::Value::String(d.to_string()),
                );
            }
        }
        // serde_json's map is a BTreeMap without the preserve_order feature:
        // keys come out sorted.
        serde_json::to_vec(&v).unwrap_or_default()
    }
}

impl<I> ActionOf<I> {
    fn validate(&self) -> Result<(), String> {
        if self.inputs.closure.is_empty() && self.inputs.toolchain.is_empty() {
            return Err(
                "[inputs] names no closure and no toolchain: the build would have an empty root"
                    .into(),
            );
        }
        if self.run.command.is_empty() || self.run.command[0].is_empty() {
            return Err("[run] command is empty".into());
        }
        if !self.run.workdir.starts_with('/') {
            return Err(format!(
                "[run] workdir {:?} must be absolute",
                self.run.workdir
            ));
        }
        for k in self.run.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(format!("[run] env name {k:?} is not a valid variable name"));
            }
        }
        if self.run.timeout.is_zero() {
            return Err("[run] timeout must be more than zero".into());
        }
        if self.outputs.names.is_empty()
            && Path::new(&self.run.workdir).starts_with(default_workdir())
        {
            return Err("[outputs] names is empty, so there is no /build to work in: name an output, or set [run] workdir outside /build".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.outputs.names {
            if !seen.insert(n) {
                return Err(format!("[outputs] names {n:?} twice"));
            }
        }
        if let Some(o) = &self.outputs.in_place {
            if !self.outputs.names.contains(o) {
                return Err(format!(
                    "[outputs] in_place = {o:?} is not one of the output names"
                ));
            }
            if self.inputs.source.is_none() {
                return Err(format!(
                    "[outputs] in_place = {o:?} needs [inputs] source: it is the tree the build works in"
                ));
            }
        }
        self.validate_placement()?;
        if self.network.mode != NetworkMode::None && self.network.lock.is_none() {
            return Err("[network] mode replay/record needs `lock = \"fetch.lock\"`".into());
        }
        let l = &self.limits;
        if l.pids == 0
            || l.memory < (16 << 20)
            || l.open_files < 16
            || l.file_size == 0
            || l.disk < (8 << 20)
            || l.reads < 64
            || l.log < 4096
        {
            return Err("[limits] are too small to run anything (pids ≥ 1, memory ≥ 16 MiB, open_files ≥ 16, file_size ≥ 1, disk ≥ 8 MiB, reads ≥ 64, log ≥ 4096)".into());
        }
        Ok(())
    }

    /// `[outputs] at`: every output placed, each on a path of its own
    /// that no other lies within, and no `/build` to work in.
    fn validate_placement(&self) -> Result<(), String> {
        let o = &self.outputs;
        if !o.placed() {
            return Ok(());
        }
        for (name, path) in &o.at {
            if !o.names.contains(name) {
                return Err(format!(
                    "[outputs] at.{name} is not one of the output names"
                ));
            }
            check_placement(name, path)?;
        }
        for name in &o.names {
            if !o.at.contains_key(name) {
                return Err(format!(
                    "[outputs] at places some outputs but not {name}: place every output, or none (then each is /build/NAME)"
                ));
            }
        }
        for (a, pa) in &o.at {
            for (b, pb) in &o.at {
                if a != b && (pa == pb || pb.starts_with(&format!("{pa}/"))) {
                    return Err(format!(
                        "[outputs] at.{b} = {pb:?} lies within at.{a} = {pa:?}: one output's directory cannot hold another's"
                    ));
                }
            }
        }
        if o.names.is_empty() && (o.in_place.is_some() || self.inputs.source.is_some()) {
            return Err(
                "[outputs] names is empty, so there is no /build and no /build/src: give the tree the build works in as part of the closure instead of [inputs] source"
                    .into(),
            );
        }
        if o.in_place.is_some() || self.inputs.source.is_some() {
            return Err(
                "[outputs] at places the outputs in the root, where there is no /build/src: give the tree the build works in as part of the closure instead of [inputs] source (and no in_place)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The lock file, resolved against the directory holding the action file.
    pub fn lock_path(&self, action_file: &Path) -> Option<PathBuf> {
        self.network.lock.as_ref().map(|l| {
            if l.is_absolute() {
                l.clone()
            } else {
                action_file.parent().unwrap_or(Path::new(".")).join(l)
            }
        })
    }
}

mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Duration::from_secs(s)),
            Raw::Text(t) => parse(&t).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "bad duration {t:?}: use a number with s, m or h (\"90s\", \"20m\", \"2h\")"
                ))
            }),
        }
    }

    pub fn parse(t: &str) -> Option<Duration> {
        let t = t.trim();
        let (num, mul) = match t.char_indices().last()? {
            (i, 's') => (&t[..i], 1),
            (i, 'm') => (&t[..i], 60),
            (i, 'h') => (&t[..i], 3600),
            _ => (t, 1),
        };
        num.trim()
            .parse::<u64>()
            .ok()?
            .checked_mul(mul)
            .map(Duration::from_secs)
    }
}

pub use duration_str::parse as parse_duration;

/// Sizes in `[limits]`: bytes, or text with a unit.
mod size {
    use serde::{Deserialize, Deserializer};

    const UNITS: &[(&str, u64)] = &[
        ("B", 1),
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
        ("kB", 1_000),
        ("KB", 1_000),
        ("MB", 1_000_000),
        ("GB", 1_000_000_000),
        ("TB", 1_000_000_000_000),
    ];

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }

    pub fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(n),
            Raw::Text(t) => parse(&t).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "bad size {t:?}: write bytes (67108864) or a number with one of B, KiB, MiB, GiB, TiB (powers of 1024) or kB, MB, GB, TB (of 1000): \"64 MiB\", \"1.5 GiB\""
                ))
            }),
        }
    }

    pub fn some_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        bytes(d).map(Some)
    }

    /// `"64 MiB"`, `"1.5GiB"`, `"100 MB"`: whole bytes (a fraction of a
    /// byte is dropped), or `None` for anything else or past `u64`.
    pub fn parse(t: &str) -> Option<u64> {
        let t = t.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (num, unit) = (t[..split].trim(), t[split..].trim());
        let mul = UNITS.iter().find(|(u, _)| *u == unit)?.1;
        let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
        if whole.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let whole: u128 = whole.parse().ok()?;
        let scale = 10u128.pow(frac.len() as u32);
        let frac: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().ok()?
        };
        let n = whole * u128::from(mul) + frac * u128::from(mul) / scale;
        u64::try_from(n).ok()
    }

    #[cfg(test)]
    mod tests {
        use super::parse;

        #[test]
        fn sizes_take_binary_and_decimal_units() {
            assert_eq!(parse("64 MiB"), Some(64 << 20));
            assert_eq!(parse("64MiB"), Some(64 << 20));
            assert_eq!(parse("1.5 GiB"), Some(3 << 29));
            assert_eq!(parse("100 MB"), Some(100_000_000));
            assert_eq!(parse("7 B"), Some(7));
            assert_eq!(parse("16 TiB"), Some(16 << 40));
            for bad in [
                "",
                "MiB",
                "64",
                "64 mib",
                "64 M",
                "1.2.3 GiB",
                "-1 GiB",
                ".5 GiB",
                "99999999999 TiB",
                "1.0000000001 GiB",
            ] {
                assert_eq!(parse(bad), None, "{bad:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "b3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262";

    fn parse(t: &str) -> Result<Action, ActionError> {
        Action::parse(t, Path::new("action.toml"))
    }

    #[test]
    fn minimal_action_parses_with_defaults() {
        let a = parse(&format!(
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"true\"]\ntimeout = \"20m\"\n"
        ))
        .unwrap();
        assert_eq!(a.run.timeout, Duration::from_secs(1200));
        assert_eq!(a.outputs.names, vec!["out".parse::<OutputName>().unwrap()]);
        assert_eq!(a.network.mode, NetworkMode::None);
        assert_eq!(a.run.workdir, "/build");
    }

    #[test]
    fn errors_carry_line_numbers_and_causes() {
        let e = parse(&format!(
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"x\"]\nbogus = 1\n"
        ))
        .unwrap_err();
        let m = e.to_string();
        assert!(m.contains("line 5") && m.contains("bogus"), "{m}");
        let e =
            parse("[inputs]\nclosure = [\"b3:nothex\"]\n[run]\ncommand = [\"x\"]\n").unwrap_err();
        let m = e.to_string();
        assert!(m.contains("line 2") && m.contains("invalid digest"), "{m}");
        let e = parse("[inputs\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        let e = parse(&format!(
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = []\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("command is empty"));
        let e = parse(&format!(
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"x\"]\n[outputs]\nnames = [\"../x\"]\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("output name \"../x\""), "{e}");
        let e = parse(&format!(
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"x\"]\n[network]\nmode = \"replay\"\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("lock"));
    }

    #[test]
    fn digest_is_stable_and_input_sensitive() {
        let t = format!("[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"a\"]\nenv = {{ B = \"1\", A = \"2\" }}\n");
        let a = parse(&t).unwrap();
        let b = parse(&t.replace("B = \"1\", A = \"2\"", "A = \"2\", B = \"1\"")).unwrap();
        assert_eq!(a.digest(None), b.digest(None));
        let c = parse(&t.replace("[\"a\"]", "[\"b\"]")).unwrap();
        assert_ne!(a.digest(None), c.digest(None));
        let lock = Digest::of(b"lock");
        assert_ne!(a.digest(None), a.digest(Some(&lock)));
    }

    #[test]
    fn sizes_with_units_are_the_same_action_as_their_bytes() {
        let t = |limits: &str| {
            parse(&format!(
                "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"a\"]\n[limits]\n{limits}\n"
            ))
        };
        let units = t("disk = \"64 MiB\"\nmemory = \"1.5 GiB\"\noutput = \"10 MB\"").unwrap();
        let bytes = t("disk = 67108864\nmemory = 1610612736\noutput = 10000000").unwrap();
        assert_eq!(units.limits, bytes.limits);
        assert_eq!(units.digest(None), bytes.digest(None));
        let e = t("disk = \"64 megabytes\"").unwrap_err().to_string();
        assert!(
            e.contains("line 6")
                && e.contains("bad size \"64 megabytes\"")
                && e.contains("\"64 MiB\""),
            "{e}"
        );
    }

    #[test]
    fn inputs_may_name_other_actions_outputs() {
        let t = format!(
            "[inputs]\nclosure = [\"{D}\", \"../fetch.toml#out\"]\nsource = \"a#b#dev\"\n[run]\ncommand = [\"x\"]\n[outputs]\nnames = [\"out\", \"dev\"]\n"
        );
        let f = ActionFile::from_text(&t, Path::new("dir/a.toml")).unwrap();
        let refs: Vec<String> = f
            .references()
            .map(|(l, p, o)| format!("{} {} {o}", l.name(), p.display()))
            .collect();
        assert_eq!(refs, ["closure ../fetch.toml out", "source a#b dev"]);
        // A resolved action can only come from digests.
        let e = Action::parse(&t, Path::new("a.toml")).unwrap_err();
        assert!(e.to_string().contains("../fetch.toml#out"), "{e}");
        let resolved = f
            .resolve(|_, _| Ok::<_, ()>(vec![Digest::of(b"x")]), |_, _| ())
            .unwrap();
        assert_eq!(resolved.inputs.closure[1], Digest::of(b"x"));
        // What a worker is sent parses back to the same action.
        let back = Action::parse(&resolved.to_toml(), Path::new("sent.toml")).unwrap();
        assert_eq!(back, resolved);
    }

    #[test]
    fn outputs_placed_in_the_root_are_checked_where_they_are_parsed() {
        let t = format!(
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"x\"]\nworkdir = \"/w/p\"\n[outputs]\nnames = [\"dir0\", \"dir1\"]\nat = {{ dir0 = \"/w/p\", dir1 = \"/install\" }}\n"
        );
        let a = parse(&t).unwrap();
        assert!(a.outputs.placed());
        assert_eq!(a.outputs.path_of(&"dir1".parse().unwrap()), "/install");
        assert!(String::from_utf8_lossy(&a.canonical(None)).contains("/install"));
        // Unset, it is not in the digest: actions written before it keep theirs.
        let plain = parse(&format!(
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"x\"]\n"
        ))
        .unwrap();
        assert!(!String::from_utf8_lossy(&plain.canonical(None)).contains("\"at\""));
        assert_eq!(plain.outputs.path_of(&"out".parse().unwrap()), "/build/out");
        for (from, to, says) in [
            ("\"/install\" }", "\"/\" }", "is the root"),
            ("\"/install\" }", "\"install\" }", "not an absolute path"),
            ("\"/install\" }", "\"/a/../b\" }", "not a normal path"),
            ("\"/install\" }", "\"/install/\" }", "not a normal path"),
            ("\"/install\" }", "\"/tmp/x\" }", "lies in /tmp"),
            ("\"/install\" }", "\"/proc\" }", "lies in /proc"),
            ("\"/install\" }", "\"/w/p/q\" }", "lies within at.dir0"),
            ("\"/install\" }", "\"/w/p\" }", "lies within"),
            (", dir1 = \"/install\"", "", "but not dir1:"),
            ("dir1 = ", "dir2 = ", "not one of the output names"),
        ] {
            let bad = t.replace(from, to);
            let e = parse(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{from} → {to}: {e}");
        }
        let with_source = t.replace("[run]", &format!("source = \"{D}\"\n[run]"));
        let e = parse(&with_source).unwrap_err().to_string();
        assert!(e.contains("no /build/src"), "{e}");
        // An action that makes nothing has no /build either.
        let nothing = format!(
            "[inputs]\nclosure = [\"{D}\"]\nsource = \"{D}\"\n[run]\ncommand = [\"x\"]\nworkdir = \"/w\"\n[outputs]\nnames = []\n"
        );
        let e = parse(&nothing).unwrap_err().to_string();
        assert!(e.contains("names is empty, so there is no /build"), "{e}");
    }

    #[test]
    fn in_place_outputs_start_as_the_source() {
        let t = format!(
            "[inputs]\nclosure = [\"{D}\"]\nsource = \"{D}\"\n[run]\ncommand = [\"x\"]\n[outputs]\nnames = [\"out\"]\nin_place = \"out\"\n"
        );
        let a = parse(&t).unwrap();
        assert_eq!(a.outputs.source_dir(), "out");
        assert_eq!(Action::parse(&a.to_toml(), Path::new("b.toml")).unwrap(), a);
        // Without it the canonical form (and so every existing digest) is unchanged.
        let plain = parse(&t.replace("in_place = \"out\"\n", "")).unwrap();
        assert_eq!(plain.outputs.source_dir(), "src");
        assert!(!String::from_utf8_lossy(&plain.canonical(None)).contains("in_place"));
        assert_ne!(plain.digest(None), a.digest(None));
        let e = parse(&t.replace("in_place = \"out\"", "in_place = \"dev\"")).unwrap_err();
        assert!(e.to_string().contains("not one of the output names"), "{e}");
        let e = parse(&t.replace(&format!("source = \"{D}\"\n"), "")).unwrap_err();
        assert!(e.to_string().contains("needs [inputs] source"), "{e}");
    }

    #[test]
    fn bad_inputs_and_output_names_are_refused_with_the_fix() {
        for (inputs, outputs, want) in [
            ("\"sha256:abc\"", "\"out\"", "neither a digest"),
            ("\"f.toml#Out\"", "\"out\"", "output name \"Out\""),
            ("\"#out\"", "\"out\"", "names no action file"),
            (&format!("\"{D}\""), "\"src\"", "not one of"),
            (&format!("\"{D}\""), "\"out\", \"out\"", "twice"),
            (&format!("\"{D}\""), "", "no /build to work in"),
            (&format!("\"{D}\""), "\"PATH\"", "lower-case"),
        ] {
            let t = format!("[inputs]\nclosure = [{inputs}]\n[run]\ncommand = [\"x\"]\n[outputs]\nnames = [{outputs}]\n");
            let e = ActionFile::from_text(&t, Path::new("a.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{inputs} {outputs}: {e}");
        }
        let old = format!("[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"x\"]\n[outputs]\npaths = [\"out\"]\n");
        let e = ActionFile::from_text(&old, Path::new("a.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("paths") && e.contains("names"), "{e}");
    }
}
