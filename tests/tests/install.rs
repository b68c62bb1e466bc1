//! The companion installed as a fleet installs it: the image built (`xtask image`, twice: the
//! same digest), pushed to a registry (Debian's docker-registry, TLS), the companion overlay
//! rendered (`kubectl kustomize deploy/kustomize/companion`) and its DaemonSet's pod template
//! run, as the DaemonSet controller would create it, as a pod of this node: its image pulled
//! from the registry by the node's kubelet (the enforcer's pod runtime stands in for kubelet,
//! its pods from the strict fake API server), with the template's security context and
//! capabilities, `hostPID`, host network, mounts, arguments and probes unedited but for the
//! test's host paths. Beside it a memory hog and a keeper: the companion, running from its
//! image, kills the hog at kernel speed and the API shows kubelet's status and event; Debian's
//! Prometheus scrapes the companion's metrics through its authenticated port with a token the
//! fake API server's TokenReview accepts, and answers a query on the eviction latency
//! histogram.
//!
//! What the test gives the pod that a cluster would: the ConfigMaps the overlay generates (the
//! kubeconfig pointing at the fake API server, plain HTTP, and the enforcer section with the
//! test node's 1Gi capacity), the service-account token volume the API server's admission
//! adds, the priority the system-node-critical class resolves to, and `status.hostIP`
//! (`--node-ip 127.0.0.1`: every port stays on loopback).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use enforcer_tests::{
    containerd::Containerd,
    fake_api::{FakeApi, Kind},
    http_get,
    kubelet::{Kubelet, grower, holder, pod_json},
    node::wait_until,
    pods::NODE,
    registry::{Registries, free_port},
};
use serde_json::{Value, json};

const HOG: &str = "install-hog-0001";
const KEEPER: &str = "install-keeper-0002";
const COMPANION: &str = "install-companion-0003";
const PROMETHEUS_USER: &str = "system:serviceaccount:monitoring:prometheus-k8s";
const PROMETHEUS_TOKEN: &str = "prometheus-scrape-token";

/// `xtask image --binary <the enforcer under test> --out <dir>`: the layout's digest.
fn build_image(out: &Path, push: Option<(&str, &Path)>) -> String {
    let mut cmd = Command::new(enforcer_tests::xtask_binary());
    cmd.args(["image", "--binary"])
        .arg(enforcer_tests::enforcer_binary())
        .arg("--out")
        .arg(out);
    if let Some((reference, certs)) = push {
        cmd.arg("--push")
            .arg(reference)
            .arg("--cert-dir")
            .arg(certs);
    }
    let o = cmd
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stderr(Stdio::inherit())
        .output()
        .expect("xtask image");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "xtask image failed: {text}");
    eprintln!("{}", text.trim());
    text.split_whitespace()
        .skip_while(|w| *w != "digest")
        .nth(1)
        .unwrap_or_else(|| panic!("a digest in {text:?}"))
        .to_owned()
}

