//! Tarballs (plain, gzip, xz, zstd) and Debian packages.

use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Imported;
use crate::store::Txn;
use crate::tree::{components, TreeBuilder};
use crate::{Error, Node, Progress, Result};

/// Bounds on what one archive may expand to: a decompression bomb is an
/// error, not a full disk.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Total unpacked bytes.
    pub max_unpacked: u64,
    /// Unpacked ÷ packed, checked once `ratio_after` bytes are unpacked.
    pub max_ratio: u64,
    pub ratio_after: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_unpacked: 256 << 30,
            max_ratio: 200,
            ratio_after: 64 << 20,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Xz,
    Zstd,
    Bzip2,
}

impl Compression {
    /// Recognise a stream by its first bytes. Plain tar is recognised by the
    /// `ustar` magic at offset 257.
    pub fn sniff(magic: &[u8]) -> Option<Self> {
        if magic.starts_with(&[0x1f, 0x8b]) {
            Some(Compression::Gzip)
        } else if magic.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Some(Compression::Xz)
        } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Compression::Zstd)
        } else if magic.len() >= 4 && magic.starts_with(b"BZh") && matches!(magic[3], b'1'..=b'9') {
            Some(Compression::Bzip2)
        } else if magic.len() >= 262 && &magic[257..262] == b"ustar" {
            Some(Compression::None)
        } else {
            None
        }
    }

    /// From a Debian member name such as `data.tar.xz`.
    fn from_member_name(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"data.tar" => Compression::None,
            b"data.tar.gz" => Compression::Gzip,
            b"data.tar.xz" => Compression::Xz,
            b"data.tar.zst" => Compression::Zstd,
            b"data.tar.bz2" => Compression::Bzip2,
            _ => return None,
        })
    }

    fn decoder<'a>(self, r: impl Read + Send + 'a) -> io::Result<Box<dyn Read + Send + 'a>> {
        Ok(match self {
            Compression::None => Box::new(r),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(r)),
            Compression::Xz => Box::new(xz2::read::XzDecoder::new_multi_decoder(r)),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(r)?),
            Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(r)),
        })
    }
}

/// Counts the bytes that pass through it.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Fails the read once the unpacked stream breaks `Limits`.
struct Bounded<R> {
    inner: R,
    packed: Arc<AtomicU64>,
    unpacked: u64,
    limits: Limits,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.unpacked += n as u64;
        let packed = self.packed.load(Ordering::Relaxed).max(1);
        if self.unpacked > self.limits.max_unpacked {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "archive expands past {} bytes (the import limit)",
                    self.limits.max_unpacked
                ),
            ));
        }
        if self.unpacked > self.limits.ratio_after && self.unpacked / packed > self.limits.max_ratio
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "decompression bomb: {} packed bytes expand to more than {} (over {}:1)",
                    packed, self.unpacked, self.limits.max_ratio
                ),
            ));
        }
        Ok(n)
    }
}

fn hostile(path: &Path, reason: impl Into<String>) -> Error {
    Error::HostileInput {
        source_path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Entries up to this size are read into memory and hashed before any
/// write; bigger ones stream to a staging file.
const SMALL: u64 = 8 << 20;

pub(super) fn import_tar(
    txn: &Txn<'_>,
    path: &Path,
    compression: Compression,
    input: impl Read + Send,
    limits: &Limits,
    progress: &dyn Progress,
) -> Result<Imported> {
    import_tar_with(txn, path, compression, input, limits, progress, None)
}

/// [`import_tar`], adding one file the archive does not hold (a `.deb`'s
/// alternatives, as data): `(path, content)`.
fn import_tar_with(
    txn: &Txn<'_>,
    path: &Path,
    compression: Compression,
    input: impl Read + Send,
    limits: &Limits,
    progress: &dyn Progress,
    extra: Option<(String, Vec<u8>)>,
) -> Result<Imported> {
    let packed = Arc::new(AtomicU64::new(0));
    let counting = Counting {
        inner: input,
        count: packed.clone(),
    };
    let decoded = compression
        .decoder(counting)
        .map_err(|e| hostile(path, format!("cannot start decompression: {e}")))?;
    let bounded = Bounded {
        inner: decoded,
        packed,
        unpacked: 0,
        limits: limits.clone(),
    };
    let mut ar = tar::Archive::new(bounded);
    let mut tree = TreeBuilder::default();
    let entries = ar
        .entries()
        .map_err(|e| hostile(path, format!("not a tar stream: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| hostile(path, format!("corrupt or truncated archive: {e}")))?;
        let raw = entry.path_bytes().into_owned();
        let comps = components(&raw).map_err(|e| hostile(path, e))?;
        let kind = entry.header().entry_type();
        let at = |e: String| hostile(path, e);
        use tar::EntryType as T;
        match kind {
            T::Directory => tree.add_dir(&comps).map_err(at)?,
            T::Regular | T::Continuous => {
                let mode = entry
                    .header()
                    .mode()
                    .map_err(|e| hostile(path, format!("bad mode field: {e}")))?;
                let size = entry.size();
                let (digest, n) = if size <= SMALL {
                    let mut buf = Vec::with_capacity(size as usize);
                    entry
                        .read_to_end(&mut buf)
                        .map_err(|e| hostile(path, format!("corrupt or truncated archive: {e}")))?;
                    (txn.put_blob(&buf)?, buf.len() as u64)
                } else {
                    txn.put_blob_reader(&mut entry).map_err(|e| match e {
                        Error::Io { source, .. } => {
                            hostile(path, format!("corrupt or truncated archive: {source}"))
                        }
                        e => e,
                    })?
                };
                if n != size {
                    return Err(hostile(
                        path,
                        "truncated archive: entry shorter than its header says",
                    ));
                }
                progress.advance(1, n);
                tree.add_leaf(
                    &comps,
                    Node::File {
                        digest,
                        size: n,
                        executable: mode & 0o100 != 0,
                    },
                )
                .map_err(at)?;
            }
            T::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| hostile(path, "symlink without a target"))?
                    .into_owned();
                tree.add_symlink(&comps, &target).map_err(at)?;
            }
            T::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| hostile(path, "hard link without a target"))?
                    .into_owned();
                let tcomps = components(&target)
                    .map_err(|e| hostile(path, format!("hard link target: {e}")))?;
                tree.add_hardlink(&comps, &tcomps).map_err(at)?;
            }
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink => {}
            T::Char | T::Block => {
                return Err(hostile(
                    path,
                    format!(
                        "device node {}: trees hold no devices",
                        String::from_utf8_lossy(&raw)
                    ),
                ))
            }
            T::Fifo => {
                return Err(hostile(
                    path,
                    format!(
                        "FIFO {}: trees hold no FIFOs",
                        String::from_utf8_lossy(&raw)
                    ),
                ))
            }
            other => {
                return Err(hostile(
                    path,
                    format!(
                        "unsupported entry type {:?} at {}",
                        other,
                        String::from_utf8_lossy(&raw)
                    ),
                ))
            }
        }
    }
    // Drain what follows the end-of-archive marker so a corrupt compressed
    // tail (a truncated gzip member, a bad checksum) is still an error.
    let mut rest = ar.into_inner();
    io::copy(&mut rest, &mut io::sink())
        .map_err(|e| hostile(path, format!("corrupt or truncated archive: {e}")))?;
    if let Some((name, content)) = extra {
        let at = components(name.as_bytes()).map_err(|e| hostile(path, e))?;
        let node = Node::File {
            digest: txn.put_blob(&content)?,
            size: content.len() as u64,
            executable: false,
        };
        tree.add_leaf(&at, node).map_err(|e| {
            hostile(
                path,
                format!("the package itself ships {name}, where fhsx keeps its alternatives: {e}"),
            )
        })?;
    }
    let (root, size) = tree.finish(txn)?;
    Ok(Imported { root, size })
}

