//! The operator's HTTP surface of a running daemon (real kernel, cgroups, a private
//! containerd): each endpoint scraped and parsed (OpenMetrics by a strict parser, JSON into
//! typed structs, the CPU profile as pprof protobuf), and `PUT /debug/flags/v` changing what
//! the `enforcer` binary logs.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use enforcer::config::ConfigArgs;
use enforcer_tests::{
    Daemon,
    containerd::Containerd,
    node::{phase, pod, wait_until},
    process::DaemonProcess,
};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// --- HTTP/1.1, by hand: what a scraper sends ---

struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
    request_with(addr, method, path, "", body)
}

/// [`request`] with extra header lines (`extra`: each ended by `\r\n`).
fn request_with(addr: SocketAddr, method: &str, path: &str, extra: &str, body: &str) -> Answer {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(90)))
        .expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete header");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        body = dechunk(&body);
    } else if let Some(n) = headers.get("content-length") {
        let n: usize = n.parse().expect("content-length");
        assert_eq!(
            body.len(),
            n,
            "{method} {path}: body shorter than announced"
        );
    }
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let size = usize::from_str_radix(
            std::str::from_utf8(&b[..eol])
                .expect("chunk size")
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .expect("chunk size");
        b = &b[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, "")
}

/// Prometheus's scrape `Accept`: OpenMetrics first.
const PROMETHEUS_ACCEPT: &str = "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n";

/// A GET as Prometheus scrapes: OpenMetrics.
fn scrape(addr: SocketAddr, path: &str) -> Answer {
    request_with(addr, "GET", path, PROMETHEUS_ACCEPT, "")
}

/// Debian's Prometheus scraping `/metrics/cadvisor` of `addr` every second: the pod `web`'s
/// container working set, CPU seconds and RSS, summed per pod as kube-prometheus' recording
/// rules do (`image!=""`), and the bytes its network namespace received (on the pod's cgroup,
/// as cAdvisor reports a sandbox's), once it has them (bounded).
async fn prometheus_per_pod(dir: &std::path::Path, addr: SocketAddr) -> [f64; 4] {
    let prom_addr = free_port();
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("prometheus dir");
    let config = prom_dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n\
             - job_name: kubelet\n  metrics_path: /metrics/cadvisor\n  honor_timestamps: false\n  \
             static_configs:\n  - targets: ['{addr}']\n"
        ),
    )
    .expect("prometheus.yml");
    let log = std::fs::File::create(prom_dir.join("prometheus.log")).expect("log");
    let mut prometheus = std::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prometheus (Debian's package, cargo xtask setup)");
    let query = |q: &str| -> Option<f64> {
        enforcer_tests::prometheus_query(&prom_addr.to_string(), q).first()?["value"][1]
            .as_str()?
            .parse()
            .ok()
    };
    let ws_q = r#"sum by (namespace, pod) (container_memory_working_set_bytes{job="kubelet", image!="", pod=~"web.*"})"#;
    let cpu_q = r#"sum by (namespace, pod) (container_cpu_usage_seconds_total{job="kubelet", image!="", pod=~"web.*"})"#;
    let rss_q =
        r#"sum by (namespace, pod) (container_memory_rss{job="kubelet", image!="", pod=~"web.*"})"#;
    let rx_q = r#"sum by (namespace, pod) (container_network_receive_bytes_total{job="kubelet", pod=~"web.*"})"#;
    let mut answer = None;
    let deadline = std::time::Instant::now() + enforcer_tests::scaled(Duration::from_secs(60));
    while answer.is_none() && std::time::Instant::now() < deadline {
        answer = query(ws_q)
            .zip(query(cpu_q))
            .zip(query(rss_q))
            .zip(query(rx_q))
            .map(|(((ws, cpu), rss), rx)| [ws, cpu, rss, rx]);
        if answer.is_none() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    if let Ok(pid) = i32::try_from(prometheus.id()) {
        enforcer_tests::kill(pid, rustix::process::Signal::TERM);
    }
    let _ = prometheus.wait();
    answer.unwrap_or_else(|| {
        panic!(
            "Prometheus never answered per pod: {}",
            std::fs::read_to_string(prom_dir.join("prometheus.log")).unwrap_or_default()
        )
    })
}

/// `promtool check metrics` on a page in the text format (what curl and kubelet's clients
/// get): the problems it reports, none when the page is clean.
fn promtool_problems(page: &str) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (cargo xtask setup installs it)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim()
    .to_owned()
}

// --- a strict OpenMetrics text parser ---

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
    /// The sample's timestamp (seconds since the epoch), when it has one.
    timestamp: Option<f64>,
}

