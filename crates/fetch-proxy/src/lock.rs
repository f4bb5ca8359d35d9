//! The lock file, `fetch.lock`: the recorded fetch set.
//!
//! TOML, entries sorted by URL then method, no timestamps: the same set of
//! entries always serialises to the same bytes. Each entry holds the
//! normalised method and URL, the status, the allow-listed response headers,
//! the body's BLAKE3 (its CAS name) and SHA-256, and its size. Nothing a
//! client sent is stored beyond the normalised URL, which carries no
//! userinfo and no signed-URL secrets (see [`crate::url`]).

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

use castore::{BlobStore, Digest, LocalStore};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::url::NormUrl;
use crate::Error;

/// The response headers a lock keeps (lower-case). `content-encoding` is
/// kept only for an encoding the proxy could not decode.
pub const ALLOWED_HEADERS: &[&str] = &[
    "content-encoding",
    "content-type",
    "etag",
    "last-modified",
    "location",
];

/// The lock format version this crate reads and writes.
pub const LOCK_VERSION: u32 = 1;

/// One recorded response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub method: String,
    pub url: String,
    pub status: u16,
    pub size: u64,
    pub blake3: Digest,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

impl Entry {
    pub fn key(&self) -> Key {
        Key {
            url: self.url.clone(),
            method: self.method.clone(),
        }
    }
}

/// What a lock is indexed by. Ordered by URL, then method.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub url: String,
    pub method: String,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.url)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LockFile {
    version: u32,
    #[serde(default, rename = "entry")]
    entries: Vec<Entry>,
}

/// The recorded fetch set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lock {
    entries: BTreeMap<Key, Entry>,
}

const HEADER: &str = "# fetch.lock: the recorded fetch set of fhsx's fetch proxy.\n# Written by `fhsx proxy --mode record`; checked by `fhsx lock verify`.\n";

impl Lock {
    pub fn new() -> Self {
        Lock::default()
    }

    /// Read a lock file; a missing file is an empty lock.
    pub fn load_or_empty(path: &Path) -> Result<Self, Error> {
        match std::fs::read_to_string(path) {
            Ok(s) => Lock::parse(&s).map_err(|e| match e {
                Error::BadLock { reason, .. } => Error::BadLock {
                    path: path.to_path_buf(),
                    reason,
                },
                other => other,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lock::new()),
            Err(e) => Err(Error::io("read lock", path, e)),
        }
    }

    /// Read a lock file that must exist.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let s = std::fs::read_to_string(path).map_err(|e| Error::io("read lock", path, e))?;
        Lock::parse(&s).map_err(|e| match e {
            Error::BadLock { reason, .. } => Error::BadLock {
                path: path.to_path_buf(),
                reason,
            },
            other => other,
        })
    }

    /// Parse and validate lock text.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::BadLock {
            path: Default::default(),
            reason,
        };
        let f: LockFile = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if f.version != LOCK_VERSION {
            return Err(bad(format!(
                "version {} is not supported (this fhsx reads version {LOCK_VERSION})",
                f.version
            )));
        }
        let mut lock = Lock::new();
        for e in f.entries {
            if e.method.is_empty() || !e.method.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(bad(format!("entry {}: bad method {:?}", e.url, e.method)));
            }
            let norm = NormUrl::parse(&e.url)
                .map_err(|err| bad(format!("entry {}: {err}", e.url)))?
                .to_string();
            if norm != e.url {
                return Err(bad(format!(
                    "entry {}: URL is not normalised (expected {norm})",
                    e.url
                )));
            }
            if !(100..=599).contains(&e.status) {
                return Err(bad(format!("entry {}: bad status {}", e.url, e.status)));
            }
            if e.sha256.len() != 64
                || !e
                    .sha256
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            {
                return Err(bad(format!(
                    "entry {}: sha256 must be 64 lower-case hex digits",
                    e.url
                )));
            }
            for h in e.headers.keys() {
                if !ALLOWED_HEADERS.contains(&h.as_str()) {
                    return Err(bad(format!(
                        "entry {}: header {h:?} is not one a lock keeps",
                        e.url
                    )));
                }
            }
            let key = e.key();
            if lock.entries.insert(key.clone(), e).is_some() {
                return Err(bad(format!("duplicate entry {key}")));
            }
        }
        Ok(lock)
    }

    /// The canonical text: same entries, same bytes.
    pub fn to_toml(&self) -> String {
        let f = LockFile {
            version: LOCK_VERSION,
            entries: self.entries.values().cloned().collect(),
        };
        // Serialising plain strings, integers and string maps cannot fail.
        let body = toml::to_string(&f).unwrap_or_default();
        format!("{HEADER}{body}")
    }

    /// BLAKE3 of the canonical text: what a BuildRecord names as the
    /// fetch-lock digest.
    pub fn digest(&self) -> Digest {
        Digest::of(self.to_toml().as_bytes())
    }

    /// Write atomically: temp file, fsync, rename, fsync the directory.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let text = self.to_toml();
        if std::fs::read(path).ok().as_deref() == Some(text.as_bytes()) {
            return Ok(());
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            std::fs::File::open(&dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io("write lock", path, e)
        })
    }

    pub fn get(&self, key: &Key) -> Option<&Entry> {
        self.entries.get(key)
    }

    pub fn insert(&mut self, e: Entry) -> Option<Entry> {
        self.entries.insert(e.key(), e)
    }

    pub fn remove(&mut self, key: &Key) -> Option<Entry> {
        self.entries.remove(key)
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Check every entry's blob: present, and its bytes match size, BLAKE3
    /// and SHA-256. Returns one problem per bad entry.
    pub fn verify(&self, store: &LocalStore) -> Vec<VerifyProblem> {
        let mut out = Vec::new();
        for e in self.entries.values() {
            if let Err(problem) = verify_entry(store, e) {
                out.push(VerifyProblem {
                    key: e.key(),
                    problem,
                });
            }
        }
        out
    }

    /// What changed from `self` (old) to `new`.
    pub fn diff(&self, new: &Lock) -> LockDiff {
        let mut d = LockDiff::default();
        for (k, e) in &self.entries {
            match new.entries.get(k) {
                None => d.removed.push(e.clone()),
                Some(n) if n != e => {
                    let mut fields = Vec::new();
                    if n.status != e.status {
                        fields.push(format!("status {} -> {}", e.status, n.status));
                    }
                    if n.size != e.size {
                        fields.push(format!("size {} -> {}", e.size, n.size));
                    }
                    if n.blake3 != e.blake3 {
                        fields.push(format!("blake3 {} -> {}", e.blake3, n.blake3));
                    }
                    if n.sha256 != e.sha256 {
                        fields.push(format!("sha256 {} -> {}", e.sha256, n.sha256));
                    }
                    if n.headers != e.headers {
                        fields.push(format!("headers {:?} -> {:?}", e.headers, n.headers));
                    }
                    d.changed.push((k.clone(), fields));
                }
                Some(_) => {}
            }
        }
        for (k, e) in &new.entries {
            if !self.entries.contains_key(k) {
                d.added.push(e.clone());
            }
        }
        d
    }
}

