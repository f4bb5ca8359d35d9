//! The per-store certificate authority and the leaf certificates it mints.
//!
//! `STORE/ca/ca.key` (mode 0600, never leaves the store) and
//! `STORE/ca/ca.crt` (what the sandbox's CA bundle holds). Created on first
//! use, atomically (a fully written temp directory renamed into place, so two
//! racing creators agree on one CA). Leaves are minted per host name, with a
//! DNS SAN for names and an IP SAN for IP literals, and cached.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::Digest as _;

use crate::Error;

const CA_CN: &str = "fhsx fetch-proxy CA";

/// The CA plus a cache of per-host TLS server configurations.
pub struct CertAuthority {
    dir: PathBuf,
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
    leaf_key: KeyPair,
    cache: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority")
            .field("dir", &self.dir)
            .finish()
    }
}

fn ca_params(key: &KeyPair) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_CN);
    dn.push(DnType::OrganizationName, "fhsx");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2099, 12, 31);
    p.serial_number = Some(serial_from(key.public_key_raw()));
    p
}

fn serial_from(bytes: &[u8]) -> SerialNumber {
    let h = sha2::Sha256::digest(bytes);
    let mut s = [0u8; 16];
    s.copy_from_slice(&h[..16]);
    s[0] &= 0x7f;
    s[0] |= 0x01;
    SerialNumber::from_slice(&s)
}

fn tls_err(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

impl CertAuthority {
    /// Load the CA in `store_root/ca`, creating it on first use.
    pub fn load_or_create(store_root: &Path) -> Result<Self, Error> {
        let dir = store_root.join("ca");
        if !dir.join("ca.key").exists() {
            Self::create(&dir)?;
        }
        let key_path = dir.join("ca.key");
        let key_pem = std::fs::read_to_string(&key_path)
            .map_err(|e| Error::io("read CA key", &key_path, e))?;
        let cert_path = dir.join("ca.crt");
        let cert_pem = std::fs::read_to_string(&cert_path)
            .map_err(|e| Error::io("read CA certificate", &cert_path, e))?;
        let key = KeyPair::from_pem(&key_pem).map_err(tls_err)?;
        let params = ca_params(&key);
        let issuer = Issuer::new(params, key);
        let leaf_key = KeyPair::generate().map_err(tls_err)?;
        Ok(CertAuthority {
            dir,
            cert_pem,
            issuer,
            leaf_key,
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn create(dir: &Path) -> Result<(), Error> {
        let parent = dir.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
        let tmp = parent.join(format!(
            ".ca-tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
        let result = (|| {
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io("chmod", &tmp, e))?;
            let key = KeyPair::generate().map_err(tls_err)?;
            let cert = ca_params(&key).self_signed(&key).map_err(tls_err)?;
            let kp = tmp.join("ca.key");
            write_synced(&kp, key.serialize_pem().as_bytes(), 0o600)?;
            write_synced(&tmp.join("ca.crt"), cert.pem().as_bytes(), 0o644)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| Error::io("chmod", &tmp, e))?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        match std::fs::rename(&tmp, dir) {
            Ok(()) => Ok(()),
            // Someone else created it first: use theirs.
            Err(_) if dir.join("ca.key").exists() => {
                let _ = std::fs::remove_dir_all(&tmp);
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                Err(Error::io("install CA", dir, e))
            }
        }
    }

    /// The CA certificate, PEM: what the sandbox trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Where the CA certificate lives.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A TLS server configuration presenting a leaf for `host` (a DNS name
    /// or an IP literal), ALPN `h2` and `http/1.1`.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, Error> {
        let host = host.to_ascii_lowercase();
        if let Some(c) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&host)
        {
            return Ok(c.clone());
        }
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host.as_str());
        p.distinguished_name = dn;
        p.subject_alt_names = vec![match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.as_str().try_into().map_err(tls_err)?),
        }];
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2099, 12, 31);
        p.serial_number = Some(serial_from(host.as_bytes()));
        let cert = p.signed_by(&self.leaf_key, &self.issuer).map_err(tls_err)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        let mut cfg =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(tls_err)?
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .map_err(tls_err)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(host, cfg.clone());
        Ok(cfg)
    }
}

fn write_synced(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| Error::io("create", path, e))?;
    f.write_all(bytes)
        .map_err(|e| Error::io("write", path, e))?;
    f.sync_all().map_err(|e| Error::io("fsync", path, e))
}
