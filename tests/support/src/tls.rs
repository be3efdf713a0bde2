//! TLS for the private servers: a test PKI made with `rcgen` at run time
//! ([`TestPki`]), the `redis-server` flags that serve it ([`ServerTls`]) and
//! redis-rs clients that trust it.
//!
//! Nothing here is a fixture file in the repo: certificates are generated
//! once per test process (ECDSA P-256 with ring, well under a millisecond
//! each) into a temp dir the [`reaper`](super::reaper) removes when the
//! process exits, so no certificate can expire in the repo or leak out of it.
//!
//! It does not own any peerq type; it only makes `rediss://` servers and
//! clients that tests then use as they use plain ones.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deadpool_redis::redis;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Where a certificate and its private key are, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate (`-----BEGIN CERTIFICATE-----`).
    pub cert: PathBuf,
    /// Its PKCS#8 private key (`-----BEGIN PRIVATE KEY-----`).
    pub key: PathBuf,
}

/// The certificates the TLS tests need, as PEM files in one temp dir.
///
/// `ca` signs `server`, `client` and `wrong_host`; `other_ca` is unrelated
/// to it and signs `other_client`, so each kind of refusal has a
/// certificate that causes it.
#[derive(Debug)]
pub struct TestPki {
    /// The dir that holds every file below.
    pub dir: PathBuf,
    /// The test CA's certificate: what servers and trusting clients trust.
    pub ca_cert: PathBuf,
    /// A second, unrelated CA's certificate: a client that trusts only it
    /// must refuse the servers.
    pub other_ca_cert: PathBuf,
    /// The server's certificate, for `127.0.0.1` and `localhost`.
    pub server: CertFiles,
    /// A server certificate from the test CA for `localhost` only, no IP
    /// address: a client connecting to `127.0.0.1` must refuse it (the
    /// hostname check), one connecting to `localhost` accepts it.
    pub wrong_host: CertFiles,
    /// A client certificate from the test CA (CN `peerq-test-client`).
    pub client: CertFiles,
    /// A client certificate from the other CA: a server that requires
    /// client certificates must refuse it.
    pub other_client: CertFiles,
}

impl TestPki {
    /// The process's PKI, generated on first use.
    ///
    /// Shared so that a [`ServerTls`] is `Copy` (as [`ServerOptions`]
    /// is) and a restarted server finds its files again; nothing writes to
    /// it after it is made.
    ///
    /// [`ServerOptions`]: super::ServerOptions
    pub fn shared() -> &'static TestPki {
        static PKI: OnceLock<TestPki> = OnceLock::new();
        PKI.get_or_init(TestPki::generate)
    }

    fn generate() -> TestPki {
        let dir = make_pki_dir();
        let ca = make_ca("peerq test CA");
        let other_ca = make_ca("unrelated test CA");
        let ca_cert = write(&dir, "ca.pem", &ca.pem());
        let other_ca_cert = write(&dir, "other-ca.pem", &other_ca.pem());
        let server_names = ["127.0.0.1".to_owned(), "localhost".to_owned()];
        TestPki {
            server: make_leaf(&dir, "server", &server_names, Purpose::Server, &ca),
            wrong_host: make_leaf(
                &dir,
                "wrong-host",
                &["localhost".to_owned()],
                Purpose::Server,
                &ca,
            ),
            client: make_leaf(&dir, "client", &[], Purpose::Client, &ca),
            other_client: make_leaf(&dir, "other-client", &[], Purpose::Client, &other_ca),
            dir,
            ca_cert,
            other_ca_cert,
        }
    }

    /// What a redis-rs client needs to trust `ca_cert` and, with
    /// `client`, to present that certificate.
    pub fn certificates(ca_cert: &Path, client: Option<&CertFiles>) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: client.map(|files| redis::ClientTlsConfig {
                client_cert: read(&files.cert),
                client_key: read(&files.key),
            }),
            root_cert: Some(read(ca_cert)),
        }
    }
}

/// How a [`RedisServer`](super::RedisServer) serves TLS: only TLS, on its
/// port (`--port 0 --tls-port <port>`), with a certificate of the
/// [`TestPki`].
#[derive(Debug, Clone, Copy)]
pub struct ServerTls {
    /// The certificates; [`TestPki::shared`] unless a test makes its own.
    pub pki: &'static TestPki,
    /// `true`: `--tls-auth-clients yes`, a client must present a certificate
    /// from the test CA. `false`: `--tls-auth-clients no`.
    pub require_client_cert: bool,
    /// `true`: serve `pki.wrong_host` (for `localhost` only) instead of
    /// `pki.server`, so clients of [`url`](super::RedisServer::url)
    /// (`127.0.0.1`) fail the hostname check; the harness's own
    /// connections go to `localhost` then.
    pub wrong_host: bool,
}

impl ServerTls {
    /// TLS with the shared PKI, client certificates required or not.
    pub fn new(require_client_cert: bool) -> ServerTls {
        ServerTls {
            pki: TestPki::shared(),
            require_client_cert,
            wrong_host: false,
        }
    }