/// The DaemonSet's pod template as the DaemonSet controller and the API server's admission
/// make a pod of it on `NODE`: name, uid, node, the priority of its class, the
/// service-account token volume; the image by the pushed digest; hostPath volumes moved to
/// the test's directories (`paths`: template path -> test path).
fn companion_pod(objects: &[Value], image: &str, paths: &[(&str, PathBuf)]) -> Value {
    let ds = objects
        .iter()
        .find(|v| v["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    let template = &ds["spec"]["template"];
    let mut spec = template["spec"].clone();
    spec["nodeName"] = NODE.into();
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    spec["priority"] = 2_000_001_000.into();
    spec["containers"][0]["image"] = image.into();
    // A runtime grants only capabilities it holds: where this machine's root lacks one the
    // DaemonSet adds (CAP_SYS_RESOURCE here: its negative oom_score_adj values, which the
    // enforcer clamps without it), the pod asks for the others, and the test says so.
    let bounding = bounding_set();
    if let Some(add) =
        spec["containers"][0]["securityContext"]["capabilities"]["add"].as_array_mut()
    {
        add.retain(|c| {
            let name = c.as_str().unwrap_or_default();
            let held = cap_number(name).is_none_or(|n| bounding & (1 << n) != 0);
            if !held {
                eprintln!(
                    "this machine's root lacks CAP_{name}: the companion pod runs without it"
                );
            }
            held
        });
    }
    for v in spec["volumes"].as_array_mut().expect("volumes") {
        let Some(p) = v["hostPath"]["path"].as_str().map(str::to_owned) else {
            continue;
        };
        if let Some((_, to)) = paths.iter().find(|(from, _)| *from == p) {
            v["hostPath"]["path"] = to.display().to_string().into();
        }
    }
    // What the ServiceAccount admission plugin adds to a pod of a service account.
    spec["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({
            "name": "kube-api-access",
            "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]},
        }));
    spec["containers"][0]["volumeMounts"]
        .as_array_mut()
        .expect("volumeMounts")
        .push(json!({"name": "kube-api-access", "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "enforcer-companion-x7k2p",
            "namespace": ds["metadata"]["namespace"],
            "uid": COMPANION,
            "labels": template["metadata"]["labels"],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    })
}

/// The overlay's ConfigMaps as the cluster would hold them, for the fake API server: the
/// kubeconfig's server is the fake's, the enforcer section gets the test node's capacity.
fn config_maps(objects: &[Value], fake: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for cm in objects
        .iter()
        .filter(|v| v["kind"] == "ConfigMap" && v["data"]["kubeconfig"].is_string())
    {
        let mut cm = cm.clone();
        let kubeconfig = cm["data"]["kubeconfig"]
            .as_str()
            .unwrap_or_default()
            .replace("https://kubernetes.default.svc", &format!("http://{fake}"));
        assert!(
            kubeconfig.contains(fake),
            "the kubeconfig's server: {kubeconfig}"
        );
        cm["data"]["kubeconfig"] = kubeconfig.into();
        let config = format!(
            "{}  nodeCapacity: {{memory: 1Gi}}\n",
            cm["data"]["config.yaml"].as_str().unwrap_or_default()
        );
        cm["data"]["config.yaml"] = config.into();
        out.push(cm);
    }
    assert_eq!(out.len(), 1, "one companion ConfigMap");
    out.push(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kube-root-ca.crt", "namespace": "enforcer-system"},
        "data": {"ca.crt": "(the fake API server is plain HTTP)\n"},
    }));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_companion_installs_from_its_image_and_evicts_with_metrics_scraped() {
    enforcer_tests::capture_logs();
    enforcer::node::set_node_ip(std::net::Ipv4Addr::LOCALHOST.into());
    let mut cd = Containerd::start("install");
    let dir = cd.dir.clone();

    // 1. The image, built and pushed to the TLS registry (containerd trusts its CA), then
    //    built again: the same digest.
    let regs = Registries::start(&dir.join("registries")).expect("the test registries");
    regs.write_hosts(&cd.certs_dir()).expect("hosts.toml");
    let certs = dir.join("registry-certs");
    std::fs::create_dir_all(&certs).expect("cert dir");
    std::fs::copy(&regs.ca, certs.join("ca.crt")).expect("the registry's CA");
    let reference = regs.tls.reference("enforcer", "test");
    let first = build_image(&dir.join("image/enforcer"), Some((&reference, &certs)));
    let again = build_image(&dir.join("image/again"), None);
    assert_eq!(first, again, "two builds of one binary give one digest");
    let image = format!("{}/enforcer@{first}", regs.tls.host);
    eprintln!("image {image}");

    // 3. The API server, kubelet's configuration, the kubelet stand-in.
    let fake = FakeApi::start().await;
    let kubeconfig = fake.kubeconfig(&dir);
    let statics = dir.join("kubelet-manifests");
    std::fs::create_dir_all(&statics).expect("static pod dir");
    let kubelet_config = dir.join("kubelet-config.yaml");
    std::fs::write(
        &kubelet_config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cgroupDriver: {}\ncgroupRoot: {}\nstaticPodPath: {}\nevictionHard:\n  \
             memory.available: 300Mi\n",
            cd.driver.as_str(),
            cd.cgroup_root,
            statics.display()
        ),
    )
    .expect("kubelet config");
    let state = dir.join("companion-state");
    std::fs::create_dir_all(&state).expect("state dir");
    let mut kubelet = Kubelet::start(&cd, Some(kubeconfig.clone()));

    // 4. The overlay, rendered; its pod on this node.
    let objects = enforcer_tests::kustomize("companion");
    let fake_addr = kubeconfig_server(&kubeconfig);
    for cm in config_maps(&objects, &fake_addr) {
        fake.put(Kind::ConfigMap, cm);
    }
    fake.review_token(
        PROMETHEUS_TOKEN,
        PROMETHEUS_USER,
        &["system:serviceaccounts"],
    );
    fake.allow(PROMETHEUS_USER, "get", "nodes/metrics");
    let pod = companion_pod(
        &objects,
        &image,
        &[
            ("/var/lib/kubelet/config.yaml", kubelet_config.clone()),
            ("/etc/kubernetes/manifests", statics.clone()),
            ("/var/lib/enforcer-companion", state.clone()),
            ("/run/containerd", dir.clone()),
        ],
    );
    fake.put_pod(pod);
    let mut ready = (String::new(), String::new());
    wait_until(
        "the companion pod pulled from the registry, started and ready (/readyz)",
        Duration::from_secs(120),
        || {
            ready = http_get("127.0.0.1:10266", "/readyz").unwrap_or_default();
            ready.0.contains(" 200")
        },
    )
    .await;
    assert!(kubelet.running(COMPANION), "the companion pod runs");
    let pulls: Vec<String> = regs
        .tls
        .access_log()
        .unwrap_or_default()
        .iter()
        .map(|a| format!("{a:?}"))
        .filter(|a| a.contains("manifests"))
        .collect();
    eprintln!("the companion pod is ready; the registry served: {pulls:?}");
    assert!(!pulls.is_empty(), "the image came from the registry");

    // 5. Prometheus, scraping the secure metrics port with its token.
    let prom_port = free_port().expect("a port");
    let prom_addr = format!("127.0.0.1:{prom_port}");
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("prometheus dir");
    std::fs::write(
        prom_dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n\
             - job_name: enforcer-companion\n  scheme: https\n  tls_config:\n    \
             insecure_skip_verify: true\n  authorization:\n    credentials: {PROMETHEUS_TOKEN}\n  \
             static_configs:\n  - targets: ['127.0.0.1:10267']\n    labels:\n      node: {NODE}\n"
        ),
    )
    .expect("prometheus.yml");
    let prom_log = std::fs::File::create(prom_dir.join("prometheus.log")).expect("log");
    let mut prometheus = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            prom_dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(Stdio::null())
        .stderr(prom_log)
        .spawn()
        .expect("prometheus (Debian's package, cargo xtask setup)");

    // 6. The keeper, then the hog: the companion kills the hog.
    fake.put_pod(pod_json("keeper", KEEPER, 1000, "700Mi", &holder(400)));
    wait_until("keeper running", Duration::from_secs(60), || {
        kubelet.running(KEEPER)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    fake.put_pod(pod_json("hog", HOG, 0, "10Mi", &grower(600)));
    wait_until(
        "the hog's eviction status in the API",
        Duration::from_secs(120),
        || {
            fake.get(Kind::Pod, "default", "hog")
                .is_some_and(|p| p["status"]["reason"] == "Evicted")
        },
    )
    .await;
    let hog = fake.get(Kind::Pod, "default", "hog").expect("hog");
    eprintln!("the hog in the API: status {}", hog["status"]);
    assert_eq!(hog["status"]["phase"], "Failed", "{hog}");
    assert!(
        hog["status"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("The node was low on resource: memory. ")),
        "{hog}"
    );
    assert!(
        hog["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "DisruptionTarget" && c["reason"] == "TerminationByKubelet"),
        "{hog}"
    );
    let event = fake.evicted_event(HOG).await;
    eprintln!(
        "the Evicted event: {} (source {})",
        event["message"], event["source"]
    );
    assert_eq!(event["source"]["host"], NODE);
    let keeper = fake.get(Kind::Pod, "default", "keeper").expect("keeper");
    assert_ne!(keeper["status"]["reason"], "Evicted", "{keeper}");
    // The kill record the companion wrote from inside its image (its state directory).
    let (records, _) = enforcer::kills::read(&state).expect("the companion's kill records");
    let record = records
        .iter()
        .rev()
        .find(|r| r.uid == HOG)
        .unwrap_or_else(|| panic!("a kill record of the hog: {records:?}"));
    eprintln!("the companion's kill record: {:?}", record.chain());
    assert!(
        record.sigkill_ns.is_some(),
        "a hard threshold kills: {record:?}"
    );

    // 7. Prometheus answers from the companion's authenticated port.
    let mut up = Vec::new();
    wait_until(
        "Prometheus scraping the companion",
        Duration::from_secs(60),
        || {
            up =
                enforcer_tests::prometheus_query(&prom_addr, "up{job=\"enforcer-companion\"} == 1");
            !up.is_empty()
        },
    )
    .await;
    let query = "histogram_quantile(0.99, sum by (le) \
                 (enforcer_eviction_decision_to_sigkill_seconds_bucket{job=\"enforcer-companion\"}))";
    let mut answer = Vec::new();
    wait_until("Prometheus' answer on the eviction latency histogram", Duration::from_secs(30), || {
        answer = enforcer_tests::prometheus_query(
            &prom_addr,
            "enforcer_eviction_decision_to_sigkill_seconds_count{job=\"enforcer-companion\"} > 0",
        );
        !answer.is_empty()
    })
    .await;
    let p99 = enforcer_tests::prometheus_query(&prom_addr, query);
    eprintln!("Prometheus: up {up:?}; evictions timed {answer:?}; {query} = {p99:?}");
    assert!(
        p99.first()
            .and_then(|r| r["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| v.is_finite() && v > 0.0),
        "a p99 from the histogram: {p99:?}"
    );
    let kubelet_families = enforcer_tests::prometheus_query(
        &prom_addr,
        "{job=\"enforcer-companion\", __name__=~\"kubelet_.*|process_.*\"}",
    );
    assert!(
        kubelet_families.is_empty(),
        "no family kubelet serves: {kubelet_families:?}"
    );
    let reviews: Vec<String> = fake.reviews().iter().map(|(k, _)| k.clone()).collect();
    assert!(
        reviews.iter().any(|k| k == "TokenReview")
            && reviews.iter().any(|k| k == "SubjectAccessReview"),
        "the scrape was authenticated and authorized through the API server: {reviews:?}"
    );

    let _ = prometheus.kill();
    let _ = prometheus.wait();
    kubelet.stop().await;
    cd.remove_all_pods().await;
    cd.teardown();
    drop(regs);
}

/// This process's capability bounding set (`CapBnd` of `/proc/self/status`).
fn bounding_set() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// The number of a capability the DaemonSet adds (`linux/capability.h`).
fn cap_number(name: &str) -> Option<u32> {
    Some(match name {
        "DAC_OVERRIDE" => 1,
        "KILL" => 5,
        "IPC_LOCK" => 14,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "SYS_NICE" => 23,
        "SYS_RESOURCE" => 24,
        "PERFMON" => 38,
        "BPF" => 39,
        _ => return None,
    })
}

/// `host:port` of the server a kubeconfig names.
fn kubeconfig_server(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("kubeconfig");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: http://"))
        .expect("a server")
        .to_owned()
}
