//! TLS on the worker's TCP port: the token and every input and result
//! cross the network encrypted, and the client knows which worker it
//! reached before it sends the token.
//!
//! There is no PKI here. The worker makes a fresh self-signed certificate
//! at start and signs a *binding* of it with the key that signs its
//! BuildRecords (`fhs_executor::sign::tls_binding_message`). The client
//! accepts any certificate during the handshake (still checking the
//! handshake signatures against it), keeps it, and after `Gate.version`
//! checks the binding against the worker's record key — which `--trust`
//! pins. So a client that pins keys never sends its token to anyone but a
//! worker holding a trusted key; one that pins none trusts on first use,
//! as it trusts the records.
//!
//! UNIX sockets stay plain: the file system's permissions guard them.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The name both sides use in the handshake (nothing checks it).
pub(crate) const SERVER_NAME: &str = "fhsx-worker";

/// The TCP stream under TLS, read through a 256 KiB buffer. rustls reads
/// at most one record (16 KiB) per call, so unbuffered an upload of the
/// hello toolchain took 22,784 `recvfrom`s on the worker, each one a
/// system call in the event loop that also decrypts and receives. Writes
/// are not buffered here: rustls hands its records to the stream as one
/// vectored write (see [`widen_sends`]), and a buffer would only copy them.
pub(crate) fn buffered(s: tokio::net::TcpStream) -> tokio::io::BufReader<tokio::net::TcpStream> {
    tokio::io::BufReader::with_capacity(256 << 10, s)
}

/// Let a connection encrypt up to 256 KiB ahead of what the socket has
/// taken, so each vectored write carries 16 records. rustls's default,
/// 64 KiB, made an upload four records (and one system call) per 64 KiB.
pub(crate) fn widen_sends<D>(conn: &mut rustls::ConnectionCommon<D>) {
    conn.set_buffer_limit(Some(256 << 10));
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A fresh self-signed identity: the server config and its certificate.
pub(crate) fn server_identity() -> Result<(Arc<rustls::ServerConfig>, Vec<u8>), String> {
    let ck = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])
        .map_err(|e| format!("making the worker's TLS certificate: {e}"))?;
    let der = ck.cert.der().to_vec();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .map_err(|e| format!("the worker's TLS certificate: {e}"))?;
    Ok((Arc::new(cfg), der))
}

/// The certificate a server presented, kept for the binding check.
pub(crate) type Seen = Arc<Mutex<Option<Vec<u8>>>>;

/// A client config accepting any certificate (see the module doc) and
/// recording it in the returned slot.
pub(crate) fn client_config() -> Result<(Arc<rustls::ClientConfig>, Seen), String> {
    let seen: Seen = Arc::default();
    let verifier = KeepCert {
        seen: seen.clone(),
        algs: provider().signature_verification_algorithms,
    };
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok((Arc::new(cfg), seen))
}

#[derive(Debug)]
struct KeepCert {
    seen: Seen,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for KeepCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // Trust is decided after the handshake, by the signed binding.
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(end_entity.to_vec());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// rustls reports a peer that closed without `close_notify` as
/// `UnexpectedEof`. Cap'n Proto frames its messages and notices a truncated
/// one itself, so such a close between messages is simply the end of the
/// connection (what the plain transports report), not an error to log.
pub(crate) struct CleanEof<S>(pub(crate) S);

impl<S: futures::AsyncRead + Unpin> futures::AsyncRead for CleanEof<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.0).poll_read(cx, buf) {
            std::task::Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                std::task::Poll::Ready(Ok(0))
            }
            r => r,
        }
    }
}

impl<S: futures::AsyncWrite + Unpin> futures::AsyncWrite for CleanEof<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_close(cx)
    }
}
