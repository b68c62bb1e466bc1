//! Real OCI registries for the image-pull tests: three processes of Debian's `docker-registry`
//! (CNCF distribution 2.8), each on an ephemeral `127.0.0.1` port with its own storage,
//! config and log below the fixture's directory. Test tooling: the release daemon does not
//! carry it.
//!
//! - `tls`: HTTPS, its server certificate (IP SAN `127.0.0.1`) signed by a test CA made with
//!   the `openssl` CLI in the directory ([`Registries::ca`]);
//! - `auth`: HTTPS with the same CA and HTTP basic auth (`auth.htpasswd`, a bcrypt file from
//!   `htpasswd -Bbn`): user [`AUTH_USER`], password [`AUTH_PASSWORD`];
//! - `plain`: plain HTTP, used as a mirror: images named `mirror.enforcer.test/<repo>:<tag>`
//!   ([`MIRROR_HOST`], a name that resolves nowhere) are fetched from it because
//!   [`Registries::write_hosts`] says so in containerd's `certs.d`.
//!
//! Images are pushed through the distribution API with `curl` ([`Registry::push`]); they are
//! built in memory by [`OciImage`] from the busybox layer of [`crate::image`], plus optional
//! layers of incompressible bytes, or as an index listing only another platform.
//!
//! # What the registry logs, and how [`Registry::access_log`] reads it
//!
//! Each registry runs with `log.level: debug` and `log.formatter: json` (its built-in access
//! log, Apache combined format on stdout, is disabled), so its log file is one JSON object a
//! line, written under one lock in the order things happened. Every line about a request
//! carries `http.request.id`, `http.request.method`, `http.request.uri`, and for repository
//! routes `vars.name` (the repository) and `vars.reference` or `vars.digest`. A request routed
//! to the API shows:
//!
//! - `"msg":"authorizing request"` (debug): the first line of every routed request, logged as
//!   the dispatcher takes it up: read as [`AccessKind::Started`];
//! - `"msg":"response completed"` (info) or `"response completed with error"` (error, e.g. a
//!   404 `manifest unknown`), after the handler returned (the body written), with
//!   `http.response.status` and `http.response.duration`: [`AccessKind::Completed`];
//! - on the registry with auth, a request without valid credentials gets no "response
//!   completed" line: its last line is `"msg":"error authorizing context: ..."` (warning), read
//!   as `Completed` with status 401 (a wrong password also logs `error authenticating user`
//!   before it).
//!
//! Lines are numbered in file order ([`Access::line`]): the order requests arrived in is the
//! order of their `Started` entries, and two pulls overlapped when one's first `Started`
//! comes before the other's last blob `GET`'s `Completed` ([`overlapped`]). The fixture's
//! own requests (pushes, start checks) carry the user agent [`PUSH_USER_AGENT`] and are left
//! out of pulls ([`Access::is_pull`]); containerd's say `containerd/1.6.20+unknown`. Requests the router does not
//! know (a path outside `/v2/`) log nothing.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::image::{ImageError, busybox_layer, header, image_config, oci_arch, sha256_hex};

/// The user of the `auth` registry.
pub const AUTH_USER: &str = "enforcer";
/// The password of [`AUTH_USER`].
pub const AUTH_PASSWORD: &str = "s3cret";
/// The registry name mirrored by the `plain` registry (it resolves nowhere).
pub const MIRROR_HOST: &str = "mirror.enforcer.test";
/// The registry binary (Debian's `docker-registry`).
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// Media types of the distribution API.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// The user agent of the fixture's own requests (pushes, start checks), so
/// [`Access::is_pull`] tells them from containerd's.
pub const PUSH_USER_AGENT: &str = "enforcer-test-fixture";

/// How long a registry may take to answer `GET /v2/` after its start.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Errors of the registry fixture; each names the file, tool or registry it concerns.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} is missing: apt-get install {package}")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("registry {name} ({config}) did not start: {why}; its log:\n{log}")]
    Start {
        name: &'static str,
        config: PathBuf,
        why: String,
        log: String,
    },
    #[error("registry {name}: {what} answered HTTP {status}: {body}")]
    Http {
        name: &'static str,
        what: String,
        status: u16,
        body: String,
    },
    #[error("{path}:{line}: {message}")]
    Log {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("building an image: {0}")]
    Image(#[from] ImageError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RegistryError + '_ {
    move |source| RegistryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs `cmd`, returning its stdout; a failure carries its stderr.
fn run(cmd: &mut Command) -> Result<Vec<u8>, RegistryError> {
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| RegistryError::Command {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(RegistryError::Command {
            command,
            message: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr)),
        })
    }
}

