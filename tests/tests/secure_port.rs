//! The secure port (the `secure_port` tier): the daemon in cluster mode against the strict fake
//! API server (its TokenReview and SubjectAccessReview), real pods on the private containerd,
//! and real clients: `curl` for the pages and logs, a WebSocket client speaking kubectl's
//! `v4.channel.k8s.io` for exec, attach and port-forward through the node to containerd's
//! streaming server; and the `enforcer` binary standalone, serving the port with client
//! certificates and `AlwaysAllow`. Needs root, containerd and curl; fails loudly without them.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use enforcer::config::ConfigArgs;
use enforcer_tests::{
    containerd::Containerd,
    fake_api::{FakeApi, Kind},
    node::Node,
    process::DaemonProcess,
    streams::Ws,
};
use serde_json::{Value, json};

const NODE: &str = "sec-node";

/// One test CA and the client certificates it signs (rcgen), written under `dir`.
struct Pki {
    dir: PathBuf,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(dir: &Path, name: &str) -> Self {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name}-ca"));
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate().expect("key"))
            .expect("ca");
        std::fs::write(dir.join(format!("{name}-ca.crt")), ca.pem()).expect("write ca");
        Self {
            dir: dir.to_path_buf(),
            ca,
        }
    }

    fn ca_file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}-ca.crt"))
    }

    /// A client certificate for `cn` in groups `orgs`, valid until `days` from now (negative:
    /// expired); returns (cert, key) files.
    fn client(&self, file: &str, cn: &str, orgs: &[&str], days: i64) -> (PathBuf, PathBuf) {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::days(30);
        p.not_after = now + time::Duration::days(days);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.ca).expect("sign");
        let (c, k) = (
            self.dir.join(format!("{file}.crt")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("write cert");
        std::fs::write(&k, key.serialize_pem()).expect("write key");
        (c, k)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// How a request authenticates.
#[derive(Clone)]
enum Cred {
    None,
    Token(&'static str),
    Cert(PathBuf, PathBuf),
}

struct Port {
    port: u16,
    /// The node's self-signed certificate (leaf and CA).
    server_ca: PathBuf,
}

impl Port {
    /// `curl` over TLS verified against the node's self-signed CA, the node's name resolved
    /// to loopback: (status, body).
    fn get(&self, path: &str, cred: &Cred, extra: &[&str]) -> (u16, String) {
        let out = tempfile::NamedTempFile::new().expect("tmp");
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-o"])
            .arg(out.path())
            .args(["-w", "%{http_code}", "--cacert"])
            .arg(&self.server_ca)
            .args(["--resolve", &format!("{NODE}:{}:127.0.0.1", self.port)]);
        match cred {
            Cred::None => {}
            Cred::Token(t) => {
                cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
            }
            Cred::Cert(c, k) => {
                cmd.arg("--cert").arg(c).arg("--key").arg(k);
            }
        }
        cmd.args(extra)
            .arg(format!("https://{NODE}:{}{path}", self.port));
        let o = cmd.output().expect("curl");
        let code = String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or(0);
        let body = std::fs::read_to_string(out.path()).unwrap_or_default();
        (code, body)
    }
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "no {what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn api_pod(name: &str, uid: &str, containers: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"nodeName": NODE, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": containers},
        "status": {"phase": "Pending"},
    })
}

fn container(name: &str, script: &str) -> Value {
    json!({"name": name, "image": "busybox:local", "imagePullPolicy": "Never",
           "command": ["/bin/sh", "-c", script]})
}

struct Setup {
    _dir: tempfile::TempDir,
    fake: FakeApi,
    node: Node,
    port: Port,
    pki: Pki,
}

async fn setup(tag: &str) -> Setup {
    setup_with(tag, false).await
}

