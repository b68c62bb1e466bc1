//! `enforcer status` and `enforcer doctor` against a running daemon on a private containerd:
//! the status screen shows the thresholds with their observations and the pods by QoS class;
//! the doctor finds a leftover pod cgroup it was given, and not once it is gone, and a value
//! the daemon wrote that something else changed, and not once it is put back. `enforcer config
//! check` refusing bad feature gates with kubelet's messages.

use std::{path::Path, process::Command, time::Duration};

use enforcer::config::ConfigArgs;
use enforcer::policy::qos::QosClass;
use enforcer_tests::node::{Node, phase, pod, wait_until};

/// The binary, built once for the test.
fn binary() -> &'static Path {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(enforcer_tests::enforcer_binary)
}

fn run(args: &[&str], state: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(binary())
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .output()
        .expect("the enforcer binary");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn findings(node: &Node, state: &Path) -> (Option<i32>, Vec<serde_json::Value>) {
    let mut args = vec!["doctor", "--json", "--cgroup-root"];
    let root = node.cd.cgroup_root.clone();
    args.push(&root);
    let (code, out, err) = run(&args, state);
    let list: Vec<serde_json::Value> =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("doctor --json: {e}: {out}{err}"));
    (code, list)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_node_and_doctor_finds_a_leftover_cgroup() {
    let node = Node::start(
        "opcli",
        ConfigArgs {
            node_capacity: vec!["memory=1Gi".to_owned()],
            eviction_hard: vec!["memory.available<100Mi".to_owned()],
            ..ConfigArgs::default()
        },
        None,
    );
    let state = node.state.clone();
    node.submit(
        "web.yaml",
        &pod(
            "web",
            "opcli-0000-0000-0000-000000000001",
            "",
            "",
            "trap 'exit 0' TERM; sleep 3600 & wait",
        ),
    );
    wait_until("web running", Duration::from_secs(60), || {
        phase(&state, "web").as_deref() == Some("Running")
    })
    .await;
    wait_until("eviction.json", Duration::from_secs(20), || {
        state.join("eviction.json").exists()
    })
    .await;
    let (code, out, err) = run(&["status"], &state);
    assert_eq!(code, Some(0), "{out}{err}");
    eprintln!("$ enforcer status\n{out}");
    assert!(out.contains("Conditions:  "), "{out}");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("memory.available"))
        .unwrap_or_else(|| panic!("no memory.available threshold line: {out}"));
    assert!(
        line.contains("<100Mi (hard)") && line.contains(" of 1Gi") && line.contains("ok"),
        "{line}"
    );
    assert!(out.contains("Pods:        BestEffort 1 (0 ended)"), "{out}");

    // The doctor: the running pod's cgroup is known (no leftover); a pod cgroup nobody owns
    // is found, and gone once removed.
    let leftover = |list: &[serde_json::Value]| {
        list.iter()
            .filter(|f| {
                f["problem"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("leftover pod cgroup"))
            })
            .count()
    };
    let (_, before) = findings(&node, &state);
    assert_eq!(leftover(&before), 0, "{before:?}");
    let l = enforcer_tests::layout();
    let (mount, _) = l.controller("memory").expect("memory controller");
    let stray = mount.join(
        node.cd
            .pod_path(QosClass::BestEffort, "00000000-dead-beef-0000-000000000000")
            .trim_start_matches('/'),
    );
    std::fs::create_dir_all(&stray).expect("a stray pod cgroup");
    let (code, with) = findings(&node, &state);
    let _ = std::fs::remove_dir(&stray);
    assert_eq!(code, Some(1), "findings exit 1: {with:?}");
    assert_eq!(leftover(&with), 1, "{with:?}");
    let f = with
        .iter()
        .find(|f| {
            f["problem"]
                .as_str()
                .is_some_and(|p| p.contains("pod00000000-dead-beef"))
        })
        .expect("the stray cgroup named");
    assert!(
        f["fix"].as_str().is_some_and(|x| x.starts_with("rmdir")),
        "{f}"
    );
    let (_, after) = findings(&node, &state);
    assert_eq!(leftover(&after), 0, "{after:?}");

    // A value the daemon wrote, changed behind its back (in this test's own cgroups): named,
    // and not once it is put back.
    wait_until("cgroups.json", Duration::from_secs(20), || {
        state.join("cgroups.json").exists()
    })
    .await;
    let written: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(state.join("cgroups.json")).expect("cgroups.json"))
            .expect("cgroups.json decodes");
    let root = node.cd.cgroup_root.trim_start_matches('/').to_owned();
    let (file, want) = written
        .iter()
        .find(|(f, _)| {
            f.contains(&root) && (f.ends_with("/cpu.shares") || f.ends_with("/cpu.weight"))
        })
        .unwrap_or_else(|| panic!("no cpu value written under {root}: {written:?}"));
    let original = std::fs::read_to_string(file).expect("the value on disk");
    assert_eq!(original.trim(), want, "{file} as written");
    let other = (want.parse::<u64>().expect("a number") + 7).to_string();
    std::fs::write(file, &other).expect("change it");
    let (_, changed) = findings(&node, &state);
    std::fs::write(file, original.trim()).expect("put it back");
    let named = |list: &[serde_json::Value]| {
        list.iter()
            .filter(|f| {
                f["check"] == "cgroup values"
                    && f["problem"]
                        .as_str()
                        .is_some_and(|p| p.starts_with(file.as_str()))
            })
            .count()
    };
    assert_eq!(named(&changed), 1, "{changed:?}");
    let (_, restored) = findings(&node, &state);
    assert_eq!(named(&restored), 0, "{restored:?}");
    drop(node.shutdown().await);
}