/// Fails with the package to install when a tool of the fixture is missing.
pub fn require_tools() -> Result<(), RegistryError> {
    for (tool, package) in [
        (REGISTRY_BIN, "docker-registry"),
        ("/usr/bin/htpasswd", "apache2-utils"),
        ("/usr/bin/openssl", "openssl"),
        ("/usr/bin/curl", "curl"),
    ] {
        if !Path::new(tool).exists() {
            return Err(RegistryError::MissingTool { tool, package });
        }
    }
    Ok(())
}

/// A free TCP port on 127.0.0.1 (bound, then released for the registry to take).
pub fn free_port() -> Result<u16, RegistryError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io_err(Path::new("127.0.0.1:0")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(io_err(Path::new("127.0.0.1:0")))
}

/// One running registry.
#[derive(Debug)]
pub struct Registry {
    /// `tls`, `auth` or `plain`.
    pub name: &'static str,
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// `https` or `http`.
    pub scheme: &'static str,
    /// The CA that signed its certificate (HTTPS only).
    pub ca: Option<PathBuf>,
    /// Basic-auth credentials it wants (the `auth` registry only).
    pub credentials: Option<(String, String)>,
    /// Its JSON log.
    pub log: PathBuf,
    /// Its config file.
    pub config: PathBuf,
    /// Its storage root.
    pub storage: PathBuf,
    child: Option<Child>,
}

/// The three registries of a test, stopped on drop.
#[derive(Debug)]
pub struct Registries {
    /// HTTPS, test CA.
    pub tls: Registry,
    /// HTTPS, test CA, basic auth ([`AUTH_USER`] / [`AUTH_PASSWORD`]).
    pub auth: Registry,
    /// Plain HTTP, the mirror of [`MIRROR_HOST`].
    pub plain: Registry,
    /// The test CA (PEM).
    pub ca: PathBuf,
    /// The fixture's directory.
    pub dir: PathBuf,
}

/// Which of the three a registry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavour {
    Tls,
    Auth,
    Plain,
}

impl Registries {
    /// Makes the CA, the server certificate and the password file in `dir` (created when
    /// missing), then starts the three registries and waits until each answers `GET /v2/`
    /// (401 counts for `auth`). A registry that does not start fails with its log.
    pub fn start(dir: &Path) -> Result<Self, RegistryError> {
        require_tools()?;
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let dir = fs::canonicalize(dir).map_err(io_err(dir))?;
        let ca = make_certificates(&dir)?;
        let htpasswd = dir.join("htpasswd");
        let line = run(Command::new("htpasswd").args(["-Bbn", AUTH_USER, AUTH_PASSWORD]))?;
        fs::write(&htpasswd, line).map_err(io_err(&htpasswd))?;
        let tls = Registry::start(&dir, Flavour::Tls, &ca)?;
        let auth = Registry::start(&dir, Flavour::Auth, &ca)?;
        let plain = Registry::start(&dir, Flavour::Plain, &ca)?;
        Ok(Self {
            tls,
            auth,
            plain,
            ca,
            dir,
        })
    }

    /// `mirror.enforcer.test/<repo>:<tag>`: an image containerd fetches from `plain`.
    #[must_use]
    pub fn mirror_reference(repo: &str, tag: &str) -> String {
        format!("{MIRROR_HOST}/{repo}:{tag}")
    }

    /// Writes containerd's `hosts.toml` for the three registries below `certs_dir` (CRI
    /// `registry.config_path`, e.g. [`crate::containerd::Containerd::certs_dir`]):
    /// `127.0.0.1:PORT/hosts.toml` for each ([`Registry::hosts_toml`]: `ca` for the HTTPS
    /// ones, the `http://` scheme for `plain`), and `mirror.enforcer.test/hosts.toml` sending
    /// that name to `plain` ([`Registry::mirror_hosts_toml`]). containerd reads them at each
    /// pull.
    pub fn write_hosts(&self, certs_dir: &Path) -> Result<(), RegistryError> {
        for r in [&self.tls, &self.auth, &self.plain] {
            write_file(&certs_dir.join(&r.host).join("hosts.toml"), &r.hosts_toml())?;
        }
        write_file(
            &certs_dir.join(MIRROR_HOST).join("hosts.toml"),
            &self.plain.mirror_hosts_toml(),
        )
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), RegistryError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    fs::write(path, text).map_err(io_err(path))
}

/// The test CA and a server certificate for 127.0.0.1 (IP SAN), signed by it, in `dir`
/// (`ca.pem`, `ca.key`, `server.pem`, `server.key`); returns the CA's path.
fn make_certificates(dir: &Path) -> Result<PathBuf, RegistryError> {
    let ca = dir.join("ca.pem");
    let ca_key = dir.join("ca.key");
    let key = dir.join("server.key");
    let csr = dir.join("server.csr");
    let cert = dir.join("server.pem");
    let ext = dir.join("server.ext");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=enforcer test CA",
        ])
        .args(ec)
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(&ca_key)
        .arg("-out")
        .arg(&ca))?;
    run(Command::new("openssl")
        .args(["req", "-new", "-subj", "/CN=127.0.0.1"])
        .args(ec)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr))?;
    write_file(
        &ext,
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
    )?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-set_serial", "1"])
        .arg("-in")
        .arg(&csr)
        .arg("-CA")
        .arg(&ca)
        .arg("-CAkey")
        .arg(&ca_key)
        .arg("-extfile")
        .arg(&ext)
        .arg("-out")
        .arg(&cert))?;
    Ok(ca)
}

