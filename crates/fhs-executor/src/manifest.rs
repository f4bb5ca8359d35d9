//! The interface manifest: what each output file is, and for ELF files what
//! they link against — the facts a later composition needs without opening
//! the files again.

use std::io::Write;

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

/// The manifest's format: 2 lists the files in the tree's own order (each
/// directory's entries by name, a directory's content right after it),
/// so it is written as it is walked.
pub const FORMAT: u32 = 2;

/// Derive the manifest of the tree `root` and store it; returns its digest.
///
/// Bounded whatever the tree: the walk keeps its own stack (no recursion),
/// the manifest streams into the store as each file is classified, and a
/// file is classified from at most a few bounded reads of its blob
/// ([`classify_file`]), never read whole.
pub fn derive_and_store(store: &LocalStore, root: &Digest) -> Result<Digest, Error> {
    let mut out = std::io::BufWriter::new(store.blob_writer()?);
    let write = |e: std::io::Error| Error::Other(format!("writing the interface manifest: {e}"));
    write!(out, "{{\"format\":{FORMAT},\"files\":[").map_err(write)?;
    let mut first = true;
    // Each directory being listed: its entries still to come, its path.
    let mut stack = vec![(store.get_directory(root)?.into_entries(), String::new())];
    while let Some((entries, at)) = stack.last_mut() {
        let Some((name, node)) = entries.next() else {
            stack.pop();
            continue;
        };
        let path = if at.is_empty() {
            name.to_string()
        } else {
            format!("{at}/{name}")
        };
        match node {
            Node::Directory { digest, .. } => {
                let d = store.get_directory(&digest).map_err(|e| e.at_path(&path))?;
                stack.push((d.into_entries(), path));
            }
            Node::File { digest, .. } => {
                let blob = store
                    .blob_path(&digest)
                    .ok_or_else(|| castore::Error::Missing {
                        digest,
                        path: Some(path.clone()),
                    })?;
                let f = std::fs::File::open(&blob).map_err(|e| Error::io("open", &blob, e))?;
                let entry = classify_file(&path, &f);
                if !std::mem::take(&mut first) {
                    out.write_all(b",").map_err(write)?;
                }
                serde_json::to_writer(&mut out, &entry)
                    .map_err(|e| Error::Other(format!("writing the interface manifest: {e}")))?;
            }
            Node::Symlink { .. } => {}
        }
    }
    out.write_all(b"]}").map_err(write)?;
    let blob = out
        .into_inner()
        .map_err(|e| Error::Other(format!("writing the interface manifest: {}", e.error())))?;
    Ok(blob.finish()?.0)
}

/// Bytes read at most for any one part of an ELF file: its program
/// headers, its dynamic section, its string table. Real ones are a few KiB;
/// a file that claims more is classified without what it holds there.
const ELF_PART: u64 = 1 << 20;

/// Classify the file `f` at `path` from bounded reads of it: its first
/// 4 KiB, and for an ELF file the parts named above.
pub fn classify_file(path: &str, f: &std::fs::File) -> Entry {
    let head = read_at(f, 0, 4096).unwrap_or_default();
    let mut e = classify(path, &head);
    if e.kind == FileKind::ElfOther {
        if let Some(facts) = elf_facts(f, &head) {
            e.kind = facts.kind;
            e.soname = facts.soname;
            e.needed = facts.needed;
            e.interpreter = facts.interpreter;
            e.runpath = facts.runpath;
        }
    }
    e
}

