//! TLS for the REST API beyond loopback: a bearer token must not cross a network in the clear.
//! The certificate is issued by the cluster's X.509 authority, a key of the cluster's state
//! directory made with its authority and kept as long (`x509-authority.key`); clients trust that
//! authority (`ca.pem` beside it), not the web's. It is an ECDSA P-256 key of its own rather
//! than the Ed25519 key that signs components' credentials, because browsers accept no Ed25519
//! signature in a certificate.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How long the API's certificate is valid: it is issued anew at every `cluster up`, and a key
/// copied off a host stops being worth anything after that long.
const LEAF_DAYS: i64 = 365;
/// How long the authority's certificate is valid (it is made again at every start, from the
/// same key, so that clients keep trusting the `ca.pem` they have).
const CA_DAYS: i64 = 3650;

/// What `cluster up` gives the global managers and their clients.
pub struct Issued {
    /// The authority's certificate, which clients trust.
    pub ca_pem: String,
    /// The API's certificate, for `ip`.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// The cluster's X.509 authority key kept at `path`, made there (mode 0600) if missing.
pub fn authority_key(path: &Path) -> anyhow::Result<KeyPair> {
    if path.exists() {
        let pem = splitos_rpc::auth::read_private(path)
            .map_err(|e| anyhow::anyhow!("cannot read the cluster's X.509 authority {}: {e}", path.display()))?;
        return Ok(KeyPair::from_pem(std::str::from_utf8(&pem)?)?);
    }
    let key = KeyPair::generate()?;
    splitos_rpc::auth::write_private(path, key.serialize_pem().as_bytes())?;
    Ok(key)
}

fn valid_for(p: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // An hour back, for clients whose clocks are a little behind.
    p.not_before = now - time::Duration::hours(1);
    p.not_after = now + time::Duration::days(days);
}

/// The authority's certificate, made again from its key (clients keep trusting the one they
/// have: same key, same name).
fn authority_cert(ca_key: &KeyPair) -> anyhow::Result<rcgen::Certificate> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "splitos cluster authority");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    valid_for(&mut ca, CA_DAYS);
    Ok(ca.self_signed(ca_key)?)
}

/// A certificate named `name` for the addresses `ips`, for `purposes`, with a key made for
/// it, signed by the authority.
fn leaf(
    ca_key: &KeyPair,
    name: &str,
    ips: &[IpAddr],
    purposes: Vec<ExtendedKeyUsagePurpose>,
) -> anyhow::Result<Issued> {
    let ca = authority_cert(ca_key)?;
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(Vec::<String>::new())?;
    leaf.distinguished_name.push(DnType::CommonName, name);
    leaf.subject_alt_names = ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
    leaf.extended_key_usages = purposes;
    valid_for(&mut leaf, LEAF_DAYS);
    let leaf = leaf.signed_by(&key, &ca, ca_key)?;
    Ok(Issued {
        ca_pem: ca.pem(),
        cert_pem: leaf.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The authority's certificate, and a certificate for the API at `ips` (every manager's)
/// signed by it (with a key made for it).
pub fn issue(ca_key: &KeyPair, ips: &[IpAddr]) -> anyhow::Result<Issued> {
    leaf(
        ca_key,
        "splitos REST API",
        ips,
        vec![ExtendedKeyUsagePurpose::ServerAuth],
    )
}

/// A certificate for an etcd member that keeps the managers' state, at `ips`: it serves the
/// managers' requests and speaks to its peers with it (server and client).
pub fn issue_etcd_member(ca_key: &KeyPair, ips: &[IpAddr]) -> anyhow::Result<Issued> {
    leaf(
        ca_key,
        "splitos etcd member",
        ips,
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
    )
}

/// The global managers' client certificate for etcd.
pub fn issue_etcd_client(ca_key: &KeyPair) -> anyhow::Result<Issued> {
    leaf(
        ca_key,
        "splitos global managers",
        &[],
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )
}

/// Writes an issued certificate to `cert`, its key to `key` (0600) and the authority's
/// certificate to `ca`.
pub fn write_issued(issued: &Issued, ca: &Path, cert: &Path, key: &Path) -> anyhow::Result<()> {
    let named = |p: &Path, e: std::io::Error| anyhow::anyhow!("cannot write {}: {e}", p.display());
    std::fs::write(ca, &issued.ca_pem).map_err(|e| named(ca, e))?;
    std::fs::write(cert, &issued.cert_pem).map_err(|e| named(cert, e))?;
    splitos_rpc::auth::write_private(key, issued.key_pem.as_bytes()).map_err(|e| named(key, e))
}

/// The server side, from the files `issue`'s output was written to; the key file must be the
/// caller's alone, as every key of the cluster.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("the API's certificate {}: {e}", cert.display()))?;
    let pem =
        splitos_rpc::auth::read_private(key).map_err(|e| anyhow::anyhow!("the API's key {}: {e}", key.display()))?;
    let key =
        PrivateKeyDer::from_pem_slice(&pem).map_err(|e| anyhow::anyhow!("the API's key {}: {e}", key.display()))?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    fn verifies(ca_pem: &str, leaf_pem: &str, ip: &str) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(leaf_pem.as_bytes()).unwrap();
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &rustls::pki_types::ServerName::try_from(ip.to_string()).unwrap(),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .is_ok()
    }

    #[test]
    fn the_apis_certificate_chains_to_the_clusters_authority_and_names_its_address() {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = authority_key(&dir.path().join("x509-authority.key")).unwrap();
        let issued = issue(&ca_key, &["10.0.0.7".parse().unwrap()]).unwrap();
        let (cert, key) = (dir.path().join("api.pem"), dir.path().join("api.key"));
        std::fs::write(&cert, &issued.cert_pem).unwrap();
        splitos_rpc::auth::write_private(&key, issued.key_pem.as_bytes()).unwrap();
        acceptor(&cert, &key).unwrap();
        assert!(verifies(&issued.ca_pem, &issued.cert_pem, "10.0.0.7"));
        assert!(
            !verifies(&issued.ca_pem, &issued.cert_pem, "10.0.0.8"),
            "another address"
        );
        // The next start's certificate chains to the authority's certificate clients kept.
        let again = authority_key(&dir.path().join("x509-authority.key")).unwrap();
        let next = issue(&again, &["10.0.0.7".parse().unwrap()]).unwrap();
        assert!(verifies(&issued.ca_pem, &next.cert_pem, "10.0.0.7"));
        // Another cluster's authority does not vouch for it.
        let other = issue(&KeyPair::generate().unwrap(), &["10.0.0.7".parse().unwrap()]).unwrap();
        assert!(!verifies(&other.ca_pem, &issued.cert_pem, "10.0.0.7"));
        // A key file others may read is refused.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(acceptor(&cert, &key).is_err());
    }
}
