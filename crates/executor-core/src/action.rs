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
    #[error("cannot read action file {file}: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inputs {
    /// Atom roots the build depends on, in composition order.
    #[serde(default)]
    pub closure: Vec<Digest>,
    /// The toolchain composition, composed after the closure.
    #[serde(default)]
    pub toolchain: Vec<Digest>,
    /// Optional source tree, copied writable to `/build/src`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Digest>,
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outputs {
    /// Paths relative to `/build` to ingest; `out` is `$out`.
    #[serde(default = "default_outputs")]
    pub paths: Vec<String>,
}

fn default_outputs() -> Vec<String> {
    vec!["out".into()]
}

impl Default for Outputs {
    fn default() -> Self {
        Outputs {
            paths: default_outputs(),
        }
    }
}

/// Resource limits for the build. Defaults are generous but finite.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "Limits::default_pids")]
    pub pids: u64,
    /// Bytes of memory.
    #[serde(default = "Limits::default_memory")]
    pub memory: u64,
    /// Largest file the build may write, bytes.
    #[serde(default = "Limits::default_file_size")]
    pub file_size: u64,
    #[serde(default = "Limits::default_open_files")]
    pub open_files: u64,
    /// Bytes the build may keep in its scratch directory at once (all
    /// files together), enforced by a file system of that size where the
    /// host allows it.
    #[serde(default = "Limits::default_disk")]
    pub disk: u64,
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            pids: Self::default_pids(),
            memory: Self::default_memory(),
            file_size: Self::default_file_size(),
            open_files: Self::default_open_files(),
            disk: Self::default_disk(),
        }
    }
}

/// A parsed, validated action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    pub inputs: Inputs,
    pub run: Run,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub outputs: Outputs,
    #[serde(default)]
    pub limits: Limits,
}

impl Action {
    /// Read and validate an action file. Relative lock paths stay relative;
    /// resolve them with [`Action::lock_path`].
    pub fn load(file: &Path) -> Result<Action, ActionError> {
        let text = std::fs::read_to_string(file).map_err(|source| ActionError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        Action::parse(&text, file)
    }

    /// Parse and validate action text; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<Action, ActionError> {
        let action: Action = toml::from_str(text).map_err(|e| ActionError::Parse {
            file: file.to_path_buf(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        action.validate().map_err(|message| ActionError::Invalid {
            file: file.to_path_buf(),
            message,
        })?;
        Ok(action)
    }

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
        for p in &self.outputs.paths {
            let ok = !p.is_empty()
                && !p.starts_with('/')
                && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
            if !ok {
                return Err(format!(
                    "[outputs] path {p:?} must be relative to /build without `.` or `..`"
                ));
            }
        }
        if self.network.mode != NetworkMode::None && self.network.lock.is_none() {
            return Err("[network] mode replay/record needs `lock = \"fetch.lock\"`".into());
        }
        let l = &self.limits;
        if l.pids == 0
            || l.memory < (16 << 20)
            || l.open_files < 16
            || l.file_size == 0
            || l.disk < (8 << 20)
        {
            return Err("[limits] are too small to run anything (pids ≥ 1, memory ≥ 16 MiB, open_files ≥ 16, file_size ≥ 1, disk ≥ 8 MiB)".into());
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

    /// The action digest: BLAKE3 of the canonical JSON encoding (keys sorted,
    /// no whitespace) with the lock replaced by its content digest, so equal
    /// digests mean equal inputs wherever the files live.
    pub fn digest(&self, lock_digest: Option<&Digest>) -> Digest {
        Digest::of(&self.canonical(lock_digest))
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
        assert_eq!(a.outputs.paths, vec!["out"]);
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
            "[inputs]\nclosure = [\"{D}\"]\n[run]\ncommand = [\"x\"]\n[outputs]\npaths = [\"../x\"]\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("outputs"));
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
}
