//! Signing a BuildRecord and checking one.

use castore::store::{BlobStore, DirectoryStore, LocalStore};
use castore::Digest;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
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

/// Load a record blob from the store.
pub fn load_record(store: &LocalStore, digest: &Digest) -> Result<SignedRecord, Error> {
    let bytes = store.read_blob(digest)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::BadRecord(format!("{digest} is not a BuildRecord: {e}")))
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

/// Check the signature, that the signer is in `trust` (any signer if `trust`
/// is empty), and that every digest the record names is present and
/// matches.
pub fn verify(
    store: &LocalStore,
    rec: &SignedRecord,
    trust: &[VerifyingKey],
) -> Result<Verification, Error> {
    let mut problems = Vec::new();
    let key = parse_public_key(&rec.public_key)?;
    let mut sig = [0u8; 64];
    let sig_ok = hex::decode_to_slice(&rec.signature, &mut sig).is_ok()
        && key
            .verify_strict(&rec.record.canonical(), &Signature::from_bytes(&sig))
            .is_ok();
    if !sig_ok {
        problems.push(
            "signature does not match the record: it was altered or signed by another key"
                .to_owned(),
        );
    }
    let trusted = trust.is_empty() || trust.contains(&key);
    for (field, d) in rec.record.digests() {
        let check = if field == "view_digest" || field == "output_digest" {
            castore::verify::verify(store, Some(&d), &()).map(|r| {
                r.problems
                    .iter()
                    .map(|p| format!("{field}: {} object {} at {:?}", p.kind, p.object, p.used_at))
                    .collect::<Vec<_>>()
            })
        } else if store.has_directory(&d).unwrap_or(false) {
            Ok(vec![])
        } else {
            store.open_blob(&d).map(|_| vec![])
        };
        match check {
            Ok(p) => problems.extend(p),
            Err(e) => problems.push(format!("{field} {d}: {e}")),
        }
    }
    Ok(Verification {
        signer: rec.public_key.clone(),
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