impl Registry {
    fn start(dir: &Path, flavour: Flavour, ca: &Path) -> Result<Self, RegistryError> {
        let name = match flavour {
            Flavour::Tls => "tls",
            Flavour::Auth => "auth",
            Flavour::Plain => "plain",
        };
        let storage = dir.join(name).join("storage");
        fs::create_dir_all(&storage).map_err(io_err(&storage))?;
        let mut last = None;
        // The port is free when picked, but another process may take it before the registry
        // binds it: a start that fails that way is tried again with another port.
        for _ in 0..3 {
            let port = free_port()?;
            let mut me = Self {
                name,
                host: format!("127.0.0.1:{port}"),
                scheme: if flavour == Flavour::Plain {
                    "http"
                } else {
                    "https"
                },
                ca: (flavour != Flavour::Plain).then(|| ca.to_path_buf()),
                credentials: (flavour == Flavour::Auth)
                    .then(|| (AUTH_USER.to_owned(), AUTH_PASSWORD.to_owned())),
                log: dir.join(name).join("registry.log"),
                config: dir.join(name).join("config.yml"),
                storage: storage.clone(),
                child: None,
            };
            write_file(&me.config, &me.config_yml(dir, flavour))?;
            match me.launch() {
                Ok(()) => return Ok(me),
                Err(e @ RegistryError::Start { .. })
                    if fs::read_to_string(&me.log)
                        .is_ok_and(|l| l.contains("address already in use")) =>
                {
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| RegistryError::Start {
            name,
            config: dir.join(name).join("config.yml"),
            why: "no free port".into(),
            log: String::new(),
        }))
    }

    fn config_yml(&self, dir: &Path, flavour: Flavour) -> String {
        let mut y = format!(
            "version: 0.1\n\
             log:\n  level: debug\n  formatter: json\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
             http:\n  addr: {host}\n  secret: enforcer-test-{name}\n",
            storage = self.storage.display(),
            host = self.host,
            name = self.name,
        );
        if flavour != Flavour::Plain {
            y.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.join("server.pem").display(),
                dir.join("server.key").display()
            ));
        }
        if flavour == Flavour::Auth {
            y.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: enforcer-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        y
    }

    fn launch(&mut self) -> Result<(), RegistryError> {
        let log = fs::File::create(&self.log).map_err(io_err(&self.log))?;
        let log2 = log.try_clone().map_err(io_err(&self.log))?;
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(io_err(Path::new(REGISTRY_BIN)))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(self.start_error(format!("exited ({status})")));
            }
            if let Ok((status, _, _)) = self.curl(&["-o", "/dev/null"], "/v2/", false)
                && (status == 200 || status == 401)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(
                    self.start_error(format!("GET /v2/ did not answer within {START_TIMEOUT:?}"))
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_error(&self, why: String) -> RegistryError {
        RegistryError::Start {
            name: self.name,
            config: self.config.clone(),
            why,
            log: fs::read_to_string(&self.log).unwrap_or_default(),
        }
    }

    /// Kills the registry (the process this fixture spawned) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The registry's base URL, `https://127.0.0.1:PORT` or `http://...`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.host)
    }