fn verify_entry(store: &LocalStore, e: &Entry) -> Result<(), String> {
    let mut r = store
        .open_blob(&e.blake3)
        .map_err(|err| castore::Chain(&err).to_string())?;
    let mut sha = sha2::Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|err| format!("read blob {}: {err}", e.blake3))?;
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
        size += n as u64;
    }
    if size != e.size {
        return Err(format!(
            "blob {} has {size} bytes, the lock says {}",
            e.blake3, e.size
        ));
    }
    let got = hex::encode(sha.finalize());
    if got != e.sha256 {
        return Err(format!(
            "blob {} has sha256 {got}, the lock says {}",
            e.blake3, e.sha256
        ));
    }
    Ok(())
}

/// A lock entry whose blob is missing or wrong.
#[derive(Clone, Debug)]
pub struct VerifyProblem {
    pub key: Key,
    pub problem: String,
}

impl fmt::Display for VerifyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.problem)
    }
}

/// Entries added, removed and changed between two locks.
#[derive(Clone, Debug, Default)]
pub struct LockDiff {
    pub added: Vec<Entry>,
    pub removed: Vec<Entry>,
    pub changed: Vec<(Key, Vec<String>)>,
}

impl LockDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl fmt::Display for LockDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.removed {
            writeln!(
                f,
                "- {} {} ({} {} bytes {})",
                e.method, e.url, e.status, e.size, e.blake3
            )?;
        }
        for e in &self.added {
            writeln!(
                f,
                "+ {} {} ({} {} bytes {})",
                e.method, e.url, e.status, e.size, e.blake3
            )?;
        }
        for (k, fields) in &self.changed {
            writeln!(f, "~ {k}")?;
            for x in fields {
                writeln!(f, "    {x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(url: &str, body: &[u8]) -> Entry {
        Entry {
            method: "GET".into(),
            url: url.into(),
            status: 200,
            size: body.len() as u64,
            blake3: Digest::of(body),
            sha256: hex::encode(sha2::Sha256::digest(body)),
            headers: [("content-type".to_string(), "text/plain".to_string())].into(),
        }
    }

    #[test]
    fn canonical_text_is_order_independent_and_round_trips() {
        let mut a = Lock::new();
        a.insert(entry("http://b/x", b"1"));
        a.insert(entry("http://a/y", b"2"));
        let mut b = Lock::new();
        b.insert(entry("http://a/y", b"2"));
        b.insert(entry("http://b/x", b"1"));
        assert_eq!(a.to_toml(), b.to_toml());
        let back = Lock::parse(&a.to_toml()).map_err(|e| e.to_string());
        assert_eq!(back, Ok(a.clone()));
        assert!(a.to_toml().find("http://a/y") < a.to_toml().find("http://b/x"));
    }

    #[test]
    fn rejects_unnormalised_and_unknown_headers() {
        let mut l = Lock::new();
        l.insert(entry("http://a/y", b"2"));
        let t = l.to_toml().replace("http://a/y", "HTTP://A/y");
        assert!(Lock::parse(&t).is_err());
        let t = l.to_toml().replace("content-type", "set-cookie");
        assert!(Lock::parse(&t).is_err());
    }

    #[test]
    fn diff_reports_changes() {
        let mut a = Lock::new();
        a.insert(entry("http://a/1", b"1"));
        a.insert(entry("http://a/2", b"2"));
        let mut b = Lock::new();
        b.insert(entry("http://a/2", b"22"));
        b.insert(entry("http://a/3", b"3"));
        let d = a.diff(&b);
        assert_eq!(d.removed.len(), 1);
        assert_eq!(d.added.len(), 1);
        assert_eq!(d.changed.len(), 1);
        assert!(a.diff(&a).is_empty());
    }
}
