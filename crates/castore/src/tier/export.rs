//! The Export tier: a stored tree as an artefact other tools read — a
//! tarball (`.tar`, `.tar.zst`) or a one-layer OCI image layout.
//!
//! Same tree, same bytes: that is the point of exporting from a
//! content-addressed store, and what lets a consumer cache or sign the
//! artefact. So nothing of the host or the moment leaks in. Entries come
//! depth-first, each directory before its children, children in name-byte
//! order (a castore directory's own order); owner and group are 0 with no
//! names; every mtime is `SOURCE_DATE_EPOCH` (or 0); modes are 0755 for
//! directories and executables, 0644 for other files, 0777 for symlinks;
//! GNU headers (long names and link targets as GNU long-name records), no
//! hard links, no extended attributes. Compression is single-threaded at a
//! fixed level, since a zstd or gzip stream depends on both.
//!
//! Every blob is read through [`BlobStore::open_blob`], which verifies it
//! before the first byte: an export never ships corrupt content. Artefacts
//! are written to a temporary sibling and renamed into place.
//!
//! The OCI layout follows image-spec v1.1: `oci-layout`, `index.json`
//! (one manifest, tagged), and under `blobs/sha256/` the layer (the tarball,
//! gzip-compressed: the one layer encoding every runtime reads), the config
//! (`rootfs.diff_ids` = the uncompressed tar's sha256) and the manifest.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest as _, Sha256};

use super::{io, Error, Result};
use crate::store::{BlobStore, DirectoryStore, LocalStore};
use crate::{Digest, Node, Progress};

/// The zstd level of `.tar.zst` exports (fixed: the bytes depend on it).
pub const ZSTD_LEVEL: i32 = 9;
/// The tag index.json gives the image unless the caller names one.
pub const DEFAULT_TAG: &str = "latest";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// How a tarball is compressed, from its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TarCompression {
    None,
    Zstd,
}

impl TarCompression {
    /// `.tar` or `.tar.zst` (also `.tzst`); anything else is refused.
    pub fn from_path(p: &Path) -> Result<Self> {
        let n = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if n.ends_with(".tar.zst") || n.ends_with(".tzst") {
            Ok(TarCompression::Zstd)
        } else if n.ends_with(".tar") {
            Ok(TarCompression::None)
        } else {
            Err(Error::BadRequest(format!(
                "{}: an export tarball must be named *.tar or *.tar.zst (or use --format oci DIR)",
                p.display()
            )))
        }
    }
}

/// The mtime of every entry: `$SOURCE_DATE_EPOCH` if set, else 0.
pub fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(s) if !s.trim().is_empty() => s.trim().parse().map_err(|_| {
            Error::BadRequest(format!(
                "SOURCE_DATE_EPOCH={s:?} is not a non-negative integer number of seconds"
            ))
        }),
        _ => Ok(0),
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TarReport {
    pub root: Digest,
    pub path: PathBuf,
    /// sha256 of the file as written.
    pub sha256: String,
    pub size: u64,
    pub entries: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct OciReport {
    pub root: Digest,
    pub dir: PathBuf,
    pub tag: String,
    /// `sha256:<hex>` of the manifest, as index.json names it.
    pub manifest: String,
    pub config: String,
    pub layer: String,
    /// sha256 of the uncompressed layer tar (the config's diff_id).
    pub diff_id: String,
    pub entries: u64,
}

/// Write the tree `root` as a deterministic tar stream into `out`; returns
/// `out` and the number of entries.
pub fn write_tar<W: Write>(
    store: &LocalStore,
    root: &Digest,
    out: W,
    mtime: u64,
    progress: &dyn Progress,
) -> Result<(W, u64)> {
    // The walk below recurses: only over a depth it can take.
    crate::walk::check_depth(store, root, crate::fs_tree::MAX_DEPTH)?;
    let mut b = tar::Builder::new(out);
    let mut n = 0u64;
    append_dir(
        store,
        root,
        &mut b,
        &mut PathBuf::new(),
        "",
        mtime,
        &mut n,
        progress,
    )?;
    let out = b
        .into_inner()
        .map_err(io("finish tar stream", PathBuf::from("-")))?;
    Ok((out, n))
}

fn header(kind: tar::EntryType, mode: u32, size: u64, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h
}

#[allow(clippy::too_many_arguments)]
fn append_dir<W: Write>(
    store: &LocalStore,
    digest: &Digest,
    b: &mut tar::Builder<W>,
    rel: &mut PathBuf,
    tp: &str,
    mtime: u64,
    n: &mut u64,
    progress: &dyn Progress,
) -> Result<()> {
    let dir = store.get_directory(digest).map_err(|e| e.at_path(tp))?;
    let werr = |p: &Path| io("write tar entry", p.to_path_buf());
    for (name, node) in dir.entries() {
        rel.push(name.as_os_str());
        let tp = if tp.is_empty() {
            name.to_string()
        } else {
            format!("{tp}/{name}")
        };
        *n += 1;
        match node {
            Node::Directory { digest, .. } => {
                let mut h = header(tar::EntryType::Directory, 0o755, 0, mtime);
                let mut with_slash = rel.as_os_str().to_os_string();
                with_slash.push("/");
                b.append_data(&mut h, &with_slash, std::io::empty())
                    .map_err(werr(rel))?;
                append_dir(store, digest, b, rel, &tp, mtime, n, progress)?;
            }
            Node::File {
                digest,
                size,
                executable,
            } => {
                let mode = if *executable { 0o755 } else { 0o644 };
                let mut h = header(tar::EntryType::Regular, mode, *size, mtime);
                let r = store.open_blob(digest).map_err(|e| e.at_path(&tp))?;
                b.append_data(&mut h, &*rel, r).map_err(werr(rel))?;
                progress.advance(1, *size);
            }
            Node::Symlink { target } => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0, mtime);
                b.append_link(&mut h, &*rel, target.as_os_str())
                    .map_err(werr(rel))?;
            }
        }
        rel.pop();
    }
    Ok(())
}

