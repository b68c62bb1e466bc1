//! The deployment files in `deploy/`: the systemd unit passes `systemd-analyze verify` and
//! keeps its hardening (`systemd-analyze security`), the cluster manifests parse into
//! k8s-openapi's types, grant what the node's API writers request, and carry a configuration
//! the enforcer's own loader accepts.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, Namespace, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde::Deserialize as _;

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

/// Every document parses into its k8s-openapi type; the role grants each request the node's
/// writers make; the DaemonSet mounts what the daemon reads and runs it with the ConfigMap's
/// files; the configuration loads.
#[test]
fn the_cluster_manifests_parse_and_grant_what_the_node_writes() {
    let text = std::fs::read_to_string(deploy("kubernetes/enforcer.yaml")).expect("the manifests");
    let mut kinds = Vec::new();
    let (mut role, mut binding, mut ds, mut cm, mut sa) = (None, None, None, None, None);
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = serde_yaml_ng::Value::deserialize(doc).expect("a YAML document");
        let kind = v["kind"].as_str().expect("kind").to_owned();
        let json = serde_json::to_value(&v).expect("as JSON");
        match kind.as_str() {
            "Namespace" => {
                parse::<Namespace>(&kind, json);
            }
            "ServiceAccount" => {
                sa = Some(parse::<ServiceAccount>(&kind, json));
            }
            "ClusterRole" => {
                role = Some(parse::<ClusterRole>(&kind, json));
            }
            "ClusterRoleBinding" => {
                binding = Some(parse::<ClusterRoleBinding>(&kind, json));
            }
            "ConfigMap" => {
                cm = Some(parse::<ConfigMap>(&kind, json));
            }
            "DaemonSet" => {
                ds = Some(parse::<DaemonSet>(&kind, json));
            }
            other => panic!("unexpected kind {other}"),
        }
        kinds.push(kind);
    }
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ]
    );
    let (role, binding, ds, cm, sa) = (
        role.expect("role"),
        binding.expect("binding"),
        ds.expect("ds"),
        cm.expect("cm"),
        sa.expect("sa"),
    );
    // What the writers request (cluster/*.rs, runtime/apiserver.rs): (group, resource, verb).
    let granted: BTreeSet<(String, String, String)> = role
        .rules
        .unwrap_or_default()
        .iter()
        .flat_map(|r| {
            let groups = r.api_groups.clone().unwrap_or_default();
            let resources = r.resources.clone().unwrap_or_default();
            groups.into_iter().flat_map(move |g| {
                let verbs = r.verbs.clone();
                resources.clone().into_iter().flat_map(move |res| {
                    let g = g.clone();
                    verbs
                        .clone()
                        .into_iter()
                        .map(move |v| (g.clone(), res.clone(), v))
                })
            })
        })
        .collect();
    for (g, res, verb) in [
        ("", "nodes", "create"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "get"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "pods/status", "update"),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    ] {
        assert!(
            granted.contains(&(g.to_owned(), res.to_owned(), verb.to_owned())),
            "the role does not grant {verb} {g}/{res}"
        );
    }
    let subject = binding
        .subjects
        .unwrap_or_default()
        .into_iter()
        .next()
        .expect("a subject");
    assert_eq!(
        (
            Some(subject.name.as_str()),
            subject.namespace.as_deref(),
            binding.role_ref.name.as_str()
        ),
        (
            sa.metadata.name.as_deref(),
            sa.metadata.namespace.as_deref(),
            role.metadata.name.as_deref().unwrap_or_default()
        )
    );
    let pod = ds.spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name, sa.metadata.name);
    assert_eq!((pod.host_pid, pod.host_network), (Some(true), Some(true)));
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"));
    let mounts: Vec<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    for path in [
        "/sys/fs/cgroup",
        "/sys/kernel/tracing",
        "/var/lib/enforcer",
        "/run/containerd",
        "/etc/enforcer",
    ] {
        assert!(mounts.contains(&path), "{path} not mounted: {mounts:?}");
    }
    let data = cm.data.expect("ConfigMap data");
    for key in ["config.yaml", "kubeconfig"] {
        assert!(
            args.iter()
                .any(|a| a.ends_with(&format!("/etc/enforcer/{key}"))),
            "{key} not passed: {args:?}"
        );
        assert!(data.contains_key(key), "{key} missing from the ConfigMap");
    }
    // The configuration, through the enforcer's own loader.
    let dir = scratch("config");
    let config = dir.join("config.yaml");
    std::fs::write(&config, &data["config.yaml"]).expect("config");
    let loaded = enforcer::config::load(&enforcer::config::ConfigArgs {
        config: Some(config),
        ..enforcer::config::ConfigArgs::default()
    })
    .expect("the DaemonSet's configuration loads");
    assert!(
        loaded.warnings.is_empty(),
        "configuration warnings: {:?}",
        loaded.warnings
    );
    // The kubeconfig: the in-cluster server through the pod's service-account token.
    let kc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&data["kubeconfig"]).expect("the kubeconfig parses");
    assert_eq!(kc["current-context"].as_str(), Some("in-cluster"));
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"].as_str(),
        Some("https://kubernetes.default.svc")
    );
    assert_eq!(
        kc["users"][0]["user"]["tokenFile"].as_str(),
        Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
    );
    let _ = std::fs::remove_dir_all(&dir);
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