#[derive(Debug)]
struct MetricFamily {
    kind: String,
    help: bool,
    samples: Vec<Sample>,
}

/// Parses OpenMetrics text: every sample belongs to the family declared by the `# TYPE`
/// before it (with the suffixes its type allows), label values are quoted and escaped,
/// values are numbers, and `# EOF` is the last line. Panics with the line otherwise.
fn parse_openmetrics(text: &str) -> BTreeMap<String, MetricFamily> {
    let mut families: BTreeMap<String, MetricFamily> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut helped = std::collections::BTreeSet::new();
    let lines: Vec<&str> = text
        .strip_suffix('\n')
        .expect("ends in a newline")
        .split('\n')
        .collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the last line is # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name, arg) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            assert!(valid_name(name), "bad metric name in {line:?}");
            match kw {
                "TYPE" => {
                    assert!(
                        [
                            "counter",
                            "gauge",
                            "histogram",
                            "summary",
                            "info",
                            "stateset",
                            "unknown",
                            "gaugehistogram"
                        ]
                        .contains(&arg),
                        "{line:?}"
                    );
                    assert!(!families.contains_key(name), "{name} declared twice");
                    families.insert(
                        name.to_owned(),
                        MetricFamily {
                            kind: arg.to_owned(),
                            help: false,
                            samples: Vec::new(),
                        },
                    );
                    current = Some(name.to_owned());
                }
                "HELP" => {
                    assert!(helped.insert(name.to_owned()), "{name}: HELP twice");
                }
                "UNIT" => {}
                other => panic!("unknown keyword {other:?} in {line:?}"),
            }
            continue;
        }
        assert!(!line.is_empty(), "empty line");
        let fam_name = current
            .clone()
            .unwrap_or_else(|| panic!("sample before # TYPE: {line:?}"));
        let (name, labels, rest) = parse_sample(line);
        let fam = families.get_mut(&fam_name).expect("family");
        let allowed: &[&str] = match fam.kind.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        assert!(
            allowed.iter().any(|s| name == format!("{fam_name}{s}")),
            "sample {name} does not belong to {fam_name} ({})",
            fam.kind
        );
        let mut fields = rest.split(' ');
        let value_text = fields.next().unwrap_or("");
        // A timestamp may follow the value (before an exemplar's `#`).
        let timestamp = match fields.next() {
            None | Some("#") => None,
            Some(t) => Some(
                t.parse::<f64>()
                    .unwrap_or_else(|_| panic!("bad timestamp in {line:?}")),
            ),
        };
        let value = match value_text {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        fam.samples.push(Sample {
            name,
            labels,
            value,
            timestamp,
        });
    }
    for (name, f) in &mut families {
        f.help = helped.contains(name);
        if f.kind == "histogram" {
            check_histogram(name, f);
        }
    }
    families
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, &str) {
    let name_end = line
        .find(['{', ' '])
        .unwrap_or_else(|| panic!("no value in {line:?}"));
    let name = &line[..name_end];
    assert!(valid_name(name), "bad sample name in {line:?}");
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(mut l) = rest.strip_prefix('{') {
        loop {
            if let Some(r) = l.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = l
                .find('=')
                .unwrap_or_else(|| panic!("label without = in {line:?}"));
            let key = &l[..eq];
            assert!(valid_name(key), "bad label name in {line:?}");
            l = l[eq + 1..]
                .strip_prefix('"')
                .unwrap_or_else(|| panic!("unquoted label value in {line:?}"));
            let mut value = String::new();
            let mut chars = l.char_indices();
            let close = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c @ ('\\' | '"'))) => value.push(c),
                        other => panic!("bad escape {other:?} in {line:?}"),
                    },
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("unterminated label value in {line:?}"),
                }
            };
            assert!(
                labels.insert(key.to_owned(), value).is_none(),
                "label {key} twice in {line:?}"
            );
            l = &l[close + 1..];
            l = l.strip_prefix(',').unwrap_or(l);
        }
    }
    let rest = rest
        .strip_prefix(' ')
        .unwrap_or_else(|| panic!("no space before the value in {line:?}"));
    (name.to_owned(), labels, rest)
}

