//! TLS for the REST API beyond loopback: a bearer token must not cross a network in the clear.
//! The certificate is issued by the cluster's authority (the key that signs every component's
//! credentials), as an X.509 certificate authority of its own; clients trust that authority
//! (`ca.pem` in the cluster's state directory), not the web's.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType, PKCS_ED25519};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use splitos_rpc::auth::Authority;

/// What `cluster up` gives the global managers and their clients.
pub struct Issued {
    /// The authority's certificate, which clients trust.
    pub ca_pem: String,
    /// The API's certificate, for `ip`.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// The authority as an X.509 certificate authority, and a certificate for the API at `ip`
/// signed by it (with a key made for it).
pub fn issue(authority: &Authority, ip: IpAddr) -> anyhow::Result<Issued> {
    let ca_key = KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(authority.pkcs8_der()), &PKCS_ED25519)?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "splitos cluster authority");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = ca.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(Vec::<String>::new())?;
    leaf.distinguished_name.push(DnType::CommonName, "splitos REST API");
    leaf.subject_alt_names = vec![SanType::IpAddress(ip)];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf.signed_by(&key, &ca, &ca_key)?;
    Ok(Issued { ca_pem: ca.pem(), cert_pem: leaf.pem(), key_pem: key.serialize_pem() })
}

/// The server side, from the files `issue`'s output was written to.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let certs = CertificateDer::pem_file_iter(cert).and_then(|i| i.collect::<Result<Vec<_>, _>>()).map_err(|e| anyhow::anyhow!("the API's certificate {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| anyhow::anyhow!("the API's key {}: {e}", key.display()))?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider())).with_safe_default_protocol_versions()?.with_no_client_auth().with_single_cert(certs, key)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn the_apis_certificate_chains_to_the_clusters_authority_and_names_its_address() {
        let dir = tempfile::tempdir().unwrap();
        let a = Authority::generate().unwrap();
        let issued = issue(&a, "10.0.0.7".parse().unwrap()).unwrap();
        let (cert, key) = (dir.path().join("api.pem"), dir.path().join("api.key"));
        std::fs::write(&cert, &issued.cert_pem).unwrap();
        std::fs::write(&key, &issued.key_pem).unwrap();
        acceptor(&cert, &key).unwrap();
        let ca = CertificateDer::from_pem_slice(issued.ca_pem.as_bytes()).unwrap();
        let leaf = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
        let now = rustls::pki_types::UnixTime::now();
        let at = |ip: &str| verifier.verify_server_cert(&leaf, &[], &rustls::pki_types::ServerName::try_from(ip.to_string()).unwrap(), &[], now);
        assert!(at("10.0.0.7").is_ok());
        assert!(at("10.0.0.8").is_err(), "another address");
        // Another cluster's authority does not vouch for it.
        let other = issue(&Authority::generate().unwrap(), "10.0.0.7".parse().unwrap()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(other.ca_pem.as_bytes()).unwrap()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::new(rustls::crypto::ring::default_provider())).build().unwrap();
        assert!(verifier.verify_server_cert(&leaf, &[], &rustls::pki_types::ServerName::try_from("10.0.0.7").unwrap(), &[], now).is_err());
    }
}