    /// `127.0.0.1:PORT/<repo>:<tag>`.
    #[must_use]
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host)
    }

    /// containerd's `hosts.toml` for this registry's own name (`127.0.0.1:PORT`): `server`
    /// with its scheme and, for HTTPS, the top-level `ca` that applies to it, and an empty
    /// `[host]` table: containerd 1.6.20 refuses a file without a `host` tree ("failed to
    /// decode hosts.toml: invalid `host` tree", then falls back to its defaults), and a host
    /// entry for the same URL would make it try every failing request twice (host, then
    /// server).
    #[must_use]
    pub fn hosts_toml(&self) -> String {
        let mut t = format!("server = \"{}\"\n", self.url());
        if let Some(ca) = &self.ca {
            t.push_str(&format!("ca = \"{}\"\n", ca.display()));
        }
        t.push_str("\n[host]\n");
        t
    }

    /// containerd's `hosts.toml` making this registry the mirror of another name: `server`
    /// and a `[host]` entry (pull, resolve) both at this registry. A request that fails at
    /// the host is sent again to the server, so the registry logs failing requests twice.
    #[must_use]
    pub fn mirror_hosts_toml(&self) -> String {
        let url = self.url();
        let mut t = format!(
            "server = \"{url}\"\n\n[host.\"{url}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        if let Some(ca) = &self.ca {
            t.push_str(&format!("  ca = \"{}\"\n", ca.display()));
        }
        t
    }

    /// Runs curl against `path` (relative to [`Self::url`], or a full URL), with the CA and
    /// credentials of this registry when `auth`; returns (status, response headers, body).
    fn curl(
        &self,
        args: &[&str],
        path: &str,
        auth: bool,
    ) -> Result<(u16, String, Vec<u8>), RegistryError> {
        let url = if path.starts_with("http") {
            path.to_owned()
        } else {
            format!("{}{path}", self.url())
        };
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "60", "-H", "Expect:", "-D", "-"]);
        cmd.args(["-A", PUSH_USER_AGENT]);
        cmd.args(["-w", "\n%{http_code}"]);
        if let Some(ca) = &self.ca {
            cmd.arg("--cacert").arg(ca);
        }
        if auth && let Some((u, p)) = &self.credentials {
            cmd.arg("-u").arg(format!("{u}:{p}"));
        }
        cmd.args(args).arg(&url);
        let out = run(&mut cmd)?;
        // stdout: the header blocks (a `100 Continue` one may come first), the body (unless
        // `-o`), then the status code on its own line.
        let text = out;
        let split = text.iter().rposition(|b| *b == b'\n').unwrap_or(0);
        let status: u16 = String::from_utf8_lossy(&text[split + 1..])
            .trim()
            .parse()
            .map_err(|_| RegistryError::Command {
                command: format!("curl {url}"),
                message: "no status code".into(),
            })?;
        let mut rest = &text[..split];
        let mut headers = String::new();
        while rest.starts_with(b"HTTP/") {
            let end = rest
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(rest.len(), |p| p + 4);
            headers = String::from_utf8_lossy(&rest[..end]).into_owned();
            rest = &rest[end..];
        }
        Ok((status, headers, rest.to_vec()))
    }

    fn expect(
        &self,
        what: &str,
        want: &[u16],
        got: (u16, String, Vec<u8>),
    ) -> Result<String, RegistryError> {
        let (status, headers, body) = got;
        if want.contains(&status) {
            Ok(headers)
        } else {
            Err(RegistryError::Http {
                name: self.name,
                what: what.to_owned(),
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        }
    }

    /// Uploads one blob (monolithic: POST an upload, PUT its bytes with the digest), unless
    /// the repository has it already.
    fn push_blob(&self, repo: &str, blob: &Blob, scratch: &Path) -> Result<(), RegistryError> {
        let head = self.curl(
            &["-I", "-o", "/dev/null"],
            &format!("/v2/{repo}/blobs/{}", blob.digest),
            true,
        )?;
        if head.0 == 200 {
            return Ok(());
        }
        let what = format!("POST /v2/{repo}/blobs/uploads/");
        let got = self.curl(
            &["-X", "POST", "-o", "/dev/null"],
            &format!("/v2/{repo}/blobs/uploads/"),
            true,
        )?;
        let headers = self.expect(&what, &[202], got)?;
        let location = header_value(&headers, "location").ok_or_else(|| RegistryError::Http {
            name: self.name,
            what: what.clone(),
            status: 202,
            body: format!("no Location header in {headers:?}"),
        })?;
        let location = if location.starts_with('/') {
            format!("{}{location}", self.url())
        } else {
            location
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let file = scratch.join(blob.digest.replace(':', "-"));
        fs::write(&file, &blob.data).map_err(io_err(&file))?;
        let data = format!("@{}", file.display());
        let got = self.curl(
            &[
                "-X",
                "PUT",
                "-H",
                "Content-Type: application/octet-stream",
                "--data-binary",
                &data,
            ],
            &format!("{location}{sep}digest={}", blob.digest),
            true,
        );
        let _ = fs::remove_file(&file);
        self.expect(&format!("PUT blob {} of {repo}", blob.digest), &[201], got?)?;
        Ok(())
    }

    fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        manifest: &Blob,
        scratch: &Path,
    ) -> Result<(), RegistryError> {
        let file = scratch.join(manifest.digest.replace(':', "-"));
        fs::write(&file, &manifest.data).map_err(io_err(&file))?;
        let data = format!("@{}", file.display());
        let content_type = format!("Content-Type: {}", manifest.media_type);
        let got = self.curl(
            &["-X", "PUT", "-H", &content_type, "--data-binary", &data],
            &format!("/v2/{repo}/manifests/{reference}"),
            true,
        );
        let _ = fs::remove_file(&file);
        self.expect(
            &format!("PUT /v2/{repo}/manifests/{reference}"),
            &[201],
            got?,
        )?;
        Ok(())
    }

    /// Pushes `image` as `<repo>:<tag>` through the distribution API (blobs, then the
    /// manifests an index lists, by digest, then the top manifest by tag); returns the
    /// digest of the top manifest (what `<repo>@<digest>` names).
    pub fn push(&self, repo: &str, tag: &str, image: &OciImage) -> Result<String, RegistryError> {
        let scratch = self
            .log
            .parent()
            .map_or_else(std::env::temp_dir, Path::to_path_buf)
            .join("push");
        fs::create_dir_all(&scratch).map_err(io_err(&scratch))?;
        for blob in &image.blobs {
            self.push_blob(repo, blob, &scratch)?;
        }
        for m in &image.manifests {
            self.push_manifest(repo, &m.digest, m, &scratch)?;
        }
        self.push_manifest(repo, tag, &image.top, &scratch)?;
        Ok(image.top.digest.clone())
    }

    /// Deletes `<repo>@<digest>` (storage.delete is enabled); its blobs stay.
    pub fn delete_manifest(&self, repo: &str, digest: &str) -> Result<(), RegistryError> {
        let got = self.curl(
            &["-X", "DELETE", "-o", "/dev/null"],
            &format!("/v2/{repo}/manifests/{digest}"),
            true,
        )?;
        self.expect(&format!("DELETE {repo}@{digest}"), &[202], got)?;
        Ok(())
    }

    /// The registry's log read into request entries, in file order (see the module doc).
    pub fn access_log(&self) -> Result<Vec<Access>, RegistryError> {
        let f = fs::File::open(&self.log).map_err(io_err(&self.log))?;
        let mut out = Vec::new();
        for (i, line) in BufReader::new(f).lines().enumerate() {
            let line = line.map_err(io_err(&self.log))?;
            if !line.starts_with('{') {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(&line).map_err(|e| RegistryError::Log {
                    path: self.log.clone(),
                    line: i + 1,
                    message: e.to_string(),
                })?;
            if let Some(a) = Access::from_json(i + 1, &v) {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// The raw log so far (for assertion messages).
    #[must_use]
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn header_value(headers: &str, name: &str) -> Option<String> {
    headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// Whether a log entry marks a request's start or its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// `authorizing request`: the dispatcher took the request up.
    Started,
    /// `response completed` (or `... with error`, or an auth failure: status 401).
    Completed,
}

/// One request event of a registry's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The line number in the log (1-based): the order of events.
    pub line: usize,
    /// `http.request.id`: the same for a request's `Started` and `Completed`.
    pub id: String,
    pub kind: AccessKind,
    /// `GET`, `HEAD`, `POST`, `PUT`, ...
    pub method: String,
    /// The request URI (path and query).
    pub uri: String,
    /// The repository (`vars.name`, or read from the URI).
    pub repo: Option<String>,
    /// The tag or digest (`vars.reference` / `vars.digest`).
    pub reference: Option<String>,
    /// The response status (`Completed` only).
    pub status: Option<u16>,
    /// Why the request failed, on a failed `Completed`: `err.message: err.detail` of a
    /// "response completed with error", or the auth failure ("basic authentication
    /// challenge for realm ...: invalid authorization credential" without credentials,
    /// "...: authentication failure" with a wrong password).
    pub error: Option<String>,
    /// `http.response.duration` as logged, e.g. `1.27ms` (`Completed` only).
    pub duration: Option<String>,
    /// The log's RFC 3339 time stamp.
    pub time: String,
    /// `http.request.useragent` (containerd says `containerd/1.6.x`).
    pub user_agent: String,
}

/// What a request asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/v2/`
    Base,
    /// `/v2/<repo>/manifests/<ref>`
    Manifest(String),
    /// `/v2/<repo>/blobs/<digest>`
    Blob(String),
    /// `/v2/<repo>/blobs/uploads/...`
    Upload,
    /// anything else (`tags/list`, `_catalog`)
    Other,
}

impl Access {
    fn from_json(line: usize, v: &serde_json::Value) -> Option<Self> {
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        let msg = s("msg")?;
        let id = s("http.request.id")?;
        let (kind, status, error) = if msg == "authorizing request" {
            (AccessKind::Started, None, None)
        } else if msg.starts_with("response completed") {
            let status = v
                .get("http.response.status")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u16::try_from(n).ok());
            let error = s("err.message").map(|m| match s("err.detail") {
                Some(d) => format!("{m}: {d}"),
                None => m,
            });
            (AccessKind::Completed, status, error)
        } else if let Some(why) = msg.strip_prefix("error authorizing context: ") {
            (AccessKind::Completed, Some(401), Some(why.to_owned()))
        } else {
            return None;
        };
        let uri = s("http.request.uri").unwrap_or_default();
        Some(Self {
            line,
            id,
            kind,
            method: s("http.request.method").unwrap_or_default(),
            repo: s("vars.name").or_else(|| repo_of_uri(&uri)),
            reference: s("vars.reference").or_else(|| s("vars.digest")),
            uri,
            status,
            error,
            duration: s("http.response.duration"),
            time: s("time").unwrap_or_default(),
            user_agent: s("http.request.useragent").unwrap_or_default(),
        })
    }

    /// What the request asked for, from its URI.
    #[must_use]
    pub fn target(&self) -> Target {
        let path = self.uri.split('?').next().unwrap_or_default();
        if path == "/v2/" || path == "/v2" {
            return Target::Base;
        }
        if path.contains("/blobs/uploads") {
            return Target::Upload;
        }
        if let Some((_, r)) = path.rsplit_once("/manifests/") {
            return Target::Manifest(r.to_owned());
        }
        if let Some((_, d)) = path.rsplit_once("/blobs/") {
            return Target::Blob(d.to_owned());
        }
        Target::Other
    }

    /// A request of a pull: `GET` or `HEAD` from anyone but this fixture (containerd says
    /// `containerd/<version>`).
    #[must_use]
    pub fn is_pull(&self) -> bool {
        (self.method == "GET" || self.method == "HEAD") && self.user_agent != PUSH_USER_AGENT
    }

    /// `METHOD uri -> status` (or `METHOD uri ...` when started), for printing.
    #[must_use]
    pub fn summary(&self) -> String {
        match (self.kind, self.status) {
            (AccessKind::Started, _) => {
                format!("{:>5} {} {} ...", self.line, self.method, self.uri)
            }
            (AccessKind::Completed, s) => format!(
                "{:>5} {} {} -> {} ({}){}",
                self.line,
                self.method,
                self.uri,
                s.map_or_else(|| "?".into(), |s| s.to_string()),
                self.duration.as_deref().unwrap_or("-"),
                self.error
                    .as_deref()
                    .map_or_else(String::new, |e| format!(" {e}"))
            ),
        }
    }
}

/// The repository in a `/v2/<repo>/(manifests|blobs|tags)/...` URI (repositories may have
/// slashes).
fn repo_of_uri(uri: &str) -> Option<String> {
    let path = uri.split('?').next()?.strip_prefix("/v2/")?;
    ["/manifests/", "/blobs/", "/tags/"]
        .iter()
        .find_map(|m| path.find(m).map(|i| path[..i].to_owned()))
}

/// The first `Started` line of a pull request ([`Access::is_pull`]) for `repo`.
#[must_use]
pub fn first_start(log: &[Access], repo: &str) -> Option<usize> {
    log.iter()
        .find(|a| a.kind == AccessKind::Started && a.is_pull() && a.repo.as_deref() == Some(repo))
        .map(|a| a.line)
}

/// The last `Completed` line of a blob `GET` of `repo` by a puller (a pull's end).
#[must_use]
pub fn last_blob_completion(log: &[Access], repo: &str) -> Option<usize> {
    log.iter()
        .rev()
        .find(|a| {
            a.kind == AccessKind::Completed
                && a.method == "GET"
                && a.is_pull()
                && a.repo.as_deref() == Some(repo)
                && matches!(a.target(), Target::Blob(_))
        })
        .map(|a| a.line)
}

/// Whether the pull of `second` began before the pull of `first` ended: `second`'s first
/// request arrived before `first`'s last blob `GET` completed.
#[must_use]
pub fn overlapped(log: &[Access], first: &str, second: &str) -> bool {
    match (first_start(log, second), last_blob_completion(log, first)) {
        (Some(start), Some(end)) => start < end,
        _ => false,
    }
}

/// A blob of an image: its media type, `sha256:<hex>` digest and bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub media_type: String,
    pub digest: String,
    pub data: Vec<u8>,
}

impl Blob {
    fn new(media_type: &str, data: Vec<u8>) -> Self {
        Self {
            media_type: media_type.to_owned(),
            digest: format!("sha256:{}", sha256_hex(&data)),
            data,
        }
    }

    fn json(media_type: &str, v: &serde_json::Value) -> Self {
        Self::new(media_type, v.to_string().into_bytes())
    }

    /// The OCI descriptor of this blob.
    #[must_use]
    pub fn descriptor(&self) -> serde_json::Value {
        serde_json::json!({
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.data.len(),
        })
    }
}

/// An image in memory, ready to push: its blobs (config and layers), the manifests an index
/// lists (pushed by digest), and the top manifest or index (pushed by tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciImage {
    /// Config and layer blobs.
    pub blobs: Vec<Blob>,
    /// Manifests the top index lists (empty for a single-manifest image).
    pub manifests: Vec<Blob>,
    /// The manifest (or index) the tag names.
    pub top: Blob,
}

impl OciImage {
    /// The busybox image of [`crate::image`] (same layer, which containerd then has already
    /// from the local image; the same config plus a label naming the variant; `Cmd` sleeps)
    /// for this machine's platform, plus, when `extra_layer_bytes > 0`, a second layer holding
    /// `/extra/<seed>` with that many pseudo-random bytes (incompressible, deterministic from
    /// `seed`): variants with different layers and sizes.
    pub fn busybox(extra_layer_bytes: usize, seed: u64) -> Result<Self, RegistryError> {
        let (blobs, manifest) = busybox_manifest(oci_arch(), extra_layer_bytes, seed)?;
        Ok(Self {
            blobs,
            manifests: Vec::new(),
            top: manifest,
        })
    }

    /// An image index listing only a `linux/<arch>` manifest (busybox's layer under a config
    /// saying `arch`): containerd on another platform fails to pull it ("no match for
    /// platform in manifest"). `arch` is an OCI name such as `arm64` or `s390x`.
    pub fn only_platform(arch: &str) -> Result<Self, RegistryError> {
        let (blobs, manifest) = busybox_manifest(arch, 0, 0)?;
        let mut desc = manifest.descriptor();
        desc["platform"] = serde_json::json!({ "architecture": arch, "os": "linux" });
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [desc],
        });
        Ok(Self {
            blobs,
            manifests: vec![manifest],
            top: Blob::json(OCI_INDEX, &index),
        })
    }

    /// An index listing only an image for a platform other than this machine's (`s390x`).
    pub fn other_platform() -> Result<Self, RegistryError> {
        Self::only_platform(if oci_arch() == "s390x" {
            "arm64"
        } else {
            "s390x"
        })
    }

    /// Total bytes of the blobs (what a pull downloads besides the manifests).
    #[must_use]
    pub fn blob_bytes(&self) -> usize {
        self.blobs.iter().map(|b| b.data.len()).sum()
    }

    /// The layer digests, in order.
    #[must_use]
    pub fn layer_digests(&self) -> Vec<String> {
        self.blobs
            .iter()
            .filter(|b| b.media_type == OCI_LAYER_GZIP)
            .map(|b| b.digest.clone())
            .collect()
    }
}