/// Buckets are cumulative, end with `+Inf`, and `+Inf` equals `_count`, per label set.
fn check_histogram(name: &str, f: &MetricFamily) {
    let key = |s: &Sample| {
        let mut l = s.labels.clone();
        l.remove("le");
        format!("{l:?}")
    };
    /// Per label set: (le, cumulative count) buckets and the `_count`.
    type Series = (Vec<(f64, f64)>, Option<f64>);
    let mut series: BTreeMap<String, Series> = BTreeMap::new();
    for s in &f.samples {
        let e = series.entry(key(s)).or_default();
        if s.name.ends_with("_bucket") {
            let le = match s.labels.get("le").map(String::as_str) {
                Some("+Inf") => f64::INFINITY,
                Some(v) => v.parse().expect("le"),
                None => panic!("{name}: bucket without le"),
            };
            e.0.push((le, s.value));
        } else if s.name.ends_with("_count") {
            e.1 = Some(s.value);
        }
    }
    for (labels, (buckets, count)) in series {
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{name}{labels}: buckets not cumulative: {buckets:?}"
        );
        let last = buckets.last().expect("buckets");
        assert!(last.0.is_infinite(), "{name}{labels}: no +Inf bucket");
        assert_eq!(Some(last.1), count, "{name}{labels}: +Inf != _count");
    }
}

/// The value of the one sample `name` with `labels` (a subset match), if present.
fn value(
    families: &BTreeMap<String, MetricFamily>,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    families
        .values()
        .flat_map(|f| &f.samples)
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

fn family<'a>(
    families: &'a BTreeMap<String, MetricFamily>,
    name: &str,
    kind: &str,
) -> &'a MetricFamily {
    let f = families.get(name).unwrap_or_else(|| {
        panic!(
            "no family {name} in {:?}",
            families.keys().collect::<Vec<_>>()
        )
    });
    assert_eq!(f.kind, kind, "{name}");
    assert!(f.help, "{name} has no HELP");
    f
}

// --- the JSON pages, as a client would type them (kubelet's field names) ---