/// A `.deb` is an `ar` archive; its `data.tar.*` member is the tree. Its
/// `control.tar.*` member (which comes first) holds the maintainer
/// scripts, read for the alternatives they register (never run); those are
/// kept *in the atom*, as `var/lib/fhsx/alternatives/PACKAGE` (JSON), so
/// they are content like any other, travel with the atom to any store, and
/// a composition is a function of its atoms' digests alone.
pub(super) fn import_deb(
    txn: &Txn<'_>,
    path: &Path,
    input: impl Read + Send,
    limits: &Limits,
    progress: &dyn Progress,
) -> Result<Imported> {
    let mut ar = ar::Archive::new(input);
    let mut extra = None;
    loop {
        // The `ar` crate panics on some malformed headers (a GNU long-name
        // reference with no name table, found by fuzzing): a hostile .deb
        // must be an error, not a crash.
        let ar = &mut ar;
        let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let ar = ar; // moved out: the closure is FnOnce, the entry may borrow it
            ar.next_entry()
        }))
        .map_err(|_| hostile(path, "corrupt .deb (ar) archive: malformed member header"))?;
        let Some(member) = next else { break };
        let member =
            member.map_err(|e| hostile(path, format!("corrupt .deb (ar) archive: {e}")))?;
        let id = member.header().identifier().to_vec();
        if let Some(c) = Compression::from_member_name(&id) {
            return import_tar_with(txn, path, c, member, limits, progress, extra);
        }
        if let Some(c) = id
            .strip_prefix(b"control")
            .and_then(|rest| Compression::from_member_name(&[b"data".as_slice(), rest].concat()))
        {
            let (package, alternatives) = read_control(path, c, member)?;
            if let (Some(package), false) = (package, alternatives.is_empty()) {
                extra = Some((
                    format!("{}/{package}", crate::alternatives::IN_ATOM),
                    serde_json::to_vec(&alternatives).unwrap_or_default(),
                ));
            }
        }
    }
    Err(hostile(path, "a .deb without a data.tar member"))
}

/// The package's name (from `control`) and the alternatives `preinst` and
/// `postinst` register.
fn read_control(
    path: &Path,
    c: Compression,
    member: impl Read + Send,
) -> Result<(Option<String>, Vec<crate::alternatives::Alternative>)> {
    // Control archives are kilobytes; a huge one is not a real package.
    const MAX: u64 = 16 << 20;
    let decoded = c
        .decoder(member.take(MAX))
        .map_err(|e| hostile(path, format!("cannot start decompression: {e}")))?;
    let mut ar = tar::Archive::new(decoded.take(MAX));
    let mut alternatives = Vec::new();
    let mut package = None;
    let entries = ar
        .entries()
        .map_err(|e| hostile(path, format!("control archive is not a tar stream: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| hostile(path, format!("corrupt control archive: {e}")))?;
        let name = entry.path_bytes().into_owned();
        let name = name.strip_prefix(b"./").unwrap_or(&name).to_vec();
        if !matches!(name.as_slice(), b"postinst" | b"preinst" | b"control") {
            continue;
        }
        let mut text = String::new();
        // Not UTF-8, or cut short: nothing from it.
        if (&mut entry)
            .take(1 << 20)
            .read_to_string(&mut text)
            .is_err()
        {
            continue;
        }
        if name == b"control" {
            package = text
                .lines()
                .find_map(|l| l.strip_prefix("Package:"))
                .map(|p| p.trim().to_owned())
                .filter(|p| crate::Name::new(p.as_str()).is_ok());
        } else {
            alternatives.extend(crate::alternatives::parse_script(&text));
        }
    }
    Ok((package, alternatives))
}