/// The busybox layer (built once per process: the binary does not change under a test).
fn cached_busybox_layer() -> Result<(Vec<u8>, String), RegistryError> {
    static LAYER: std::sync::OnceLock<(Vec<u8>, String)> = std::sync::OnceLock::new();
    if let Some(l) = LAYER.get() {
        return Ok(l.clone());
    }
    let l = busybox_layer(Path::new("/bin/busybox"))?;
    Ok(LAYER.get_or_init(|| l).clone())
}

/// `n` pseudo-random bytes from `seed` (xorshift64*): incompressible, deterministic.
#[must_use]
pub fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A layer holding `/extra/<seed>` with `bytes` pseudo-random bytes: `(gzip blob, diff_id)`.
fn extra_layer(bytes: usize, seed: u64) -> Result<(Vec<u8>, String), RegistryError> {
    let data = pseudo_random_bytes(bytes, seed);
    let here = Path::new("<extra layer>");
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(
        &mut header(tar::EntryType::Directory, 0o755, 0),
        "extra",
        &[][..],
    )
    .map_err(io_err(here))?;
    b.append_data(
        &mut header(tar::EntryType::Regular, 0o644, data.len() as u64),
        format!("extra/{seed}"),
        &data[..],
    )
    .map_err(io_err(here))?;
    let tar = b.into_inner().map_err(io_err(here))?;
    let diff_id = format!("sha256:{}", sha256_hex(&tar));
    // Stored, not compressed: the bytes are random anyway, and deflate in a debug build is
    // slow.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    std::io::Write::write_all(&mut enc, &tar).map_err(io_err(here))?;
    Ok((enc.finish().map_err(io_err(here))?, diff_id))
}

