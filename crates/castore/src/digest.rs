//! The content digest: BLAKE3-256, printed `b3:<64 lowercase hex>`.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// Bytes and the digest they were found to hash to. Made only by hashing
/// them, so holding one proves the digest is theirs: a store files it
/// under that digest without hashing it a second time
/// (`Txn::put_checked_blob`) — a worker checks what a client sent before
/// it stores anything of a batch, and each byte is hashed once.
#[derive(Debug, Clone)]
pub struct CheckedBlob<B> {
    digest: Digest,
    bytes: B,
}

impl<B: AsRef<[u8]>> CheckedBlob<B> {
    /// Hash `bytes`.
    pub fn new(bytes: B) -> Self {
        let digest = Digest::of(bytes.as_ref());
        CheckedBlob { digest, bytes }
    }

    /// Hash `bytes`, keeping them only if they hash to `expected`; else
    /// the digest they do hash to.
    pub fn expecting(expected: &Digest, bytes: B) -> std::result::Result<Self, Digest> {
        let b = CheckedBlob::new(bytes);
        if b.digest == *expected {
            Ok(b)
        } else {
            Err(b.digest)
        }
    }

    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

/// A BLAKE3-256 digest naming a blob or a directory.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    pub const LEN: usize = 32;

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    pub fn from_bytes(b: [u8; 32]) -> Self {
        Digest(b)
    }

    /// From a slice that must be exactly 32 bytes long.
    pub fn from_slice(b: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(b).ok().map(Digest)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex without the `b3:` prefix (how objects are named on disk).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl From<blake3::Hash> for Digest {
    fn from(h: blake3::Hash) -> Self {
        Digest(*h.as_bytes())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b3:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::BadDigest(s.to_owned());
        let h = s.strip_prefix("b3:").ok_or_else(bad)?;
        if h.len() != 64 || h.bytes().any(|c| !matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(h, &mut out).map_err(|_| bad())?;
        Ok(Digest(out))
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_bad_forms() {
        let d = Digest::of(b"");
        let s = d.to_string();
        assert_eq!(
            s,
            "b3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(s.parse::<Digest>().ok(), Some(d));
        for bad in [
            "",
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
            "b3:AF1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
            "b3:af13",
            "sha256:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} parsed");
        }
    }
}