/// A writer that hashes (sha256) and counts what passes through.
struct Sha256Writer<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> Sha256Writer<W> {
    fn new(inner: W) -> Self {
        Sha256Writer {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }
    fn finish(self) -> (W, String, u64) {
        (self.inner, hex::encode(self.hasher.finalize()), self.len)
    }
}

impl<W: Write> Write for Sha256Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn sibling_tmp(dest: &Path) -> Result<PathBuf> {
    let name = dest
        .file_name()
        .ok_or_else(|| Error::BadRequest(format!("{}: must end in a file name", dest.display())))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(parent.join(format!(
        ".{}.fhsx-export-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )))
}

/// Export the tree `root` as a tarball at `dest` (compression from its
/// name), replacing any file there atomically.
pub fn export_tarball(
    store: &LocalStore,
    root: &Digest,
    dest: &Path,
    mtime: u64,
    progress: &dyn Progress,
) -> Result<TarReport> {
    let compression = TarCompression::from_path(dest)?;
    store.get_directory(root)?;
    let tmp = sibling_tmp(dest)?;
    let written = (|| {
        let f = File::create(&tmp).map_err(io("create", &tmp))?;
        let hashed = Sha256Writer::new(BufWriter::with_capacity(1 << 20, f));
        let (hashed, entries) = match compression {
            TarCompression::None => write_tar(store, root, hashed, mtime, progress)?,
            TarCompression::Zstd => {
                let enc = zstd::stream::write::Encoder::new(hashed, ZSTD_LEVEL)
                    .map_err(io("start zstd for", &tmp))?;
                let (enc, n) = write_tar(store, root, enc, mtime, progress)?;
                (enc.finish().map_err(io("finish zstd for", &tmp))?, n)
            }
        };
        let (buf, sha, size) = hashed.finish();
        let f = buf
            .into_inner()
            .map_err(|e| io("write", &tmp)(e.into_error()))?;
        f.sync_all().map_err(io("sync", &tmp))?;
        fs::rename(&tmp, dest).map_err(io("rename into place", dest))?;
        Ok(TarReport {
            root: *root,
            path: dest.to_path_buf(),
            sha256: sha,
            size,
            entries,
        })
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// The OCI platform name of this host's architecture.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "arm" => "arm",
        other => other,
    }
}

const MT_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MT_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MT_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MT_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Export the tree `root` as an OCI image layout in `dir`, which must not
/// exist or be empty. `tag` names the image in index.json.
pub fn export_oci(
    store: &LocalStore,
    root: &Digest,
    dir: &Path,
    tag: &str,
    mtime: u64,
    progress: &dyn Progress,
) -> Result<OciReport> {
    if let Ok(mut rd) = fs::read_dir(dir) {
        if rd.next().is_some() {
            return Err(Error::BadRequest(format!(
                "{} is not empty: an OCI layout goes into a new or empty directory",
                dir.display()
            )));
        }
    } else if fs::symlink_metadata(dir).is_ok() {
        return Err(Error::BadRequest(format!(
            "{} exists and is not a directory",
            dir.display()
        )));
    }
    if tag.is_empty() || tag.len() > 128 || tag.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err(Error::BadRequest(format!(
            "{tag:?} is not a usable image tag"
        )));
    }
    store.get_directory(root)?;
    let staging = sibling_tmp(dir)?;
    let made = (|| {
        let blobs = staging.join("blobs/sha256");
        fs::create_dir_all(&blobs).map_err(io("create", &blobs))?;

        // The layer: tar → sha256 (diff_id) → gzip → sha256 (digest) → file.
        let layer_tmp = blobs.join(".layer");
        let f = File::create(&layer_tmp).map_err(io("create", &layer_tmp))?;
        let outer = Sha256Writer::new(BufWriter::with_capacity(1 << 20, f));
        let gz = flate2::GzBuilder::new()
            .mtime(0)
            .write(outer, flate2::Compression::new(6));
        let inner = Sha256Writer::new(gz);
        let (inner, entries) = write_tar(store, root, inner, mtime, progress)?;
        let (gz, diff_id, _) = inner.finish();
        let outer = gz.finish().map_err(io("finish gzip for", &layer_tmp))?;
        let (buf, layer_sha, layer_size) = outer.finish();
        let f = buf
            .into_inner()
            .map_err(|e| io("write", &layer_tmp)(e.into_error()))?;
        f.sync_all().map_err(io("sync", &layer_tmp))?;
        let layer_path = blobs.join(&layer_sha);
        fs::rename(&layer_tmp, &layer_path).map_err(io("rename", &layer_path))?;

        let created = rfc3339(mtime);
        let config = serde_json::json!({
            "created": created,
            "architecture": oci_arch(),
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
            "history": [{
                "created": created,
                "created_by": format!("fhsx materialize --tier export {root}"),
            }],
        });
        let (config_sha, config_size) = put_json(&blobs, &config)?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MT_MANIFEST,
            "config": {
                "mediaType": MT_CONFIG,
                "digest": format!("sha256:{config_sha}"),
                "size": config_size,
            },
            "layers": [{
                "mediaType": MT_LAYER_GZIP,
                "digest": format!("sha256:{layer_sha}"),
                "size": layer_size,
            }],
            "annotations": {"dev.fhsx.view": root.to_string()},
        });
        let (manifest_sha, manifest_size) = put_json(&blobs, &manifest)?;
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MT_INDEX,
            "manifests": [{
                "mediaType": MT_MANIFEST,
                "digest": format!("sha256:{manifest_sha}"),
                "size": manifest_size,
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }],
        });
        write_json(&staging.join("index.json"), &index)?;
        write_json(
            &staging.join("oci-layout"),
            &serde_json::json!({"imageLayoutVersion": "1.0.0"}),
        )?;
        if dir.is_dir() {
            fs::remove_dir(dir).map_err(io("replace empty directory", dir))?;
        }
        fs::rename(&staging, dir).map_err(io("rename into place", dir))?;
        Ok(OciReport {
            root: *root,
            dir: dir.to_path_buf(),
            tag: tag.to_owned(),
            manifest: format!("sha256:{manifest_sha}"),
            config: format!("sha256:{config_sha}"),
            layer: format!("sha256:{layer_sha}"),
            diff_id: format!("sha256:{diff_id}"),
            entries,
        })
    })();
    if made.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    made
}

/// `secs` after the epoch as RFC 3339 UTC (`1970-01-01T00:00:00Z`), for
/// the config's `created` (from SOURCE_DATE_EPOCH, so still deterministic).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn json_bytes(v: &serde_json::Value) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| Error::BadRequest(format!("encoding JSON: {e}")))
}

/// Store a JSON document as a blob named by its sha256; (hex, size).
fn put_json(blobs: &Path, v: &serde_json::Value) -> Result<(String, u64)> {
    let bytes = json_bytes(v)?;
    let sha = hex::encode(Sha256::digest(&bytes));
    let p = blobs.join(&sha);
    fs::write(&p, &bytes).map_err(io("write", &p))?;
    Ok((sha, bytes.len() as u64))
}

fn write_json(p: &Path, v: &serde_json::Value) -> Result<()> {
    let bytes = json_bytes(v)?;
    fs::write(p, bytes).map_err(io("write", p))
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