    /// The `redis-server` arguments that serve TLS on `port` and no plain
    /// TCP at all, so a test can never pass by falling back to plain text.
    pub(super) fn server_args(&self, port: u16) -> Vec<OsString> {
        let served = if self.wrong_host {
            &self.pki.wrong_host
        } else {
            &self.pki.server
        };
        let auth = if self.require_client_cert {
            "yes"
        } else {
            "no"
        };
        let port = port.to_string();
        flags(&[
            ("--port", "0".as_ref()),
            ("--tls-port", port.as_ref()),
            ("--tls-cert-file", served.cert.as_ref()),
            ("--tls-key-file", served.key.as_ref()),
            ("--tls-ca-cert-file", self.pki.ca_cert.as_ref()),
            ("--tls-auth-clients", auth.as_ref()),
        ])
    }

    /// The arguments that make a cluster node speak TLS to the other
    /// nodes too: the cluster bus and replication (and so `CLUSTER SLOTS`
    /// names the TLS ports). A node presents the test client certificate
    /// to the others: by default it would present its server certificate,
    /// made for server authentication only, which a node requiring client
    /// certificates refuses (the cluster never forms).
    pub(super) fn cluster_args(&self) -> Vec<OsString> {
        flags(&[
            ("--tls-cluster", "yes".as_ref()),
            ("--tls-replication", "yes".as_ref()),
            ("--tls-client-cert-file", self.pki.client.cert.as_ref()),
            ("--tls-client-key-file", self.pki.client.key.as_ref()),
        ])
    }

    /// The `redis-cli` arguments that reach a server of these settings:
    /// TLS, trusting the test CA, presenting the test client certificate.
    pub(super) fn cli_args(&self) -> Vec<OsString> {
        let mut args = vec![OsString::from("--tls")];
        args.extend(flags(&[
            ("--cacert", self.pki.ca_cert.as_ref()),
            ("--cert", self.pki.client.cert.as_ref()),
            ("--key", self.pki.client.key.as_ref()),
        ]));
        args
    }

    /// The host the harness's own connections name: one the served
    /// certificate is valid for. Both resolve to `127.0.0.1` only.
    pub(super) fn control_host(&self) -> &'static str {
        if self.wrong_host {
            "localhost"
        } else {
            "127.0.0.1"
        }
    }

    /// A redis-rs client for `url` (a `rediss://` URL) that trusts the test
    /// CA and presents the test client certificate: what the harness's own
    /// control connections and [`RedisServer::client`] use.
    ///
    /// The certificate is sent whether or not the server asks for it, so
    /// one client works with both settings of `require_client_cert`.
    ///
    /// [`RedisServer::client`]: super::RedisServer::client
    pub fn trusted_client(&self, url: &str) -> redis::Client {
        let certs = TestPki::certificates(&self.pki.ca_cert, Some(&self.pki.client));
        redis::Client::build_with_tls(url, certs).expect("TLS client config is valid")
    }
}

/// `(name, value)` pairs as command-line arguments, `name value` each.
fn flags(pairs: &[(&str, &OsStr)]) -> Vec<OsString> {
    pairs
        .iter()
        .flat_map(|(name, value)| [OsString::from(name), value.to_os_string()])
        .collect()
}

/// What a certificate is for: its extended key usage.
#[derive(Clone, Copy)]
enum Purpose {
    Server,
    Client,
}

fn make_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("generate a CA key");
    CertifiedIssuer::self_signed(params, key).expect("self-sign the CA")
}

/// A certificate for `names` (DNS names or IP addresses) signed by `ca`,
/// written as `<stem>.pem` and `<stem>-key.pem` in `dir`.
fn make_leaf(
    dir: &Path,
    stem: &str,
    names: &[String],
    purpose: Purpose,
    ca: &CertifiedIssuer<'static, KeyPair>,
) -> CertFiles {
    let mut params = CertificateParams::new(names.to_vec()).expect("valid subject names");
    let common_name = match purpose {
        Purpose::Server => names.first().map_or("server", String::as_str).to_owned(),
        Purpose::Client => format!("peerq-test-{stem}"),
    };
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    // OpenSSL (the server) and webpki (the client) both check the extended
    // key usage, so a server cert must not be usable as a client cert and
    // the other way round.
    params.extended_key_usages = vec![match purpose {
        Purpose::Server => ExtendedKeyUsagePurpose::ServerAuth,
        Purpose::Client => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("generate a key");
    let cert = params.signed_by(&key, ca).expect("sign the certificate");
    CertFiles {
        cert: write(dir, &format!("{stem}.pem"), &cert.pem()),
        key: write(dir, &format!("{stem}-key.pem"), &key.serialize_pem()),
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, pem).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
    path
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}

/// A fresh dir for the PKI, removed by the reaper when the process exits
/// (the PKI lives in a `static`, which is never dropped).
fn make_pki_dir() -> PathBuf {
    super::redis_server::fresh_dir("pki")
}