/// The companion's manifests parse; its role grants exactly what the companion's writers
/// request and nothing that writes nodes, leases or pods; the DaemonSet is not privileged,
/// shares the host's PIDs, mounts kubelet's file read-only and runs `--companion` on it; its
/// configuration loads on top of a kubeadm kubelet file without a warning.
#[test]
fn the_companion_manifests_grant_only_what_the_companion_writes() {
    let text = std::fs::read_to_string(deploy("companion/enforcer-companion.yaml"))
        .expect("the companion's manifests");
    let (mut role, mut ds, mut cm) = (None, None, None);
    let mut kinds = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = serde_yaml_ng::Value::deserialize(doc).expect("a YAML document");
        let kind = v["kind"].as_str().expect("kind").to_owned();
        let json = serde_json::to_value(&v).expect("as JSON");
        match kind.as_str() {
            "Namespace" => drop(parse::<Namespace>(&kind, json)),
            "ServiceAccount" => drop(parse::<ServiceAccount>(&kind, json)),
            "ClusterRoleBinding" => drop(parse::<ClusterRoleBinding>(&kind, json)),
            "ClusterRole" => role = Some(parse::<ClusterRole>(&kind, json)),
            "ConfigMap" => cm = Some(parse::<ConfigMap>(&kind, json)),
            "DaemonSet" => ds = Some(parse::<DaemonSet>(&kind, json)),
            other => panic!("unexpected kind {other}"),
        }
        kinds.push(kind);
    }
    assert_eq!(kinds.len(), 6, "{kinds:?}");
    let role = role.expect("role");
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
    ]
    .iter()
    .map(|(r, v)| ((*r).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(granted, wanted, "the companion's role");
    let pod = ds.expect("ds").spec.template.spec.expect("pod spec");
    assert_eq!(pod.host_pid, Some(true));
    let c = &pod.containers[0];
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
    ] {
        assert!(args.iter().any(|a| a == arg), "{arg} in {args:?}");
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
    // Its configuration on top of kubeadm's kubelet file, through the enforcer's loader.
    let data = cm.expect("cm").data.expect("ConfigMap data");
    let dir = scratch("companion-config");
    let kubelet = dir.join("kubelet-config.yaml");
    std::fs::write(
        &kubelet,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nstaticPodPath: /etc/kubernetes/manifests\nevictionHard:\n  memory.available: 100Mi\n",
    )
    .expect("kubelet config");
    let own = dir.join("config.yaml");
    std::fs::write(&own, &data["config.yaml"]).expect("config");
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
