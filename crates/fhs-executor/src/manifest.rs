//! The interface manifest: what each output file is, and for ELF files what
//! they link against — the facts a later composition needs without opening
//! the files again.

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::{Digest, Node};
use serde::Serialize;

use crate::Error;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileKind {
    ElfExecutable,
    ElfSharedObject,
    ElfOther,
    Script,
    Header,
    PkgConfig,
    Other,
}

#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub path: String,
    pub kind: FileKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soname: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runpath: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    pub format: u32,
    pub files: Vec<Entry>,
}

/// Derive the manifest of the tree `root` and store it; returns its digest.
pub fn derive_and_store(store: &LocalStore, root: &Digest) -> Result<(Manifest, Digest), Error> {
    let mut files = Vec::new();
    walk(store, root, "", &mut files)?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let m = Manifest { format: 1, files };
    let bytes = serde_json::to_vec(&m).map_err(|e| Error::Other(e.to_string()))?;
    let d = store.put_blob(&bytes)?;
    Ok((m, d))
}

fn walk(store: &LocalStore, dir: &Digest, at: &str, out: &mut Vec<Entry>) -> Result<(), Error> {
    let d = store.get_directory(dir)?;
    for (name, node) in d.entries() {
        let path = if at.is_empty() {
            name.to_string()
        } else {
            format!("{at}/{name}")
        };
        match node {
            Node::Directory { digest, .. } => walk(store, digest, &path, out)?,
            Node::File { digest, .. } => {
                let bytes = store.read_blob(digest).map_err(|e| e.at_path(&path))?;
                out.push(classify(&path, &bytes));
            }
            Node::Symlink { .. } => {}
        }
    }
    Ok(())
}

/// Classify one file by its path and bytes.
pub fn classify(path: &str, bytes: &[u8]) -> Entry {
    let mut e = Entry {
        path: path.to_owned(),
        kind: FileKind::Other,
        soname: None,
        needed: vec![],
        interpreter: None,
        runpath: vec![],
    };
    if bytes.starts_with(b"\x7fELF") {
        e.kind = FileKind::ElfOther;
        if let Ok(elf) = goblin::elf::Elf::parse(bytes) {
            use goblin::elf::header::{ET_DYN, ET_EXEC};
            e.soname = elf.soname.map(str::to_owned);
            e.needed = elf.libraries.iter().map(|s| (*s).to_owned()).collect();
            e.interpreter = elf.interpreter.map(str::to_owned);
            e.runpath = elf
                .runpaths
                .iter()
                .chain(elf.rpaths.iter())
                .flat_map(|r| r.split(':'))
                .map(str::to_owned)
                .collect();
            const DF_1_PIE: u64 = 0x0800_0000;
            let pie = elf
                .dynamic
                .as_ref()
                .is_some_and(|d| d.info.flags_1 & DF_1_PIE != 0);
            e.kind = match elf.header.e_type {
                ET_EXEC => FileKind::ElfExecutable,
                // ET_DYN is both: a PIE executable says so in DT_FLAGS_1; a
                // library has a SONAME (libc has an interpreter too).
                ET_DYN if pie => FileKind::ElfExecutable,
                ET_DYN if e.soname.is_some() => FileKind::ElfSharedObject,
                ET_DYN if e.interpreter.is_some() => FileKind::ElfExecutable,
                ET_DYN => FileKind::ElfSharedObject,
                _ => FileKind::ElfOther,
            };
        }
    } else if let Some(rest) = bytes.strip_prefix(b"#!") {
        e.kind = FileKind::Script;
        let line = rest.split(|b| *b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        e.interpreter = line.split_whitespace().next().map(str::to_owned);
    } else if path.ends_with(".pc") && path.contains("pkgconfig/") {
        e.kind = FileKind::PkgConfig;
    } else if [".h", ".hh", ".hpp", ".hxx"]
        .iter()
        .any(|s| path.ends_with(s))
    {
        e.kind = FileKind::Header;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_real_host_binaries() {
        let sh = std::fs::read("/bin/sh").expect("/bin/sh");
        let e = classify("bin/sh", &sh);
        assert_eq!(e.kind, FileKind::ElfExecutable);
        assert!(
            e.interpreter
                .as_deref()
                .is_some_and(|i| i.contains("ld-linux")),
            "{e:?}"
        );
        assert!(e.needed.iter().any(|n| n.starts_with("libc.so")), "{e:?}");
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let e = classify("lib/libc.so.6", &libc);
        assert_eq!(e.kind, FileKind::ElfSharedObject);
        assert_eq!(e.soname.as_deref(), Some("libc.so.6"));
        assert_eq!(
            classify("bin/x", b"#!/usr/bin/env python3\n")
                .interpreter
                .as_deref(),
            Some("/usr/bin/env")
        );
        assert_eq!(classify("include/a.h", b"int x;").kind, FileKind::Header);
        assert_eq!(
            classify("lib/pkgconfig/z.pc", b"Name: z").kind,
            FileKind::PkgConfig
        );
    }
}
