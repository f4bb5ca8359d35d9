//! Signing a BuildRecord and checking one.
//!
//! A format-1 record (one `output_digest` tree) is verified as what it is —
//! the signature over the JSON it was signed as and every `*_digest` it
//! names — with a note that it is never a cache hit; `fhsx record show`
//! prints it as stored.

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::Digest;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use executor_core::record::RECORD_FORMAT;
use executor_core::{BuildRecord, SignedRecord};

use crate::keys::{parse_public_key, public_key_string};
use crate::Error;

pub fn sign(record: BuildRecord, key: &SigningKey) -> SignedRecord {
    let sig = key.sign(&record.canonical());
    SignedRecord {
        record,
        public_key: public_key_string(&key.verifying_key()),
        signature: hex::encode(sig.to_bytes()),
    }
}

/// Prefix of what a worker signs to bind its TLS certificate to its record
/// key. A record's signed bytes are canonical JSON and begin with `{`, so
/// neither signature can pass for the other.
pub const TLS_BINDING_CONTEXT: &[u8] = b"fhsx-worker-tls-binding-v1\0";

/// The bytes a worker signs for the certificate `cert_der`.
pub fn tls_binding_message(cert_der: &[u8]) -> Vec<u8> {
    let mut m = TLS_BINDING_CONTEXT.to_vec();
    m.extend_from_slice(blake3::hash(cert_der).as_bytes());
    m
}

/// Whether `signature` binds `cert_der` to the key `public_key`
/// (`ed25519:<hex>`).
pub fn verify_tls_binding(public_key: &str, cert_der: &[u8], signature: &[u8]) -> bool {
    let Ok(key) = parse_public_key(public_key) else {
        return false;
    };
    let Ok(sig) = <[u8; 64]>::try_from(signature) else {
        return false;
    };
    key.verify_strict(&tls_binding_message(cert_der), &Signature::from_bytes(&sig))
        .is_ok()
}

/// Store a signed record as a blob; its digest names the record.
pub fn store_record(store: &LocalStore, rec: &SignedRecord) -> Result<Digest, Error> {
    let bytes = serde_json::to_vec_pretty(rec).map_err(|e| Error::BadRecord(e.to_string()))?;
    Ok(store.put_blob(&bytes)?)
}

/// Load a record blob of the current format from the store.
pub fn load_record(store: &LocalStore, digest: &Digest) -> Result<SignedRecord, Error> {
    match load_any(store, digest)? {
        StoredRecord::Current(r) => Ok(*r),
        StoredRecord::Older { format, .. } => Err(Error::BadRecord(format!(
            "{digest} is a format-{format} record; this fhsx reads format {RECORD_FORMAT} (`fhsx record verify` still checks it; rebuild the action for a current record)"
        ))),
    }
}

/// A stored record of any format this fhsx can still check.
#[derive(Debug, Clone)]
pub enum StoredRecord {
    Current(Box<SignedRecord>),
    /// An earlier format, kept as the JSON it was signed as.
    Older {
        format: u32,
        record: serde_json::Value,
        public_key: String,
        signature: String,
    },
}

/// Load a record blob of any format.
pub fn load_any(store: &LocalStore, digest: &Digest) -> Result<StoredRecord, Error> {
    parse_any(digest, &store.read_blob(digest)?)
}

/// Parse the bytes of the record blob `digest` (already checked to hash
/// to it), of any format.
pub fn parse_any(digest: &Digest, bytes: &[u8]) -> Result<StoredRecord, Error> {
    let not_a_record = |e: String| Error::BadRecord(format!("{digest} is not a BuildRecord: {e}"));
    let raw: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| not_a_record(e.to_string()))?;
    let format = raw["record"]["format"].as_u64().unwrap_or(0) as u32;
    if format == RECORD_FORMAT {
        return serde_json::from_value(raw)
            .map(|r| StoredRecord::Current(Box::new(r)))
            .map_err(|e| not_a_record(e.to_string()));
    }
    match (
        format,
        raw["public_key"].as_str(),
        raw["signature"].as_str(),
    ) {
        (1, Some(k), Some(s)) => Ok(StoredRecord::Older {
            format,
            record: raw["record"].clone(),
            public_key: k.to_owned(),
            signature: s.to_owned(),
        }),
        _ => Err(not_a_record(format!(
            "format {format} is not one this fhsx knows (it writes {RECORD_FORMAT})"
        ))),
    }
}

/// Whether `rec`'s signature holds for `key` (whatever key it names).
pub fn signed_with(rec: &SignedRecord, key: &VerifyingKey) -> bool {
    verifies(key, &rec.signature, &rec.record.canonical())
}

fn signed_by(public_key: &str, signature: &str, message: &[u8]) -> Option<VerifyingKey> {
    let key = parse_public_key(public_key).ok()?;
    verifies(&key, signature, message).then_some(key)
}

/// Whether the hex `signature` over `message` holds for `key`.
fn verifies(key: &VerifyingKey, signature: &str, message: &[u8]) -> bool {
    let mut sig = [0u8; 64];
    hex::decode_to_slice(signature, &mut sig).is_ok()
        && key
            .verify_strict(message, &Signature::from_bytes(&sig))
            .is_ok()
}

/// What `verify` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verification {
    pub signer: String,
    pub trusted: bool,
    pub problems: Vec<String>,
}

