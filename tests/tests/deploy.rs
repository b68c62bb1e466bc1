//! The deployment files in `deploy/`: the systemd units pass `systemd-analyze verify` and keep
//! their hardening (`systemd-analyze security`); the companion's kustomization renders
//! (`kubectl kustomize`) into objects that parse into k8s-openapi's types, grant what the
//! companion requests, and carry a configuration the enforcer's own loader accepts; the
//! alerting rules pass `promtool check rules`.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, Namespace, Service, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("deploy")
        .join(path)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("enforcer-deploy-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// `systemd-analyze` (systemd is on every machine this runs on; missing, the test fails).
fn analyze(args: &[&str], unit: &Path) -> (bool, String, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .output()
        .expect("systemd-analyze (package systemd) is needed to check deploy/systemd");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One document as its k8s-openapi type (unknown fields are refused by none of them, so the
/// test checks the fields it relies on below).
fn parse<T: serde::de::DeserializeOwned>(kind: &str, json: serde_json::Value) -> T {
    serde_json::from_value(json).unwrap_or_else(|e| {
        panic!(
            "{kind} does not parse as {}: {e}",
            std::any::type_name::<T>()
        )
    })
}

/// The unit `text` written as `name` with its binary at the built one (`verify` checks that
/// `ExecStart` exists): it passes `systemd-analyze verify` without a warning about it, and
/// its `systemd-analyze security` exposure is returned with the line that gives it.
fn verified_exposure(text: &str, name: &str) -> (f64, String) {
    let bin = enforcer_tests::enforcer_binary();
    let dir = scratch(name);
    let unit = dir.join(name);
    std::fs::write(
        &unit,
        text.replace("/usr/local/bin/enforcer", &bin.display().to_string()),
    )
    .expect("unit copy");
    let (ok, out, err) = analyze(&["verify"], &unit);
    assert!(ok, "systemd-analyze verify: {out}{err}");
    assert!(
        !err.contains(&format!("{name}:")),
        "systemd-analyze verify warns about the unit: {err}"
    );
    let (_, out, err) = analyze(&["security", "--offline=yes", "--no-pager"], &unit);
    let line = out
        .lines()
        .chain(err.lines())
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no exposure level: {out}{err}"))
        .to_owned();
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("exposure in {line:?}"));
    eprintln!("{line}");
    let _ = std::fs::remove_dir_all(&dir);
    (score, line)
}

/// The unit verifies (with its binary at the built one: `verify` checks that `ExecStart`
/// exists), runs `enforcer run` with a configuration file, keeps the pods when it stops, and
/// its exposure stays at systemd's MEDIUM or better.
#[test]
fn the_systemd_unit_verifies_and_is_hardened() {
    let text = std::fs::read_to_string(deploy("systemd/enforcer.service")).expect("the unit");
    assert!(
        text.contains("ExecStart=/usr/local/bin/enforcer run --config /etc/enforcer/config.yaml")
    );
    assert!(
        text.contains("\nKillMode=process\n"),
        "stopping the daemon must not kill the pods"
    );
    for cap in ["CAP_BPF", "CAP_SYS_RESOURCE", "CAP_KILL"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("CapabilityBoundingSet=") && l.contains(cap)),
            "{cap} in the bounding set"
        );
    }
    let (score, line) = verified_exposure(&text, "enforcer.service");
    assert!(
        score <= 6.5,
        "hardening regressed (docs/deployment.md): {line}"
    );
}

/// The companion's unit verifies, runs `enforcer run --companion` on kubelet's file, keeps to
/// the companion's capabilities (no CAP_SYS_ADMIN) and scores better than the full agent's.
#[test]
fn the_companion_unit_verifies_and_is_hardened() {
    let text = std::fs::read_to_string(deploy("companion/enforcer-companion.service"))
        .expect("the companion unit");
    let exec = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    for arg in [
        "run",
        "--companion",
        "--kubelet-config=/var/lib/kubelet/config.yaml",
    ] {
        assert!(exec.split_whitespace().any(|a| a == arg), "{arg} in {exec}");
    }
    let bounding: BTreeSet<&str> = text
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("a bounding set")
        .split_whitespace()
        .collect();
    let daemonset: Vec<String> = enforcer_tests::companion_daemonset_capabilities()
        .iter()
        .map(|c| format!("CAP_{c}"))
        .collect();
    assert_eq!(
        bounding,
        daemonset.iter().map(String::as_str).collect(),
        "the unit's bounding set is the DaemonSet's capabilities"
    );
    let (score, line) = verified_exposure(&text, "enforcer-companion.service");
    assert!(score <= 5.5, "the companion's hardening regressed: {line}");
}

