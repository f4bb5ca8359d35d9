//! The executor's ed25519 signing key: generated on first use, kept in the
//! store directory with mode 0600, its public half printed as
//! `ed25519:<hex>` for trust lists.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::Error;

/// Where a store keeps its executor key.
pub fn key_path(store_root: &Path) -> PathBuf {
    store_root.join("keys").join("executor.ed25519")
}

/// Print form of a public key.
pub fn public_key_string(k: &VerifyingKey) -> String {
    format!("ed25519:{}", hex::encode(k.as_bytes()))
}

/// Parse `ed25519:<hex>`.
pub fn parse_public_key(s: &str) -> Result<VerifyingKey, Error> {
    let bad = || Error::BadKey(format!("{s:?} is not `ed25519:<64 hex digits>`"));
    let b = public_key_bytes(s).ok_or_else(bad)?;
    VerifyingKey::from_bytes(&b).map_err(|_| bad())
}

/// The 32 bytes `ed25519:<hex>` spells, not yet checked to be a key: what
/// a trust list can be compared with before any curve arithmetic.
pub fn public_key_bytes(s: &str) -> Option<[u8; 32]> {
    let h = s.trim().strip_prefix("ed25519:")?;
    let mut b = [0u8; 32];
    hex::decode_to_slice(h, &mut b).ok()?;
    Some(b)
}

/// The key of `trust` that `claimed` (a record's `public_key`) names, by
/// its bytes: the one the record's signature must then be checked with.
pub fn trusted<'k>(trust: &'k [VerifyingKey], claimed: &str) -> Option<&'k VerifyingKey> {
    let claimed = public_key_bytes(claimed)?;
    trust.iter().find(|k| k.as_bytes() == &claimed)
}

/// Create a new key at `path`; refuses to overwrite one.
pub fn generate(path: &Path) -> Result<SigningKey, Error> {
    let mut seed = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|e| Error::io("read /dev/urandom for", path, e))?;
    let key = SigningKey::from_bytes(&seed);
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    }
    // One name per writer: two builds starting on a fresh store both get
    // here, and a shared temporary name would let one link the other's key
    // while signing with its own.
    let tmp = path.with_extension(format!(
        "tmp-{}-{}",
        std::process::id(),
        hex::encode(&seed[..8])
    ));
    let mut f = fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io("create", &tmp, e))?;
    f.write_all(hex::encode(seed).as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io("write", &tmp, e))?;
    // link, not rename: never replace a key another process just made.
    fs::hard_link(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::BadKey(format!(
                "a key already exists at {}; remove it first to replace it",
                path.display()
            ))
        } else {
            Error::io("install key", path, e)
        }
    })?;
    let _ = fs::remove_file(&tmp);
    Ok(key)
}

/// Load the key at `path`.
pub fn load(path: &Path) -> Result<SigningKey, Error> {
    let text = fs::read_to_string(path).map_err(|e| Error::io("read key", path, e))?;
    let mut seed = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut seed).map_err(|_| {
        Error::BadKey(format!(
            "{} does not hold a 32-byte hex ed25519 seed",
            path.display()
        ))
    })?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Load the key, creating it if there is none yet.
pub fn load_or_generate(path: &Path) -> Result<SigningKey, Error> {
    if path.exists() {
        return load(path);
    }
    match generate(path) {
        Ok(k) => Ok(k),
        // Someone else created it between our check and our link.
        Err(Error::BadKey(_)) if path.exists() => load(path),
        Err(e) => Err(e),
    }
}