/// `enforcer config check` on feature gates and Memory QoS, as an operator runs it: kubelet's
/// messages for an unknown gate and a locked one (from the file and from the flag), exit 2,
/// the file or the command line named; a valid configuration printed with the gates' values
/// and the knobs as given.
#[test]
fn config_check_refuses_bad_feature_gates_with_kubelets_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("config");
        p.display().to_string()
    };
    let locked = file("locked.yaml", "featureGates: {KubeletPSI: false}\n");
    let (code, _, err) = run(&["config", "check", "--config", &locked], &state);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{locked}: invalid value \"KubeletPSI=false\" for featureGates: cannot set feature gate KubeletPSI to false, feature is locked to true"
        )),
        "{err}"
    );
    let (code, _, err) = run(
        &["config", "check", "--feature-gates=PSINodeCondition=true"],
        &state,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("command line: invalid value \"PSINodeCondition=true\" for --feature-gates: unrecognized feature gate: PSINodeCondition"),
        "{err}"
    );
    let policy = file("policy.yaml", "memoryReservationPolicy: Strict\n");
    let (code, _, err) = run(&["config", "check", "--config", &policy], &state);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("must be None or TieredReservation"), "{err}");
    let good = file(
        "good.yaml",
        "featureGates: {MemoryQoS: true}\nmemoryThrottlingFactor: 0.8\nmemoryReservationPolicy: TieredReservation\n",
    );
    let (code, out, err) = run(&["config", "check", "--config", &good], &state);
    assert_eq!(code, Some(0), "{err}");
    let shown: serde_json::Value =
        serde_json::from_str(out.get(out.find('{').unwrap_or(0)..).unwrap_or_default())
            .unwrap_or_else(|e| panic!("config check prints JSON: {e}: {out}"));
    assert_eq!(shown["featureGates"]["MemoryQoS"], true, "{shown}");
    assert_eq!(shown["featureGates"]["KubeletPSI"], true, "{shown}");
    assert_eq!(shown["memoryThrottlingFactor"], 0.8, "{shown}");
    assert_eq!(
        shown["memoryReservationPolicy"], "TieredReservation",
        "{shown}"
    );
}