/// The blobs and the manifest of a busybox image for `arch` with an optional extra layer.
fn busybox_manifest(
    arch: &str,
    extra_layer_bytes: usize,
    seed: u64,
) -> Result<(Vec<Blob>, Blob), RegistryError> {
    let mut layers = vec![cached_busybox_layer()?];
    if extra_layer_bytes > 0 {
        layers.push(extra_layer(extra_layer_bytes, seed)?);
    }
    let diff_ids: Vec<String> = layers.iter().map(|(_, d)| d.clone()).collect();
    let mut config = image_config(arch, &diff_ids);
    // A label per variant: no two variants (nor the local image containerd imported, whose
    // config is otherwise the same) share a config, so each pull fetches its own config.
    config["config"]["Labels"] = serde_json::json!({
        "org.enforcer.test.variant": format!("{arch}-{extra_layer_bytes}-{seed}"),
    });
    let config = Blob::json(OCI_CONFIG, &config);
    let layers: Vec<Blob> = layers
        .into_iter()
        .map(|(gz, _)| Blob::new(OCI_LAYER_GZIP, gz))
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
    });
    let manifest = Blob::json(OCI_MANIFEST, &manifest);
    let mut blobs = vec![config];
    blobs.extend(layers);
    Ok((blobs, manifest))
}

