//! The secure port's TLS: the serving certificate (the configured files, a self-signed pair
//! as kubelet makes one, or `serverTLSBootstrap`'s CSR) and the client-certificate request.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use rustls::{
    DigitallySignedStruct, DistinguishedName, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject as _},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};

use super::{SecureError, SecureOptions, file_err};

/// kubelet's `GenerateSelfSignedCertKey`: a CA (`<host>-ca@<unix>`) and a serving leaf
/// (`<host>@<unix>`, the host as its one SAN, server auth), valid from an hour ago for a
/// year; `kubelet.crt` holds the leaf then the CA. Existing files are kept (as kubelet).
pub fn ensure_self_signed(dir: &Path, host: &str) -> Result<(PathBuf, PathBuf), SecureError> {
    let crt = dir.join("kubelet.crt");
    let key = dir.join("kubelet.key");
    if crt.exists() && key.exists() {
        return Ok((crt, key));
    }
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let g = |e: rcgen::Error| SecureError::Generate(e.to_string());
    let now = time::OffsetDateTime::now_utc();
    let unix = now.unix_timestamp();
    let from = now - time::Duration::hours(1);
    let to = from + time::Duration::days(365);
    let ca_key = rcgen::KeyPair::generate().map_err(g)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(g)?;
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{host}-ca@{unix}"));
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = from;
    ca.not_after = to;
    let issuer = rcgen::CertifiedIssuer::self_signed(ca, ca_key).map_err(g)?;
    let leaf_key = rcgen::KeyPair::generate().map_err(g)?;
    let mut leaf = rcgen::CertificateParams::new(vec![host.to_owned()]).map_err(g)?;
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{host}@{unix}"));
    leaf.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = from;
    leaf.not_after = to;
    let cert = leaf.signed_by(&leaf_key, &issuer).map_err(g)?;
    std::fs::write(&crt, format!("{}{}", cert.pem(), issuer.pem()))
        .map_err(|e| file_err(&crt, e))?;
    write_private(&key, &leaf_key.serialize_pem())?;
    tracing::info!(cert = %crt.display(), "using a self-signed serving certificate");
    Ok((crt, key))
}

fn write_private(path: &Path, text: &str) -> Result<(), SecureError> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| file_err(path, e))?;
    f.write_all(text.as_bytes()).map_err(|e| file_err(path, e))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// kubelet's `RequestClientCert`: a client certificate is asked for and, when given, must
/// prove its key in the handshake; whether it is trusted is decided per request.
#[derive(Debug)]
struct RequestClientCert {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The TLS acceptor and the verifier of client certificates.
pub struct Tls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub(super) verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// The serving certificate of `serverTLSBootstrap`: none until the CSR is issued (the
/// handshake then fails, as kubelet's `no serving certificate available for the kubelet`).
#[derive(Debug, Default)]
pub struct BootstrapCert {
    current: std::sync::RwLock<Option<Arc<rustls::sign::CertifiedKey>>>,
}

impl rustls::server::ResolvesServerCert for BootstrapCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        crate::locks::read(&self.current).clone()
    }
}

impl BootstrapCert {
    /// Serves the chain and key in `pem` (the certificate file kubelet keeps: chain, then key).
    pub fn load(&self, pem: &[u8], name: &Path) -> Result<(), SecureError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| file_err(name, e))?;
        if chain.is_empty() {
            return Err(file_err(name, "no CERTIFICATE block"));
        }
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| file_err(name, e))?;
        let signing = provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| file_err(name, e))?;
        let ck = rustls::sign::CertifiedKey::new(chain, signing);
        *crate::locks::write(&self.current) = Some(Arc::new(ck));
        Ok(())
    }

    fn is_set(&self) -> bool {
        crate::locks::read(&self.current).is_some()
    }
}

/// The file `serverTLSBootstrap` keeps the issued certificate in.
pub const BOOTSTRAP_CURRENT: &str = "kubelet-server-current.pem";

