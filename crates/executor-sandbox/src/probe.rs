//! Probing the host: what a path is, the mount table, what bwrap supports.
//!
//! Everything the argv depends on that comes from the host filesystem goes
//! through [`HostFs`], so a test can pin the argv with an in-memory host
//! ([`MemFs`]) while real runs use [`RealFs`].

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Debug;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use executor_core::SandboxError;

/// What a host path is, without following a final symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileKind {
    Dir,
    File,
    Symlink(PathBuf),
    /// A socket, device or fifo.
    Other,
}

/// The host filesystem as the argv builder sees it.
pub trait HostFs: Send + Sync + Debug {
    /// `lstat`: what `path` is, or `None` if it does not exist.
    fn kind(&self, path: &Path) -> Option<FileKind>;
    /// The path with every symlink resolved, or `None` if it does not resolve.
    fn canonicalize(&self, path: &Path) -> Option<PathBuf>;
    /// The names in a directory, sorted by bytes.
    fn read_dir(&self, path: &Path) -> Result<Vec<OsString>, SandboxError>;
    /// The mount points of the host, from `/proc/self/mountinfo`.
    fn mount_points(&self) -> Result<Vec<PathBuf>, SandboxError>;
}

/// The real host.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl HostFs for RealFs {
    fn kind(&self, path: &Path) -> Option<FileKind> {
        let md = std::fs::symlink_metadata(path).ok()?;
        let ft = md.file_type();
        Some(if ft.is_dir() {
            FileKind::Dir
        } else if ft.is_file() {
            FileKind::File
        } else if ft.is_symlink() {
            FileKind::Symlink(std::fs::read_link(path).ok()?)
        } else {
            FileKind::Other
        })
    }

    fn canonicalize(&self, path: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(path).ok()
    }

    fn read_dir(&self, path: &Path) -> Result<Vec<OsString>, SandboxError> {
        let rd = std::fs::read_dir(path).map_err(|source| SandboxError::Io {
            what: format!("listing {}", path.display()),
            source,
        })?;
        let mut names = Vec::new();
        for e in rd {
            let e = e.map_err(|source| SandboxError::Io {
                what: format!("listing {}", path.display()),
                source,
            })?;
            names.push(e.file_name());
        }
        names.sort();
        Ok(names)
    }

    fn mount_points(&self) -> Result<Vec<PathBuf>, SandboxError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = read_proc_text(path).map_err(|source| SandboxError::MountProbe {
            path: path.to_path_buf(),
            source,
        })?;
        let table = parse_mountinfo(&text);
        let points = table.iter().map(|m| m.mount_point.clone()).collect();
        *LAST_MOUNTINFO.lock().unwrap_or_else(|p| p.into_inner()) = Some(table);
        Ok(points)
    }
}

/// The mount table [`RealFs::mount_points`] parsed last, for the one
/// other reader in a run: where the cgroup hierarchies are mounted
/// (`reaper`), looked up once per process. Formatting the table is the
/// costly part (~0.3 ms of a `fhsx run` here, cgroup v1 options and all),
/// and the second read gave the same table.
static LAST_MOUNTINFO: std::sync::Mutex<Option<Vec<MountInfo>>> = std::sync::Mutex::new(None);

/// Take the table [`RealFs::mount_points`] parsed last, if it parsed one.
pub(crate) fn take_last_mountinfo() -> Option<Vec<MountInfo>> {
    LAST_MOUNTINFO
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
}

/// A `/proc` file's text, read in one `read` where it fits in 64 KiB.
/// `read_to_string` starts with a 32-byte read (such a file's size says
/// 0), then doubles: `/proc/self/mountinfo` took eight reads, each
/// formatting the table again up to where it stopped.
pub(crate) fn read_proc_text(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(64 << 10);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub root: PathBuf,
    /// The file system's own options (a cgroup v1 hierarchy's name its
    /// controllers); empty if the line has none.
    pub super_options: String,
}

