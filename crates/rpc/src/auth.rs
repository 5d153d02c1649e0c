//! Who is on the other end of a connection: every connection between components starts with a
//! Noise handshake (`Noise_XX_25519_AESGCM_BLAKE2s`) in which each side proves it holds the
//! private half of a static key that the cluster's certificate authority signed together with
//! a role. The authority is an Ed25519 key that `cluster up` creates and keeps readable by
//! root alone; it issues one [`Credentials`] per component (and one to the admin's tools).
//! After the handshake each side knows the other's [`Role`] from the certificate it verified,
//! never from what a request says.
//!
//! Records after the handshake: a connection that leaves the host is encrypted and
//! authenticated record by record ([`Session`]); a connection over loopback, which only root
//! can watch or inject into, carries frames as they are once the handshake bound it. The
//! initiator says which in its handshake, and the responder refuses plain records from a peer
//! that is not on loopback.
use std::io::{self, Read, Write};
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::server::Peer;
use crate::wire::Role;

pub const NOISE: &str = "Noise_XX_25519_AESGCM_BLAKE2s";
/// The longest handshake or record message Noise allows.
const MAX_MESSAGE: usize = 65535;
/// The initiator's first handshake message: its ephemeral X25519 key.
const FIRST_MESSAGE: usize = 32;
/// Bytes of plaintext in one record (the rest of a message is the tag).
pub const RECORD: usize = MAX_MESSAGE - 16;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("handshake: {0}")]
    Io(io::Error),
    /// The peer is not of this cluster, or broke the protocol.
    #[error("handshake refused: {0}")]
    Refused(String),
}

impl From<io::Error> for AuthError {
    fn from(e: io::Error) -> Self {
        AuthError::Io(e)
    }
}

fn refused(why: impl Into<String>) -> AuthError {
    AuthError::Refused(why.into())
}

/// A component's (or the admin's) identity in the cluster: its role, its static key pair and
/// the authority's signature over both, and the authority's public key to check peers with.
#[derive(Clone, Serialize, Deserialize)]
pub struct Credentials {
    pub role: Role,
    private: Vec<u8>,
    public: Vec<u8>,
    cert: Vec<u8>,
    ca: [u8; 32],
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The certificate a side sends in its handshake message.
#[derive(Serialize, Deserialize)]
struct Cert {
    role: Role,
    sig: Vec<u8>,
    /// Initiator only: whether records are encrypted.
    encrypt: bool,
}

/// What the authority signs: the role and the static public key, with a context.
fn signed(role: Role, public: &[u8]) -> Vec<u8> {
    let mut b = b"splitos component certificate v1\0".to_vec();
    b.extend_from_slice(role.name().as_bytes());
    b.push(0);
    b.extend_from_slice(public);
    b
}

/// `N` bytes from the kernel's random generator.
pub fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: getrandom(2) writes at most `N - got` bytes into the rest of `b`, a live local.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr() as *mut libc::c_void, N - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        got += n as usize;
    }
    Ok(b)
}

/// An identifier no one can guess (a process id, a component id), from the kernel's generator.
pub fn random_u64() -> u64 {
    u64::from_ne_bytes(random::<8>().expect("the kernel's random generator"))
}

/// Writes `bytes` to a new file only its owner may read (`0600`), replacing `path` at once.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Reads a key file, refusing one that another user owns or that other users may read or
/// change.
pub fn read_private(path: &Path) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this user (uid {me})",
                path.display(),
                m.uid()
            ),
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is open to other users (mode {:o}); it must be 0600",
                path.display(),
                m.mode() & 0o777
            ),
        ));
    }
    std::fs::read(path)
}

/// The cluster's certificate authority.
pub struct Authority {
    key: SigningKey,
}

impl Authority {
    pub fn generate() -> io::Result<Authority> {
        Ok(Authority {
            key: SigningKey::from_bytes(&random::<32>()?),
        })
    }

    pub fn load(path: &Path) -> io::Result<Authority> {
        let b = read_private(path)?;
        let seed: [u8; 32] = b.as_slice().try_into().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a cluster authority key", path.display()),
            )
        })?;
        Ok(Authority {
            key: SigningKey::from_bytes(&seed),
        })
    }

    pub fn save(&self, path: &Path) -> io::Result<()> {
        write_private(path, self.key.as_bytes())
    }

    /// New credentials for one component (or the admin) of `role`.
    pub fn issue(&self, role: Role) -> Result<Credentials, AuthError> {
        let kp = snow::Builder::new(NOISE.parse().expect("a valid Noise name"))
            .generate_keypair()
            .map_err(|e| refused(format!("cannot make a key pair: {e}")))?;
        let sig = self.key.sign(&signed(role, &kp.public));
        Ok(Credentials {
            role,
            private: kp.private,
            public: kp.public,
            cert: sig.to_bytes().to_vec(),
            ca: self.key.verifying_key().to_bytes(),
        })
    }
}