impl Verification {
    pub fn ok(&self) -> bool {
        self.trusted && self.problems.is_empty()
    }
}

/// How far `verify` looks at the objects a record names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Each named object is in the store. Enough where the store's own
    /// invariants are trusted: every object was hashed on its way in, and
    /// a stored directory's children are stored (what a remote client
    /// checks after each build: its downloads were hashed as they came,
    /// and re-hashing the whole view — a toolchain's hundreds of MB —
    /// would cost every remote action more than the action).
    Present,
    /// Every object of every named tree re-hashed: an audit of the store
    /// too (`fhsx record verify`).
    Rehash,
}

/// Check the signature, that the signer is in `trust` (any signer if `trust`
/// is empty), and that every digest the record names is present (and,
/// with [`Depth::Rehash`], matches, object by object).
pub fn verify(
    store: &LocalStore,
    rec: &SignedRecord,
    trust: &[VerifyingKey],
    depth: Depth,
) -> Result<Verification, Error> {
    let digests = rec.record.digests();
    let named: Vec<(&str, Digest)> = digests.iter().map(|(f, d)| (*f, *d)).collect();
    let mut v = check(
        store,
        &rec.public_key,
        &rec.signature,
        &rec.record.canonical(),
        &named,
        trust,
        depth,
    )?;
    if let Some(reused) = rec.record.reused {
        // Nothing ran: the claim is that the reused read set holds here.
        let holds = castore_fuse::ReadSet::load(store, &rec.record.observed_read_set_digest)
            .map_err(|e| castore::Chain(&e).to_string())
            .and_then(|rs| crate::validate::read_set_holds(store, &rec.record.view_digest, &rs));
        if let Err(why) = holds {
            v.problems.push(format!(
                "it reuses record {reused}, whose read set does not hold in its view: {why}"
            ));
        }
    }
    Ok(v)
}

/// [`verify`] for any stored format. An older record is checked as what it
/// is: its signature over the JSON it was signed as, and every `*_digest`
/// field it names.
pub fn verify_any(
    store: &LocalStore,
    rec: &StoredRecord,
    trust: &[VerifyingKey],
    depth: Depth,
) -> Result<Verification, Error> {
    match rec {
        StoredRecord::Current(r) => verify(store, r, trust, depth),
        StoredRecord::Older {
            record,
            public_key,
            signature,
            ..
        } => {
            let canonical = serde_json::to_vec(record).unwrap_or_default();
            let mut named = Vec::new();
            if let Some(fields) = record.as_object() {
                for (field, v) in fields {
                    if let Some(d) = v.as_str().and_then(|s| s.parse::<Digest>().ok()) {
                        if field.ends_with("_digest") {
                            named.push((field.as_str(), d));
                        }
                    }
                }
            }
            check(
                store, public_key, signature, &canonical, &named, trust, depth,
            )
        }
    }
}

/// Fields that name whole trees, checked object by object.
const TREE_FIELDS: &[&str] = &["view_digest", "output_digest", "outputs"];

fn check(
    store: &LocalStore,
    public_key: &str,
    signature: &str,
    canonical: &[u8],
    named: &[(&str, Digest)],
    trust: &[VerifyingKey],
    depth: Depth,
) -> Result<Verification, Error> {
    let mut problems = Vec::new();
    let key = parse_public_key(public_key)?;
    if signed_by(public_key, signature, canonical).is_none() {
        problems.push(
            "signature does not match the record: it was altered or signed by another key"
                .to_owned(),
        );
    }
    let trusted = trust.is_empty() || trust.contains(&key);
    for (field, d) in named {
        let check = if depth == Depth::Rehash && TREE_FIELDS.contains(field) {
            castore::verify::verify(store, Some(d), &()).map(|r| {
                r.problems
                    .iter()
                    .map(|p| {
                        format!(
                            "{field}: {} object {} at {}",
                            p.kind,
                            p.object,
                            p.used_at.join(", ")
                        )
                    })
                    .collect::<Vec<_>>()
            })
        } else if store.has_directory(d).unwrap_or(false) {
            Ok(vec![])
        } else {
            store.open_blob(d).map(|_| vec![])
        };
        match check {
            Ok(p) => problems.extend(p),
            Err(e) => problems.push(format!("{field} {d}: {}", castore::Chain(&e))),
        }
    }
    Ok(Verification {
        signer: public_key.to_owned(),
        trusted,
        problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binding holds for exactly the certificate and key it was made
    /// for; a record signature (same key, other bytes) is no binding.
    #[test]
    fn tls_binding_binds_one_certificate_to_one_key() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let other = SigningKey::from_bytes(&[8; 32]);
        let pk = public_key_string(&key.verifying_key());
        let cert = b"a certificate's DER";
        let sig = key.sign(&tls_binding_message(cert)).to_bytes();
        assert!(verify_tls_binding(&pk, cert, &sig));
        assert!(!verify_tls_binding(&pk, b"another certificate", &sig));
        let forged = other.sign(&tls_binding_message(cert)).to_bytes();
        assert!(!verify_tls_binding(&pk, cert, &forged));
        let as_record = key.sign(cert).to_bytes();
        assert!(!verify_tls_binding(&pk, cert, &as_record));
        assert!(!verify_tls_binding(&pk, cert, &sig[..63]));
        assert!(!verify_tls_binding("ed25519:zz", cert, &sig));
    }
}
