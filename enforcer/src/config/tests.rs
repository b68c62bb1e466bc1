//! The configuration's loading, merging and validation.

use super::*;
use crate::policy::eviction::Signal;

fn doc(yaml: &str) -> KubeletConfiguration {
    parse_document("test.yaml", yaml).unwrap().0
}

#[test]
fn defaults_are_kubelets() {
    let c = Config::defaults().unwrap();
    assert_eq!(c.eviction.thresholds.len(), 6); // 5 defaults + allocatable copy
    assert_eq!(
        c.eviction.pressure_transition_period,
        Duration::from_secs(300)
    );
    assert_eq!(c.max_pods, 110);
    assert_eq!(c.enforce_node_allocatable, ["pods"]);
    assert_eq!(c.cgroup_root, "/");
    assert_eq!(c.enforcer.http_address.to_string(), "127.0.0.1:10255");
    assert_eq!(c.enforcer.housekeeping_interval, Duration::from_secs(10));
    assert_eq!(c.kube_api_qps, 50);
    assert!(c.serialize_image_pulls);
}

#[test]
fn file_then_flags() {
    let d = doc(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: {memory.available: 1Gi}\nevictionSoft: {memory.available: 2Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\nmaxPods: 20\nsomethingElse: 1\nenforcer: {nodeCapacity: {memory: 2Gi, cpu: \"2\"}, memoryQoS: true, bogus: 1}\n",
    );
    let args = ConfigArgs::default();
    let l = resolve("test.yaml", &d, &args).unwrap();
    assert_eq!(l.config.eviction.thresholds.len(), 3);
    assert_eq!(l.config.max_pods, 20);
    assert!(l.config.enforcer.memory_qos);
    assert_eq!(l.config.enforcer.node_capacity["memory"].to_string(), "2Gi");
    let (_, w) = parse_document("test.yaml", "somethingElse: 1\nenforcer: {bogus: 1}\n").unwrap();
    assert_eq!(
        w,
        [
            "test.yaml: unknown field \"somethingElse\" ignored",
            "test.yaml: unknown field \"enforcer.bogus\" ignored"
        ]
    );
    // A flag replaces the file's map.
    let args = ConfigArgs {
        eviction_hard: vec!["memory.available<500Mi,nodefs.available<10%".into()],
        max_pods: Some(30),
        ..Default::default()
    };
    let l = resolve("test.yaml", &d, &args).unwrap();
    let hard: Vec<_> = l
        .config
        .eviction
        .thresholds
        .iter()
        .filter(|t| t.is_hard())
        .map(|t| t.signal)
        .collect();
    assert_eq!(
        hard,
        [
            Signal::MemoryAvailable,
            Signal::NodeFsAvailable,
            Signal::AllocatableMemoryAvailable
        ]
    );
    assert_eq!(l.config.max_pods, 30);
    // podPidsLimit: -1 by default, the file's value, the flag over the file.
    assert_eq!(l.config.pod_pids_limit, -1);
    assert_eq!(l.config.sync_frequency, Duration::from_secs(60));
    assert_eq!(l.config.resolv_conf, "/etc/resolv.conf");
    let l = resolve(
        "test.yaml",
        &doc("clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\nresolvConf: ''\n"),
        &ConfigArgs::default(),
    )
    .expect("dns");
    assert_eq!(
        (
            l.config.cluster_dns.clone(),
            l.config.cluster_domain.as_str(),
            l.config.resolv_conf.as_str()
        ),
        (vec!["10.96.0.10".to_owned()], "cluster.local", "")
    );
    let e = resolve(
        "test.yaml",
        &doc("clusterDNS: [dns.local]\n"),
        &ConfigArgs::default(),
    )
    .expect_err("not an IP");
    assert!(e.to_string().contains("clusterDNS"), "{e}");
    let l = resolve(
        "test.yaml",
        &doc("syncFrequency: 5s\n"),
        &ConfigArgs::default(),
    )
    .expect("syncFrequency");
    assert_eq!(l.config.sync_frequency, Duration::from_secs(5));
    let e = resolve(
        "test.yaml",
        &doc("syncFrequency: 0s\n"),
        &ConfigArgs::default(),
    )
    .expect_err("zero");
    assert!(e.to_string().contains("syncFrequency"), "{e}");
    let d = doc("podPidsLimit: 1024\n");
    let l = resolve("test.yaml", &d, &ConfigArgs::default()).unwrap();
    assert_eq!(l.config.pod_pids_limit, 1024);
    let args = ConfigArgs {
        pod_max_pids: Some(64),
        ..Default::default()
    };
    assert_eq!(
        resolve("test.yaml", &d, &args)
            .unwrap()
            .config
            .pod_pids_limit,
        64
    );
}

#[test]
fn every_struct_field_is_known() {
    let mut v = serde_yaml_ng::to_value(KubeletConfiguration::default()).unwrap();
    v["enforcer"] = serde_yaml_ng::to_value(EnforcerSection::default()).unwrap();
    let (_, w) = from_value("t.yaml", v).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let (_, w) = parse_document(
        "t.yaml",
        "enforcer: {nested: {x: 1}}\nmaxPods: 3\n\"odd key\": [1]\n",
    )
    .unwrap();
    assert_eq!(
        w,
        [
            "t.yaml: unknown field \"enforcer.nested\" ignored",
            "t.yaml: unknown field \"odd key\" ignored"
        ]
    );
}

#[test]
fn errors_name_field_and_value() {
    let err = |yaml: &str, args: ConfigArgs| {
        resolve("c.yaml", &doc(yaml), &args)
            .unwrap_err()
            .to_string()
    };
    let e = err(
        "evictionHard: {memory.available: -1Gi}",
        ConfigArgs::default(),
    );
    assert!(e.contains("evictionHard") && e.contains("-1Gi"), "{e}");
    let e = err(
        "",
        ConfigArgs {
            eviction_hard: vec!["memory.available<abc".into()],
            ..Default::default()
        },
    );
    assert!(e.contains("--eviction-hard") && e.contains("abc"), "{e}");
    let e = err(
        "evictionSoft: {memory.available: 1Gi}",
        ConfigArgs::default(),
    );
    assert!(
        e.contains("evictionSoft") && e.contains("grace period"),
        "{e}"
    );
    let e = err(
        "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: -1s}",
        ConfigArgs::default(),
    );
    assert!(e.contains("evictionSoftGracePeriod"), "{e}");
    let e = err("maxPods: -1", ConfigArgs::default());
    assert!(e.contains("maxPods"), "{e}");
    let e = err("systemReserved: {memory: 1e30}", ConfigArgs::default());
    assert!(e.contains("systemReserved.memory"), "{e}");
    let e = err(
        "evictionPressureTransitionPeriod: 5x",
        ConfigArgs::default(),
    );
    assert!(e.contains("evictionPressureTransitionPeriod"), "{e}");
    let e = err("cgroupDriver: sysd", ConfigArgs::default());
    assert!(
        e.contains("cgroupDriver") && e.contains("cgroupfs or systemd"),
        "{e}"
    );
    let e = err("podPidsLimit: -2", ConfigArgs::default());
    assert!(e.contains("podPidsLimit") && e.contains("-2"), "{e}");
    let e = err(
        "",
        ConfigArgs {
            pod_max_pids: Some(-5),
            ..Default::default()
        },
    );
    assert!(e.contains("--pod-max-pids") && e.contains("-5"), "{e}");
    assert!(
        parse_document("c.yaml", "maxPods: [1]")
            .unwrap_err()
            .to_string()
            .contains("maxPods")
    );
    assert!(parse_document("c.yaml", "maxPods: 99999999999").is_err());
    assert!(parse_document("c.yaml", ": : :").is_err());
    assert!(
        parse_document("c.yaml", "evictionHard: 3")
            .unwrap_err()
            .to_string()
            .contains("evictionHard")
    );
}

#[test]
fn clap_flags() {
    use clap::Parser;
    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        c: ConfigArgs,
    }
    let t = T::try_parse_from([
        "t",
        "--eviction-hard=memory.available<500Mi,nodefs.available<10%",
        "--eviction-soft=memory.available<1Gi",
        "--eviction-soft-grace-period=memory.available=1m30s",
        "--system-reserved=cpu=500m,memory=1Gi",
        "--serialize-image-pulls=false",
        "--memory-qos",
        "--max-pods=50",
    ])
    .unwrap();
    let l = resolve("defaults", &KubeletConfiguration::default(), &t.c).unwrap();
    assert_eq!(l.config.system_reserved["cpu"].milli_value(), 500);
    assert!(!l.config.serialize_image_pulls);
    assert!(l.config.enforcer.memory_qos);
    let soft = l
        .config
        .eviction
        .thresholds
        .iter()
        .find(|t| !t.is_hard())
        .unwrap();
    assert_eq!(soft.grace_period, Duration::from_secs(90));
}

/// Cluster-mode settings: kubelet's defaults, the report period following an explicit
/// update period, the name from `hostnameOverride` lower-cased, `--node-labels`.
#[test]
fn cluster_settings() {
    let c = resolve("c.yaml", &doc(""), &ConfigArgs::default())
        .unwrap()
        .config;
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(c.node_lease_duration_seconds, 40);
    assert_eq!(c.node_name(), crate::node::node_name());
    let c = resolve(
        "c.yaml",
        &doc("hostnameOverride: Node-A\nnodeStatusUpdateFrequency: 4s\nnodeLeaseDurationSeconds: 20\n"),
        &ConfigArgs {
            node_labels: vec!["role=edge,zone=a".to_owned()],
            ..ConfigArgs::default()
        },
    )
    .unwrap()
    .config;
    assert_eq!(c.node_name(), "node-a");
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(4));
    assert_eq!(c.node_lease_duration_seconds, 20);
    assert_eq!(c.node_labels["zone"], "a");
    let e = resolve(
        "c.yaml",
        &doc("nodeLeaseDurationSeconds: 0"),
        &ConfigArgs::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("nodeLeaseDurationSeconds"), "{e}");
    let e = resolve(
        "c.yaml",
        &doc(""),
        &ConfigArgs {
            node_labels: vec!["nolabel".to_owned()],
            ..ConfigArgs::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--node-labels"), "{e}");
}

/// `allowedUnsafeSysctls`: the file's list, the flag's list instead, each entry checked
/// as kubelet checks it at start.
#[test]
fn allowed_unsafe_sysctls() {
    use clap::Parser;
    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        c: ConfigArgs,
    }
    let d = doc("allowedUnsafeSysctls: [kernel.msg*, net.core.somaxconn]");
    let l = resolve("c.yaml", &d, &ConfigArgs::default()).unwrap();
    assert_eq!(
        l.config.allowed_unsafe_sysctls,
        ["kernel.msg*", "net.core.somaxconn"]
    );
    let w = l.config.sysctl_allowlist();
    assert_eq!(w.validate("kernel.msgmax", false, false), Ok(()));
    assert_eq!(w.validate("net.core.somaxconn", false, false), Ok(()));
    assert!(w.validate("kernel.sem", false, false).is_err());
    let t = T::try_parse_from(["t", "--allowed-unsafe-sysctls=kernel.sem,fs.mqueue.*"]).unwrap();
    let l = resolve("c.yaml", &d, &t.c).unwrap();
    assert_eq!(
        l.config.allowed_unsafe_sysctls,
        ["kernel.sem", "fs.mqueue.*"]
    );
    assert!(
        Config::defaults()
            .unwrap()
            .allowed_unsafe_sysctls
            .is_empty()
    );
    let e = resolve(
        "c.yaml",
        &doc("allowedUnsafeSysctls: [kernel.panic]"),
        &ConfigArgs::default(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "c.yaml: invalid value \"kernel.panic\" for allowedUnsafeSysctls: the sysctls \"kernel.panic\" are not known to be namespaced"
    );
    let t = T::try_parse_from(["t", "--allowed-unsafe-sysctls=Bad*"]).unwrap();
    let e = resolve("c.yaml", &doc(""), &t.c).unwrap_err().to_string();
    assert!(
        e.starts_with("command line: invalid value \"Bad*\" for --allowed-unsafe-sysctls: sysctl \"Bad*\" must have at most 253 characters"),
        "{e}"
    );
}

/// `--kubelet-config` with `--config`: the kubelet's file decides every kubelet field
/// (one warning per field the other sets), the other adds its `enforcer:` section,
/// `staticPodPath` is the manifest directory when that section names none, and flags
/// still apply on top.
#[test]
fn kubelet_config_decides_and_config_adds_the_enforcer_section() {
    let dir = std::env::temp_dir().join(format!("enforcer-kcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubelet = dir.join("kubelet.yaml");
    std::fs::write(
        &kubelet,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nstaticPodPath: /etc/kubernetes/manifests\nevictionHard: {memory.available: 300Mi}\nmaxPods: 50\n",
    )
    .unwrap();
    let own = dir.join("own.yaml");
    std::fs::write(
        &own,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 7\nevictionHard: {memory.available: 1Gi}\nenforcer: {stateDir: /var/lib/c, nodeCapacity: {memory: 2Gi}}\n",
    )
    .unwrap();
    let args = ConfigArgs {
        kubelet_config: Some(kubelet.clone()),
        config: Some(own.clone()),
        hostname_override: Some("Node-B".to_owned()),
        ..ConfigArgs::default()
    };
    let l = load(&args).unwrap();
    assert_eq!(l.config.max_pods, 50, "kubelet's maxPods");
    assert_eq!(l.config.cgroup_driver.as_str(), "systemd");
    let hard: Vec<String> = l
        .config
        .eviction
        .thresholds
        .iter()
        .filter(|t| t.signal == Signal::MemoryAvailable)
        .map(|t| t.value.to_string())
        .collect();
    assert_eq!(hard, ["300Mi"], "kubelet's evictionHard");
    assert_eq!(l.config.enforcer.state_dir, Path::new("/var/lib/c"));
    assert_eq!(
        l.config.enforcer.manifest_dir,
        Path::new("/etc/kubernetes/manifests")
    );
    assert_eq!(l.config.node_name(), "node-b", "flags apply on top");
    let ignored: Vec<&String> = l
        .warnings
        .iter()
        .filter(|w| w.contains("is ignored: the kubelet's configuration"))
        .collect();
    assert_eq!(ignored.len(), 2, "{:?}", l.warnings);
    assert!(
        ignored
            .iter()
            .any(|w| w.starts_with(&format!("{}: maxPods is ignored", own.display()))),
        "{ignored:?}"
    );
    // A kubelet file that cannot be read names it.
    let e = load(&ConfigArgs {
        kubelet_config: Some(dir.join("missing.yaml")),
        ..ConfigArgs::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("missing.yaml"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memory_swap_and_fail_swap_on() {
    use crate::policy::swap::SwapBehavior;
    let resolved = |yaml: &str, args: ConfigArgs| resolve("c.yaml", &doc(yaml), &args);
    // kubelet's defaults: NoSwap, failSwapOn.
    let c = Config::defaults().unwrap();
    assert_eq!(c.memory_swap.swap_behavior, SwapBehavior::NoSwap);
    assert!(c.fail_swap_on);
    for (yaml, want) in [
        ("memorySwap: {}", SwapBehavior::NoSwap),
        ("memorySwap: {swapBehavior: \"\"}", SwapBehavior::NoSwap),
        ("memorySwap: {swapBehavior: NoSwap}", SwapBehavior::NoSwap),
        (
            "memorySwap: {swapBehavior: LimitedSwap}",
            SwapBehavior::LimitedSwap,
        ),
    ] {
        let l = resolved(yaml, ConfigArgs::default()).unwrap();
        assert_eq!(l.config.memory_swap.swap_behavior, want, "{yaml}");
        assert!(l.warnings.is_empty(), "{yaml}: {:?}", l.warnings);
    }
    // kubelet's validation: `memorySwap.swapBehavior "X" must be one of: "", "LimitedSwap" or
    // "NoSwap"`, naming the field.
    let e = resolved(
        "memorySwap: {swapBehavior: UnlimitedSwap}",
        ConfigArgs::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("memorySwap.swapBehavior")
            && e.contains("UnlimitedSwap")
            && e.contains("\"LimitedSwap\" or \"NoSwap\""),
        "{e}"
    );
    let (_, w) =
        parse_document("c.yaml", "memorySwap: {swapBehavior: NoSwap, bogus: 1}\n").unwrap();
    assert_eq!(w, ["c.yaml: unknown field \"memorySwap.bogus\" ignored"]);
    // failSwapOn: the file, overridden by --fail-swap-on.
    let l = resolved("failSwapOn: false", ConfigArgs::default()).unwrap();
    assert!(!l.config.fail_swap_on);
    let l = resolved(
        "failSwapOn: false",
        ConfigArgs {
            fail_swap_on: Some(true),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(l.config.fail_swap_on);
    let json = serde_json::to_value(&l.config).unwrap();
    assert_eq!(json["memorySwap"]["swapBehavior"], "NoSwap");
    assert_eq!(json["failSwapOn"], true);
}

#[test]
fn resource_managers() {
    use crate::policy::{
        memory::MemoryManagerPolicy,
        topology::{Policy, Scope},
    };
    let c = Config::defaults().unwrap();
    assert_eq!(c.memory_manager_policy, MemoryManagerPolicy::None);
    assert!(c.reserved_memory.is_empty());
    assert_eq!(c.topology_manager_policy, Policy::None);
    assert_eq!(c.topology_manager_scope, Scope::Container);
    let d = doc(
        "memoryManagerPolicy: Static\nreservedMemory: [{numaNode: 0, limits: {memory: 1Gi, hugepages-2Mi: 2Mi}}, {numaNode: 1, limits: {memory: 512Mi}}]\ntopologyManagerPolicy: single-numa-node\ntopologyManagerScope: container\n",
    );
    let l = resolve("c.yaml", &d, &ConfigArgs::default()).unwrap();
    assert_eq!(l.config.memory_manager_policy, MemoryManagerPolicy::Static);
    assert_eq!(l.config.reserved_memory.len(), 2);
    assert_eq!(
        l.config.reserved_memory[0].limits["hugepages-2Mi"].to_string(),
        "2Mi"
    );
    assert_eq!(l.config.topology_manager_policy, Policy::SingleNumaNode);
    // Flags replace the file's entries.
    let args = ConfigArgs {
        reserved_memory: vec!["0:memory=1Gi;1:memory=2Gi,hugepages-1Gi=1Gi".into()],
        topology_manager_policy: Some("restricted".into()),
        ..Default::default()
    };
    let l = resolve("c.yaml", &d, &args).unwrap();
    assert_eq!(
        l.config.reserved_memory[1].limits["hugepages-1Gi"].to_string(),
        "1Gi"
    );
    assert_eq!(l.config.topology_manager_policy, Policy::Restricted);
    // Errors name the field (or flag) and the value.
    let err = |yaml: &str, args: ConfigArgs| {
        resolve("c.yaml", &doc(yaml), &args)
            .unwrap_err()
            .to_string()
    };
    let e = err("memoryManagerPolicy: static", ConfigArgs::default());
    assert!(
        e.contains("memoryManagerPolicy") && e.contains("None or Static"),
        "{e}"
    );
    let e = err("memoryManagerPolicy: Static", ConfigArgs::default());
    assert!(
        e.contains("memoryManagerPolicy") && e.contains("system reserved memory"),
        "{e}"
    );
    let e = err(
        "reservedMemory: [{numaNode: 0, limits: {cpu: 1}}]",
        ConfigArgs::default(),
    );
    assert!(
        e.contains("reservedMemory") && e.contains("\"cpu\" for NUMA node 0 is not supported"),
        "{e}"
    );
    let e = err(
        "reservedMemory: [{numaNode: 0, limits: {memory: 0}}]",
        ConfigArgs::default(),
    );
    assert!(e.contains("may not be zero"), "{e}");
    let e = err(
        "reservedMemory: [{numaNode: 0, limits: {memory: 1Gi}}, {numaNode: 0, limits: {memory: 1Gi}}]",
        ConfigArgs::default(),
    );
    assert!(e.contains("duplicate value for NUMA node 0"), "{e}");
    let e = err(
        "",
        ConfigArgs {
            reserved_memory: vec!["x:memory=1Gi".into()],
            ..Default::default()
        },
    );
    assert!(
        e.contains("--reserved-memory") && e.contains("NUMA node number"),
        "{e}"
    );
    let e = err("topologyManagerPolicy: strict", ConfigArgs::default());
    assert!(
        e.contains("topologyManagerPolicy") && e.contains("single-numa-node"),
        "{e}"
    );
    let e = err(
        "",
        ConfigArgs {
            topology_manager_scope: Some("node".into()),
            ..Default::default()
        },
    );
    assert!(
        e.contains("--topology-manager-scope") && e.contains("container or pod"),
        "{e}"
    );
}