#[derive(Debug, Deserialize)]
struct Configz {
    kubeletconfig: KubeletConfigz,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfigz {
    eviction_hard: BTreeMap<String, String>,
    max_pods: u32,
    cgroup_root: String,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: bool,
    enforcer: EnforcerConfigz,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnforcerConfigz {
    http_address: String,
    housekeeping_interval: String,
}

#[derive(Debug, Deserialize)]
struct Summary {
    node: NodeStats,
    pods: Vec<PodStats>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStats {
    node_name: String,
    start_time: String,
    #[serde(default)]
    system_containers: Vec<ContainerStats>,
    cpu: CpuStats,
    memory: MemoryStats,
    fs: FsStats,
    runtime: Option<RuntimeStats>,
    rlimit: RlimitStats,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuntimeStats {
    image_fs: FsStats,
    container_fs: Option<FsStats>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CpuStats {
    time: String,
    usage_core_nano_seconds: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemoryStats {
    time: String,
    available_bytes: Option<u64>,
    working_set_bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FsStats {
    available_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
    used_bytes: Option<u64>,
    inodes_free: Option<u64>,
    #[serde(default)]
    inodes_used: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct RlimitStats {
    maxpid: i64,
    curproc: i64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStats {
    pod_ref: PodRef,
    containers: Vec<ContainerStats>,
    cpu: CpuStats,
    memory: MemoryStats,
    #[serde(rename = "ephemeral-storage")]
    ephemeral_storage: FsStats,
    #[serde(rename = "process_stats")]
    process_stats: ProcessStats,
}

#[derive(Debug, Deserialize)]
struct PodRef {
    name: String,
    namespace: String,
    uid: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStats {
    name: String,
    memory: Option<MemoryStats>,
    cpu: Option<CpuStats>,
    rootfs: Option<FsStats>,
}

#[derive(Debug, Deserialize)]
struct ProcessStats {
    process_count: u64,
}

// --- the daemon ---

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    l.local_addr().expect("addr")
}

const UID: &str = "e0000000-0000-0000-0000-000000000001";
/// Burns a little CPU (so CPU figures are above zero), logs, then sleeps.
const WORK: &str = "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo started; trap 'exit 0' TERM; sleep 3600 & wait";

/// Every endpoint of the in-process daemon, with a pod running, parsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_of_a_running_daemon_parses() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::require_root();
    let cd = Containerd::start("ops");
    let manifests = cd.dir.join("manifests");
    let state = cd.dir.join("state");
    std::fs::create_dir_all(&manifests).expect("manifests");
    let addr = free_port();
    let args = ConfigArgs {
        node_capacity: vec!["memory=1Gi".to_owned()],
        eviction_hard: vec!["memory.available<100Mi".to_owned()],
        housekeeping_interval: Some("1s".to_owned()),
        cgroup_root: Some(cd.cgroup_root.clone()),
        cgroup_driver: Some(cd.driver.as_str().to_owned()),
        cri_socket: Some(cd.socket.clone()),
        manifest_dir: Some(manifests.clone()),
        state_dir: Some(state.clone()),
        http_address: Some(addr.to_string()),
        allow_host_namespaces: Some(true),
        ..ConfigArgs::default()
    };
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&args))
        .expect("configuration")
        .config;
    let daemon = Daemon::start_with(enforcer::daemon::DaemonOptions {
        config,
        watches: vec![],
        run_pods: true,
        static_pods: false,
        kubeconfig: None,
        companion: None,
    });
    wait_until("the daemon answering", Duration::from_secs(60), || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    })
    .await;
    // A readiness probe every second (its results on /metrics/probes).
    let probe = "    readinessProbe: {exec: {command: [\"true\"]}, periodSeconds: 1}\n";
    std::fs::write(manifests.join("web.yaml"), pod("web", UID, "", probe, WORK)).expect("manifest");
    wait_until("the pod running", Duration::from_secs(60), || {
        phase(&state, "web").as_deref() == Some("Running")
    })
    .await;
    // A relist after the start (running pods and containers are relist figures).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // /healthz
    let h = get(addr, "/healthz");
    assert_eq!((h.status, h.text().as_str()), (200, "ok\n"));

    // /metrics, /metrics/resource and /metrics/probes as curl and kubelet's clients get them:
    // the text format kubelet serves, clean by promtool.
    for path in [
        "/metrics",
        "/metrics/resource",
        "/metrics/probes",
        "/metrics/cadvisor",
    ] {
        let plain = get(addr, path);
        assert_eq!(plain.status, 200);
        assert_eq!(
            plain.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8",
            "{path}"
        );
        let problems = promtool_problems(&plain.text());
        assert!(
            problems.is_empty(),
            "promtool check metrics {path}:\n{problems}"
        );
    }
    // cAdvisor's root filesystems (this machine's root is a block device's ext4) and the
    // container's last-seen time.
    let cadvisor = get(addr, "/metrics/cadvisor").text();
    let root_fs = cadvisor
        .lines()
        .find(|l| {
            l.starts_with("container_fs_usage_bytes{container=\"\",device=\"/dev/")
                && l.contains("id=\"/\"")
        })
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(root_fs.is_some_and(|b| b > 0.0), "{cadvisor}");
    assert!(
        cadvisor
            .lines()
            .any(|l| l.starts_with("container_last_seen{container=\"app\"")
                && l.contains("pod=\"web")),
        "{cadvisor}"
    );
    // cAdvisor's process families: the container's own process, its descriptors.
    let of_app = |family: &str| {
        cadvisor
            .lines()
            .find(|l| {
                l.starts_with(&format!("{family}{{container=\"app\"")) && l.contains("pod=\"web")
            })
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert!(
        of_app("container_processes").is_some_and(|n| n >= 1.0),
        "{cadvisor}"
    );
    assert!(
        of_app("container_file_descriptors").is_some_and(|n| n >= 1.0),
        "{cadvisor}"
    );
    // /metrics/probes: the readiness probe's successes, kubelet's labels.
    let probes = get(addr, "/metrics/probes").text();
    let successes = probes
        .lines()
        .find(|l| {
            l.starts_with("prober_probe_total{")
                && l.contains(&format!("pod_uid=\"{UID}\""))
                && l.contains("container=\"app\",namespace=\"default\"")
                && l.contains("probe_type=\"Readiness\",result=\"successful\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(successes.is_some_and(|n| n >= 1.0), "{probes}");
    assert!(probes.contains("process_start_time_seconds "), "{probes}");
    // /metrics/cadvisor scraped by Debian's Prometheus, answering per pod as kube-prometheus'
    // rules ask (`image!=""`: the containers).
    let [pod_ws, pod_cpu, pod_rss, pod_rx] = prometheus_per_pod(&cd.dir, addr).await;
    eprintln!(
        "Prometheus on /metrics/cadvisor: working set {pod_ws} bytes, CPU {pod_cpu} s, RSS {pod_rss} bytes, {pod_rx} bytes received of pod web"
    );
    assert!(
        pod_ws > 0.0 && pod_cpu > 0.0 && pod_rss > 0.0 && pod_rx > 0.0,
        "{pod_ws} {pod_cpu} {pod_rss} {pod_rx}"
    );
    // /metrics as Prometheus scrapes it: OpenMetrics, kubelet's names and the enforcer's.
    let m = scrape(addr, "/metrics");
    assert_eq!(m.status, 200);
    assert!(
        m.headers["content-type"].starts_with("application/openmetrics-text"),
        "{:?}",
        m.headers
    );
    let fams = parse_openmetrics(&m.text());
    let conds = family(&fams, "enforcer_node_condition", "gauge");
    let mut names: Vec<&str> = conds
        .samples
        .iter()
        .map(|s| s.labels["condition"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["DiskPressure", "MemoryPressure", "PIDPressure"]);
    assert!(conds.samples.iter().all(|s| s.value == 0.0), "{conds:?}");
    // Present once they have a sample (a labelled family without one is not written).
    for c in [
        "enforcer_signals_decoded",
        "enforcer_signals_dropped",
        "enforcer_kernel_ringbuf_full",
        "kubelet_started_pods",
        "kubelet_started_containers",
        "kubelet_runtime_operations",
    ] {
        family(&fams, c, "counter");
    }
    for h in [
        "kubelet_runtime_operations_duration_seconds",
        "kubelet_pod_start_duration_seconds",
        "kubelet_pod_worker_duration_seconds",
        "kubelet_pleg_relist_duration_seconds",
        "kubelet_pleg_relist_interval_seconds",
        "kubelet_cgroup_manager_duration_seconds",
        "enforcer_eviction_decision_to_sigkill_seconds",
        "enforcer_eviction_sigkill_to_memory_released_seconds",
    ] {
        family(&fams, h, "histogram");
    }
    // The eviction manager's families, typed right when they appear.
    for (name, kind) in [
        ("kubelet_evictions", "counter"),
        ("kubelet_preemptions", "counter"),
        ("enforcer_kernel_oom_kills", "counter"),
        ("kubelet_runtime_operations_errors", "counter"),
        ("kubelet_eviction_stats_age_seconds", "histogram"),
        ("enforcer_signal_delay_seconds", "histogram"),
        (
            "enforcer_eviction_crossing_to_decision_seconds",
            "histogram",
        ),
    ] {
        if fams.contains_key(name) {
            family(&fams, name, kind);
        }
    }
    let at_least = |name: &str, labels: &[(&str, &str)], min: f64| {
        let v = value(&fams, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?}"));
        assert!(v >= min, "{name}{labels:?} = {v}, want >= {min}");
    };
    at_least("kubelet_running_pods", &[], 1.0);
    at_least(
        "kubelet_running_containers",
        &[("container_state", "running")],
        1.0,
    );
    at_least("kubelet_started_pods_total", &[], 1.0);
    at_least(
        "kubelet_started_containers_total",
        &[("container_type", "container")],
        1.0,
    );
    at_least(
        "kubelet_runtime_operations_total",
        &[("operation_type", "run_podsandbox")],
        1.0,
    );
    at_least(
        "kubelet_runtime_operations_total",
        &[("operation_type", "list_containers")],
        1.0,
    );
    at_least(
        "kubelet_runtime_operations_duration_seconds_count",
        &[("operation_type", "create_container")],
        1.0,
    );
    at_least("kubelet_pod_start_duration_seconds_count", &[], 1.0);
    at_least(
        "kubelet_pod_worker_duration_seconds_count",
        &[("operation_type", "sync")],
        1.0,
    );
    at_least("kubelet_pleg_relist_duration_seconds_count", &[], 2.0);
    at_least("kubelet_pleg_relist_interval_seconds_count", &[], 1.0);
    // kubelet's cgroup manager: the pod cgroup created by the first sync, its values
    // re-written (update) by the next ones.
    at_least(
        "kubelet_cgroup_manager_duration_seconds_count",
        &[("operation_type", "create")],
        1.0,
    );
    at_least(
        "kubelet_cgroup_manager_duration_seconds_count",
        &[("operation_type", "update")],
        1.0,
    );
    // One manifest pod: desired and active, static (not from the API server).
    assert_eq!(
        value(&fams, "kubelet_desired_pods", &[("static", "true")]),
        Some(1.0)
    );
    assert_eq!(
        value(&fams, "kubelet_desired_pods", &[("static", "false")]),
        Some(0.0)
    );
    assert_eq!(
        value(&fams, "kubelet_active_pods", &[("static", "true")]),
        Some(1.0)
    );
    // Its worker: syncing, desired, static; kubelet's 15 working-pod series are all set.
    let working = family(&fams, "kubelet_working_pods", "gauge");
    assert_eq!(working.samples.len(), 15, "{working:?}");
    let sum: f64 = working.samples.iter().map(|s| s.value).sum();
    assert_eq!(sum, 1.0, "{working:?}");
    assert_eq!(
        value(
            &fams,
            "kubelet_working_pods",
            &[
                ("lifecycle", "sync"),
                ("config", "desired"),
                ("static", "true")
            ]
        ),
        Some(1.0)
    );

    // /metrics/resource
    let r = scrape(addr, "/metrics/resource");
    assert_eq!(r.status, 200);
    let res = parse_openmetrics(&r.text());
    assert_eq!(value(&res, "resource_scrape_error", &[]), Some(0.0));
    let node_cpu = value(&res, "node_cpu_usage_seconds_total", &[]).expect("node cpu");
    assert!(node_cpu > 0.0, "{node_cpu}");
    let node_ws = value(&res, "node_memory_working_set_bytes", &[]).expect("node memory");
    assert!(node_ws > 0.0, "{node_ws}");
    let pod_name =
        enforcer_tests::node::find(&enforcer_tests::node::status_file(&state).pods, "web")
            .expect("record")
            .name
            .clone();
    let pod_l = [("namespace", "default"), ("pod", pod_name.as_str())];
    let pod_ws = value(&res, "pod_memory_working_set_bytes", &pod_l).expect("pod memory");
    assert!(pod_ws > 0.0, "{pod_ws}");
    let pod_cpu = value(&res, "pod_cpu_usage_seconds_total", &pod_l).expect("pod cpu");
    assert!(pod_cpu > 0.0, "{pod_cpu}");
    let c_l = [
        ("container", "app"),
        ("namespace", "default"),
        ("pod", pod_name.as_str()),
    ];
    let c_cpu = value(&res, "container_cpu_usage_seconds_total", &c_l).expect("container cpu");
    assert!(c_cpu > 0.0 && c_cpu <= pod_cpu, "{c_cpu} vs pod {pod_cpu}");
    value(&res, "container_memory_working_set_bytes", &c_l).expect("container memory");
    // kubelet's per-sample timestamps: the reading's time on every node, pod and container
    // sample (one reading), none on resource_scrape_error.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64();
    let mut stamps = Vec::new();
    for (name, f) in &res {
        for s in &f.samples {
            if name == "resource_scrape_error" {
                assert_eq!(s.timestamp, None, "{s:?}");
            } else {
                stamps.push(s.timestamp.unwrap_or_else(|| panic!("no timestamp: {s:?}")));
            }
        }
    }
    assert!(stamps.len() >= 6, "{stamps:?}");
    assert!(
        stamps
            .iter()
            .all(|t| *t == stamps[0] && (now - t).abs() < 60.0),
        "{stamps:?} vs now {now}"
    );

    // /configz
    let c = get(addr, "/configz");
    assert_eq!(c.status, 200);
    let configz: Configz = serde_json::from_slice(&c.body).expect("configz JSON");
    let kc = configz.kubeletconfig;
    assert_eq!(
        kc.eviction_hard.get("memory.available").map(String::as_str),
        Some("100Mi")
    );
    assert_eq!(kc.max_pods, 110);
    assert_eq!(kc.cgroup_root, cd.cgroup_root);
    assert!(kc.cgroups_per_qos);
    assert_eq!(kc.enforcer.http_address, addr.to_string());
    assert_eq!(kc.enforcer.housekeeping_interval, "1s");

    // /pods: a PodList of what runs.
    let p = get(addr, "/pods");
    assert_eq!(p.status, 200);
    let raw: serde_json::Value = serde_json::from_slice(&p.body).expect("pods JSON");
    assert_eq!(
        (raw["kind"].as_str(), raw["apiVersion"].as_str()),
        (Some("PodList"), Some("v1"))
    );
    let list: k8s_openapi::List<Pod> = serde_json::from_slice(&p.body).expect("a PodList");
    assert_eq!(list.items.len(), 1, "{list:?}");
    let web = &list.items[0];
    assert_eq!(web.metadata.uid.as_deref(), Some(UID));
    assert_eq!(web.metadata.name.as_deref(), Some(pod_name.as_str()));
    assert_eq!(
        web.spec.as_ref().map(|s| s.containers[0].name.as_str()),
        Some("app")
    );
    let st = web.status.as_ref().expect("status");
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    let cs = &st.container_statuses.as_ref().expect("container statuses")[0];
    assert!(
        cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
        "{cs:?}"
    );
    assert!(
        cs.container_id
            .as_deref()
            .is_some_and(|i| i.starts_with("containerd://"))
    );

    // /stats/summary
    let s = get(addr, "/stats/summary");
    assert_eq!(s.status, 200, "{}", s.text());
    let summary: Summary = serde_json::from_slice(&s.body)
        .unwrap_or_else(|e| panic!("summary JSON: {e}\n{}", s.text()));
    let n = &summary.node;
    assert!(!n.node_name.is_empty() && !n.start_time.is_empty());
    assert!(n.cpu.usage_core_nano_seconds > 0 && !n.cpu.time.is_empty());
    // The 1Gi capacity override: available + working set = capacity.
    let avail = n.memory.available_bytes.expect("node memory available");
    assert_eq!(
        avail + n.memory.working_set_bytes,
        1 << 30,
        "{:?}",
        n.memory
    );
    assert!(!n.memory.time.is_empty());
    assert!(n.fs.capacity_bytes.unwrap_or(0) > 0 && n.fs.available_bytes.is_some());
    assert!(n.fs.inodes_free.is_some() && n.fs.used_bytes.is_some());
    // The runtime's filesystems from CRI ImageFsInfo: used figures from containerd, the rest
    // from statvfs of the mountpoint it names; containerd names no separate container
    // filesystem, so containerFs is the image filesystem's.
    let rt = n.runtime.as_ref().expect("node.runtime");
    let image = &rt.image_fs;
    assert!(
        image.used_bytes.is_some() && image.capacity_bytes.unwrap_or(0) > 0,
        "{rt:?}"
    );
    assert!(image.available_bytes.is_some() && image.inodes_free.is_some());
    let cfs = rt.container_fs.as_ref().expect("containerFs");
    assert_eq!(
        (cfs.used_bytes, cfs.capacity_bytes, cfs.inodes_used),
        (image.used_bytes, image.capacity_bytes, image.inodes_used)
    );
    assert!(
        n.rlimit.maxpid > 0 && n.rlimit.curproc > 0,
        "{:?}",
        n.rlimit
    );
    assert!(
        n.system_containers.iter().any(|c| c.name == "pods"
            && c.memory
                .as_ref()
                .is_some_and(|m| m.available_bytes.is_some())),
        "{:?}",
        n.system_containers
    );
    assert_eq!(summary.pods.len(), 1, "{:?}", summary.pods);
    let ps = &summary.pods[0];
    assert_eq!(
        (
            ps.pod_ref.name.as_str(),
            ps.pod_ref.namespace.as_str(),
            ps.pod_ref.uid.as_str()
        ),
        (pod_name.as_str(), "default", UID)
    );
    assert!(ps.memory.working_set_bytes > 0);
    assert!(ps.cpu.usage_core_nano_seconds > 0);
    assert!(
        ps.process_stats.process_count >= 2,
        "{:?}",
        ps.process_stats
    );
    // The log ("started\n") counts towards the pod's ephemeral storage.
    assert!(
        ps.ephemeral_storage.used_bytes.unwrap_or(0) > 0,
        "{:?}",
        ps.ephemeral_storage
    );
    let app = ps.containers.iter().find(|c| c.name == "app").expect("app");
    assert!(app.memory.as_ref().is_some_and(|m| m.working_set_bytes > 0));
    assert!(
        app.cpu
            .as_ref()
            .is_some_and(|c| c.usage_core_nano_seconds > 0)
    );
    assert!(app.rootfs.as_ref().is_some_and(|r| r.used_bytes.is_some()));

    // /capabilities
    let cap = get(addr, "/capabilities");
    assert_eq!(cap.status, 200);
    let _: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&cap.body).expect("capabilities JSON object");

    // /debug/pprof: the bound, the heap's refusal, a CPU profile decoded.
    for bad in ["0", "61", "x"] {
        let a = get(addr, &format!("/debug/pprof/profile?seconds={bad}"));
        assert_eq!(a.status, 400, "seconds={bad}: {}", a.text());
    }
    let heap = get(addr, "/debug/pprof/heap");
    assert_eq!(heap.status, 501);
    assert!(heap.text().contains("allocator"), "{}", heap.text());
    // Load while sampling, until the profile is answered: this process is the daemon's (the
    // profiler samples every thread).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut x: u64 = 1;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..10_000 {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                }
            }
            x
        })
    };
    let prof = tokio::task::spawn_blocking(move || get(addr, "/debug/pprof/profile?seconds=2"))
        .await
        .expect("join");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = busy.join();
    assert_eq!(prof.status, 200, "{}", prof.text());
    use pprof::protos::Message as _;
    let profile = pprof::protos::Profile::decode(prof.body.as_slice()).expect("pprof protobuf");
    let strings = &profile.string_table;
    assert_eq!(
        strings.first().map(String::as_str),
        Some(""),
        "string 0 is empty"
    );
    let types: Vec<&str> = profile
        .sample_type
        .iter()
        .map(|t| strings[usize::try_from(t.ty).expect("index")].as_str())
        .collect();
    assert!(types.contains(&"cpu"), "{types:?}");
    assert!(
        profile.duration_nanos >= 2_000_000_000,
        "{}",
        profile.duration_nanos
    );
    assert!(!profile.sample.is_empty(), "no samples");
    assert!(!profile.location.is_empty() && !profile.function.is_empty());

    // The pod deleted: its worker ends (no working pod left) after destroying its cgroup.
    std::fs::remove_file(manifests.join("web.yaml")).expect("remove the manifest");
    let working_total = || {
        let fams = parse_openmetrics(&scrape(addr, "/metrics").text());
        fams.get("kubelet_working_pods")
            .map(|f| f.samples.iter().map(|s| s.value).sum::<f64>())
    };
    wait_until("the pod's worker gone", Duration::from_secs(60), || {
        working_total() == Some(0.0)
    })
    .await;
    let fams = parse_openmetrics(&scrape(addr, "/metrics").text());
    let destroyed = value(
        &fams,
        "kubelet_cgroup_manager_duration_seconds_count",
        &[("operation_type", "destroy")],
    );
    assert!(destroyed.is_some_and(|n| n >= 1.0), "{destroyed:?}");

    // /debug/flags/v without the binary's reloadable subscriber: refused, not ignored.
    let v = request(addr, "PUT", "/debug/flags/v", "4");
    assert_eq!(v.status, 501, "{}", v.text());

    // Unknown paths and methods.
    assert_eq!(get(addr, "/nope").status, 404);
    assert_eq!(request(addr, "POST", "/metrics", "").status, 405);

    daemon.stop().await;
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "still listening after the daemon stopped"
    );
    drop(cd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_during_the_start_is_a_clean_stop() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::require_root();
    let cd = Containerd::start("opsterm");
    let manifests = cd.dir.join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifests");
    let mut daemon = DaemonProcess::spawn(
        &[
            "run".to_owned(),
            "--node-capacity=memory=1Gi".to_owned(),
            format!("--http-address={}", free_port()),
            format!("--cri-socket={}", cd.socket.display()),
            format!("--manifest-dir={}", manifests.display()),
            format!("--state-dir={}", cd.dir.join("state").display()),
            format!("--cgroup-root={}", cd.cgroup_root),
        ],
        &cd.dir.join("enforcer.log"),
    );
    // The start's first line: the daemon runs, and is far from started.
    daemon
        .wait_for_log("starting", Duration::from_secs(30))
        .await;
    let status = daemon.terminate(Duration::from_secs(60)).await;
    eprintln!("SIGTERM during the start: {status}");
    assert!(status.success(), "{status}: {}", daemon.log_text());
    assert!(
        daemon.log_text().contains("shutting down"),
        "{}",
        daemon.log_text()
    );
    drop(cd);
}

/// `PUT /debug/flags/v` changes what the `enforcer` binary logs: at the default verbosity no
/// request is logged; at 4 each one is (kubelet logs requests from 3); back at 0 none again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_debug_flags_v_changes_what_is_logged() {
    let _serial = SERIAL.lock().await;
    enforcer_tests::require_root();
    let cd = Containerd::start("opsv");
    let manifests = cd.dir.join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifests");
    let addr = free_port();
    let log_path = cd.dir.join("enforcer.log");
    let daemon = DaemonProcess::spawn(
        &[
            "run".to_owned(),
            "--housekeeping-interval=1s".to_owned(),
            "--node-capacity=memory=1Gi".to_owned(),
            "--eviction-hard=memory.available<100Mi".to_owned(),
            "--image-gc-high-threshold=100".to_owned(),
            "--image-gc-low-threshold=99".to_owned(),
            format!("--http-address={addr}"),
            format!("--cri-socket={}", cd.socket.display()),
            format!("--manifest-dir={}", manifests.display()),
            format!("--state-dir={}", cd.dir.join("state").display()),
            format!("--cgroup-root={}", cd.cgroup_root),
        ],
        &log_path,
    );
    let log_text = || daemon.log_text();
    let logged = || {
        log_text()
            .lines()
            .filter(|l| l.contains("HTTP request") && l.contains("/healthz"))
            .count()
    };
    wait_until("the daemon answering", Duration::from_secs(60), || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    })
    .await;
    for _ in 0..3 {
        assert_eq!(get(addr, "/healthz").status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        logged(),
        0,
        "requests logged at the default verbosity:\n{}",
        log_text()
    );

    let bad = request(addr, "PUT", "/debug/flags/v", "loud");
    assert_eq!(bad.status, 400, "{}", bad.text());
    let set = request(addr, "PUT", "/debug/flags/v", "4");
    assert_eq!(
        (set.status, set.text().as_str()),
        (200, "successfully set klog.logging.verbosity to 4")
    );
    assert_eq!(get(addr, "/healthz").status, 200);
    wait_until("the request logged at v=4", Duration::from_secs(5), || {
        logged() >= 1
    })
    .await;
    assert!(
        log_text().contains("log verbosity changed"),
        "{}",
        log_text()
    );

    let set = request(addr, "PUT", "/debug/flags/v", "0");
    assert_eq!(set.status, 200, "{}", set.text());
    let before = logged();
    for _ in 0..3 {
        assert_eq!(get(addr, "/healthz").status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        logged(),
        before,
        "requests logged after v=0:\n{}",
        log_text()
    );
    drop(daemon);
    drop(cd);
}