async fn setup_with(tag: &str, bootstrap: bool) -> Setup {
    enforcer_tests::require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "clients");
    let fake = FakeApi::start().await;
    let cd = Containerd::start(tag);
    let kubeconfig = fake.kubeconfig(&cd.dir);
    let port = free_port();
    let args = ConfigArgs {
        hostname_override: Some(NODE.to_owned()),
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_hard: vec!["memory.available<100Mi".to_owned()],
        port: Some(i32::from(port)),
        address: Some("127.0.0.1".to_owned()),
        client_ca_file: Some(pki.ca_file("clients").display().to_string()),
        rotate_server_certificates: Some(bootstrap),
        ..ConfigArgs::default()
    };
    let node = Node::start_in_cluster(cd, args, None, Some(kubeconfig), false);
    let server_ca = if bootstrap {
        pki.ca_file("clients")
    } else {
        node.state.join("pki").join("kubelet.crt")
    };
    wait_until("the secure port", Duration::from_secs(30), || {
        (bootstrap || server_ca.exists())
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    Setup {
        _dir: dir,
        fake,
        node,
        port: Port { port, server_ca },
        pki,
    }
}

async fn run_pod(fake: &FakeApi, pod: Value) {
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    fake.put_pod(pod);
    wait_until(&format!("{name} Running"), Duration::from_secs(60), || {
        fake.get(Kind::Pod, "default", &name)
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
}

/// Per endpoint: anonymous 401, unauthorized 403 (kubelet's body, the fine-grained check
/// falling back to `proxy`), authorized 200; client certificates (CN and O) verified against
/// the client CA (expired or another CA's: 401); bad tokens 401; reviews cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_authorization_per_endpoint() {
    let s = setup("sec-auth").await;
    run_pod(
        &s.fake,
        api_pod(
            "logger",
            "sec-uid-logger",
            json!([container("app", "echo hello; sleep 3600")]),
        ),
    )
    .await;
    // alice: nodes/proxy only. bob: nodes/stats and nodes/metrics. carol (certificate):
    // group ops, everything.
    s.fake.review_token("alice-token", "alice", &["devs"]);
    s.fake.review_token("bob-token", "bob", &[]);
    s.fake.allow("alice", "get", "nodes/proxy");
    s.fake.allow("bob", "get", "nodes/stats");
    s.fake.allow("bob", "get", "nodes/metrics");
    s.fake.allow("ops", "*", "*");
    let carol = Cred::Cert(
        s.pki.client("carol", "carol", &["ops"], 30).0,
        s.pki.dir.join("carol.key"),
    );
    let (expired_c, expired_k) = s.pki.client("old", "carol", &["ops"], -1);
    let other = Pki::new(&s.pki.dir, "other");
    let (foreign_c, foreign_k) = other.client("foreign", "carol", &["ops"], 30);
    let logs = "/containerLogs/default/logger/app";
    // (path, alice, bob)
    let table: &[(&str, u16, u16)] = &[
        ("/pods", 200, 403),
        ("/healthz", 200, 403),
        ("/configz", 200, 403),
        ("/stats/summary", 403, 200),
        ("/metrics", 403, 200),
        ("/metrics/resource", 403, 200),
        (logs, 200, 403),
    ];
    for (path, alice, bob) in table {
        let (code, body) = s.port.get(path, &Cred::None, &[]);
        assert_eq!(
            (code, body.as_str()),
            (401, "Unauthorized"),
            "anonymous {path}"
        );
        let (code, body) = s.port.get(path, &Cred::Token("alice-token"), &[]);
        assert_eq!(code, *alice, "alice {path}: {body}");
        let (code, body) = s.port.get(path, &Cred::Token("bob-token"), &[]);
        assert_eq!(code, *bob, "bob {path}: {body}");
        let (code, body) = s.port.get(path, &carol, &[]);
        assert_eq!(code, 200, "carol {path}: {body}");
    }
    let (_, body) = s.port.get("/pods", &Cred::Token("bob-token"), &[]);
    assert_eq!(
        body,
        "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    let (_, body) = s.port.get("/metrics", &Cred::Token("alice-token"), &[]);
    assert_eq!(
        body,
        "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[metrics])\n"
    );
    let (code, body) = s.port.get(logs, &Cred::Token("alice-token"), &[]);
    assert_eq!((code, body.as_str()), (200, "hello\n"));
    // Bad credentials are 401 (never anonymous).
    for (what, cred) in [
        ("an unknown token", Cred::Token("nobody-token")),
        ("an expired certificate", Cred::Cert(expired_c, expired_k)),
        ("another CA's certificate", Cred::Cert(foreign_c, foreign_k)),
    ] {
        let (code, body) = s.port.get("/pods", &cred, &[]);
        assert_eq!((code, body.as_str()), (401, "Unauthorized"), "{what}");
    }
    // The reviews: carol's certificate needs no TokenReview; alice's token was reviewed once
    // (cached for cacheTTL); each of alice's (user, subresource) decisions asked once.
    let reviews = s.fake.reviews();
    let token_reviews = |t: &str| {
        reviews
            .iter()
            .filter(|(k, spec)| k == "TokenReview" && spec["token"] == t)
            .count()
    };
    assert_eq!(token_reviews("alice-token"), 1, "{reviews:#?}");
    assert_eq!(token_reviews("bob-token"), 1);
    let sar = |user: &str, sub: &str| {
        reviews
            .iter()
            .filter(|(k, spec)| {
                k == "SubjectAccessReview"
                    && spec["user"] == user
                    && spec["resourceAttributes"]["subresource"] == sub
            })
            .count()
    };
    assert_eq!(sar("alice", "proxy"), 1, "{reviews:#?}");
    assert_eq!(sar("alice", "pods"), 1);
    let carol_review = reviews
        .iter()
        .find(|(k, spec)| k == "SubjectAccessReview" && spec["user"] == "carol")
        .map(|(_, spec)| spec.clone())
        .expect("a review for carol");
    assert_eq!(
        carol_review["groups"],
        json!(["ops", "system:authenticated"]),
        "the certificate's O, then system:authenticated"
    );
    assert_eq!(
        carol_review["resourceAttributes"],
        json!({"verb": "get", "version": "v1", "resource": "nodes", "subresource": "pods", "name": NODE})
    );
    finish(s).await;
}

async fn finish(s: Setup) {
    let Setup { node, fake, .. } = s;
    drop(fake);
    let mut cd = node.shutdown().await;
    cd.teardown();
}

/// `/containerLogs` with each option, as kubelet answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_logs_with_each_option() {
    let s = setup("sec-logs").await;
    s.fake.review_token("t", "admin", &[]);
    s.fake.allow("admin", "*", "*");
    let tok = Cred::Token("t");
    run_pod(
        &s.fake,
        api_pod(
            "logs",
            "sec-uid-logs",
            json!([
                container(
                    "lines",
                    "for i in 1 2 3 4 5; do echo line $i; done; sleep 0.5; echo oops >&2; sleep 3600"
                ),
                container(
                    "ticker",
                    "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"
                ),
                container(
                    "once",
                    "echo run $(cat /proc/sys/kernel/random/uuid); sleep 1; exit 1"
                ),
            ]),
        ),
    )
    .await;
    let base = "/containerLogs/default/logs";
    let get = |q: &str| s.port.get(&format!("{base}/{q}"), &tok, &[]);
    wait_until("every line logged", Duration::from_secs(20), || {
        get("lines").1.ends_with("oops\n")
    })
    .await;
    let (code, all) = get("lines");
    assert_eq!(
        (code, all.as_str()),
        (200, "line 1\nline 2\nline 3\nline 4\nline 5\noops\n")
    );
    assert_eq!(get("lines?tailLines=2").1, "line 5\noops\n");
    assert_eq!(get("lines?tail=2").1, "line 5\noops\n");
    assert_eq!(get("lines?tailLines=0").1, "");
    assert_eq!(
        get("lines?tailLines=9223372036854775807").1,
        all,
        "a huge tail"
    );
    assert_eq!(get("lines?limitBytes=9").1, "line 1\nli");
    let stamped = get("lines?timestamps=true&tailLines=1").1;
    let (ts, rest) = stamped.split_once(' ').expect("a timestamp");
    assert_eq!(rest, "oops\n");
    assert!(
        ts.len() == 30 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.',
        "RFC3339 with nine fractional digits: {ts}"
    );
    assert_eq!(get("lines?sinceSeconds=3600").1, all);
    let future = "2999-01-01T00:00:00Z";
    assert_eq!(get(&format!("lines?sinceTime={future}")).1, "");
    // Follow: the ticker's lines keep coming until the client leaves (curl's 2 s).
    let (_, followed) = s.port.get(
        &format!("{base}/ticker?follow=true"),
        &tok,
        &["--max-time", "2"],
    );
    let ticks = followed.lines().filter(|l| l.starts_with("tick ")).count();
    let (_, now) = get("ticker");
    assert!(ticks >= 5, "followed {ticks} ticks: {followed}");
    assert!(now.lines().count() >= ticks);
    // Previous: the instance before the restart.
    wait_until("the restarted container", Duration::from_secs(30), || {
        let (_, prev) = get("once?previous=true");
        prev.starts_with("run ")
    })
    .await;
    let (_, prev) = get("once?previous=true");
    let (_, cur) = get("once");
    assert!(
        prev.starts_with("run ") && cur.starts_with("run "),
        "{prev} / {cur}"
    );
    assert_ne!(prev, cur, "the previous instance's log is its own");
    // Bad input: kubelet's codes and bodies.
    for (q, code, body) in [
        (
            "lines?tailLines=-1",
            422,
            r#"{"message": "Invalid request."}"#,
        ),
        (
            "lines?limitBytes=0",
            422,
            r#"{"message": "Invalid request."}"#,
        ),
        (
            "lines?sinceSeconds=1&sinceTime=2020-01-01T00:00:00Z",
            422,
            r#"{"message": "Invalid request."}"#,
        ),
        (
            "lines?tailLines=abc",
            400,
            r#"{"message": "Unable to decode query."}"#,
        ),
        ("nope", 404, "container \"nope\" not found in pod \"logs\""),
        (
            "lines?previous=true",
            400,
            "previous terminated container \"lines\" in pod \"logs\" not found",
        ),
    ] {
        let (c, b) = get(q);
        assert_eq!((c, b.as_str()), (code, body), "{q}");
    }
    let (c, b) = s.port.get("/containerLogs/default/ghost/app", &tok, &[]);
    assert_eq!((c, b.as_str()), (404, "pod \"ghost\" does not exist"));
    let (c, _) = s
        .port
        .get("/containerLogs/default/../../etc/passwd", &tok, &[]);
    assert!(c == 404 || c == 400, "{c}");
    finish(s).await;
}

/// exec, attach and port-forward through the node: a WebSocket client (kubectl's
/// `v4.channel.k8s.io`) to `/exec`, `/attach` and `/portForward`, proxied to containerd's
/// streaming server; and kubelet's refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_attach_and_port_forward() {
    let s = setup("sec-stream").await;
    s.fake.review_token("t", "admin", &[]);
    s.fake.allow("admin", "*", "*");
    let echo_port = free_port();
    run_pod(
        &s.fake,
        api_pod(
            "shell",
            "sec-uid-shell",
            json!([
                container(
                    "ticker",
                    "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"
                ),
                container("echo", &format!("exec nc -ll -p {echo_port} -e /bin/cat")),
            ]),
        ),
    )
    .await;
    // exec: stdout and the status channel.
    let mut ws = Ws::open(
        s.port.port,
        &s.port.server_ca,
        NODE,
        "/exec/default/shell/ticker?command=sh&command=-c&command=echo%20hello%20$((6*7))&output=1&error=1",
        "t",
    )
    .await
    .unwrap_or_else(|e| panic!("exec: {e}"));
    let (out, status) = ws.collect(1, Duration::from_secs(10)).await;
    assert_eq!(out, "hello 42\n");
    assert!(status.contains("Success"), "{status}");
    // exec with stdin: cat echoes what is sent.
    let mut ws = Ws::open(
        s.port.port,
        &s.port.server_ca,
        NODE,
        "/exec/default/shell/ticker?command=head&command=-n1&input=1&output=1",
        "t",
    )
    .await
    .unwrap_or_else(|e| panic!("exec stdin: {e}"));
    ws.send(0, b"from stdin\n").await;
    let (out, _) = ws.collect(1, Duration::from_secs(10)).await;
    assert_eq!(out, "from stdin\n");
    // attach: the running container's output as it comes.
    let mut ws = Ws::open(
        s.port.port,
        &s.port.server_ca,
        NODE,
        "/attach/default/shell/ticker?output=1",
        "t",
    )
    .await
    .unwrap_or_else(|e| panic!("attach: {e}"));
    let (out, _) = ws.collect(1, Duration::from_secs(2)).await;
    assert!(
        out.lines().filter(|l| l.starts_with("tick ")).count() >= 3,
        "attached output: {out}"
    );
    // port-forward: the pod's echo server through the node.
    let mut ws = Ws::open(
        s.port.port,
        &s.port.server_ca,
        NODE,
        &format!("/portForward/default/shell?port={echo_port}"),
        "t",
    )
    .await
    .unwrap_or_else(|e| panic!("port-forward: {e}"));
    // The server names the port on each channel first (2 bytes, little-endian).
    let mut greeted = 0;
    while greeted < 2 {
        let (c, d) = ws.recv().await.expect("port announcements");
        assert!(c <= 1 && d == echo_port.to_le_bytes(), "{c} {d:?}");
        greeted += 1;
    }
    ws.send(0, b"ping through the node\n").await;
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        let mut got = Vec::new();
        while !got.ends_with(b"\n") {
            match ws.recv().await {
                Some((0, d)) => got.extend_from_slice(&d),
                Some(_) => {}
                None => break,
            }
        }
        got
    })
    .await
    .expect("an echo");
    assert_eq!(got, b"ping through the node\n");
    // Refusals, as kubelet words them.
    let tok = Cred::Token("t");
    let (c, b) = s
        .port
        .get("/exec/default/shell/ticker?command=ls", &tok, &[]);
    assert_eq!(
        (c, b.as_str()),
        (400, "you must specify at least 1 of stdin, stdout, stderr")
    );
    let (c, b) = s
        .port
        .get("/exec/default/shell/ticker?command=ls&output=1", &tok, &[]);
    assert_eq!((c, b.as_str()), (500, "Upgrade request required\n"));
    let (c, b) = s
        .port
        .get("/exec/default/ghost/x?command=ls&output=1", &tok, &[]);
    assert_eq!((c, b.as_str()), (404, "pod does not exist"));
    let e = Ws::open(
        s.port.port,
        &s.port.server_ca,
        NODE,
        "/portForward/default/shell",
        "t",
    )
    .await
    .err();
    assert!(
        e.as_deref()
            .is_some_and(|e| e.starts_with("HTTP/1.1 400")
                && e.contains("query parameter \"port\" is required")),
        "{e:?}"
    );
    let e = Ws::open(
        s.port.port,
        &s.port.server_ca,
        NODE,
        "/exec/default/shell/ticker?command=ls&output=1",
        "nobody",
    )
    .await
    .err();
    assert!(
        e.as_deref().is_some_and(|e| e.starts_with("HTTP/1.1 401")),
        "{e:?}"
    );
    finish(s).await;
}