/// The ports of a kubeadm node's components (kubelet, kube-proxy, controller manager,
/// scheduler, etcd): nothing of the companion's may use one.
const KUBEADM_PORTS: [u16; 10] = [
    10248, 10249, 10250, 10255, 10256, 10257, 10259, 2379, 2380, 2381,
];

/// `deploy/kustomize/companion` as `kubectl kustomize` renders it: every object parses into
/// its k8s-openapi type; the role grants exactly what the companion's writers and its secure
/// metrics port request; the DaemonSet pulls its image by digest, is not privileged, shares
/// the host's PIDs, mounts kubelet's file read-only, runs `--companion` on it, probes
/// `/healthz` and `/readyz`, waits `minReadySeconds`, and uses no port of a kubeadm node's
/// components; the Service and ServiceMonitor scrape the secure metrics port; the
/// PrometheusRule is the rule file promtool checks; its configuration loads on top of a
/// kubeadm kubelet file without a warning.
#[test]
fn the_companion_kustomization_renders_what_a_cluster_installs() {
    let objects = enforcer_tests::kustomize("companion");
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|v| v["kind"].as_str().expect("kind").to_owned())
        .collect();
    kinds.sort();
    eprintln!("kubectl kustomize deploy/kustomize/companion: {kinds:?}");
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    for (kind, n) in [
        ("Namespace", 1),
        ("ServiceAccount", 1),
        ("ClusterRole", 2),
        ("ClusterRoleBinding", 2),
        ("ConfigMap", 2),
        ("DaemonSet", 1),
        ("Service", 1),
        ("ServiceMonitor", 1),
        ("PrometheusRule", 1),
        ("ValidatingAdmissionPolicy", 3),
        ("ValidatingAdmissionPolicyBinding", 3),
    ] {
        assert_eq!(count(kind), n, "{kind} in {kinds:?}");
    }
    let named = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|v| v["kind"] == kind && v["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} in {kinds:?}"))
            .clone()
    };
    for v in &objects {
        let kind = v["kind"].as_str().unwrap_or_default();
        let json = v.clone();
        match kind {
            "Namespace" => drop(parse::<Namespace>(kind, json)),
            "ServiceAccount" => drop(parse::<ServiceAccount>(kind, json)),
            "ClusterRole" => drop(parse::<ClusterRole>(kind, json)),
            "ClusterRoleBinding" => drop(parse::<ClusterRoleBinding>(kind, json)),
            "ConfigMap" => drop(parse::<ConfigMap>(kind, json)),
            "DaemonSet" => drop(parse::<DaemonSet>(kind, json)),
            "Service" => drop(parse::<Service>(kind, json)),
            _ => {}
        }
    }
    let role = parse::<ClusterRole>("ClusterRole", named("ClusterRole", "enforcer-companion"));
    let granted: BTreeSet<(String, String)> = role
        .rules
        .unwrap_or_default()
        .iter()
        .flat_map(|r| {
            let resources = r.resources.clone().unwrap_or_default();
            let verbs = r.verbs.clone();
            resources
                .into_iter()
                .flat_map(move |res| verbs.clone().into_iter().map(move |v| (res.clone(), v)))
        })
        .collect();
    let wanted: BTreeSet<(String, String)> = [
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods/status", "get"),
        ("pods/status", "patch"),
        ("events", "create"),
        ("events", "patch"),
        ("tokenreviews", "create"),
        ("subjectaccessreviews", "create"),
    ]
    .iter()
    .map(|(r, v)| ((*r).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(granted, wanted, "the companion's role");
    let ds = parse::<DaemonSet>("DaemonSet", named("DaemonSet", "enforcer-companion"));
    let spec = ds.spec;
    assert!(spec.min_ready_seconds.unwrap_or(0) > 0, "minReadySeconds");
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.host_pid, Some(true));
    let c = &pod.containers[0];
    let image = c.image.clone().unwrap_or_default();
    let digest = image
        .split_once("@sha256:")
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("the image by digest: {image}"));
    assert!(
        digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "{image}"
    );
    let sc = c.security_context.clone().expect("securityContext");
    assert_eq!(sc.privileged, Some(false));
    let caps = sc.capabilities.expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(
        caps.add.unwrap_or_default().len(),
        9,
        "the capabilities docs/companion.md lists"
    );
    let args = c.args.clone().unwrap_or_default();
    for arg in [
        "run",
        "--companion",
        "--kubelet-config=/var/lib/kubelet/config.yaml",
        "--config=/etc/enforcer/config.yaml",
        "--kubeconfig=/etc/enforcer/kubeconfig",
        "--http-address=127.0.0.1:10266",
        "--secure-metrics-address=$(NODE_IP):10267",
    ] {
        assert!(args.iter().any(|a| a == arg), "{arg} in {args:?}");
    }
    // No port of kubeadm's components: in the arguments, the probes, the container's ports.
    let mut ports: Vec<u16> = args
        .iter()
        .filter_map(|a| a.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
        .collect();
    let port_of = |p: &Option<k8s_openapi::api::core::v1::Probe>, path: &str| {
        let get = p
            .as_ref()
            .and_then(|p| p.http_get.clone())
            .unwrap_or_else(|| panic!("an httpGet probe on {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        match get.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => {
                u16::try_from(p).expect("a port")
            }
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                panic!("a named probe port {s}")
            }
        }
    };
    ports.push(port_of(&c.liveness_probe, "/healthz"));
    ports.push(port_of(&c.readiness_probe, "/readyz"));
    ports.extend(
        c.ports
            .iter()
            .flatten()
            .map(|p| u16::try_from(p.container_port).expect("port")),
    );
    assert!(
        ports.contains(&10266) && ports.contains(&10267),
        "{ports:?}"
    );
    for p in &ports {
        assert!(
            !KUBEADM_PORTS.contains(p),
            "port {p} is a kubeadm component's"
        );
    }
    let mounts: Vec<(&str, bool)> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.as_str(), m.read_only == Some(true)))
        .collect();
    for (path, ro) in [
        ("/var/lib/kubelet/config.yaml", true),
        ("/etc/kubernetes/manifests", true),
        ("/sys/fs/cgroup", false),
        ("/sys/kernel/tracing", false),
        ("/run/containerd", false),
    ] {
        assert!(
            mounts.contains(&(path, ro)),
            "{path} (read-only {ro}): {mounts:?}"
        );
    }
    // The Service and ServiceMonitor scrape the secure metrics port over HTTPS.
    let svc = objects
        .iter()
        .find(|v| v["kind"] == "Service")
        .expect("Service");
    assert_eq!(svc["spec"]["ports"][0]["port"], 10267, "{svc}");
    let sm = objects
        .iter()
        .find(|v| v["kind"] == "ServiceMonitor")
        .expect("ServiceMonitor");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["scheme"], "https", "{sm}");
    assert_eq!(ep["port"], svc["spec"]["ports"][0]["name"], "{sm}");
    // The PrometheusRule carries the rule file promtool checks.
    let rule = objects
        .iter()
        .find(|v| v["kind"] == "PrometheusRule")
        .expect("PrometheusRule");
    let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(deploy("kustomize/monitoring/enforcer-rules.yaml"))
            .expect("the rule file"),
    )
    .expect("YAML");
    assert_eq!(
        rule["spec"],
        serde_json::to_value(&file).expect("JSON"),
        "the PrometheusRule's spec is deploy/kustomize/monitoring/enforcer-rules.yaml"
    );
    // Its configuration on top of kubeadm's kubelet file, through the enforcer's loader.
    let cm = objects
        .iter()
        .find(|v| v["kind"] == "ConfigMap" && v["data"]["config.yaml"].is_string())
        .expect("the companion's ConfigMap");
    let dir = scratch("companion-config");
    let kubelet = dir.join("kubelet-config.yaml");
    std::fs::write(
        &kubelet,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nstaticPodPath: /etc/kubernetes/manifests\nevictionHard:\n  memory.available: 100Mi\n",
    )
    .expect("kubelet config");
    let own = dir.join("config.yaml");
    std::fs::write(&own, cm["data"]["config.yaml"].as_str().unwrap_or_default()).expect("config");
    let loaded = enforcer::config::load(&enforcer::config::ConfigArgs {
        kubelet_config: Some(kubelet),
        config: Some(own),
        ..enforcer::config::ConfigArgs::default()
    })
    .expect("the companion's configuration loads");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(
        loaded.config.enforcer.state_dir,
        Path::new("/var/lib/enforcer-companion")
    );
    assert_eq!(
        loaded.config.enforcer.manifest_dir,
        Path::new("/etc/kubernetes/manifests")
    );
    assert_eq!(loaded.config.cgroup_driver.as_str(), "systemd");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The alerting rules pass `promtool check rules` (Debian's prometheus package), and the
/// dashboard is JSON whose queries name only families the companion serves (`enforcer_*`,
/// and Prometheus' own `up`).
#[test]
fn the_alerting_rules_pass_promtool_and_the_dashboard_queries_the_companions_families() {
    let rules = deploy("kustomize/monitoring/enforcer-rules.yaml");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool (Debian's prometheus package, cargo xtask setup) checks the rules");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("$ promtool check rules {}\n{text}", rules.display());
    assert!(out.status.success() && text.contains("SUCCESS"), "{text}");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy("kustomize/monitoring/enforcer-dashboard.json"))
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap_or_default().to_owned());
        }
    }
    assert!(exprs.len() >= 6, "{exprs:?}");
    for e in &exprs {
        let names: Vec<&str> = e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| {
                w.contains('_')
                    && (w.ends_with("_total")
                        || w.ends_with("_bucket")
                        || w.starts_with("enforcer_")
                        || w.starts_with("kubelet_"))
            })
            .collect();
        for n in names {
            assert!(
                n.starts_with("enforcer_"),
                "{n} in {e}: not a family the companion serves"
            );
        }
    }
}