impl Credentials {
    pub fn load(path: &Path) -> io::Result<Credentials> {
        postcard::from_bytes(&read_private(path)?).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} holds no credentials: {e}", path.display()),
            )
        })
    }

    pub fn save(&self, path: &Path) -> io::Result<()> {
        write_private(
            path,
            &postcard::to_allocvec(self).expect("encoding into a Vec cannot fail"),
        )
    }

    /// Checks a peer's certificate for the static key the handshake proved it holds.
    fn verify(&self, cert: &Cert, remote_static: &[u8]) -> Result<(), AuthError> {
        let ca = VerifyingKey::from_bytes(&self.ca).map_err(|e| refused(format!("bad authority key: {e}")))?;
        let sig = Signature::from_slice(&cert.sig).map_err(|_| refused("a malformed certificate"))?;
        ca.verify_strict(&signed(cert.role, remote_static), &sig)
            .map_err(|_| refused("a certificate this cluster's authority did not issue"))
    }
}

/// What a handshake established: the peer's role, and the keys of the records that follow
/// (`None`: plain records over loopback).
pub struct Handshake {
    pub peer: Peer,
    pub session: Option<Session>,
}

/// The record keys of one connection. Each direction counts its own records, so a reader and
/// a writer on different threads share it without a lock.
pub struct Session {
    t: snow::StatelessTransportState,
}

impl Session {
    /// Encrypts record number `n` of this side.
    pub fn seal(&self, n: u64, plain: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        out.resize(plain.len() + 16, 0);
        let len = self
            .t
            .write_message(n, plain, out)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("cannot seal a record: {e}")))?;
        out.truncate(len);
        Ok(())
    }

    /// Decrypts and checks record number `n` of the peer.
    pub fn open(&self, n: u64, sealed: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        out.resize(sealed.len(), 0);
        let len = self
            .t
            .read_message(n, sealed, out)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a record that does not authenticate"))?;
        out.truncate(len);
        Ok(())
    }
}

fn send(s: &mut impl Write, msg: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(2 + msg.len());
    b.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    b.extend_from_slice(msg);
    s.write_all(&b)
}

fn recv(s: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut b = vec![0u8; u16::from_le_bytes(len) as usize];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// The peer a verified certificate names: its role and the static key it proved.
fn verified(creds: &Credentials, cert: &Cert, remote_static: Option<&[u8]>) -> Result<Peer, AuthError> {
    let key: [u8; 32] = remote_static
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| refused("no static key"))?;
    creds.verify(cert, &key)?;
    Ok(Peer { role: cert.role, key })
}

fn builder(creds: &Credentials) -> Result<snow::Builder<'_>, AuthError> {
    snow::Builder::new(NOISE.parse().expect("a valid Noise name"))
        .local_private_key(&creds.private)
        .map_err(|e| refused(format!("bad private key: {e}")))
}

/// The connecting side: `encrypt` says whether the records that follow are encrypted.
pub fn initiate<S: Read + Write>(s: &mut S, creds: &Credentials, encrypt: bool) -> Result<Handshake, AuthError> {
    let mut hs = builder(creds)?.build_initiator().map_err(|e| refused(e.to_string()))?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = hs.write_message(&[], &mut buf).map_err(|e| refused(e.to_string()))?;
    send(s, &buf[..n])?;
    let msg = recv(s)?;
    let mut payload = vec![0u8; MAX_MESSAGE];
    let n = hs
        .read_message(&msg, &mut payload)
        .map_err(|_| refused("the peer's handshake does not authenticate"))?;
    let theirs: Cert = postcard::from_bytes(&payload[..n]).map_err(|_| refused("a malformed certificate"))?;
    let peer = verified(creds, &theirs, hs.get_remote_static())?;
    let mine = postcard::to_allocvec(&Cert {
        role: creds.role,
        sig: creds.cert.clone(),
        encrypt,
    })
    .expect("encoding into a Vec cannot fail");
    let n = hs.write_message(&mine, &mut buf).map_err(|e| refused(e.to_string()))?;
    send(s, &buf[..n])?;
    let t = hs.into_stateless_transport_mode().map_err(|e| refused(e.to_string()))?;
    Ok(Handshake {
        peer,
        session: encrypt.then_some(Session { t }),
    })
}