/// `serverTLSBootstrap` (`--rotate-server-certificates`): the node asks the API server for its
/// serving certificate with a CSR as kubelet's (signer `kubernetes.io/kubelet-serving`,
/// `system:node:<name>` in `system:nodes`, the node's name among the SANs); no handshake
/// succeeds until it is issued; once the test's signer issues it, the port serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificate_through_a_csr() {
    let s = setup_with("sec-csr", true).await;
    s.fake.review_token("t", "admin", &[]);
    s.fake.allow("admin", "*", "*");
    let mut csr = Value::Null;
    wait_until("a CSR", Duration::from_secs(30), || {
        csr = s.fake.csrs().into_iter().next().unwrap_or(Value::Null);
        !csr.is_null()
    })
    .await;
    assert_eq!(csr["spec"]["signerName"], "kubernetes.io/kubelet-serving");
    assert_eq!(
        csr["spec"]["usages"],
        json!(["digital signature", "server auth"])
    );
    let request = csr["spec"]["request"].as_str().expect("request");
    let pem = {
        use std::io::Write as _;
        let mut child = std::process::Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("base64");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(request.as_bytes())
            .expect("write");
        String::from_utf8(child.wait_with_output().expect("base64").stdout).expect("pem")
    };
    let params = rcgen::CertificateSigningRequestParams::from_pem(&pem).expect("a CSR");
    let subject = format!("{:?}", params.params.distinguished_name);
    assert!(
        subject.contains(&format!("system:node:{NODE}")) && subject.contains("system:nodes"),
        "{subject}"
    );
    assert!(
        format!("{:?}", params.params.subject_alt_names).contains(NODE),
        "{:?}",
        params.params.subject_alt_names
    );
    // Not issued yet: no handshake.
    let (code, _) = s.port.get("/healthz", &Cred::Token("t"), &[]);
    assert_eq!(code, 0, "a handshake before the certificate was issued");
    let cert = params.signed_by(&s.pki.ca).expect("sign");
    let name = csr["metadata"]["name"].as_str().expect("name");
    s.fake.issue_csr(name, &cert.pem());
    let mut last = (0, String::new());
    wait_until(
        "the issued certificate served",
        Duration::from_secs(30),
        || {
            last = s.port.get("/healthz", &Cred::Token("t"), &[]);
            last.0 == 200
        },
    )
    .await;
    assert_eq!(last.1, "ok\n");
    assert!(
        s.node
            .state
            .join("pki")
            .join("kubelet-server-current.pem")
            .exists()
    );
    finish(s).await;
}