/// A ValidatingAdmissionPolicy applied to one request as the API server applies it: its
/// match conditions, then its variables in order, then its validations in order, each a CEL
/// expression evaluated by cel-rust. `Ok(true)`: allowed, `Ok(false)`: not matched (the policy
/// does not apply), `Err`: denied, with the policy's message.
fn admit(
    policy: &serde_json::Value,
    request: &serde_json::Value,
    object: &serde_json::Value,
    old: &serde_json::Value,
) -> Result<bool, String> {
    use cel_interpreter::{Context, Program, Value as Cel};
    let spec = &policy["spec"];
    let mut ctx = Context::default();
    ctx.add_variable("request", request.clone())
        .expect("request");
    ctx.add_variable("object", object.clone()).expect("object");
    ctx.add_variable("oldObject", old.clone())
        .expect("oldObject");
    let eval = |ctx: &Context, expr: &str| -> Cel {
        let program = Program::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e:?}"));
        program
            .execute(ctx)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"))
    };
    for mc in spec["matchConditions"].as_array().into_iter().flatten() {
        if eval(&ctx, mc["expression"].as_str().expect("expression")) == Cel::Bool(false) {
            return Ok(false);
        }
    }
    let mut vars = serde_json::Map::new();
    for v in spec["variables"].as_array().into_iter().flatten() {
        ctx.add_variable("variables", serde_json::Value::Object(vars.clone()))
            .expect("variables");
        let value = match eval(&ctx, v["expression"].as_str().expect("expression")) {
            Cel::String(s) => serde_json::Value::String(s.to_string()),
            Cel::Bool(b) => serde_json::Value::Bool(b),
            other => panic!("variable {}: {other:?}", v["name"]),
        };
        vars.insert(v["name"].as_str().expect("name").to_owned(), value);
    }
    ctx.add_variable("variables", serde_json::Value::Object(vars))
        .expect("variables");
    for val in spec["validations"].as_array().into_iter().flatten() {
        match eval(&ctx, val["expression"].as_str().expect("expression")) {
            Cel::Bool(true) => {}
            Cel::Bool(false) => {
                return Err(match val["messageExpression"].as_str() {
                    Some(m) => match eval(&ctx, m) {
                        Cel::String(s) => s.to_string(),
                        other => format!("{other:?}"),
                    },
                    None => val["message"].as_str().unwrap_or_default().to_owned(),
                });
            }
            other => panic!("validation {}: not a bool: {other:?}", val["expression"]),
        }
    }
    Ok(true)
}