/// Parse `/proc/self/mountinfo`; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || sep + 1 >= fields.len() {
            continue;
        }
        out.push(MountInfo {
            root: PathBuf::from(unescape_octal(fields[3])),
            mount_point: PathBuf::from(unescape_octal(fields[4])),
            fs_type: fields[sep + 1].to_string(),
            super_options: fields.get(sep + 3).unwrap_or(&"").to_string(),
        });
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// An in-memory host for deterministic argv tests.
#[derive(Debug, Clone, Default)]
pub struct MemFs {
    entries: BTreeMap<PathBuf, FileKind>,
    mounts: Vec<PathBuf>,
}

impl MemFs {
    pub fn new() -> Self {
        Self::default()
    }
    /// Add a directory (and its parents).
    pub fn dir(mut self, p: impl Into<PathBuf>) -> Self {
        let p = p.into();
        self.add_parents(&p);
        self.entries.insert(p, FileKind::Dir);
        self
    }
    /// Add a regular file (and its parents).
    pub fn file(mut self, p: impl Into<PathBuf>) -> Self {
        let p = p.into();
        self.add_parents(&p);
        self.entries.insert(p, FileKind::File);
        self
    }
    /// Add a symlink (and its parents).
    pub fn symlink(mut self, p: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        let p = p.into();
        self.add_parents(&p);
        self.entries.insert(p, FileKind::Symlink(target.into()));
        self
    }
    /// Add a socket, device or fifo (and its parents).
    pub fn other(mut self, p: impl Into<PathBuf>) -> Self {
        let p = p.into();
        self.add_parents(&p);
        self.entries.insert(p, FileKind::Other);
        self
    }
    /// Add a mount point to the fake mount table.
    pub fn mount(mut self, p: impl Into<PathBuf>) -> Self {
        self.mounts.push(p.into());
        self
    }
    fn add_parents(&mut self, p: &Path) {
        let mut cur = p.parent();
        while let Some(d) = cur {
            self.entries.entry(d.to_path_buf()).or_insert(FileKind::Dir);
            cur = d.parent();
        }
    }
}

impl HostFs for MemFs {
    fn kind(&self, path: &Path) -> Option<FileKind> {
        self.entries.get(path).cloned()
    }
    fn canonicalize(&self, path: &Path) -> Option<PathBuf> {
        let mut out = PathBuf::from("/");
        let mut hops = 0;
        let mut pending: Vec<PathBuf> = path
            .components()
            .rev()
            .map(|c| PathBuf::from(c.as_os_str()))
            .collect();
        while let Some(c) = pending.pop() {
            match c.components().next()? {
                Component::RootDir => out = PathBuf::from("/"),
                Component::CurDir => {}
                Component::ParentDir => {
                    out.pop();
                }
                Component::Normal(n) => {
                    let next = out.join(n);
                    match self.entries.get(&next)? {
                        FileKind::Symlink(t) => {
                            hops += 1;
                            if hops > 40 {
                                return None;
                            }
                            pending
                                .extend(t.components().rev().map(|c| PathBuf::from(c.as_os_str())));
                        }
                        _ => out = next,
                    }
                }
                Component::Prefix(_) => return None,
            }
        }
        Some(out)
    }
    fn read_dir(&self, path: &Path) -> Result<Vec<OsString>, SandboxError> {
        Ok(self
            .entries
            .keys()
            .filter(|k| k.parent() == Some(path))
            .filter_map(|k| k.file_name().map(|n| n.to_os_string()))
            .collect())
    }
    fn mount_points(&self) -> Result<Vec<PathBuf>, SandboxError> {
        Ok(self.mounts.clone())
    }
}

/// The optional bwrap flags this host's bubblewrap understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwrapFeatures {
    /// `--disable-userns` (bubblewrap >= 0.8).
    pub disable_userns: bool,
}

impl BwrapFeatures {
    /// Everything on: what the golden test pins.
    pub const ALL: BwrapFeatures = BwrapFeatures {
        disable_userns: true,
    };