/// Up to `len` bytes of `f` from `offset` (fewer at its end).
fn read_at(f: &std::fs::File, offset: u64, len: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut r = f;
    r.seek(SeekFrom::Start(offset)).ok()?;
    let mut buf = Vec::new();
    r.take(len).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// What an ELF file's dynamic linking says of it.
struct ElfFacts {
    kind: FileKind,
    soname: Option<String>,
    needed: Vec<String>,
    interpreter: Option<String>,
    runpath: Vec<String>,
}

fn elf_facts(f: &std::fs::File, head: &[u8]) -> Option<ElfFacts> {
    use goblin::container::{Container, Ctx, Endian};
    use goblin::elf::header::{EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB, ET_DYN, ET_EXEC};
    use goblin::elf::program_header::{PT_DYNAMIC, PT_INTERP, PT_LOAD};
    let h = goblin::elf::Elf::parse_header(head).ok()?;
    let wide = h.e_ident[EI_CLASS] == ELFCLASS64;
    let le = h.e_ident[EI_DATA] == ELFDATA2LSB;
    let ctx = Ctx::new(
        if wide {
            Container::Big
        } else {
            Container::Little
        },
        Endian::from(le),
    );
    let ph_len = u64::from(h.e_phnum) * u64::from(h.e_phentsize);
    let ph_bytes = read_at(f, h.e_phoff, ph_len.min(ELF_PART))?;
    let phdrs =
        goblin::elf::ProgramHeader::parse(&ph_bytes, 0, usize::from(h.e_phnum), ctx).ok()?;
    let segment = |p: &goblin::elf::ProgramHeader| read_at(f, p.p_offset, p.p_filesz.min(ELF_PART));
    let c_string = |b: &[u8]| {
        let b = b.split(|c| *c == 0).next().unwrap_or_default();
        String::from_utf8_lossy(b).into_owned()
    };
    let interpreter = phdrs
        .iter()
        .find(|p| p.p_type == PT_INTERP)
        .and_then(&segment)
        .map(|b| c_string(&b));
    // The dynamic section: (tag, value) words.
    let word = |b: &[u8]| -> u64 {
        match (wide, le) {
            (true, true) => b.try_into().map(u64::from_le_bytes).unwrap_or(0),
            (true, false) => b.try_into().map(u64::from_be_bytes).unwrap_or(0),
            (false, true) => b.try_into().map(u32::from_le_bytes).map_or(0, u64::from),
            (false, false) => b.try_into().map(u32::from_be_bytes).map_or(0, u64::from),
        }
    };
    let w = if wide { 8 } else { 4 };
    let dynamic: Vec<(u64, u64)> = phdrs
        .iter()
        .find(|p| p.p_type == PT_DYNAMIC)
        .and_then(&segment)
        .map(|b| {
            b.chunks_exact(2 * w)
                .map(|d| (word(&d[..w]), word(&d[w..])))
                .take_while(|(tag, _)| *tag != 0)
                .collect()
        })
        .unwrap_or_default();
    const DT_NEEDED: u64 = 1;
    const DT_STRTAB: u64 = 5;
    const DT_STRSZ: u64 = 10;
    const DT_SONAME: u64 = 14;
    const DT_RPATH: u64 = 15;
    const DT_RUNPATH: u64 = 29;
    const DT_FLAGS_1: u64 = 0x6fff_fffb;
    const DF_1_PIE: u64 = 0x0800_0000;
    let tag = |t: u64| dynamic.iter().find(|(k, _)| *k == t).map(|(_, v)| *v);
    // The string table, from its address to where a loaded segment puts it.
    let strtab = tag(DT_STRTAB).and_then(|addr| {
        let load = phdrs
            .iter()
            .find(|p| p.p_type == PT_LOAD && addr >= p.p_vaddr && addr - p.p_vaddr < p.p_filesz)?;
        let size = tag(DT_STRSZ).unwrap_or(0).min(ELF_PART);
        read_at(f, load.p_offset + (addr - load.p_vaddr), size)
    });
    let string = |off: u64| {
        let t = strtab.as_deref()?;
        t.get(usize::try_from(off).ok()?..).map(c_string)
    };
    let all = |t: u64| -> Vec<String> {
        dynamic
            .iter()
            .filter(|(k, _)| *k == t)
            .filter_map(|(_, v)| string(*v))
            .collect()
    };
    let soname = tag(DT_SONAME).and_then(string);
    let runpath = all(DT_RUNPATH)
        .into_iter()
        .chain(all(DT_RPATH))
        .flat_map(|r| r.split(':').map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let pie = tag(DT_FLAGS_1).is_some_and(|f| f & DF_1_PIE != 0);
    let kind = match h.e_type {
        ET_EXEC => FileKind::ElfExecutable,
        // ET_DYN is both: a PIE executable says so in DT_FLAGS_1; a
        // library has a SONAME (libc has an interpreter too).
        ET_DYN if pie => FileKind::ElfExecutable,
        ET_DYN if soname.is_some() => FileKind::ElfSharedObject,
        ET_DYN if interpreter.is_some() => FileKind::ElfExecutable,
        ET_DYN => FileKind::ElfSharedObject,
        _ => FileKind::ElfOther,
    };
    Some(ElfFacts {
        kind,
        soname,
        needed: all(DT_NEEDED),
        interpreter,
        runpath,
    })
}

/// Classify one file by its path and its first bytes; an ELF file is only
/// recognised as one here ([`classify_file`] reads what it links against).
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
        let sh = std::fs::File::open("/bin/sh").expect("/bin/sh");
        let e = classify_file("bin/sh", &sh);
        assert_eq!(e.kind, FileKind::ElfExecutable);
        assert!(
            e.interpreter
                .as_deref()
                .is_some_and(|i| i.contains("ld-linux")),
            "{e:?}"
        );
        assert!(e.needed.iter().any(|n| n.starts_with("libc.so")), "{e:?}");
        let libc = std::fs::File::open("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let e = classify_file("lib/libc.so.6", &libc);
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