/// kubectl itself (`kubectl logs`, `kubectl exec`) against the fake API server, which proxies
/// the pod's `log` and `exec` to the node's secure port with its own client certificate, as
/// the API server does; the node authorizes the API server's user by its group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_and_exec_through_the_api_server() {
    let kubectl = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    assert!(
        kubectl.as_ref().is_ok_and(|o| o.status.success()),
        "kubectl is missing (cargo xtask setup installs Debian's kubernetes-client): {kubectl:?}"
    );
    let s = setup("sec-kubectl").await;
    let (cert, key) = s.pki.client(
        "apiserver",
        "kube-apiserver-kubelet-client",
        &["system:masters"],
        30,
    );
    s.fake.allow("system:masters", "*", "*");
    s.fake.proxy_to_node(enforcer_tests::fake_api::NodeProxy {
        port: s.port.port,
        server_name: NODE.to_owned(),
        server_ca: s.port.server_ca.clone(),
        client_cert: cert,
        client_key: key,
    });
    run_pod(
        &s.fake,
        api_pod(
            "shell",
            "sec-uid-kubectl",
            json!([container(
                "ticker",
                "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"
            )]),
        ),
    )
    .await;
    let kubeconfig = s.fake.kubeconfig(s._dir.path());
    let run = |args: &[&str]| {
        let o = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--request-timeout", "20s"])
            .args(args)
            .output()
            .expect("kubectl");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (ok, out, err) = run(&["logs", "shell", "-c", "ticker", "--tail=2"]);
    assert!(ok, "kubectl logs: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l.starts_with("tick ")), "{out}");
    let (ok, out, err) = run(&[
        "exec",
        "shell",
        "-c",
        "ticker",
        "--",
        "sh",
        "-c",
        "echo hello $((6*7))",
    ]);
    assert!(ok, "kubectl exec: {err}");
    assert_eq!(out, "hello 42\n");
    // kubectl port-forward to the pod's echo server, through the API server and the node.
    let (local, remote) = (free_port(), free_port());
    s.fake.put_pod(api_pod(
        "echo",
        "sec-uid-echo",
        json!([container(
            "echo",
            &format!("exec nc -ll -p {remote} -e /bin/cat")
        )]),
    ));
    wait_until("echo Running", Duration::from_secs(60), || {
        s.fake
            .get(Kind::Pod, "default", "echo")
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let mut forward = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["port-forward", "pod/echo", &format!("{local}:{remote}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let echoed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(mut c) = tokio::net::TcpStream::connect(("127.0.0.1", local)).await {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                if c.write_all(b"through kubectl\n").await.is_ok() {
                    let mut got = Vec::new();
                    let mut b = [0u8; 256];
                    while !got.ends_with(b"\n") {
                        match c.read(&mut b).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got.extend_from_slice(&b[..n]),
                        }
                    }
                    if !got.is_empty() {
                        return got;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    // The kubectl this test started, by its PID.
    let _ = forward.kill();
    let out = forward.wait_with_output().expect("kubectl port-forward");
    assert_eq!(
        echoed.ok().as_deref(),
        Some(&b"through kubectl\n"[..]),
        "kubectl port-forward: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    finish(s).await;
}

/// The secure port standalone, as kubelet serves it without an API server: `enforcer run`
/// with `--port`, `--client-ca-file` and `--authorization-mode=AlwaysAllow` serves it with
/// its self-signed certificate; a client certificate turns the log verbosity up (`PUT
/// /debug/flags/v`) and takes a CPU profile; no certificate is 401 (anonymous off), a bearer
/// token too (no API server to review it). `--authorization-mode=Webhook` standalone stops
/// the start with kubelet's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secure_port_standalone_with_client_certificates() {
    enforcer_tests::require_root();
    let cd = Containerd::start("sec-alone");
    let pki = Pki::new(&cd.dir, "alone");
    let (cert, key) = pki.client("admin", "admin", &["system:masters"], 30);
    let manifests = cd.dir.join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifests");
    let state = cd.dir.join("enforcer-state");
    let port = free_port();
    let args = |mode: &str| {
        vec![
            "run".to_owned(),
            "--node-capacity=memory=1Gi".to_owned(),
            "--eviction-hard=memory.available<100Mi".to_owned(),
            "--image-gc-high-threshold=100".to_owned(),
            "--image-gc-low-threshold=99".to_owned(),
            format!("--hostname-override={NODE}"),
            "--address=127.0.0.1".to_owned(),
            format!("--port={port}"),
            format!("--client-ca-file={}", pki.ca_file("alone").display()),
            format!("--authorization-mode={mode}"),
            "--http-address=127.0.0.1:0".to_owned(),
            format!("--cri-socket={}", cd.socket.display()),
            format!("--cgroup-root={}", cd.cgroup_root),
            format!("--cgroup-driver={}", cd.driver.as_str()),
            format!("--manifest-dir={}", manifests.display()),
            format!("--state-dir={}", state.display()),
        ]
    };
    let log = cd.dir.join("enforcer.log");
    // Webhook authorization needs the API server: refused before anything starts.
    let mut refused = DaemonProcess::spawn(&args("Webhook"), &log);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = refused.ended() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "still running: {}",
            refused.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "{status}");
    assert!(
        refused
            .log_text()
            .contains("no client provided, cannot use webhook authorization"),
        "{}",
        refused.log_text()
    );
    let mut daemon = DaemonProcess::spawn(&args("AlwaysAllow"), &log);
    daemon
        .wait_for_log("serving the secure port", Duration::from_secs(60))
        .await;
    let p = Port {
        port,
        server_ca: state.join("pki/kubelet.crt"),
    };
    let admin = Cred::Cert(cert, key);
    assert_eq!(p.get("/healthz", &admin, &[]), (200, "ok\n".to_owned()));
    let (code, body) = p.get("/debug/flags/v", &admin, &["-X", "PUT", "-d", "4"]);
    assert_eq!(
        (code, body.as_str()),
        (200, "successfully set klog.logging.verbosity to 4")
    );
    daemon
        .wait_for_log("log verbosity changed", Duration::from_secs(10))
        .await;
    let out = tempfile::NamedTempFile::new().expect("tmp");
    let profile = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "30", "-o"])
        .arg(out.path())
        .args(["-w", "%{http_code}", "--cacert"])
        .arg(&p.server_ca)
        .args(["--resolve", &format!("{NODE}:{port}:127.0.0.1")])
        .args(["--cert", &pki.dir.join("admin.crt").display().to_string()])
        .args(["--key", &pki.dir.join("admin.key").display().to_string()])
        .arg(format!(
            "https://{NODE}:{port}/debug/pprof/profile?seconds=1"
        ))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&profile.stdout), "200");
    let bytes = std::fs::read(out.path()).expect("profile");
    // A pprof protobuf (gzip-free): field 1 (sample_type), length-delimited.
    assert!(
        bytes.first() == Some(&0x0a) && bytes.len() > 16,
        "a pprof profile: {} bytes",
        bytes.len()
    );
    assert_eq!(p.get("/pods", &Cred::None, &[]).0, 401, "anonymous is off");
    assert_eq!(
        p.get("/pods", &Cred::Token("some-token"), &[]).0,
        401,
        "no API server reviews tokens"
    );
    eprintln!(
        "standalone secure port {port}: client certificate 200 on PUT /debug/flags/v and a 1 s CPU profile ({} bytes); anonymous and a token 401; Webhook mode refused at start",
        bytes.len()
    );
    let stopped = daemon.terminate(Duration::from_secs(60)).await;
    assert!(stopped.success(), "{stopped}");
}
