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
//! out of pulls ([`Access::is_pull`]). Requests the router does not know (a path outside
//! `/v2/`) log nothing.
//!
//! What containerd 1.6 sends, as these logs show: a pull is `HEAD manifests/<tag>`, `GET
//! manifests/<digest>`, then a `GET blobs/<digest>` for the config and each layer it does not
//! have yet (the busybox layer it has from the local image is never fetched); an index for
//! another platform only is fetched, nothing it lists. Through the mirror every URI carries
//! `?ns=mirror.enforcer.test`. Against basic auth, each request goes once without
//! credentials (401 "invalid authorization credential") and again with them; a wrong password
//! is tried several times (401 "authentication failure") before the pull fails.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::image::ImageError;

mod access;
mod oci;

pub use access::{Access, AccessKind, Target, first_start, last_blob_completion, overlapped};
pub use oci::{
    Blob, OCI_CONFIG, OCI_INDEX, OCI_LAYER_GZIP, OCI_MANIFEST, OciImage, pseudo_random_bytes,
};

/// The user of the `auth` registry.
pub const AUTH_USER: &str = "enforcer";
/// The password of [`AUTH_USER`].
pub const AUTH_PASSWORD: &str = "s3cret";
/// The registry name mirrored by the `plain` registry (it resolves nowhere).
pub const MIRROR_HOST: &str = "mirror.enforcer.test";
/// The registry binary (Debian's `docker-registry`).
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

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

/// Standard base64 with padding (docker config `auth` fields, Secret data).
#[must_use]
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A docker config (`{"auths": ...}`) for `registry` with `user` and `password`.
#[must_use]
pub fn docker_config(registry: &Registry, user: &str, password: &str) -> String {
    serde_json::json!({"auths": {format!("https://{}", registry.host): {
        "auth": base64(format!("{user}:{password}").as_bytes())
    }}})
    .to_string()
}