/// The accepting side; `plain_ok`: whether the peer may ask for plain records (it is on
/// loopback).
pub fn respond<S: Read + Write>(s: &mut S, creds: &Credentials, plain_ok: bool) -> Result<Handshake, AuthError> {
    let mut hs = builder(creds)?.build_responder().map_err(|e| refused(e.to_string()))?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut payload = vec![0u8; MAX_MESSAGE];
    // The first message of XX is the initiator's ephemeral key alone: anything else (a frame
    // of the wire format sent without a handshake) is refused before more is read.
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    if u16::from_le_bytes(len) as usize != FIRST_MESSAGE {
        return Err(refused("not a Noise handshake"));
    }
    let mut msg = [0u8; FIRST_MESSAGE];
    s.read_exact(&mut msg)?;
    hs.read_message(&msg, &mut payload)
        .map_err(|_| refused("not a Noise handshake"))?;
    let mine = postcard::to_allocvec(&Cert {
        role: creds.role,
        sig: creds.cert.clone(),
        encrypt: false,
    })
    .expect("encoding into a Vec cannot fail");
    let n = hs.write_message(&mine, &mut buf).map_err(|e| refused(e.to_string()))?;
    send(s, &buf[..n])?;
    let msg = recv(s)?;
    let n = hs
        .read_message(&msg, &mut payload)
        .map_err(|_| refused("the peer's handshake does not authenticate"))?;
    let theirs: Cert = postcard::from_bytes(&payload[..n]).map_err(|_| refused("a malformed certificate"))?;
    let peer = verified(creds, &theirs, hs.get_remote_static())?;
    if !theirs.encrypt && !plain_ok {
        return Err(refused("plain records from a peer that is not on loopback"));
    }
    let t = hs.into_stateless_transport_mode().map_err(|e| refused(e.to_string()))?;
    Ok(Handshake {
        peer,
        session: theirs.encrypt.then_some(Session { t }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn pair(
        a: Credentials,
        b: Credentials,
        encrypt: bool,
        plain_ok: bool,
    ) -> (Result<Handshake, AuthError>, Result<Handshake, AuthError>) {
        let (mut x, mut y) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || respond(&mut y, &b, plain_ok));
        let i = initiate(&mut x, &a, encrypt);
        drop(x);
        (i, t.join().unwrap())
    }

    #[test]
    fn peers_of_one_authority_learn_each_others_role_and_share_record_keys() {
        let ca = Authority::generate().unwrap();
        let (p, m) = (ca.issue(Role::Proc).unwrap(), ca.issue(Role::Mem).unwrap());
        let (pk, mk) = (p.public.clone(), m.public.clone());
        let (i, r) = pair(p, m, true, false);
        let (i, r) = (i.unwrap(), r.unwrap());
        assert_eq!((i.peer.role, r.peer.role), (Role::Mem, Role::Proc));
        assert_eq!(
            (&i.peer.key[..], &r.peer.key[..]),
            (&mk[..], &pk[..]),
            "each learns the key the other proved"
        );
        let (si, sr) = (i.session.unwrap(), r.session.unwrap());
        let (mut sealed, mut opened) = (Vec::new(), Vec::new());
        si.seal(0, b"page", &mut sealed).unwrap();
        assert_ne!(&sealed[..4], b"page");
        sr.open(0, &sealed, &mut opened).unwrap();
        assert_eq!(opened, b"page");
        assert!(
            sr.open(1, &sealed, &mut opened).is_err(),
            "a record replayed under another number"
        );
        sealed[0] ^= 1;
        assert!(sr.open(0, &sealed, &mut opened).is_err(), "a changed record");
    }

    #[test]
    fn another_authoritys_credentials_are_refused_both_ways() {
        let (ours, theirs) = (Authority::generate().unwrap(), Authority::generate().unwrap());
        let (i, r) = pair(
            theirs.issue(Role::Mem).unwrap(),
            ours.issue(Role::Mem).unwrap(),
            true,
            true,
        );
        assert!(i.is_err() || r.is_err(), "one side must refuse");
        assert!(matches!(r, Err(AuthError::Refused(_))) || matches!(i, Err(AuthError::Refused(_))));
        let (i, _) = pair(
            ours.issue(Role::Proc).unwrap(),
            theirs.issue(Role::Mem).unwrap(),
            true,
            true,
        );
        assert!(
            matches!(i, Err(AuthError::Refused(_))),
            "the initiator checks the responder too"
        );
    }

    #[test]
    fn a_role_cannot_be_claimed_with_a_certificate_of_another() {
        let ca = Authority::generate().unwrap();
        let mut forged = ca.issue(Role::Storage).unwrap();
        forged.role = Role::Gm;
        let (_, r) = pair(forged, ca.issue(Role::Mem).unwrap(), true, true);
        assert!(matches!(r, Err(AuthError::Refused(_))));
    }

    #[test]
    fn plain_records_only_from_loopback() {
        let ca = Authority::generate().unwrap();
        let (i, r) = pair(ca.issue(Role::Proc).unwrap(), ca.issue(Role::Mem).unwrap(), false, true);
        assert!(i.unwrap().session.is_none() && r.unwrap().session.is_none());
        let (_, r) = pair(
            ca.issue(Role::Proc).unwrap(),
            ca.issue(Role::Mem).unwrap(),
            false,
            false,
        );
        assert!(matches!(r, Err(AuthError::Refused(_))));
    }

    #[test]
    fn key_files_are_private_and_refused_when_open_to_others() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let ca = Authority::generate().unwrap();
        let (ap, cp) = (d.path().join("ca.key"), d.path().join("mem.cred"));
        ca.save(&ap).unwrap();
        ca.issue(Role::Mem).unwrap().save(&cp).unwrap();
        for p in [&ap, &cp] {
            assert_eq!(std::fs::metadata(p).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(Credentials::load(&cp).unwrap().role, Role::Mem);
        let again = Authority::load(&ap).unwrap();
        assert_eq!(again.key.verifying_key(), ca.key.verifying_key());
        std::fs::set_permissions(&cp, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            Credentials::load(&cp).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
    }
}