/// `serverTLSBootstrap`: a CSR (`system:node:<name>` in `system:nodes`, the hostname and the
/// node's addresses as SANs, signer `kubernetes.io/kubelet-serving`, usages digital
/// signature and server auth) to the API server, waited for until it is issued, its
/// certificate then written with its key to `kubelet-server-<time>.pem` under `dir`
/// (`kubelet-server-current.pem` pointing at it) and served. A current file that still
/// holds is served at once and no CSR is made.
pub async fn bootstrap(opts: SecureOptions, cert: Arc<BootstrapCert>) {
    let dir = opts.cert_dir.clone();
    let current = dir.join(BOOTSTRAP_CURRENT);
    if let Ok(pem) = std::fs::read(&current)
        && cert.load(&pem, &current).is_ok()
    {
        tracing::info!(path = %current.display(), "serving certificate from the last bootstrap");
        return;
    }
    if opts.kubeconfig.is_none() {
        tracing::warn!(path = %current.display(), "serverTLSBootstrap: Certificate rotation is not enabled, no connection to the apiserver: no serving certificate until that file holds one");
        return;
    }
    let mut delay = Duration::from_secs(1);
    loop {
        match request_certificate(&opts).await {
            Ok(pem) => {
                let file = dir.join(format!(
                    "kubelet-server-{}.pem",
                    k8s_openapi::jiff::Timestamp::now().as_second()
                ));
                let written = std::fs::create_dir_all(&dir)
                    .map_err(|e| file_err(&dir, e))
                    .and_then(|()| write_private(&file, &pem))
                    .and_then(|()| {
                        let tmp = dir.join("kubelet-server-updated.pem");
                        let _ = std::fs::remove_file(&tmp);
                        std::os::unix::fs::symlink(&file, &tmp)
                            .and_then(|()| std::fs::rename(&tmp, &current))
                            .map_err(|e| file_err(&current, e))
                    })
                    .and_then(|()| cert.load(pem.as_bytes(), &file));
                match written {
                    Ok(()) => {
                        tracing::info!(path = %file.display(), "serving certificate issued through the CSR");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "keeping the issued serving certificate"),
                }
            }
            Err(e) => tracing::warn!(error = %e, retry_in = ?delay, "serving certificate CSR"),
        }
        if cert.is_set() {
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

/// One CSR, created and waited for: the issued chain and the key, PEM.
async fn request_certificate(opts: &SecureOptions) -> Result<String, SecureError> {
    use k8s_openapi::{
        ByteString,
        api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };
    let Some(k) = &opts.kubeconfig else {
        return Err(SecureError::CsrNoApiServer);
    };
    let client = crate::sources::apiserver::client_from_kubeconfig(k)
        .await
        .map_err(|e| SecureError::ApiClient(Box::new(e)))?;
    let key = rcgen::KeyPair::generate().map_err(SecureError::Csr)?;
    let mut sans: Vec<String> = vec![opts.hostname.clone()];
    sans.extend(opts.addresses.iter().cloned());
    sans.sort();
    sans.dedup();
    let mut params = rcgen::CertificateParams::new(sans).map_err(SecureError::Csr)?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("system:node:{}", opts.node_name),
    );
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let csr = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(SecureError::Csr)?;
    let api: kube::Api<CertificateSigningRequest> = kube::Api::all(client);
    let made = api
        .create(
            &kube::api::PostParams::default(),
            &CertificateSigningRequest {
                metadata: ObjectMeta {
                    generate_name: Some("csr-".to_owned()),
                    ..Default::default()
                },
                spec: CertificateSigningRequestSpec {
                    request: ByteString(csr.into_bytes()),
                    signer_name: "kubernetes.io/kubelet-serving".to_owned(),
                    usages: Some(vec![
                        "digital signature".to_owned(),
                        "server auth".to_owned(),
                    ]),
                    ..Default::default()
                },
                status: None,
            },
        )
        .await
        .map_err(|e| SecureError::CsrCreate(Box::new(e)))?;
    let name = made.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, "waiting for the serving certificate's CSR to be approved and issued");
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let got = api.get(&name).await.map_err(|e| SecureError::CsrRead {
            name: name.clone(),
            source: Box::new(e),
        })?;
        let st = got.status.unwrap_or_default();
        if let Some(c) = st
            .conditions
            .iter()
            .flatten()
            .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        {
            return Err(SecureError::CsrRefused {
                name,
                condition: c.type_.clone(),
                message: c.message.clone().unwrap_or_default(),
            });
        }
        if let Some(cert) = st.certificate.filter(|c| !c.0.is_empty()) {
            let mut pem = String::from_utf8_lossy(&cert.0).into_owned();
            if !pem.ends_with('\n') {
                pem.push('\n');
            }
            pem.push_str(&key.serialize_pem());
            return Ok(pem);
        }
    }
}

/// The serving certificate (the files, else the self-signed pair) and the client CA.
pub fn tls(opts: &SecureOptions) -> Result<Tls, SecureError> {
    tls_with(opts, None)
}

/// [`tls`], or with `bootstrap` the certificate it will hold.
pub fn tls_with(
    opts: &SecureOptions,
    bootstrap: Option<Arc<BootstrapCert>>,
) -> Result<Tls, SecureError> {
    let served = match (&opts.cert_files, &bootstrap) {
        (_, Some(_)) => None,
        (Some(p), None) => Some(p.clone()),
        (None, None) => Some(ensure_self_signed(&opts.cert_dir, &opts.hostname)?),
    };
    let mut pair = None;
    if let Some((crt, key)) = &served {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(crt)
            .map_err(|e| file_err(crt, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| file_err(crt, e))?;
        if chain.is_empty() {
            return Err(file_err(crt, "no CERTIFICATE block"));
        }
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| file_err(key, e))?;
        pair = Some((chain, private, key.clone()));
    }
    let verifier: Option<Arc<dyn ClientCertVerifier>> = match &opts.client_ca {
        None => None,
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| file_err(ca, e))? {
                roots
                    .add(c.map_err(|e| file_err(ca, e))?)
                    .map_err(|e| file_err(ca, e))?;
            }
            if roots.is_empty() {
                return Err(file_err(ca, "no CA certificate"));
            }
            Some(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| file_err(ca, e))?,
            )
        }
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .map_err(|e| SecureError::Tls(e.to_string()))?;
    let builder = match &verifier {
        Some(v) => {
            builder.with_client_cert_verifier(Arc::new(RequestClientCert { inner: v.clone() }))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = match (pair, bootstrap) {
        (Some((chain, private, key)), _) => builder
            .with_single_cert(chain, private)
            .map_err(|e| file_err(&key, e))?,
        (None, Some(b)) => builder.with_cert_resolver(b),
        (None, None) => return Err(SecureError::Tls("no serving certificate".to_owned())),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        verifier,
    })
}
