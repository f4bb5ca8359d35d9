//! Resolving and fetching packages with the host's apt.
//!
//! Resolution asks apt's own solver what `apt-get install` would install on
//! a system with nothing installed (`-o Dir::State::status=/dev/null`,
//! `--simulate`, no recommends): the dependency closure with alternatives
//! and virtual packages chosen as apt chooses them. `apt-cache show` then
//! gives each package's archive SHA-256. Nothing is installed on the host,
//! and the host's apt configuration (sources, pinning) is what decides.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use castore::store::{DirectoryStore, LocalStore};
use castore::Digest;
use sha2::Digest as _;

use crate::toolchain::Entry;
use crate::Error;

/// What to make a toolchain of.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub packages: Vec<String>,
    /// Add Debian's Essential packages and those of priority `required`,
    /// which every Debian system has (`/bin/sh`, coreutils, `awk`, `sed`,
    /// `grep`, `locale`, …) — debootstrap's minbase set.
    pub essential: bool,
}

/// One package apt chose, with what the archive says of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Package {
    pub name: String,
    pub architecture: String,
    pub version: String,
    /// The archive's SHA-256 of the `.deb`, hex.
    pub sha256: String,
}

impl Package {
    /// `name:arch=version`, as apt takes an exact package.
    fn spec(&self) -> String {
        spec(&self.name, &self.architecture, &self.version)
    }

    /// The file name `apt-get download` gives the package.
    pub fn file_name(&self) -> String {
        format!(
            "{}_{}_{}.deb",
            self.name,
            self.version.replace(':', "%3a"),
            self.architecture
        )
    }
}

/// `name=version` for architecture-independent packages, which apt does
/// not qualify.
fn spec(name: &str, arch: &str, version: &str) -> String {
    if arch == "all" || arch.is_empty() {
        format!("{name}={version}")
    } else {
        format!("{name}:{arch}={version}")
    }
}

fn run(cmd: &mut Command) -> Result<std::process::Output, Error> {
    cmd.env("LC_ALL", "C")
        .output()
        .map_err(|source| Error::Spawn {
            command: format!("{cmd:?}"),
            source,
        })
}

/// The exact packages `req` comes to, sorted.
pub fn resolve(req: &Request) -> Result<Vec<Package>, Error> {
    let mut names: BTreeSet<String> = req.packages.iter().cloned().collect();
    if req.essential {
        names.extend(essential_set()?);
    }
    let o = run(Command::new("apt-get")
        .args([
            "install",
            "--simulate",
            "--no-install-recommends",
            "-o",
            "Dir::State::status=/dev/null",
            "-o",
            "Debug::NoLocking=1",
        ])
        .args(&names))?;
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    if let Some(missing) = err
        .lines()
        .find_map(|l| l.strip_prefix("E: Unable to locate package "))
    {
        return Err(Error::UnknownPackage(missing.trim().to_owned()));
    }
    if !o.status.success() {
        return Err(Error::Unresolvable(err.trim().to_owned()));
    }
    let chosen = parse_simulation(&out);
    if chosen.is_empty() {
        return Err(Error::Unresolvable(format!(
            "apt chose no packages for {names:?}: {}",
            err.trim()
        )));
    }
    describe(&chosen)
}

/// `(name, arch, version)` from `Inst name[:arch] (version … [arch])` lines.
fn parse_simulation(out: &str) -> Vec<(String, String, String)> {
    let mut chosen = Vec::new();
    for line in out.lines() {
        let Some(rest) = line.strip_prefix("Inst ") else {
            continue;
        };
        let Some((name, paren)) = rest.split_once(" (") else {
            continue;
        };
        let paren = paren.split_once(')').map_or(paren, |(p, _)| p);
        let version = paren.split_whitespace().next().unwrap_or_default();
        let arch = paren
            .rsplit_once('[')
            .and_then(|(_, a)| a.split_once(']'))
            .map(|(a, _)| a)
            .unwrap_or_default();
        let (name, arch) = match name.split_once(':') {
            Some((n, a)) => (n, a),
            None => (name, arch),
        };
        chosen.push((name.to_owned(), arch.to_owned(), version.to_owned()));
    }
    chosen
}