/// The companion's least privilege, evaluated with a real CEL evaluator on the policies
/// `kubectl kustomize` renders: a companion may write the status of its own node's pods and
/// its own node's events, and is refused another node's pod, a pod bound to no node, a token
/// without the node-name claim, another node's event, and an update that takes over another
/// node's event; other users are not matched.
#[test]
fn the_companion_may_write_only_its_own_nodes_pods_and_events() {
    let objects = enforcer_tests::kustomize("companion");
    let policy = |name: &str| {
        objects
            .iter()
            .find(|v| v["kind"] == "ValidatingAdmissionPolicy" && v["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("policy {name}"))
            .clone()
    };
    let bound = |p: &str| {
        assert!(
            objects
                .iter()
                .any(|v| v["kind"] == "ValidatingAdmissionPolicyBinding"
                    && v["spec"]["policyName"] == p
                    && v["spec"]["validationActions"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x == "Deny"))),
            "{p} is bound with Deny"
        );
    };
    let sa = "system:serviceaccount:enforcer-system:enforcer-companion";
    let request = |op: &str, user: &str, node: Option<&str>| {
        let mut r = serde_json::json!({"operation": op, "userInfo": {"username": user}});
        if let Some(n) = node {
            r["userInfo"]["extra"] = serde_json::json!({
                "authentication.kubernetes.io/node-name": [n],
                "authentication.kubernetes.io/pod-name": ["enforcer-companion-x"],
            });
        }
        r
    };
    let pod = |node: Option<&str>| {
        let mut p = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "hog", "namespace": "default"}, "spec": {},
            "status": {"phase": "Failed", "reason": "Evicted"}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = n.into();
        }
        p
    };
    let status = policy("enforcer-companion-pod-status");
    bound("enforcer-companion-pod-status");
    let own = admit(
        &status,
        &request("UPDATE", sa, Some("n1")),
        &pod(Some("n1")),
        &pod(Some("n1")),
    );
    eprintln!("own node's pod status: {own:?}");
    assert_eq!(own, Ok(true));
    let other = admit(
        &status,
        &request("UPDATE", sa, Some("n1")),
        &pod(Some("n2")),
        &pod(Some("n2")),
    );
    eprintln!("another node's pod status: {other:?}");
    assert!(
        other
            .as_ref()
            .is_err_and(|m| m.contains("n1") && m.contains("n2")),
        "{other:?}"
    );
    for (what, req, obj) in [
        (
            "a pod bound to no node",
            request("UPDATE", sa, Some("n1")),
            pod(None),
        ),
        (
            "a token without the node-name claim",
            request("UPDATE", sa, None),
            pod(Some("n1")),
        ),
    ] {
        let r = admit(&status, &req, &obj, &obj);
        assert!(r.is_err(), "{what}: {r:?}");
    }
    let kubelet = admit(
        &status,
        &request("UPDATE", "system:node:n2", None),
        &pod(Some("n1")),
        &pod(Some("n1")),
    );
    assert_eq!(kubelet, Ok(false), "another user is not matched");

    let event = |host: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Event", "reason": "Evicted",
            "metadata": {"name": "hog.1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "hog"},
            "source": {"component": "kubelet", "host": host},
            "reportingComponent": "kubelet", "reportingInstance": host})
    };
    let events = policy("enforcer-companion-events");
    bound("enforcer-companion-events");
    let none = serde_json::Value::Null;
    assert_eq!(
        admit(
            &events,
            &request("CREATE", sa, Some("n1")),
            &event("n1"),
            &none
        ),
        Ok(true),
        "its own node's event"
    );
    let other = admit(
        &events,
        &request("CREATE", sa, Some("n1")),
        &event("n2"),
        &none,
    );
    assert!(other.is_err(), "another node's event: {other:?}");
    let takeover = admit(
        &events,
        &request("UPDATE", sa, Some("n1")),
        &event("n1"),
        &event("n2"),
    );
    assert!(
        takeover.is_err(),
        "taking over another node's event: {takeover:?}"
    );
    let series = admit(
        &events,
        &request("UPDATE", sa, Some("n1")),
        &event("n1"),
        &event("n1"),
    );
    assert_eq!(series, Ok(true), "its own event's series");

    let new_events = policy("enforcer-companion-events-k8s-io");
    bound("enforcer-companion-events-k8s-io");
    let new_event = |host: &str| {
        serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "reason": "Evicted",
            "metadata": {"name": "hog.2", "namespace": "default"},
            "regarding": {"kind": "Pod", "name": "hog"},
            "reportingController": "kubelet", "reportingInstance": host})
    };
    assert_eq!(
        admit(
            &new_events,
            &request("CREATE", sa, Some("n1")),
            &new_event("n1"),
            &none
        ),
        Ok(true)
    );
    let other = admit(
        &new_events,
        &request("CREATE", sa, Some("n1")),
        &new_event("n2"),
        &none,
    );
    assert!(
        other.is_err(),
        "another node's events.k8s.io event: {other:?}"
    );
}