    /// Which optional flags this bwrap knows, once per process: by looking
    /// for the flag's name in the executable (its option table holds it),
    /// else by asking `bwrap --help` (a process start costs more than the
    /// whole scan).
    ///
    /// The executable is mapped, not read: reading its 72 KB into a fresh
    /// buffer cost ~90 µs of a `fhsx run` (the copy, and a page fault for
    /// every page of the buffer), the mapping ~15 µs (a few faults on
    /// page-cache pages already there).
    pub fn probe(bwrap: &Path) -> Result<BwrapFeatures, SandboxError> {
        static CACHE: OnceLock<BwrapFeatures> = OnceLock::new();
        if let Some(f) = CACHE.get() {
            return Ok(*f);
        }
        if let Some(found) = executable_contains(bwrap, b"--disable-userns") {
            let f = BwrapFeatures {
                disable_userns: found,
            };
            let _ = CACHE.set(f);
            return Ok(f);
        }
        let out = std::process::Command::new(bwrap)
            .arg("--help")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|source| SandboxError::Spawn {
                what: "probing bwrap --help",
                source,
            })?;
        let help = String::from_utf8_lossy(&out.stdout);
        let f = BwrapFeatures {
            disable_userns: help.contains("--disable-userns"),
        };
        let _ = CACHE.set(f);
        Ok(f)
    }
}

/// Whether `needle` occurs in the executable at `path`, or `None` if it
/// cannot be mapped.
fn executable_contains(path: &Path, needle: &[u8]) -> Option<bool> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a private read-only mapping of an installed executable,
    // dropped before this returns. Package managers replace executables
    // by rename, not by rewriting them in place (the kernel refuses
    // writes to a running one), so the pages do not change under the
    // search. Only a file truncated by hand during these microseconds
    // could end this process (SIGBUS) — the one risk a mapping adds over
    // a read, taken for a probe that runs before any build starts.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    Some(contains(&map, needle))
}

/// Whether `needle` occurs in `hay` (a binary of ~72 KB). memchr's
/// vectorised search: the byte-by-byte scan it replaced was 1-2% of a
/// `fhsx run`'s own CPU.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

/// Find `bwrap` on `PATH` (or the standard locations).
pub fn find_bwrap() -> Result<PathBuf, SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/bin".into(), "/bin".into()]);
    for d in dirs {
        let p = d.join("bwrap");
        if let Ok(md) = std::fs::metadata(&p) {
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return Ok(p);
            }
        }
    }
    Err(SandboxError::BwrapMissing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_finds_a_needle_anywhere_and_only_whole() {
        assert!(contains(b"xx--disable-userns\0", b"--disable-userns"));
        assert!(contains(b"--disable-userns", b"--disable-userns"));
        assert!(!contains(b"--disable-user", b"--disable-userns"));
        assert!(!contains(b"", b"-x"));
        assert!(contains(b"a-b--x", b"--x"));
    }

    #[test]
    fn mountinfo_parses_and_unescapes() {
        let t = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                 41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                 50 27 0:40 /x /mnt/a\\040b rw shared:1 - fuse.castore c rw\n\
                 garbage\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].fs_type, "cgroup2");
        assert_eq!(m[1].super_options, "rw");
        assert_eq!(m[2].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!(m[2].root, PathBuf::from("/x"));
    }

    #[test]
    fn memfs_canonicalizes_through_symlinks() {
        let fs = MemFs::new()
            .dir("/usr/bin")
            .symlink("/bin", "usr/bin")
            .symlink("/w/l", "/usr");
        assert_eq!(
            fs.canonicalize(Path::new("/bin")),
            Some(PathBuf::from("/usr/bin"))
        );
        assert_eq!(
            fs.canonicalize(Path::new("/w/l/bin")),
            Some(PathBuf::from("/usr/bin"))
        );
        assert_eq!(fs.canonicalize(Path::new("/nope")), None);
    }
}