/// The archive's record of each chosen package.
fn describe(chosen: &[(String, String, String)]) -> Result<Vec<Package>, Error> {
    let specs: Vec<String> = chosen.iter().map(|(n, a, v)| spec(n, a, v)).collect();
    let o = run(Command::new("apt-cache").arg("show").args(&specs))?;
    if !o.status.success() {
        return Err(Error::Unresolvable(
            String::from_utf8_lossy(&o.stderr).trim().to_owned(),
        ));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut found = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |k: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix(": ")))
                .map(str::to_owned)
        };
        if let (Some(name), Some(version), Some(architecture), Some(sha256)) = (
            field("Package"),
            field("Version"),
            field("Architecture"),
            field("SHA256"),
        ) {
            found.push(Package {
                name,
                architecture,
                version,
                sha256,
            });
        }
    }
    let mut out = Vec::new();
    for (n, a, v) in chosen {
        // An `all` package is installed for the native architecture.
        let p = found
            .iter()
            .find(|p| {
                &p.name == n && &p.version == v && (&p.architecture == a || p.architecture == "all")
            })
            .ok_or_else(|| Error::Unresolvable(format!("apt-cache show knows no {n}:{a}={v}")))?;
        out.push(p.clone());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Names of the packages marked `Essential: yes` or of priority `required`.
fn essential_set() -> Result<BTreeSet<String>, Error> {
    let o = run(Command::new("apt-cache").arg("dumpavail"))?;
    let text = String::from_utf8_lossy(&o.stdout);
    let mut names = BTreeSet::new();
    for stanza in text.split("\n\n") {
        let mut name = None;
        let mut essential = false;
        for l in stanza.lines() {
            if let Some(n) = l.strip_prefix("Package: ") {
                name = Some(n.trim());
            } else if l == "Essential: yes" || l == "Priority: required" {
                essential = true;
            }
        }
        if let (Some(n), true) = (name, essential) {
            names.insert(n.to_owned());
        }
    }
    if names.is_empty() {
        return Err(Error::Unresolvable(
            "apt knows no Essential packages: run `apt-get update`".into(),
        ));
    }
    Ok(names)
}

/// Where the store remembers which atom a `.deb` (by SHA-256) imported as.
fn index_path(store: &LocalStore, sha256: &str) -> std::path::PathBuf {
    // `sha256-v2`: atoms imported before a .deb's alternatives were kept in
    // its atom are not reused.
    store.root().join("debian").join("sha256-v2").join(sha256)
}

fn known_atom(store: &LocalStore, sha256: &str) -> Option<Digest> {
    let d: Digest = std::fs::read_to_string(index_path(store, sha256))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    store.has_directory(&d).ok()?.then_some(d)
}

/// Import each package as an atom. A package whose `.deb` the store has
/// imported before (same SHA-256, atom still present) costs one lookup;
/// the rest are downloaded with `apt-get download` (which checks them
/// against the signed index), checked against the SHA-256 once more, and
/// imported. `note` hears one line per package fetched. With `cache`, the
/// `.deb`s are downloaded there (under apt's own file names) and kept, and
/// a package already there with the right SHA-256 is not downloaded again:
/// one download serves many stores.
pub fn import_packages(
    store: &LocalStore,
    packages: &[Package],
    cache: Option<&Path>,
    note: &mut dyn FnMut(&str),
) -> Result<Vec<Entry>, Error> {
    let mut entries = Vec::with_capacity(packages.len());
    let mut missing = Vec::new();
    for p in packages {
        match known_atom(store, &p.sha256) {
            Some(atom) => {
                name_atom(store, p, &atom);
                entries.push(entry(p, atom))
            }
            None => missing.push(p),
        }
    }
    if missing.is_empty() {
        return Ok(entries);
    }
    let tmp;
    let dir = match cache {
        Some(c) => {
            std::fs::create_dir_all(c).map_err(|e| Error::io("create", c, e))?;
            c
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("fhsx-debs-")
                .tempdir()
                .map_err(|e| {
                    Error::io("create a download directory in", &std::env::temp_dir(), e)
                })?;
            tmp.path()
        }
    };
    let mut fetch = Vec::new();
    for p in &missing {
        let cached = dir.join(p.file_name());
        if !(cached.is_file() && sha256_of(&cached)? == p.sha256) {
            fetch.push(p.spec());
        }
    }
    if !fetch.is_empty() {
        note(&format!(
            "downloading {} package(s) with apt-get download",
            fetch.len()
        ));
        let o = run(Command::new("apt-get")
            .current_dir(dir)
            .arg("download")
            .args(&fetch))?;
        if !o.status.success() {
            return Err(Error::Download {
                package: fetch.join(" "),
                message: String::from_utf8_lossy(&o.stderr).trim().to_owned(),
            });
        }
    }
    for p in missing {
        let path = dir.join(p.file_name());
        let got = if path.is_file() {
            sha256_of(&path)?
        } else {
            "(not downloaded)".into()
        };
        if got != p.sha256 {
            return Err(Error::Checksum {
                file: path,
                want: p.sha256.clone(),
                got,
            });
        }
        let atom = castore::import::import_path(store, &path, &())?.root;
        remember(store, &p.sha256, &atom)?;
        name_atom(store, p, &atom);
        note(&format!("imported {} {} as {atom}", p.name, p.version));
        entries.push(entry(p, atom));
    }
    entries.sort();
    Ok(entries)
}

/// The package an atom was imported from (`name version arch`), if it came
/// from `fhsx toolchain apt`.
pub fn atom_name(store: &LocalStore, atom: &Digest) -> Option<String> {
    std::fs::read_to_string(store.root().join("debian").join("atoms").join(atom.hex()))
        .ok()
        .map(|s| s.trim().to_owned())
}

fn name_atom(store: &LocalStore, p: &Package, atom: &Digest) {
    let dir = store.root().join("debian").join("atoms");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(
        dir.join(atom.hex()),
        format!("{} {} {}\n", p.name, p.version, p.architecture),
    );
}

fn entry(p: &Package, atom: Digest) -> Entry {
    Entry {
        name: p.name.clone(),
        architecture: p.architecture.clone(),
        version: p.version.clone(),
        sha256: p.sha256.clone(),
        atom,
    }
}

fn remember(store: &LocalStore, sha256: &str, atom: &Digest) -> Result<(), Error> {
    let path = index_path(store, sha256);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let tmp =
        tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io("create a file in", dir, e))?;
    std::fs::write(tmp.path(), format!("{atom}\n"))
        .map_err(|e| Error::io("write", tmp.path(), e))?;
    tmp.persist(&path)
        .map_err(|e| Error::io("replace", &path, e.error))?;
    Ok(())
}

fn sha256_of(path: &Path) -> Result<String, Error> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| Error::io("read", path, e))?;
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulation_lines_give_name_arch_and_version() {
        let out = "NOTE: x\nInst gcc-12-base (12.2.0-14+deb12u1 Debian:12.15/oldstable [amd64])\nInst libgcc-s1 (12.2.0-14+deb12u1 Debian:12.15/oldstable [amd64]) []\nInst libc6:i386 (2.36-9 Debian:12 [i386])\nConf libc6 (2.36)\nInst tzdata (2025a-0+deb12u1 Debian:12.15/oldstable [all])\n";
        assert_eq!(
            parse_simulation(out),
            vec![
                (
                    "gcc-12-base".into(),
                    "amd64".into(),
                    "12.2.0-14+deb12u1".into()
                ),
                (
                    "libgcc-s1".into(),
                    "amd64".into(),
                    "12.2.0-14+deb12u1".into()
                ),
                ("libc6".into(), "i386".into(), "2.36-9".into()),
                ("tzdata".into(), "all".into(), "2025a-0+deb12u1".into()),
            ]
        );
    }
}