/// CRI `PullImage` of `image` at the containerd socket `socket`, with basic-auth
/// `credentials` when given (CRI `AuthConfig{username, password}`); returns the image ref
/// or containerd's error as it came (`tonic::Status`: its `message()` is containerd's text).
pub async fn cri_pull(
    socket: &Path,
    image: &str,
    credentials: Option<(&str, &str)>,
) -> Result<String, tonic::Status> {
    use hyper_util::rt::TokioIo;
    use k8s_cri::v1 as cri;
    let path = socket.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{}: {e}", socket.display())))?;
    let mut client = cri::image_service_client::ImageServiceClient::new(channel);
    let auth = credentials.map(|(username, password)| cri::AuthConfig {
        username: username.to_owned(),
        password: password.to_owned(),
        ..Default::default()
    });
    let mut req = tonic::Request::new(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        }),
        auth,
        sandbox_config: None,
    });
    req.set_timeout(Duration::from_secs(120));
    client
        .pull_image(req)
        .await
        .map(|r| r.into_inner().image_ref)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_become_accesses() {
        let started = serde_json::json!({
            "http.request.id": "a", "http.request.method": "HEAD",
            "http.request.uri": "/v2/lib/app/manifests/v1", "level": "debug",
            "msg": "authorizing request", "vars.name": "lib/app", "vars.reference": "v1",
            "time": "t0",
        });
        let done = serde_json::json!({
            "http.request.id": "b", "http.request.method": "GET",
            "http.request.uri": "/v2/lib/app/blobs/sha256:ab", "level": "info",
            "msg": "response completed", "http.response.status": 200,
            "http.response.duration": "1ms", "time": "t1",
        });
        let denied = serde_json::json!({
            "http.request.id": "c", "http.request.method": "GET", "http.request.uri": "/v2/",
            "msg": "error authorizing context: basic authentication challenge",
        });
        let other = serde_json::json!({ "http.request.id": "d", "msg": "GetImageManifest" });
        let a = Access::from_json(1, &started).expect("started");
        assert_eq!(a.kind, AccessKind::Started);
        assert_eq!(a.repo.as_deref(), Some("lib/app"));
        assert_eq!(a.target(), Target::Manifest("v1".into()));
        let b = Access::from_json(2, &done).expect("done");
        assert_eq!((b.kind, b.status), (AccessKind::Completed, Some(200)));
        assert_eq!(b.repo.as_deref(), Some("lib/app"), "repo read from the URI");
        assert_eq!(b.target(), Target::Blob("sha256:ab".into()));
        let c = Access::from_json(3, &denied).expect("denied");
        assert_eq!(
            (c.kind, c.status, c.target()),
            (AccessKind::Completed, Some(401), Target::Base)
        );
        assert_eq!(c.error.as_deref(), Some("basic authentication challenge"));
        assert!(Access::from_json(4, &other).is_none());
        let log = vec![a, b];
        assert_eq!(first_start(&log, "lib/app"), Some(1));
        assert_eq!(last_blob_completion(&log, "lib/app"), Some(2));
    }

    #[test]
    fn overlap_is_read_from_line_order() {
        let ev = |line, repo: &str, kind, uri: &str| Access {
            line,
            id: line.to_string(),
            kind,
            method: "GET".into(),
            uri: uri.into(),
            repo: Some(repo.into()),
            reference: None,
            status: (kind == AccessKind::Completed).then_some(200),
            error: None,
            duration: None,
            time: String::new(),
            user_agent: String::new(),
        };
        use AccessKind::{Completed, Started};
        let serial = vec![
            ev(1, "a", Started, "/v2/a/blobs/sha256:1"),
            ev(2, "a", Completed, "/v2/a/blobs/sha256:1"),
            ev(3, "b", Started, "/v2/b/manifests/t"),
        ];
        assert!(!overlapped(&serial, "a", "b"));
        let parallel = vec![
            ev(1, "a", Started, "/v2/a/blobs/sha256:1"),
            ev(2, "b", Started, "/v2/b/manifests/t"),
            ev(3, "a", Completed, "/v2/a/blobs/sha256:1"),
        ];
        assert!(overlapped(&parallel, "a", "b"));
    }

    #[test]
    fn random_layers_are_deterministic_and_incompressible() {
        let a = pseudo_random_bytes(100_000, 7);
        assert_eq!(a, pseudo_random_bytes(100_000, 7));
        assert_ne!(a, pseudo_random_bytes(100_000, 8));
        let (gz, _) = extra_layer(100_000, 7).expect("layer");
        assert!(gz.len() > 100_000, "gzip of random bytes: {}", gz.len());
    }
}
